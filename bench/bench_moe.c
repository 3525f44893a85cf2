/* ompk-bench entries for the MoE experts (a layer shaped like Qwen3-30B-A3B: E128 H2048 I768
 * top-8): prefill (1024 tokens) per weight format and ISA, decode (1 token) round-robin over 8
 * distinct layers (8 x 75 MB of routed bf16 experts: twice the 300 MB L3 of the Xeon it runs on) so
 * the experts' weights come from memory, and a STREAM-like read of the same run as the decode
 * roofline. On a GPU pass x/y/ids/weights live on the device and the staging through host buffers
 * is reported as its own record. --quick: a small set for the CI machine. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "ompk/moe.h"

#define MOE_LAYERS 8

typedef struct moe_shape {
    int64_t E, H, I;
    int k;
} moe_shape;

typedef struct moe_arg {
    ompk_moe **layers;
    int nl, cur;
    ompk_tensor x, ids, w, y;
} moe_arg;

static ompk_status moe_call(void *p) {
    moe_arg *a = p;
    ompk_moe *m = a->layers[a->cur];
    a->cur = (a->cur + 1) % a->nl;
    return ompk_moe_forward(m, &a->x, &a->ids, &a->w, &a->y);
}

static double stream_read_gbs;

/* Sum of a buffer much larger than the caches, best of 5: the read bandwidth the decode is
 * compared with. */
static void stream_read(ompk_bench_ctx *ctx) {
    size_t bytes = ctx->quick ? ((size_t)256 << 20) : ((size_t)2 << 30), n = bytes / 8;
    uint64_t *a = malloc(bytes);
    if (!a) return;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) a[i] = i;
    double best = 1e30;
    volatile uint64_t sink = 0;
    for (int r = 0; r < 6; r++) {
        double t0 = omp_get_wtime();
        uint64_t s = 0;
#pragma omp parallel for schedule(static) reduction(+ : s)
        for (size_t i = 0; i < n; i++) s += a[i];
        double t = omp_get_wtime() - t0;
        sink += s;
        if (r > 0 && t < best) best = t;
    }
    (void)sink;
    free(a);
    stream_read_gbs = (double)bytes / best / 1e9;
    char shape[32];
    snprintf(shape, sizeof shape, "%zu MiB", bytes >> 20);
    ompk_bench_record r = {0};
    r.kernel = "moe_stream_read";
    r.dtype = "u64";
    r.shape = shape;
    r.variant = "omp-sum";
    r.ms = best * 1e3;
    r.ms_min = best * 1e3;
    r.bytes = (double)bytes;
    r.extra_mem_bytes = 0;
    ompk_bench_emit(ctx, &r);
}

static ompk_moe *make_layer(const moe_shape *s, ompk_moe_format f, ompk_moe_isa isa, int64_t Tmax,
                            const ompk_tensor *g, const ompk_tensor *u, const ompk_tensor *d,
                            int no_kblock) {
    ompk_moe_config c;
    memset(&c, 0, sizeof c);
    c.experts = s->E;
    c.hidden = s->H;
    c.intermediate = s->I;
    c.top_k = s->k;
    c.max_tokens = Tmax;
    c.format = f;
    c.isa = isa;
    c.no_kblock = no_kblock;
    ompk_moe *m = NULL;
    if (ompk_moe_create(&c, &m) != OMPK_OK) {
        fprintf(stderr, "moe bench: create: %s\n", ompk_last_error());
        return NULL;
    }
    if (ompk_moe_load_weights(m, g, u, d) != OMPK_OK) {
        fprintf(stderr, "moe bench: load: %s\n", ompk_last_error());
        ompk_moe_destroy(m);
        return NULL;
    }
    return m;
}

/* Routing: k distinct experts per token, uniform; positive weights. */
static void make_routing(int64_t T, const moe_shape *s, uint64_t seed, int32_t *ids, float *w) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t t = 0; t < T; t++)
        for (int j = 0; j < s->k; j++) {
            int64_t e;
            int dup;
            do {
                z ^= z << 13, z ^= z >> 7, z ^= z << 17;
                e = (int64_t)(z % (uint64_t)s->E);
                dup = 0;
                for (int q = 0; q < j; q++) dup |= ids[t * s->k + q] == e;
            } while (dup);
            ids[t * s->k + j] = (int32_t)e;
            w[t * s->k + j] = 0.05f + (float)(z >> 40) / (float)(1 << 24) * 0.2f;
        }
}

static const char *fmt_name(ompk_moe_format f) {
    static const char *n[] = {"bf16", "int8", "int4", "int4-zp"};
    return n[f];
}

/* Time T tokens over the given layers (round-robin), emit one record. */
static int run_case(ompk_bench_ctx *ctx, const moe_shape *s, ompk_moe **layers, int nl, int64_t T,
                    ompk_moe_format f, const char *suffix) {
    int32_t *hid = malloc((size_t)(T * s->k) * 4);
    float *hw = malloc((size_t)(T * s->k) * 4);
    make_routing(T, s, (uint64_t)T + 7, hid, hw);
    void *x = ompk_bench_alloc_random(ctx, OMPK_BF16, T * s->H, 11);
    void *y = ompk_bench_alloc_random(ctx, OMPK_BF16, T * s->H, 12);
    void *ids = ompk_malloc(ctx->dev, (size_t)(T * s->k) * 4);
    void *w = ompk_malloc(ctx->dev, (size_t)(T * s->k) * 4);
    int rc = 1;
    if (x && y && ids && w && hid && hw) {
        ompk_memcpy(ids, ctx->dev, hid, ompk_device_host(), (size_t)(T * s->k) * 4);
        ompk_memcpy(w, ctx->dev, hw, ompk_device_host(), (size_t)(T * s->k) * 4);
        int64_t sx[2] = {T, s->H}, si[2] = {T, s->k};
        moe_arg a = {layers,
                     nl,
                     0,
                     ompk_tensor_make(x, OMPK_BF16, 2, sx, ctx->dev),
                     ompk_tensor_make(ids, OMPK_I32, 2, si, ctx->dev),
                     ompk_tensor_make(w, OMPK_F32, 2, si, ctx->dev),
                     ompk_tensor_make(y, OMPK_BF16, 2, sx, ctx->dev)};
        double mn;
        double ms = ompk_bench_time(ctx, moe_call, &a, &mn);
        if (ms >= 0) {
            ompk_moe_info info;
            ompk_moe_stats st;
            ompk_moe_get_info(layers[0], &info);
            ompk_moe_get_stats(layers[(a.cur + nl - 1) % nl], &st);
            /* experts touched by the routing, each read once */
            char *used = calloc((size_t)s->E, 1);
            int64_t nused = 0;
            for (int64_t i = 0; i < T * s->k; i++)
                if (!used[hid[i]]) used[hid[i]] = 1, nused++;
            free(used);
            char shape[96], variant[48];
            snprintf(shape, sizeof shape, "E%lld H%lld I%lld k%d T%lld%s", (long long)s->E,
                     (long long)s->H, (long long)s->I, s->k, (long long)T, nl > 1 ? " L8rr" : "");
            snprintf(variant, sizeof variant, "%s%s%s", ompk_moe_isa_name(info.isa), suffix,
                     ctx->dev.type == OMPK_HOST ? "" : "+staged");
            ompk_bench_record r = {0};
            r.kernel = "moe_fwd";
            r.dtype = fmt_name(f);
            r.shape = shape;
            r.variant = variant;
            r.ms = ms;
            r.ms_min = mn;
            r.bytes = (double)info.weight_bytes / (double)s->E * (double)nused + 4.0 * T * s->H;
            r.flops = 6.0 * (double)s->H * (double)s->I * (double)T * s->k;
            r.extra_mem_bytes = (double)info.arena_bytes;
            r.peak = f == OMPK_MOE_BF16 ? "bf16" : NULL;
            ompk_bench_emit(ctx, &r);
            double gbs = r.bytes / (ms * 1e6), tfs = r.flops / (ms * 1e9);
            printf("      moe %s T%lld: %.3f TFLOP/s/core (%d threads), %.1f GB/s = %.1f%% of "
                   "stream read (%.1f GB/s); experts amx %d / vector %d\n",
                   r.dtype, (long long)T, tfs / info.threads, info.threads, gbs,
                   stream_read_gbs > 0 ? 100 * gbs / stream_read_gbs : NAN, stream_read_gbs,
                   st.experts_amx, st.experts_vector);
            printf("      moe %s T%lld last call phases (ms): gather %.3f gate/up %.3f quant-a "
                   "%.3f down "
                   "%.3f reduce %.3f\n",
                   r.dtype, (long long)T, st.phase_ms[0], st.phase_ms[1], st.phase_ms[2],
                   st.phase_ms[3], st.phase_ms[4]);
            if (ctx->dev.type != OMPK_HOST) {
                ompk_bench_record q = r;
                q.kernel = "moe_fwd_staging";
                q.ms = q.ms_min = st.stage_in_ms + st.stage_out_ms;
                q.bytes = (double)T * s->H * 4 + (double)T * s->k * 8;
                q.flops = 0;
                q.peak = NULL;
                ompk_bench_emit(ctx, &q);
            }
            rc = 0;
        }
    }
    ompk_bench_free(ctx, x);
    ompk_bench_free(ctx, y);
    ompk_free(ctx->dev, ids);
    ompk_free(ctx->dev, w);
    free(hid);
    free(hw);
    return rc;
}

static int bench_moe(ompk_bench_ctx *ctx) {
    moe_shape s = ctx->quick ? (moe_shape){16, 512, 256, 4} : (moe_shape){128, 2048, 768, 8};
    const int64_t Tp = ctx->quick ? 64 : 1024;
    const int host = ctx->dev.type == OMPK_HOST;
    ompk_bench_ctx hctx = *ctx;
    hctx.dev = ompk_device_host();
    int64_t ng = s.E * s.I * s.H, s1[3] = {s.E, s.I, s.H}, s2[3] = {s.E, s.H, s.I};
    void *gw = ompk_bench_alloc_random(&hctx, OMPK_BF16, ng, 21);
    void *uw = ompk_bench_alloc_random(&hctx, OMPK_BF16, ng, 22);
    void *dw = ompk_bench_alloc_random(&hctx, OMPK_BF16, ng, 23);
    if (!gw || !uw || !dw) return 1;
    ompk_tensor g = ompk_tensor_make(gw, OMPK_BF16, 3, s1, hctx.dev);
    ompk_tensor u = ompk_tensor_make(uw, OMPK_BF16, 3, s1, hctx.dev);
    ompk_tensor d = ompk_tensor_make(dw, OMPK_BF16, 3, s2, hctx.dev);
    int rc = 0;
    if (host) stream_read(ctx);
    const ompk_moe_format fmts[3] = {OMPK_MOE_BF16, OMPK_MOE_INT8, OMPK_MOE_INT4};
    for (int fi = 0; fi < (host ? 3 : 1); fi++) {
        ompk_moe_format f = fmts[fi];
        /* decode wants distinct layers; the GPU pass only measures staging on one */
        int nl = host && f != OMPK_MOE_INT4 ? MOE_LAYERS : 1;
        ompk_moe *layers[MOE_LAYERS] = {0};
        int ok = 1;
        double t0 = omp_get_wtime();
        for (int l = 0; l < nl && ok; l++)
            ok = (layers[l] = make_layer(&s, f, OMPK_MOE_ISA_AUTO, Tp, &g, &u, &d, 0)) != NULL;
        if (ok)
            printf("      moe %s: %d layer(s) created and packed in %.2f s\n", fmt_name(f), nl,
                   omp_get_wtime() - t0);
        if (ok) rc |= run_case(ctx, &s, layers, 1, Tp, f, "");
        if (ok) rc |= run_case(ctx, &s, layers, nl, 1, f, "");
        for (int l = 0; l < nl; l++) ompk_moe_destroy(layers[l]);
        if (!ok) rc = 1;
        /* the vector path on the same prefill, where AMX is the default */
        if (host && f != OMPK_MOE_INT4 && ompk_moe_isa_available(OMPK_MOE_ISA_AMX) &&
            ompk_moe_isa_available(OMPK_MOE_ISA_AVX512BF16)) {
            ompk_moe *v = make_layer(&s, f, OMPK_MOE_ISA_AVX512BF16, Tp, &g, &u, &d, 0);
            if (v) rc |= run_case(ctx, &s, &v, 1, Tp, f, "");
            ompk_moe_destroy(v);
            /* AMX without K-blocking, to show what the blocking buys */
            v = make_layer(&s, f, OMPK_MOE_ISA_AMX, Tp, &g, &u, &d, 1);
            if (v) rc |= run_case(ctx, &s, &v, 1, Tp, f, "-nokblock");
            ompk_moe_destroy(v);
        }
    }
    ompk_bench_free(&hctx, gw);
    ompk_bench_free(&hctx, uw);
    ompk_bench_free(&hctx, dw);
    return rc;
}

OMPK_BENCH_REGISTER(bench_moe, "moe_fwd", 1, 1)
