/* ompk-bench entries for the product-key router (issue 6): forward at T = 16384, N in {64, 256},
 * k in {8, 32}, f32 and bf16 (peer: bench/peers/router_peer.py, same kernel/shape keys), and the
 * backward at the largest shape. */
#include <stdio.h>
#include <stdlib.h>

#include "bench.h"
#include "variant.h"
#include "ompk/router.h"

typedef struct fwd_arg {
    ompk_tensor sx, sy, sc, ix;
    int64_t k;
} fwd_arg;

static ompk_status fwd_call(void *p) {
    fwd_arg *a = p;
    return ompk_router_topk_fwd(&a->sx, &a->sy, a->k, &a->sc, &a->ix);
}

static int bench_fwd_shape(ompk_bench_ctx *ctx, ompk_dtype dt, int64_t T, int64_t N, int64_t k,
                           const char *variant) {
    const int64_t sn[2] = {T, N}, sk[2] = {T, k};
    void *sx = ompk_bench_alloc_random(ctx, dt, T * N, 1);
    void *sy = ompk_bench_alloc_random(ctx, dt, T * N, 2);
    void *sc = ompk_bench_alloc_random(ctx, OMPK_F32, T * k, 3);
    void *ix = ompk_malloc(ctx->dev, sizeof(int32_t) * (size_t)(T * k));
    int rc = 1;
    if (sx && sy && sc && ix) {
        fwd_arg a = {ompk_tensor_make(sx, dt, 2, sn, ctx->dev),
                     ompk_tensor_make(sy, dt, 2, sn, ctx->dev),
                     ompk_tensor_make(sc, OMPK_F32, 2, sk, ctx->dev),
                     ompk_tensor_make(ix, OMPK_I32, 2, sk, ctx->dev), k};
        double mn;
        const double ms = ompk_bench_time(ctx, fwd_call, &a, &mn);
        if (ms >= 0) {
            char shape[64];
            snprintf(shape, sizeof shape, "T%lld N%lld k%lld", (long long)T, (long long)N,
                     (long long)k);
            ompk_bench_record r = {0};
            r.kernel = "router_topk_fwd";
            r.variant = variant;
            r.dtype = ompk_dtype_name(dt);
            r.shape = shape;
            r.ms = ms;
            r.ms_min = mn;
            r.bytes = (double)T * (2.0 * N * (ompk_dtype_bits(dt) / 8) + 8.0 * k);
            r.flops = 0; /* selection, not arithmetic */
            r.extra_mem_bytes = 0;
            ompk_bench_emit(ctx, &r);
            rc = 0;
        }
    }
    ompk_bench_free(ctx, sx);
    ompk_bench_free(ctx, sy);
    ompk_bench_free(ctx, sc);
    ompk_free(ctx->dev, ix);
    return rc;
}

static int bench_fwd(ompk_bench_ctx *ctx) {
    int rc = 0;
    const ompk_dtype dts[2] = {OMPK_F32, OMPK_BF16};
    const int64_t Ns[2] = {64, 256}, ks[2] = {8, 32};
    const int64_t T = ctx->quick ? 2048 : 16384;
    /* the records name the entry a selection (OMPK_VARIANT=router_fwd:<name>) named, if any */
    const ompk_impl *named = NULL;
    if (ompk_variant_selected(OMPK_OP_ROUTER_FWD, "bench_router", &named) != OMPK_OK) return 1;
    const char *dflt = named ? named->name : NULL;
    for (int d = 0; d < 2; d++)
        for (int n = 0; n < 2; n++)
            for (int k = 0; k < 2; k++) {
                if (ctx->quick && (d == 1 || k != n)) continue;
                rc |= bench_fwd_shape(ctx, dts[d], T, Ns[n], ks[k], dflt);
            }
    /* a handful of tokens: the fixed cost of one call (validation, launch, synchronization),
     * the floor under the figures above */
    if (!ctx->quick) rc |= bench_fwd_shape(ctx, OMPK_F32, 16, 64, 8, dflt);
    /* on a GPU, the N = 64 shapes again with one token per warp instead of two (the default
     * covers k <= 11 with two; k = 32 runs the same kernel either way and is the control) */
    if (ctx->dev.type != OMPK_HOST && !ctx->quick &&
        ompk_variant_force("router_fwd", "warp1") == OMPK_OK) {
        for (int d = 0; d < 2; d++)
            for (int k = 0; k < 2; k++) rc |= bench_fwd_shape(ctx, dts[d], T, 64, ks[k], "warp1");
        ompk_bench_variant_restore(ctx, "router_fwd");
    }
    return rc;
}

OMPK_BENCH_REGISTER(bench_fwd, "router_topk_fwd", 1, 1)

typedef struct bwd_arg {
    ompk_tensor ds, ix, dx, dy;
    int64_t n;
} bwd_arg;

static ompk_status bwd_call(void *p) {
    bwd_arg *a = p;
    return ompk_router_topk_bwd(&a->ds, &a->ix, a->n, &a->dx, &a->dy);
}

/* indices from a forward over random scores, so the slots are realistic (distinct pairs) */
static int bench_bwd(ompk_bench_ctx *ctx) {
    const ompk_dtype dt = OMPK_F32;
    const int64_t T = ctx->quick ? 2048 : 16384, N = 256, k = 32;
    const int64_t sn[2] = {T, N}, sk[2] = {T, k};
    void *sx = ompk_bench_alloc_random(ctx, dt, T * N, 1);
    void *sy = ompk_bench_alloc_random(ctx, dt, T * N, 2);
    void *ds = ompk_bench_alloc_random(ctx, OMPK_F32, T * k, 3);
    void *dx = ompk_bench_alloc_random(ctx, dt, T * N, 4);
    void *dy = ompk_bench_alloc_random(ctx, dt, T * N, 5);
    void *ix = ompk_malloc(ctx->dev, sizeof(int32_t) * (size_t)(T * k));
    int rc = 1;
    if (sx && sy && ds && dx && dy && ix) {
        fwd_arg f = {ompk_tensor_make(sx, dt, 2, sn, ctx->dev),
                     ompk_tensor_make(sy, dt, 2, sn, ctx->dev),
                     ompk_tensor_make(dx, OMPK_F32, 2, sk, ctx->dev),
                     ompk_tensor_make(ix, OMPK_I32, 2, sk, ctx->dev), k};
        bwd_arg a = {ompk_tensor_make(ds, OMPK_F32, 2, sk, ctx->dev), f.ix,
                     ompk_tensor_make(dx, dt, 2, sn, ctx->dev),
                     ompk_tensor_make(dy, dt, 2, sn, ctx->dev), N};
        double mn, ms = -1;
        if (fwd_call(&f) == OMPK_OK) ms = ompk_bench_time(ctx, bwd_call, &a, &mn);
        if (ms >= 0) {
            char shape[64];
            snprintf(shape, sizeof shape, "T%lld N%lld k%lld", (long long)T, (long long)N,
                     (long long)k);
            ompk_bench_record r = {0};
            r.kernel = "router_topk_bwd";
            r.dtype = ompk_dtype_name(dt);
            r.shape = shape;
            r.ms = ms;
            r.ms_min = mn;
            r.bytes = (double)T * (8.0 * k + 2.0 * N * 4);
            r.extra_mem_bytes = 0;
            ompk_bench_emit(ctx, &r);
            rc = 0;
        }
    }
    ompk_bench_free(ctx, sx);
    ompk_bench_free(ctx, sy);
    ompk_bench_free(ctx, ds);
    ompk_bench_free(ctx, dx);
    ompk_bench_free(ctx, dy);
    ompk_free(ctx->dev, ix);
    return rc;
}

OMPK_BENCH_REGISTER(bench_bwd, "router_topk_bwd", 1, 1)
