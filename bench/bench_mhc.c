/* ompk-bench entries for mHC post forward. */
#include <stdio.h>
#include <stdlib.h>

#include "bench.h"
#include "variant.h"

typedef struct post_arg {
    ompk_tensor x, comb, post, f, out;
} post_arg;

static ompk_status post_call(void *p) {
    post_arg *a = p;
    return ompk_mhc_post_fwd(&a->x, &a->comb, &a->post, &a->f, &a->out);
}

/* One measurement per entry of `sweep`: the mhc_post_fwd entry named (NULL: the default order;
 * one this build lacks is left out), with the team-size knob set when threads > 0; all on the
 * same buffers, in the same process, so they compare with each other and with this pass's copy
 * bandwidth. */
typedef struct post_sweep_entry {
    const char *variant;
    int threads;
} post_sweep_entry;

static int bench_post_shape(ompk_bench_ctx *ctx, ompk_dtype dt, int64_t B, int64_t S, int64_t n,
                            int64_t D, const post_sweep_entry *sweep, int nsweep) {
    int64_t xs[4] = {B, S, n, D}, cs[4] = {B, S, n, n}, ps[3] = {B, S, n}, fs[3] = {B, S, D};
    int64_t T = B * S;
    void *x = ompk_bench_alloc_random(ctx, dt, T * n * D, 1);
    void *comb = ompk_bench_alloc_random(ctx, OMPK_F32, T * n * n, 2);
    void *post = ompk_bench_alloc_random(ctx, OMPK_F32, T * n, 3);
    void *f = ompk_bench_alloc_random(ctx, dt, T * D, 4);
    void *out = ompk_bench_alloc_random(ctx, dt, T * n * D, 5);
    int rc = 1;
    if (x && comb && post && f && out) {
        post_arg a = {ompk_tensor_make(x, dt, 4, xs, ctx->dev),
                      ompk_tensor_make(comb, OMPK_F32, 4, cs, ctx->dev),
                      ompk_tensor_make(post, OMPK_F32, 3, ps, ctx->dev),
                      ompk_tensor_make(f, dt, 3, fs, ctx->dev),
                      ompk_tensor_make(out, dt, 4, xs, ctx->dev)};
        rc = 0;
        for (int v = 0; v < nsweep; v++) {
            char label[64];
            const char *name = sweep[v].variant;
            if (ompk_variant_force("mhc_post_fwd", name) != OMPK_OK) continue;
            if (sweep[v].threads > 0) {
#ifdef OMPK_LAB
                ompk_variant_knob_force(OMPK_KNOB_MHC_POST_THREADS, sweep[v].threads);
#else
                continue; /* the team-size knob: lab builds only */
#endif
                snprintf(label, sizeof label, "%s/t%d", name ? name : "default", sweep[v].threads);
                name = label;
            }
            double mn;
            double ms = ompk_bench_time(ctx, post_call, &a, &mn);
            ompk_bench_variant_restore(ctx, "mhc_post_fwd");
#ifdef OMPK_LAB
            ompk_variant_knob_force(OMPK_KNOB_MHC_POST_THREADS, 0);
#endif
            if (ms < 0) {
                rc = 1;
                continue;
            }
            int esz = ompk_dtype_bits(dt) / 8;
            char shape[64];
            snprintf(shape, sizeof shape, "B%lld S%lld n%lld D%lld", (long long)B, (long long)S,
                     (long long)n, (long long)D);
            ompk_bench_record r = {0};
            r.kernel = "mhc_post_fwd";
            r.variant = name;
            r.dtype = ompk_dtype_name(dt);
            r.shape = shape;
            r.ms = ms;
            r.ms_min = mn;
            r.bytes = (double)T * ((2.0 * n + 1) * D * esz + (n * n + n) * 4.0);
            r.flops = 2.0 * T * n * D * (n + 1);
            r.extra_mem_bytes = 0;
            ompk_bench_emit(ctx, &r);
        }
    }
    ompk_bench_free(ctx, x);
    ompk_bench_free(ctx, comb);
    ompk_bench_free(ctx, post);
    ompk_bench_free(ctx, f);
    ompk_bench_free(ctx, out);
    return rc;
}

static int bench_post(ompk_bench_ctx *ctx) {
    int rc = 0;
    const post_sweep_entry dflt[1] = {{NULL, 0}};
    /* the host shape is the one bench/peers/mhc_peer.py times on the CPU */
    if (ctx->dev.type == OMPK_HOST) {
        rc |= bench_post_shape(ctx, OMPK_BF16, 1, 1024, 4, 2048, dflt, 1);
        rc |= bench_post_shape(ctx, OMPK_F32, 1, 1024, 4, 2048, dflt, 1);
        return rc;
    }
    /* on a GPU, the default and the alternatives (mhc_post_fwd entries, team sizes; see
     * src/host/mhc/mhc_post_impl.c), the default again last to show drift within the run */
    const post_sweep_entry bf16_sweep[] = {{NULL, 0},   {"bare1", 0}, {"portable", 0}, {NULL, 64},
                                           {NULL, 256}, {"u1c", 0},   {"u2c", 0},      {"u2c", 128},
                                           {"u4c", 0},  {"u4p", 0},   {NULL, 0}};
    const post_sweep_entry f32_sweep[] = {
        {NULL, 0}, {NULL, 64}, {"f32u1c", 0}, {"bare1", 0}, {"portable", 0}};
    rc |= bench_post_shape(ctx, OMPK_BF16, 4, 4096, 4, 4096, bf16_sweep,
                           (int)(sizeof bf16_sweep / sizeof bf16_sweep[0]));
    rc |= bench_post_shape(ctx, OMPK_F32, 4, 4096, 4, 4096, f32_sweep,
                           (int)(sizeof f32_sweep / sizeof f32_sweep[0]));
    /* n8 with the same bytes of x, and n = 1, 2, 6 at its D (the shapes bench_mhc_pre.c and the
     * peer time for n != 4) */
    static const int n_other[] = {8, 1, 2, 6};
    for (int i = 0; !ctx->quick && i < 4; i++)
        rc |= bench_post_shape(ctx, OMPK_BF16, 4, 4096, n_other[i], 2048, dflt, 1);
    /* decode-size calls, as bench_mhc_pre.c times the pre forward there */
    static const int t_decode[] = {1, 16, 64};
    for (int i = 0; !ctx->quick && i < 3; i++)
        rc |= bench_post_shape(ctx, OMPK_BF16, 1, t_decode[i], 4, 4096, dflt, 1);
    return rc;
}

OMPK_BENCH_REGISTER(bench_post, "mhc_post_fwd", 1, 1)
