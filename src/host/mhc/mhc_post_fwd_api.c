/* ompk_mhc_post_fwd: validation, routing, verify and trace around the kernel. */
#include "check.h"
#include "error.h"
#include "mhc_ref.h"
#include "ompk/mhc.h"
#include "route.h"
#include "mhc_impl.h"
#include "target/mhc/mhc_post.h"
#include "tolerance.h"
#include "verify.h"

static int post_fwd_ref(const ompk_verify_io *io) {
    ompk_ref_mhc_post_fwd(&io->h[0], &io->h[1], &io->h[2], &io->h[3], io->ref[4]);
    return 1;
}

/* each output sums n+1 products of O(1) values */
static ompk_tol post_fwd_tol(const ompk_verify_io *io, int i) {
    return ompk_tol_for(io->h[i].dtype, 1.0);
}

void ompk_mhc_post_fwd_verify(const ompk_tensor *x, const ompk_tensor *comb,
                              const ompk_tensor *post, const ompk_tensor *f,
                              const ompk_tensor *out) {
    const ompk_verify_arg args[5] = {{"x", x, 1, 0, 0, NULL},
                                     {"comb", comb, 1, 0, 0, NULL},
                                     {"post", post, 1, 0, 0, NULL},
                                     {"f", f, 1, 0, 0, NULL},
                                     {"out", out, 1, 1, 0, NULL}};
    const ompk_verify_op op = {
        .fn = "mhc_post_fwd", .args = args, .nargs = 5, .ref = post_fwd_ref, .tol = post_fwd_tol};
    ompk_verify_run(&op);
}

void ompk_mhc_post_fwd_check(ompk_call *c, const ompk_tensor *x, const ompk_tensor *comb,
                             const ompk_tensor *post, const ompk_tensor *f, const ompk_tensor *out,
                             const char *out_name) {
    if (ompk_call_input(c, "x", x, 4, OMPK_DT_FLOAT)) {
        const int64_t B = x->shape[0], S = x->shape[1], n = x->shape[2], D = x->shape[3];
        ompk_call_require(c, n >= 1 && n <= 8, OMPK_ERR_INVALID_ARGUMENT,
                          "n = %lld streams, must be 1..8", (long long)n);
        ompk_call_input(c, "comb", comb, 4, OMPK_DT(OMPK_F32));
        ompk_call_input(c, "post", post, 3, OMPK_DT(OMPK_F32));
        ompk_call_input(c, "f", f, 3, OMPK_DT_FLOAT);
        ompk_call_output(c, out_name, out, 4, OMPK_DT_FLOAT);
        const int64_t cs[4] = {B, S, n, n}, ps[3] = {B, S, n}, fs[3] = {B, S, D};
        for (int d = 0; d < 4; d++) ompk_call_dim(c, "comb", comb, d, cs[d]);
        for (int d = 0; d < 3; d++) ompk_call_dim(c, "post", post, d, ps[d]);
        for (int d = 0; d < 3; d++) ompk_call_dim(c, "f", f, d, fs[d]);
        for (int d = 0; d < 4; d++) ompk_call_dim(c, out_name, out, d, x->shape[d]);
        ompk_call_same_dtype(c, "x", x, "f", f);
        ompk_call_same_dtype(c, "x", x, out_name, out);
    }
}

void ompk_mhc_post_fwd_build(const ompk_tensor *x, const ompk_tensor *comb, const ompk_tensor *post,
                             const ompk_tensor *f, ompk_tensor *out, ompk_mhc_post_args *a) {
    a->x = x->data;
    a->comb = (const float *)comb->data;
    a->post = (const float *)post->data;
    a->f = f->data;
    a->out = out->data;
    a->B = x->shape[0];
    a->S = x->shape[1];
    a->n = (int)x->shape[2];
    a->D = x->shape[3];
    a->is_bf16 = x->dtype == OMPK_BF16;
    for (int d = 0; d < 4; d++) {
        a->sx[d] = x->strides[d];
        a->sc[d] = comb->strides[d];
        a->so[d] = out->strides[d];
    }
    for (int d = 0; d < 3; d++) {
        a->sp[d] = post->strides[d];
        a->sf[d] = f->strides[d];
    }
}

ompk_status ompk_mhc_post_fwd(const ompk_tensor *x, const ompk_tensor *comb,
                              const ompk_tensor *post, const ompk_tensor *f, ompk_tensor *out) {
    ompk_call c;
    ompk_call_begin(&c, "ompk_mhc_post_fwd");
    ompk_mhc_post_fwd_check(&c, x, comb, post, f, out, "out");
    ompk_status st = ompk_call_end(&c);
    if (st != OMPK_OK) return st;
    if (ompk_tensor_numel(out) == 0) return OMPK_OK;
    ompk_mhc_post_args a;
    ompk_mhc_post_fwd_build(x, comb, post, f, out, &a);
    const mhc_post_fwd_call call = {ompk_exec_for(c.device), &a};
    st = ompk_impl_run(OMPK_OP_MHC_POST_FWD, &call, c.device, c.fn, NULL);
    if (st != OMPK_OK) return st;
    if (ompk_verify_enabled() || ompk_trace_enabled())
        ompk_mhc_post_fwd_verify(x, comb, post, f, out);
    return OMPK_OK;
}
