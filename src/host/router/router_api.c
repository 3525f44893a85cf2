/* ompk_router_topk_fwd / ompk_router_topk_bwd: validation, routing, verify and trace around the
 * kernels in src/target/router/router_topk.c. */
#include <stdlib.h>

#include "check.h"
#include "error.h"
#include "ompk/router.h"
#include "ref/router_ref.h"
#include "route.h"
#include "router_impl.h"
#include "target/router/router_topk.h"
#include "verify.h"

/* indices are int32 flattened pair numbers */
#define RT_MAX_N 46340

/* The fp32 reference results as doubles. */
static void widen(const float *v, int64_t n, double *out) {
    for (int64_t e = 0; e < n; e++) out[e] = v[e];
}

static int fwd_ref(const ompk_verify_io *io) {
    const int64_t k = *(const int64_t *)io->ctx, n = io->ref_n[2];
    float *rs = malloc(sizeof(float) * (size_t)(n ? n : 1));
    int32_t *ri = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    int ok = rs && ri && ompk_ref_router_topk_fwd(&io->h[0], &io->h[1], k, rs, ri) == OMPK_OK;
    if (ok) {
        widen(rs, n, io->ref[2]);
        for (int64_t e = 0; e < n; e++) io->ref[3][e] = ri[e];
    }
    free(rs);
    free(ri);
    return ok;
}

/* the kernel forms the same fp32 sums, so both outputs must match exactly */
static ompk_tol fwd_tol(const ompk_verify_io *io, int i) {
    (void)io, (void)i;
    const ompk_tol exact = {.atol = 0.0, .rtol = 0.0};
    return exact;
}

static void fwd_verify(const ompk_tensor *sx, const ompk_tensor *sy, int64_t k,
                       const ompk_tensor *scores, const ompk_tensor *indices) {
    const ompk_verify_arg args[4] = {{"sx", sx, 1, 0, 0, NULL},
                                     {"sy", sy, 1, 0, 0, NULL},
                                     {"scores", scores, 1, 1, 0, NULL},
                                     {"indices", indices, 0, 1, 0, NULL}};
    const ompk_verify_op op = {.fn = "router_topk_fwd",
                               .args = args,
                               .nargs = 4,
                               .ctx = &k,
                               .ref = fwd_ref,
                               .tol = fwd_tol};
    ompk_verify_run(&op);
}

ompk_status ompk_router_topk_fwd(const ompk_tensor *sx, const ompk_tensor *sy, int64_t k,
                                 ompk_tensor *scores, ompk_tensor *indices) {
    ompk_call c;
    ompk_call_begin(&c, "ompk_router_topk_fwd");
    if (ompk_call_input(&c, "sx", sx, 2, OMPK_DT_FLOAT)) {
        const int64_t T = sx->shape[0], N = sx->shape[1];
        const int64_t NN = N >= 1 && N <= RT_MAX_N ? N * N : 0;
        ompk_call_require(&c, N >= 1 && N <= RT_MAX_N, OMPK_ERR_INVALID_ARGUMENT,
                          "N = %lld, must be 1..%d (indices are int32 i*N+j)", (long long)N,
                          RT_MAX_N);
        ompk_call_require(&c, k >= 1 && k <= NN, OMPK_ERR_INVALID_ARGUMENT,
                          "k = %lld, must be 1..N^2 = %lld", (long long)k, (long long)NN);
        if (ompk_call_input(&c, "sy", sy, 2, OMPK_DT_FLOAT)) {
            ompk_call_dim(&c, "sy", sy, 0, T);
            ompk_call_dim(&c, "sy", sy, 1, N);
            ompk_call_same_dtype(&c, "sx", sx, "sy", sy);
        }
        if (ompk_call_output(&c, "scores", scores, 2, OMPK_DT(OMPK_F32))) {
            ompk_call_dim(&c, "scores", scores, 0, T);
            ompk_call_dim(&c, "scores", scores, 1, k);
        }
        if (ompk_call_output(&c, "indices", indices, 2, OMPK_DT(OMPK_I32))) {
            ompk_call_dim(&c, "indices", indices, 0, T);
            ompk_call_dim(&c, "indices", indices, 1, k);
        }
    }
    ompk_status st = ompk_call_end(&c);
    if (st != OMPK_OK) return st;
    if (sx->shape[0] == 0) return OMPK_OK;

    ompk_router_fwd_args a;
    a.sx = sx->data;
    a.sy = sy->data;
    a.scores = (float *)scores->data;
    a.indices = (int32_t *)indices->data;
    a.T = sx->shape[0];
    a.N = sx->shape[1];
    a.k = k;
    a.is_bf16 = sx->dtype == OMPK_BF16;
    a.sx0 = sx->strides[0];
    a.sx1 = sx->strides[1];
    a.sy0 = sy->strides[0];
    a.sy1 = sy->strides[1];
    a.sc0 = scores->strides[0];
    a.sc1 = scores->strides[1];
    a.ix0 = indices->strides[0];
    a.ix1 = indices->strides[1];
    a.device = c.device;
    const router_fwd_call call = {ompk_exec_for(c.device), &a};
    st = ompk_impl_run(OMPK_OP_ROUTER_FWD, &call, c.device, c.fn, NULL);
    if (st != OMPK_OK) return st;

    if (ompk_verify_enabled() || ompk_trace_enabled()) fwd_verify(sx, sy, k, scores, indices);
    return OMPK_OK;
}

static int bwd_ref(const ompk_verify_io *io) {
    const int64_t n = *(const int64_t *)io->ctx, m = io->ref_n[2];
    float *rx = malloc(sizeof(float) * (size_t)(m ? m : 1));
    float *ry = malloc(sizeof(float) * (size_t)(m ? m : 1));
    int ok = rx && ry && ompk_ref_router_topk_bwd(&io->h[0], &io->h[1], n, rx, ry) == OMPK_OK;
    if (ok) {
        widen(rx, m, io->ref[2]);
        widen(ry, m, io->ref[3]);
    }
    free(rx);
    free(ry);
    return ok;
}

/* same fp32 sums in the same order: exact for f32, one rounding for bf16 */
static ompk_tol bwd_tol(const ompk_verify_io *io, int i) {
    (void)i;
    const ompk_tol tol = {.rtol = io->h[2].dtype == OMPK_BF16 ? 4e-3 : 0.0};
    return tol;
}

static void bwd_verify(const ompk_tensor *dscores, const ompk_tensor *indices, int64_t n,
                       const ompk_tensor *dsx, const ompk_tensor *dsy) {
    const ompk_verify_arg args[4] = {{"dscores", dscores, 1, 0, 0, NULL},
                                     {"indices", indices, 0, 0, 0, NULL},
                                     {"dsx", dsx, 1, 1, 0, NULL},
                                     {"dsy", dsy, 1, 1, 0, NULL}};
    const ompk_verify_op op = {.fn = "router_topk_bwd",
                               .args = args,
                               .nargs = 4,
                               .ctx = &n,
                               .ref = bwd_ref,
                               .tol = bwd_tol};
    ompk_verify_run(&op);
}

ompk_status ompk_router_topk_bwd(const ompk_tensor *dscores, const ompk_tensor *indices, int64_t n,
                                 ompk_tensor *dsx, ompk_tensor *dsy) {
    ompk_call c;
    ompk_call_begin(&c, "ompk_router_topk_bwd");
    const int64_t nn = n >= 1 && n <= RT_MAX_N ? n * n : 0;
    ompk_call_require(&c, n >= 1 && n <= RT_MAX_N, OMPK_ERR_INVALID_ARGUMENT,
                      "N = %lld, must be 1..%d (indices are int32 i*N+j)", (long long)n, RT_MAX_N);
    if (ompk_call_input(&c, "dscores", dscores, 2, OMPK_DT_FLOAT)) {
        const int64_t T = dscores->shape[0], k = dscores->shape[1];
        ompk_call_require(&c, k >= 1 && k <= nn, OMPK_ERR_INVALID_ARGUMENT,
                          "k = %lld slots, must be 1..N^2 = %lld", (long long)k, (long long)nn);
        if (ompk_call_input(&c, "indices", indices, 2, OMPK_DT(OMPK_I32))) {
            ompk_call_dim(&c, "indices", indices, 0, T);
            ompk_call_dim(&c, "indices", indices, 1, k);
        }
        if (ompk_call_output(&c, "dsx", dsx, 2, OMPK_DT_FLOAT)) {
            ompk_call_dim(&c, "dsx", dsx, 0, T);
            ompk_call_dim(&c, "dsx", dsx, 1, n);
        }
        if (ompk_call_output(&c, "dsy", dsy, 2, OMPK_DT_FLOAT)) {
            ompk_call_dim(&c, "dsy", dsy, 0, T);
            ompk_call_dim(&c, "dsy", dsy, 1, n);
            ompk_call_same_dtype(&c, "dsx", dsx, "dsy", dsy);
        }
    }
    ompk_status st = ompk_call_end(&c);
    if (st != OMPK_OK) return st;
    if (dscores->shape[0] == 0) return OMPK_OK;

    ompk_router_bwd_args a;
    a.dscores = dscores->data;
    a.indices = (const int32_t *)indices->data;
    a.dsx = dsx->data;
    a.dsy = dsy->data;
    a.T = dscores->shape[0];
    a.N = n;
    a.k = dscores->shape[1];
    a.ds_bf16 = dscores->dtype == OMPK_BF16;
    a.out_bf16 = dsx->dtype == OMPK_BF16;
    a.ds0 = dscores->strides[0];
    a.ds1 = dscores->strides[1];
    a.ix0 = indices->strides[0];
    a.ix1 = indices->strides[1];
    a.dx0 = dsx->strides[0];
    a.dx1 = dsx->strides[1];
    a.dy0 = dsy->strides[0];
    a.dy1 = dsy->strides[1];
    const ompk_exec ex = ompk_exec_for(c.device);

    const int64_t bad = ompk_router_first_bad_index(ex, &a);
    if (bad >= 0) {
        const int64_t t = bad / a.k, r = bad % a.k;
        int32_t v = 0;
        const int32_t *p = a.indices + t * a.ix0 + r * a.ix1;
        ompk_memcpy(&v, ompk_device_host(), p, c.device, sizeof v);
        ompk_router_bwd_zero(ex, &a);
        return ompk_fail(OMPK_ERR_INDEX_OUT_OF_RANGE, "ompk_router_topk_bwd",
                         "indices[%lld,%lld] = %d is outside [0, N^2 = %lld) and is not -1; "
                         "dsx and dsy were zeroed",
                         (long long)t, (long long)r, (int)v, (long long)(n * n));
    }
    const router_bwd_call call = {ex, &a};
    st = ompk_impl_run(OMPK_OP_ROUTER_BWD, &call, c.device, c.fn, NULL);
    if (st != OMPK_OK) return st;

    if (ompk_verify_enabled() || ompk_trace_enabled()) bwd_verify(dscores, indices, n, dsx, dsy);
    return OMPK_OK;
}
