/* ompk_mhc_post_pre_fwd: layer l's post forward and layer l+1's pre forward in one call. The
 * checks, kernel arguments and verify steps are the two calls' own (mhc_post_fwd_api.c,
 * mhc_pre_api.c); x_out is the post's output and the pre's input. Where the pre forward would
 * run the decode kernel, that kernel takes the post in front (one region); otherwise the post and
 * pre kernels run one after the other, as the two calls would. */
#include <string.h>

#include "error.h"
#include "mhc_impl.h"
#include "verify.h"

ompk_status ompk_mhc_post_pre_fwd(const ompk_mhc_post_pre_fwd_args *g,
                                  const ompk_mhc_params *params) {
    static const char fn[] = "ompk_mhc_post_pre_fwd";
    if (!g) return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "args is NULL");
    ompk_call c;
    ompk_call_begin(&c, fn);
    const ompk_mhc_params p = params ? *params : ompk_mhc_params_default();
    ompk_mhc_pre_fwd_args pre = g->pre;
    ompk_call_require(&c, pre.x == NULL || pre.x == g->x_out, OMPK_ERR_INVALID_ARGUMENT,
                      "pre.x must be NULL or x_out (x_out is the pre's input)");
    pre.x = g->x_out;
    ompk_mhc_post_fwd_check(&c, g->x, g->comb, g->post, g->f, g->x_out, "x_out");
    ompk_mhc_pre_fwd_check(&c, &pre, &p, 1);
    ompk_status st = ompk_call_end(&c);
    if (st != OMPK_OK) return st;
    mhc_pre_fwd_args a;
    ompk_mhc_pre_fwd_build(&pre, &p, &a);
    ompk_mhc_post_args pa;
    ompk_mhc_post_fwd_build(g->x, g->comb, g->post, g->f, g->x_out, &pa);
    if (a.B * a.S == 0) return OMPK_OK;

    const ompk_exec ex = ompk_exec_for(c.device);
    mhc_pre_fwd_call call = {ex, &a, NULL};
    const ompk_impl *pick;
    st = ompk_impl_pick(OMPK_OP_MHC_PRE_FWD, &call, fn, &pick);
    if (st != OMPK_OK) return st;
    if (pick && strcmp(pick->name, "decode") == 0) {
        call.post = &pa;
        st = ompk_impl_run_entry(pick, &call, c.device, fn);
    } else {
        const mhc_post_fwd_call pc = {ex, &pa};
        st = ompk_impl_run(OMPK_OP_MHC_POST_FWD, &pc, c.device, fn, NULL);
        if (st == OMPK_OK) st = ompk_impl_run(OMPK_OP_MHC_PRE_FWD, &call, c.device, fn, NULL);
    }
    if (st != OMPK_OK) return st;
    if (ompk_verify_enabled() || ompk_trace_enabled()) {
        ompk_mhc_post_fwd_verify(g->x, g->comb, g->post, g->f, g->x_out);
        ompk_mhc_pre_fwd_verify(&pre, &p);
    }
    return OMPK_OK;
}
