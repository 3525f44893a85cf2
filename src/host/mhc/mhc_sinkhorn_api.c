/* ompk_mhc_sinkhorn_fwd / ompk_mhc_sinkhorn_bwd: validation, routing, verify and trace. */
#include <math.h>
#include <stdlib.h>
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

/* trace/verify: ts = {logits, (dcomb), out} */
static void sk_verify(const char *fn, const char *oname, const ompk_tensor *lg,
                      const ompk_tensor *dc, const ompk_tensor *out, int repeat, float eps) {
    ompk_tensor h[3];
    void *own[3] = {0, 0, 0};
    const ompk_tensor *ts[3] = {lg, dc, out};
    const char *names[3] = {"logits", "dcomb", oname};
    int ok = 1;
    for (int i = 0; i < 3 && ok; i++)
        if (ts[i]) ok = ompk_host_view(ts[i], &h[i], &own[i]) == OMPK_OK;
    if (ok && ompk_trace_enabled())
        for (int i = 0; i < 3; i++)
            if (ts[i]) ompk_trace_tensor(fn, names[i], &h[i]);
    if (ok && ompk_verify_enabled()) {
        const int64_t N = ompk_tensor_numel(lg), T = lg->shape[0] * lg->shape[1];
        const int n = (int)lg->shape[2];
        double *l = malloc(sizeof(double) * (size_t)(N ? N : 1));
        double *g = malloc(sizeof(double) * (size_t)(N ? N : 1));
        double *r = malloc(sizeof(double) * (size_t)(N ? N : 1));
        if (l && g && r) {
            ompk_mhc_ref_gather(&h[0], l);
            double scale = 1;
            if (dc) {
                ompk_mhc_ref_gather(&h[1], g);
                ompk_mhc_ref_sinkhorn_bwd(T, n, repeat, eps, l, g, r);
                for (int64_t i = 0; i < N; i++) scale = fmax(scale, fabs(g[i]));
            } else {
                ompk_mhc_ref_sinkhorn_fwd(T, n, repeat, eps, l, r);
            }
            ompk_verify_report(fn, oname, "res", &h[2], r, 0, -1, ompk_tol_for(OMPK_F32, scale));
        }
        free(l), free(g), free(r);
    }
    for (int i = 0; i < 3; i++) ompk_host_view_free(own[i]);
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
        sk_verify("sinkhorn_fwd", "comb", logits, NULL, comb, repeat, eps);
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
        sk_verify("sinkhorn_bwd", "dlogits", logits, dcomb, dlogits, repeat, eps);
    return OMPK_OK;
}
