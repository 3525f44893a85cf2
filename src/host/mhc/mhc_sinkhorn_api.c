/* ompk_mhc_sinkhorn_fwd / ompk_mhc_sinkhorn_bwd: validation, routing, verify and trace. */
#include <math.h>
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

static void sk_common(ompk_call *c, const ompk_tensor *logits, int repeat, float eps) {
    ompk_call_require(c, repeat >= 1 && repeat <= 1000, OMPK_ERR_INVALID_ARGUMENT,
                      "sinkhorn_repeat = %d, must be 1..1000", repeat);
    ompk_call_require(c, isfinite(eps) && eps >= 0, OMPK_ERR_INVALID_ARGUMENT,
                      "sinkhorn_eps must be finite and >= 0");
    if (ompk_call_input(c, "logits", logits, 4, OMPK_DT(OMPK_F32))) {
        const int64_t n = logits->shape[2];
        ompk_call_require(c, n >= 1 && n <= 8, OMPK_ERR_INVALID_ARGUMENT,
                          "n = %lld streams, must be 1..8", (long long)n);
        ompk_call_dim(c, "logits", logits, 3, n);
    }
}

static void same_shape(ompk_call *c, const char *name, const ompk_tensor *t,
                       const ompk_tensor *ref) {
    if (!ref || !ompk_call_ok(c)) return;
    for (int d = 0; d < 4; d++) ompk_call_dim(c, name, t, d, ref->shape[d]);
}

static void fill_args(mhc_sk_args *a, const ompk_tensor *lg, int repeat, float eps) {
    memset(a, 0, sizeof *a);
    a->logits = (const float *)lg->data;
    a->B = lg->shape[0], a->S = lg->shape[1], a->n = (int)lg->shape[2];
    a->repeat = repeat, a->eps = eps;
    for (int d = 0; d < 4; d++) a->sl[d] = lg->strides[d];
}

/* args: logits, dcomb (backward only), the output */
static int sk_ref(const ompk_verify_io *io) {
    const mhc_sk_args *a = io->ctx;
    if (io->args[1].t)
        ompk_mhc_ref_sinkhorn_bwd(a->B * a->S, a->n, a->repeat, a->eps, io->d[0], io->d[1],
                                  io->ref[2]);
    else
        ompk_mhc_ref_sinkhorn_fwd(a->B * a->S, a->n, a->repeat, a->eps, io->d[0], io->ref[2]);
    return 1;
}

/* comb is doubly stochastic (unit scale); dlogits scales with dcomb */
static ompk_tol sk_tol(const ompk_verify_io *io, int i) {
    (void)i;
    double scale = 1;
    if (io->args[1].t)
        for (int64_t e = 0; e < ompk_tensor_numel(&io->h[1]); e++)
            scale = fmax(scale, fabs(io->d[1][e]));
    return ompk_tol_for(OMPK_F32, scale);
}

static void sk_verify(const char *fn, const char *oname, const ompk_tensor *lg,
                      const ompk_tensor *dc, const ompk_tensor *out, const mhc_sk_args *a) {
    const ompk_verify_arg args[3] = {
        {"logits", lg, 1, 0, 0, NULL}, {"dcomb", dc, 1, 0, 0, NULL}, {oname, out, 1, 1, 0, "res"}};
    const ompk_verify_op op = {
        .fn = fn, .args = args, .nargs = 3, .gather = 1, .ctx = a, .ref = sk_ref, .tol = sk_tol};
    ompk_verify_run(&op);
}

ompk_status ompk_mhc_sinkhorn_fwd(const ompk_tensor *logits, ompk_tensor *comb,
                                  const ompk_mhc_params *params) {
    const ompk_mhc_params p = params ? *params : ompk_mhc_params_default();
    const int repeat = p.sinkhorn_repeat;
    const float eps = p.sinkhorn_eps;
    ompk_call c;
    ompk_call_begin(&c, "ompk_mhc_sinkhorn_fwd");
    sk_common(&c, logits, repeat, eps);
    ompk_call_output(&c, "comb", comb, 4, OMPK_DT(OMPK_F32));
    same_shape(&c, "comb", comb, logits);
    ompk_status st = ompk_call_end(&c);
    if (st != OMPK_OK) return st;
    mhc_sk_args a;
    fill_args(&a, logits, repeat, eps);
    a.out = (float *)comb->data;
    for (int d = 0; d < 4; d++) a.so[d] = comb->strides[d];
    if (a.B * a.S == 0) return OMPK_OK;
    const mhc_sk_call call = {ompk_exec_for(c.device), &a};
    st = ompk_impl_run(OMPK_OP_MHC_SINKHORN_FWD, &call, c.device, c.fn, NULL);
    if (st != OMPK_OK) return st;
    if (ompk_verify_enabled() || ompk_trace_enabled())
        sk_verify("sinkhorn_fwd", "comb", logits, NULL, comb, &a);
    return OMPK_OK;
}

ompk_status ompk_mhc_sinkhorn_bwd(const ompk_tensor *logits, const ompk_tensor *dcomb,
                                  ompk_tensor *dlogits, const ompk_mhc_params *params) {
    const ompk_mhc_params p = params ? *params : ompk_mhc_params_default();
    const int repeat = p.sinkhorn_repeat;
    const float eps = p.sinkhorn_eps;
    ompk_call c;
    ompk_call_begin(&c, "ompk_mhc_sinkhorn_bwd");
    sk_common(&c, logits, repeat, eps);
    ompk_call_input(&c, "dcomb", dcomb, 4, OMPK_DT(OMPK_F32));
    same_shape(&c, "dcomb", dcomb, logits);
    ompk_call_output(&c, "dlogits", dlogits, 4, OMPK_DT(OMPK_F32));
    same_shape(&c, "dlogits", dlogits, logits);
    ompk_status st = ompk_call_end(&c);
    if (st != OMPK_OK) return st;
    mhc_sk_args a;
    fill_args(&a, logits, repeat, eps);
    a.dcomb = (const float *)dcomb->data;
    a.out = (float *)dlogits->data;
    for (int d = 0; d < 4; d++) a.sd[d] = dcomb->strides[d], a.so[d] = dlogits->strides[d];
    if (a.B * a.S == 0) return OMPK_OK;
    const mhc_sk_call call = {ompk_exec_for(c.device), &a};
    st = ompk_impl_run(OMPK_OP_MHC_SINKHORN_BWD, &call, c.device, c.fn, NULL);
    if (st != OMPK_OK) return st;
    if (ompk_verify_enabled() || ompk_trace_enabled())
        sk_verify("sinkhorn_bwd", "dlogits", logits, dcomb, dlogits, &a);
    return OMPK_OK;
}
