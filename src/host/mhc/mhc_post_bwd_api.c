/* ompk_mhc_post_bwd: validation, workspace, routing, verify and trace around the kernel. */
#include <string.h>

#include "check.h"
#include "mhc_impl.h"
#include "error.h"
#include "mhc_ref_pre.h"
#include "ompk/mhc.h"
#include "route.h"
#include "target/mhc/mhc_kern.h"
#include "tolerance.h"
#include "verify.h"

static void dims(ompk_call *c, const char *name, const ompk_tensor *t, int nd,
                 const int64_t *shape) {
    for (int d = 0; d < nd; d++) ompk_call_dim(c, name, t, d, shape[d]);
}

static int post_bwd_ref(const ompk_verify_io *io) {
    const ompk_tensor *x = &io->h[0];
    double *const *d = io->d;
    ompk_mhc_ref_post_bwd(x->shape[0] * x->shape[1], (int)x->shape[2], x->shape[3], d[0], d[1],
                          d[2], d[3], d[4], io->ref[5], io->ref[6], io->ref[7], io->ref[8]);
    return 1;
}

ompk_status ompk_mhc_post_bwd(const ompk_tensor *x, const ompk_tensor *comb,
                              const ompk_tensor *post, const ompk_tensor *f,
                              const ompk_tensor *dout, ompk_tensor *dx, ompk_tensor *df,
                              ompk_tensor *dpost, ompk_tensor *dcomb) {
    ompk_call c;
    ompk_call_begin(&c, "ompk_mhc_post_bwd");
    int64_t B = 0, S = 0, n = 0, D = 0;
    if (ompk_call_input(&c, "x", x, 4, OMPK_DT_FLOAT)) {
        B = x->shape[0], S = x->shape[1], n = x->shape[2], D = x->shape[3];
        ompk_call_require(&c, n >= 1 && n <= 8, OMPK_ERR_INVALID_ARGUMENT,
                          "n = %lld streams, must be 1..8", (long long)n);
        ompk_call_require(&c, D >= 1, OMPK_ERR_INVALID_ARGUMENT, "D must be >= 1");
        ompk_call_unit_stride(&c, "x", x, 3);
    }
    const int64_t xs[4] = {B, S, n, D}, cs[4] = {B, S, n, n}, ps[3] = {B, S, n};
    const int64_t fs[3] = {B, S, D};
    ompk_call_input(&c, "comb", comb, 4, OMPK_DT(OMPK_F32));
    dims(&c, "comb", comb, 4, cs);
    ompk_call_input(&c, "post", post, 3, OMPK_DT(OMPK_F32));
    dims(&c, "post", post, 3, ps);
    ompk_call_input(&c, "f", f, 3, OMPK_DT_FLOAT);
    dims(&c, "f", f, 3, fs);
    ompk_call_same_dtype(&c, "x", x, "f", f);
    ompk_call_unit_stride(&c, "f", f, 2);
    ompk_call_input(&c, "dout", dout, 4, OMPK_DT_FLOAT);
    dims(&c, "dout", dout, 4, xs);
    ompk_call_same_dtype(&c, "x", x, "dout", dout);
    ompk_call_unit_stride(&c, "dout", dout, 3);
    ompk_call_output(&c, "dx", dx, 4, OMPK_DT_FLOAT);
    dims(&c, "dx", dx, 4, xs);
    ompk_call_same_dtype(&c, "x", x, "dx", dx);
    ompk_call_unit_stride(&c, "dx", dx, 3);
    ompk_call_output(&c, "df", df, 3, OMPK_DT_FLOAT);
    dims(&c, "df", df, 3, fs);
    ompk_call_same_dtype(&c, "x", x, "df", df);
    ompk_call_unit_stride(&c, "df", df, 2);
    ompk_call_output(&c, "dpost", dpost, 3, OMPK_DT(OMPK_F32));
    dims(&c, "dpost", dpost, 3, ps);
    ompk_call_output(&c, "dcomb", dcomb, 4, OMPK_DT(OMPK_F32));
    dims(&c, "dcomb", dcomb, 4, cs);
    ompk_status st = ompk_call_end(&c);
    if (st != OMPK_OK) return st;

    mhc_post_bwd_args a;
    memset(&a, 0, sizeof a);
    a.x = x->data, a.f = f->data, a.dout = dout->data;
    a.comb = (const float *)comb->data, a.post = (const float *)post->data;
    a.dx = dx->data, a.df = df->data;
    a.dpost = (float *)dpost->data, a.dcomb = (float *)dcomb->data;
    a.B = B, a.S = S, a.D = D, a.n = (int)n, a.bf16 = x->dtype == OMPK_BF16;
    for (int d = 0; d < 4; d++) {
        a.sx[d] = x->strides[d], a.sg[d] = dout->strides[d], a.sc[d] = comb->strides[d];
        a.sdx[d] = dx->strides[d], a.sdc[d] = dcomb->strides[d];
    }
    for (int d = 0; d < 3; d++) {
        a.sf[d] = f->strides[d], a.sp[d] = post->strides[d], a.sdf[d] = df->strides[d];
        a.sdp[d] = dpost->strides[d];
    }
    if (B * S == 0) return OMPK_OK;
    const mhc_post_bwd_call call = {ompk_exec_for(c.device), &a};
    st = ompk_impl_run(OMPK_OP_MHC_POST_BWD, &call, c.device, c.fn, NULL);
    if (st != OMPK_OK) return st;

    if (ompk_verify_enabled() || ompk_trace_enabled()) {
        const ompk_verify_arg args[9] = {
            {"x", x, 1, 0, 0, NULL},         {"comb", comb, 1, 0, 0, NULL},
            {"post", post, 1, 0, 0, NULL},   {"f", f, 1, 0, 0, NULL},
            {"dout", dout, 1, 0, 0, NULL},   {"dx", dx, 1, 1, 0, NULL},
            {"df", df, 1, 1, 0, NULL},       {"dpost", dpost, 1, 1, 0, "post"},
            {"dcomb", dcomb, 1, 1, 0, "res"}};
        const ompk_verify_op op = {.fn = "mhc_post_bwd",
                                   .args = args,
                                   .nargs = 9,
                                   .gather = 1,
                                   .ref = post_bwd_ref,
                                   .tol = ompk_verify_tol_ref_max};
        ompk_verify_run(&op);
    }
    return OMPK_OK;
}
