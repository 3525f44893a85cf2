/* ompk-bench entries for mHC pre forward (Sinkhorn fused), Sinkhorn forward/backward, pre
 * backward, the training chain (pre fwd + Sinkhorn bwd + pre bwd), post backward, and layer l's
 * post forward + layer l+1's pre forward as one call (mhc_post_pre_fwd) and as the two calls.
 * GPU: B4 S4096 n4 D4096 bf16 (the shape), and B4 S4096 D2048 at n = 8, 1, 2, 6. Host: B1
 * S1024 n4 D2048 bf16, small enough for the 2-core CI machine; bench/peers/mhc_peer.py times
 * PyTorch on the same keys. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "variant.h"

typedef struct mhc_bufs {
    int64_t B, S, n, D, T, K, M;
    ompk_dtype dt;
    ompk_mhc_params p;
    void *x, *phi, *gamma, *alpha, *bias, *h_in, *h_post, *logits, *comb, *h_mix, *inv, *h_pre;
    void *dh_in, *dh_post, *dh_res, *dcomb, *dx, *dphi, *dalpha, *dbias, *dgamma;
    void *f, *dout, *df, *dpost, *dcombp;
    ompk_tensor tx, tphi, tgamma, talpha, tbias, th_in, th_post, tlogits, tcomb, th_mix, tinv,
        th_pre;
    ompk_tensor tdh_in, tdh_post, tdh_res, tdcomb, tdx, tdphi, tdalpha, tdbias, tdgamma;
    ompk_tensor tf, tdout, tdf, tdpost, tdcombp;
} mhc_bufs;

static void *alloc_t(ompk_bench_ctx *ctx, ompk_tensor *t, ompk_dtype dt, int nd, int64_t s0,
                     int64_t s1, int64_t s2, int64_t s3, uint64_t seed) {
    int64_t sh[4] = {s0, s1, s2, s3}, n = 1;
    for (int i = 0; i < nd; i++) n *= sh[i];
    void *p = ompk_bench_alloc_random(ctx, dt, n, seed);
    *t = ompk_tensor_make(p, dt, nd, sh, ctx->dev);
    return p;
}

static ompk_status call_pre_fwd(void *p);

static int bufs_new(ompk_bench_ctx *ctx, mhc_bufs *m) {
    const int64_t B = m->B, S = m->S, n = m->n, D = m->D, T = B * S, K = n * D;
    const int64_t M = 2 * n + n * n;
    const ompk_dtype dt = m->dt, F = OMPK_F32;
    m->T = T, m->K = K, m->M = M;
    m->p = ompk_mhc_params_default();
    m->x = alloc_t(ctx, &m->tx, dt, 4, B, S, n, D, 1);
    m->phi = alloc_t(ctx, &m->tphi, F, 2, M, K, 0, 0, 2);
    m->gamma = alloc_t(ctx, &m->tgamma, F, 1, K, 0, 0, 0, 3);
    m->alpha = alloc_t(ctx, &m->talpha, F, 1, 3, 0, 0, 0, 4);
    m->bias = alloc_t(ctx, &m->tbias, F, 1, M, 0, 0, 0, 5);
    m->h_in = alloc_t(ctx, &m->th_in, dt, 3, B, S, D, 0, 6);
    m->h_post = alloc_t(ctx, &m->th_post, F, 3, B, S, n, 0, 7);
    m->logits = alloc_t(ctx, &m->tlogits, F, 4, B, S, n, n, 8);
    m->comb = alloc_t(ctx, &m->tcomb, F, 4, B, S, n, n, 9);
    m->h_mix = alloc_t(ctx, &m->th_mix, F, 2, T, M, 0, 0, 10);
    m->inv = alloc_t(ctx, &m->tinv, F, 1, T, 0, 0, 0, 11);
    m->h_pre = alloc_t(ctx, &m->th_pre, F, 2, T, n, 0, 0, 12);
    m->dh_in = alloc_t(ctx, &m->tdh_in, dt, 3, B, S, D, 0, 13);
    m->dh_post = alloc_t(ctx, &m->tdh_post, F, 3, B, S, n, 0, 14);
    m->dh_res = alloc_t(ctx, &m->tdh_res, F, 4, B, S, n, n, 15);
    m->dcomb = alloc_t(ctx, &m->tdcomb, F, 4, B, S, n, n, 16);
    m->dx = alloc_t(ctx, &m->tdx, dt, 4, B, S, n, D, 17);
    m->dphi = alloc_t(ctx, &m->tdphi, F, 2, M, K, 0, 0, 18);
    m->dalpha = alloc_t(ctx, &m->tdalpha, F, 1, 3, 0, 0, 0, 19);
    m->dbias = alloc_t(ctx, &m->tdbias, F, 1, M, 0, 0, 0, 20);
    m->dgamma = alloc_t(ctx, &m->tdgamma, F, 1, K, 0, 0, 0, 21);
    m->f = alloc_t(ctx, &m->tf, dt, 3, B, S, D, 0, 22);
    m->dout = alloc_t(ctx, &m->tdout, dt, 4, B, S, n, D, 23);
    m->df = alloc_t(ctx, &m->tdf, dt, 3, B, S, D, 0, 24);
    m->dpost = alloc_t(ctx, &m->tdpost, F, 3, B, S, n, 0, 25);
    m->dcombp = alloc_t(ctx, &m->tdcombp, F, 4, B, S, n, n, 26);
    void *all[] = {m->x,      m->phi,   m->gamma, m->alpha, m->bias,   m->h_in,  m->h_post,
                   m->logits, m->comb,  m->h_mix, m->inv,   m->h_pre,  m->dh_in, m->dh_post,
                   m->dh_res, m->dcomb, m->dx,    m->dphi,  m->dalpha, m->dbias, m->dgamma,
                   m->f,      m->dout,  m->df,    m->dpost, m->dcombp};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (!all[i]) return 1;
    /* a forward once, so the backward sees consistent saved tensors */
    ompk_status st = call_pre_fwd(m);
    return st != OMPK_OK;
}

static void bufs_free(ompk_bench_ctx *ctx, mhc_bufs *m) {
    void *all[] = {m->x,      m->phi,   m->gamma, m->alpha, m->bias,   m->h_in,  m->h_post,
                   m->logits, m->comb,  m->h_mix, m->inv,   m->h_pre,  m->dh_in, m->dh_post,
                   m->dh_res, m->dcomb, m->dx,    m->dphi,  m->dalpha, m->dbias, m->dgamma,
                   m->f,      m->dout,  m->df,    m->dpost, m->dcombp};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ompk_bench_free(ctx, all[i]);
}

/* the pre forward's arguments on x (NULL: left to the caller) */
static ompk_mhc_pre_fwd_args pre_args(mhc_bufs *m, const ompk_tensor *x) {
    return (ompk_mhc_pre_fwd_args){.x = x,
                                   .phi = &m->tphi,
                                   .gamma = &m->tgamma,
                                   .alpha = &m->talpha,
                                   .bias = &m->tbias,
                                   .h_in = &m->th_in,
                                   .h_post = &m->th_post,
                                   .res_logits = &m->tlogits,
                                   .comb = &m->tcomb,
                                   .h_mix = &m->th_mix,
                                   .inv_rms = &m->tinv,
                                   .h_pre = &m->th_pre};
}

static ompk_status call_pre_fwd(void *p) {
    mhc_bufs *m = p;
    const ompk_mhc_pre_fwd_args a = pre_args(m, &m->tx);
    return ompk_mhc_pre_fwd(&a, &m->p);
}

static ompk_status call_sk_fwd(void *p) {
    mhc_bufs *m = p;
    return ompk_mhc_sinkhorn_fwd(&m->tlogits, &m->tcomb, &m->p);
}

static ompk_status call_sk_bwd(void *p) {
    mhc_bufs *m = p;
    return ompk_mhc_sinkhorn_bwd(&m->tlogits, &m->tdcomb, &m->tdh_res, &m->p);
}

static ompk_status call_pre_bwd(void *p) {
    mhc_bufs *m = p;
    return ompk_mhc_pre_bwd(&(ompk_mhc_pre_bwd_args){.x = &m->tx,
                                                     .phi = &m->tphi,
                                                     .gamma = &m->tgamma,
                                                     .alpha = &m->talpha,
                                                     .dh_in = &m->tdh_in,
                                                     .dh_post = &m->tdh_post,
                                                     .dh_res = &m->tdh_res,
                                                     .h_mix = &m->th_mix,
                                                     .inv_rms = &m->tinv,
                                                     .h_pre = &m->th_pre,
                                                     .h_post = &m->th_post,
                                                     .dx = &m->tdx,
                                                     .dphi = &m->tdphi,
                                                     .dalpha = &m->tdalpha,
                                                     .dbias = &m->tdbias,
                                                     .dgamma = &m->tdgamma},
                            &m->p);
}

static ompk_status call_train(void *p) {
    ompk_status st = call_pre_fwd(p);
    if (st == OMPK_OK) st = call_sk_bwd(p);
    if (st == OMPK_OK) st = call_pre_bwd(p);
    return st;
}

static ompk_status call_post_bwd(void *p) {
    mhc_bufs *m = p;
    return ompk_mhc_post_bwd(&m->tx, &m->tcomb, &m->th_post, &m->tf, &m->tdout, &m->tdx, &m->tdf,
                             &m->tdpost, &m->tdcombp);
}

static void emit_v(ompk_bench_ctx *ctx, mhc_bufs *m, const char *kernel, const char *variant,
                   double ms, double mn, double bytes, double flops, double extra) {
    char shape[64];
    snprintf(shape, sizeof shape, "B%lld S%lld n%lld D%lld", (long long)m->B, (long long)m->S,
             (long long)m->n, (long long)m->D);
    ompk_bench_record r = {0};
    r.kernel = kernel;
    r.dtype = ompk_dtype_name(m->dt);
    r.shape = shape;
    r.ms = ms;
    r.ms_min = mn;
    r.bytes = bytes;
    r.flops = flops;
    r.extra_mem_bytes = extra;
    r.peak = flops > 0 ? "fp32" : NULL;
    r.variant = variant;
    ompk_bench_emit(ctx, &r);
}

static void emit(ompk_bench_ctx *ctx, mhc_bufs *m, const char *kernel, double ms, double mn,
                 double bytes, double flops, double extra) {
    emit_v(ctx, m, kernel, NULL, ms, mn, bytes, flops, extra);
}

/* layer l's post forward into dout (the new residual), then the pre forward on it: post's comb
 * and weights are the dcombp and dpost buffers, so that no output overlaps an input */
static ompk_status call_post_then_pre(void *p) {
    mhc_bufs *m = p;
    ompk_status st = ompk_mhc_post_fwd(&m->tx, &m->tdcombp, &m->tdpost, &m->tf, &m->tdout);
    if (st != OMPK_OK) return st;
    const ompk_mhc_pre_fwd_args a = pre_args(m, &m->tdout);
    return ompk_mhc_pre_fwd(&a, &m->p);
}

static ompk_status call_post_pre(void *p) {
    mhc_bufs *m = p;
    const ompk_mhc_post_pre_fwd_args a = {.x = &m->tx,
                                          .comb = &m->tdcombp,
                                          .post = &m->tdpost,
                                          .f = &m->tf,
                                          .x_out = &m->tdout,
                                          .pre = pre_args(m, NULL)};
    return ompk_mhc_post_pre_fwd(&a, &m->p);
}

static int bench_shape(ompk_bench_ctx *ctx, int64_t B, int64_t S, int64_t n, int64_t D,
                       const char *const *variants, int nvar) {
    mhc_bufs m;
    memset(&m, 0, sizeof m);
    m.B = B, m.S = S, m.n = n, m.D = D, m.dt = OMPK_BF16;
    int rc = bufs_new(ctx, &m);
    if (rc) {
        bufs_free(ctx, &m);
        return 1;
    }
    const double T = (double)m.T, K = (double)m.K, M = (double)m.M, Dd = (double)D;
    const double e = 2.0, nn = (double)(n * n), nd = (double)n;
    const double gemm = 2.0 * T * K * M;
    double mn, ms;
    /* bytes: each input read once, each output written once; workspace not counted */
    ms = ompk_bench_time(ctx, call_pre_fwd, &m, &mn);
    const double fwd_bytes =
        T * (K * e + Dd * e + (2 * nd + 2 * nn + M + 1) * 4) + (M * K + K + M + 3) * 4;
    if (ms < 0)
        rc = 1;
    else
        emit(ctx, &m, "mhc_pre_fwd", ms, mn, fwd_bytes, gemm + 2 * T * K + 2 * T * K, -1);
    /* the alternatives to the default kernels (entries of the mhc_pre_fwd list; those this build
     * lacks are left out) */
    for (int v = 0; v < nvar; v++) {
        if (ompk_variant_force("mhc_pre_fwd", variants[v]) != OMPK_OK) continue;
        ms = ompk_bench_time(ctx, call_pre_fwd, &m, &mn);
        ompk_bench_variant_restore(ctx, "mhc_pre_fwd");
        if (ms < 0)
            rc = 1;
        else
            emit_v(ctx, &m, "mhc_pre_fwd", variants[v], ms, mn, fwd_bytes,
                   gemm + 2 * T * K + 2 * T * K, -1);
    }
    ms = ompk_bench_time(ctx, call_sk_fwd, &m, &mn);
    if (ms < 0)
        rc = 1;
    else
        emit(ctx, &m, "mhc_sinkhorn_fwd", ms, mn, T * nn * 8, T * nn * 4 * m.p.sinkhorn_repeat, 0);
    ms = ompk_bench_time(ctx, call_sk_bwd, &m, &mn);
    if (ms < 0)
        rc = 1;
    else
        emit(ctx, &m, "mhc_sinkhorn_bwd", ms, mn, T * nn * 12, T * nn * 12 * m.p.sinkhorn_repeat,
             T * nn * 8 * m.p.sinkhorn_repeat);
    ms = ompk_bench_time(ctx, call_pre_bwd, &m, &mn);
    if (ms < 0)
        rc = 1;
    else
        emit(ctx, &m, "mhc_pre_bwd", ms, mn,
             T * (2 * K * e + Dd * e + (nd + nn + M + 1 + 2 * nd) * 4) + (2 * M * K + 2 * K) * 4,
             2 * gemm + 2 * T * K, -1);
    ms = ompk_bench_time(ctx, call_train, &m, &mn);
    if (ms < 0)
        rc = 1;
    else
        emit(ctx, &m, "mhc_pre_fwd_sinkhorn_bwd", ms, mn,
             T * (3 * K * e + 2 * Dd * e) + (3 * M * K) * 4, 3 * gemm, -1);
    ms = ompk_bench_time(ctx, call_post_bwd, &m, &mn);
    if (ms < 0)
        rc = 1;
    else
        emit(ctx, &m, "mhc_post_bwd", ms, mn, T * (3 * K * e + 2 * Dd * e + (2 * nn + 2 * nd) * 4),
             T * Dd * (4 * nn + 4 * nd), -1);
    /* x and f read, x_out and h_in written once each (the floor of a fused pass) */
    const double pp_bytes = T * (2 * K * e + 2 * Dd * e);
    ms = ompk_bench_time(ctx, call_post_then_pre, &m, &mn);
    if (ms < 0)
        rc = 1;
    else
        emit(ctx, &m, "mhc_post_then_pre_fwd", ms, mn, pp_bytes, gemm, -1);
    ms = ompk_bench_time(ctx, call_post_pre, &m, &mn);
    if (ms < 0)
        rc = 1;
    else
        emit(ctx, &m, "mhc_post_pre_fwd", ms, mn, pp_bytes, gemm, -1);
    bufs_free(ctx, &m);
    return rc;
}

static int bench_mhc_pre(ompk_bench_ctx *ctx) {
    if (ctx->dev.type == OMPK_HOST) return bench_shape(ctx, 1, 1024, 4, 2048, NULL, 0);
    /* n4: every GPU entry of the mhc_pre_fwd list by name (src/host/mhc/mhc_pre_fwd_impl.c: the
     * wide-load and register tensor-core GEMMs and their alternatives) and the SIMT kernels */
    const char *n4[32];
    int nn4 = 0;
    const ompk_impl *e;
    for (int i = 0; nn4 < 32 && (e = ompk_variant_list("mhc_pre_fwd", i)) != NULL; i++)
        if (strcmp(e->name, "host") != 0) n4[nn4++] = e->name;
    /* n8 (M = 80, beyond the wide GEMM's n <= 4): the same bytes of x as n4 D4096, the default
     * (tc-l2fill) against the rotated register GEMM and the SIMT kernels */
    static const char *const n8[] = {"tc-rot", "portable"};
    int rc = bench_shape(ctx, 4, 4096, 4, 4096, n4, nn4);
    if (!ctx->quick) rc |= bench_shape(ctx, 4, 4096, 8, 2048, n8, (int)(sizeof n8 / sizeof n8[0]));
    /* n = 1, 2, 6 at the n8 shape's D: the defaults only */
    static const int n_other[] = {1, 2, 6};
    for (int i = 0; !ctx->quick && i < 3; i++)
        rc |= bench_shape(ctx, 4, 4096, n_other[i], 2048, NULL, 0);
    /* decode-size calls (T = 1, 16, 64 tokens at n4 D4096): latency, not bandwidth */
    static const int t_decode[] = {1, 16, 64};
    for (int i = 0; !ctx->quick && i < 3; i++)
        rc |= bench_shape(ctx, 1, t_decode[i], 4, 4096, NULL, 0);
    return rc;
}

OMPK_BENCH_REGISTER(bench_mhc_pre, "mhc_pre", 1, 1)
