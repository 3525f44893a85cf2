/* ompk-bench entries for MoE LoRA fine-tuning (issue 14): moe_sft_fwd (ompk_moe_fwd_train
 * with PUSH), moe_sft_bwd (ompk_moe_bwd, which pops it) and moe_sft_step (both). Shapes: E64
 * H2048 I1408 top-6 at T4096 (DeepSeek-V2-Lite-like) and E128 H2048 I768 top-8 at T1024, bf16
 * base with LoRA r8 and r32, int8 base with r8, the r8 cases also with OMPK_MOE_GRAD_BF16; --quick:
 * E16 H512 I256 top-4 T128 (CI machine). A training step counts 16*T*k*H*I FLOPs (6 forward, 10
 * backward; LoRA FLOPs not counted, as kt-kernel counts them). Every rep is one forward + backward
 * pair, each timed on its own and the pair with one clock across both, so fwd, bwd and step are
 * medians of the same kind of call in the same cache state. The variant names the path and the
 * thread count (TFLOP/s per core = tflop_per_s / threads); extra_mem_bytes is the forward cache one
 * saved forward of T tokens holds. On a GPU pass x, ids, weights, y, dy, dx and dw live on the
 * device and the staging through host buffers is reported as its own records (the forward's from
 * ompk_moe_get_stats; the backward's as the same backward on device tensors minus on host tensors,
 * there being no backward stats). */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "ompk/moe.h"

typedef struct sft_shape {
    int64_t E, H, I, T;
    int k;
} sft_shape;

typedef struct sft_case {
    ompk_moe_format fmt;
    int rank;
    ompk_moe_grad_operands grad; /* GRAD_BF16: the variant name ends in "-gbf16" */
} sft_case;

enum { SFT_FWD, SFT_BWD, SFT_STEP };
static const char *sft_kernel[3] = {"moe_sft_fwd", "moe_sft_bwd", "moe_sft_step"};
static const double sft_flops[3] = {6, 10, 16}; /* x T*k*H*I */

typedef struct sft_io {
    ompk_tensor x, ids, w, y, dy, dx, dw;
} sft_io;

typedef struct sft_lora {
    void *p[6];  /* gate A, gate B, up A, up B, down A, down B (bf16) */
    float *g[6]; /* their gradients (f32) */
    ompk_tensor t[6], tg[6];
} sft_lora;

/* Routing: k distinct experts per token, uniform; positive weights. */
static void sft_routing(const sft_shape *s, uint64_t seed, int32_t *ids, float *w) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t t = 0; t < s->T; t++)
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

/* Random LoRA adapters (B too: a zero B would let a kernel skip work) and f32 gradients. */
static int lora_new(sft_lora *L, const sft_shape *s, int r) {
    ompk_bench_ctx h = {0};
    h.dev = ompk_device_host();
    memset(L, 0, sizeof *L);
    int ok = 1;
    for (int i = 0; i < 6; i++) {
        const int64_t in = i < 4 ? s->H : s->I, out = i < 4 ? s->I : s->H;
        int64_t sh[3] = {s->E, i % 2 ? out : r, i % 2 ? r : in}, n = s->E * r * (i % 2 ? out : in);
        L->p[i] = ompk_bench_alloc_random(&h, OMPK_BF16, n, 41 + (uint64_t)i);
        L->g[i] = malloc((size_t)n * sizeof(float));
        ok &= L->p[i] != NULL && L->g[i] != NULL;
        L->t[i] = ompk_tensor_make(L->p[i], OMPK_BF16, 3, sh, h.dev);
        L->tg[i] = ompk_tensor_make(L->g[i], OMPK_F32, 3, sh, h.dev);
    }
    return ok;
}

static void lora_free(sft_lora *L) {
    for (int i = 0; i < 6; i++) free(L->p[i]), free(L->g[i]);
}

static ompk_moe *sft_layer(const sft_shape *s, const sft_case *c, const ompk_tensor w[3],
                           sft_lora *L) {
    ompk_moe_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.experts = s->E;
    cfg.hidden = s->H;
    cfg.intermediate = s->I;
    cfg.top_k = s->k;
    cfg.max_tokens = s->T;
    cfg.format = c->fmt;
    cfg.cache_depth = 1;
    cfg.lora_max_rank = c->rank;
    cfg.grad_operands = c->grad;
    ompk_moe *m = NULL;
    if (ompk_moe_create(&cfg, &m) != OMPK_OK) {
        fprintf(stderr, "moe_sft bench: create: %s\n", ompk_last_error());
        return NULL;
    }
    /* alpha = 2r: scale 2, a common SFT setting; no dropout */
    ompk_moe_lora lora;
    memset(&lora, 0, sizeof lora);
    lora.rank = c->rank;
    lora.alpha = 2.0f * (float)c->rank;
    lora.gate_a = &L->t[0], lora.gate_b = &L->t[1];
    lora.up_a = &L->t[2], lora.up_b = &L->t[3];
    lora.down_a = &L->t[4], lora.down_b = &L->t[5];
    if (ompk_moe_load_weights(m, &w[0], &w[1], &w[2]) != OMPK_OK ||
        ompk_moe_set_lora(m, &lora) != OMPK_OK) {
        fprintf(stderr, "moe_sft bench: load / set_lora: %s\n", ompk_last_error());
        ompk_moe_destroy(m);
        return NULL;
    }
    return m;
}

static int cmp_ms(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* ctx->warmup untimed pairs, then ctx->reps timed ones: med/mn[SFT_FWD|BWD|STEP] in ms;
 * ph[0|1] the forward's and the backward's phase times of the last pair (ompk_moe_stats). */
static int time_pairs(ompk_bench_ctx *ctx, ompk_moe *m, sft_io *io, const ompk_moe_grads *g,
                      double med[3], double mn[3], double ph[2][5]) {
    double *t = malloc(sizeof(double) * 3 * (size_t)ctx->reps);
    if (!t) return 1;
    for (int i = -ctx->warmup; i < ctx->reps; i++) {
        double t0 = omp_get_wtime();
        ompk_status st =
            ompk_moe_fwd_train(m, &io->x, &io->ids, &io->w, &io->y, OMPK_MOE_CACHE_PUSH);
        double t1 = omp_get_wtime();
        ompk_moe_stats fs;
        ompk_moe_get_stats(m, &fs);
        if (st == OMPK_OK) st = ompk_moe_bwd(m, &io->dy, g);
        double t2 = omp_get_wtime();
        if (st != OMPK_OK) {
            fprintf(stderr, "  moe_sft call failed: %s: %s\n", ompk_status_str(st),
                    ompk_last_error());
            free(t);
            return 1;
        }
        if (i < 0) continue;
        ompk_moe_stats bs;
        ompk_moe_get_stats(m, &bs);
        memcpy(ph[0], fs.phase_ms, sizeof fs.phase_ms);
        memcpy(ph[1], bs.phase_ms, sizeof bs.phase_ms);
        t[i] = (t1 - t0) * 1e3;
        t[ctx->reps + i] = (t2 - t1) * 1e3;
        t[2 * ctx->reps + i] = (t2 - t0) * 1e3;
    }
    for (int q = 0; q < 3; q++) {
        double *v = t + (size_t)q * (size_t)ctx->reps;
        qsort(v, (size_t)ctx->reps, sizeof(double), cmp_ms);
        const int n = ctx->reps;
        med[q] = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
        mn[q] = v[0];
    }
    free(t);
    return 0;
}

/* Tensors of one case on device dev (ids/weights/dw there too). */
static int io_new(sft_io *io, ompk_device dev, const sft_shape *s, const int32_t *hid,
                  const float *hw) {
    ompk_bench_ctx d = {0};
    d.dev = dev;
    const int64_t nx = s->T * s->H, nk = s->T * s->k;
    int64_t sx[2] = {s->T, s->H}, sk[2] = {s->T, s->k};
    void *x = ompk_bench_alloc_random(&d, OMPK_BF16, nx, 11);
    void *y = ompk_bench_alloc_random(&d, OMPK_BF16, nx, 12);
    void *dy = ompk_bench_alloc_random(&d, OMPK_BF16, nx, 13);
    void *dx = ompk_bench_alloc_random(&d, OMPK_BF16, nx, 14);
    void *ids = ompk_malloc(dev, (size_t)nk * 4), *w = ompk_malloc(dev, (size_t)nk * 4);
    void *dw = ompk_malloc(dev, (size_t)nk * 4);
    if (ids) ompk_memcpy(ids, dev, hid, ompk_device_host(), (size_t)nk * 4);
    if (w) ompk_memcpy(w, dev, hw, ompk_device_host(), (size_t)nk * 4);
    io->x = ompk_tensor_make(x, OMPK_BF16, 2, sx, dev);
    io->y = ompk_tensor_make(y, OMPK_BF16, 2, sx, dev);
    io->dy = ompk_tensor_make(dy, OMPK_BF16, 2, sx, dev);
    io->dx = ompk_tensor_make(dx, OMPK_BF16, 2, sx, dev);
    io->ids = ompk_tensor_make(ids, OMPK_I32, 2, sk, dev);
    io->w = ompk_tensor_make(w, OMPK_F32, 2, sk, dev);
    io->dw = ompk_tensor_make(dw, OMPK_F32, 2, sk, dev);
    return x && y && dy && dx && ids && w && dw;
}

static void io_free(sft_io *io) {
    ompk_tensor *t[7] = {&io->x, &io->y, &io->dy, &io->dx, &io->ids, &io->w, &io->dw};
    for (int i = 0; i < 7; i++)
        if (t[i]->data) ompk_free(t[i]->device, t[i]->data);
}

static void emit(ompk_bench_ctx *ctx, const char *kernel, const ompk_bench_record *base, double ms,
                 double mn, double flops) {
    ompk_bench_record r = *base;
    r.kernel = kernel;
    r.ms = ms;
    r.ms_min = mn;
    r.flops = flops;
    if (flops == 0) r.peak = NULL;
    ompk_bench_emit(ctx, &r);
}

static int run_case(ompk_bench_ctx *ctx, int which, const sft_shape *s, const sft_case *c,
                    const ompk_tensor w[3]) {
    const int host = ctx->dev.type == OMPK_HOST;
    const int64_t nk = s->T * s->k;
    int32_t *hid = malloc((size_t)nk * 4);
    float *hw = malloc((size_t)nk * 4);
    sft_lora L;
    sft_io io, hio;
    ompk_moe_grads g; /* LoRA gradients (=), no full-weight ones: LoRA SFT */
    double med[3], mn[3], ph[2][5];
    memset(&L, 0, sizeof L);
    memset(&io, 0, sizeof io);
    memset(&hio, 0, sizeof hio);
    memset(&g, 0, sizeof g);
    int rc = 1;
    ompk_moe *m = NULL;
    if (!hid || !hw || !lora_new(&L, s, c->rank)) goto out;
    sft_routing(s, (uint64_t)s->T + 7, hid, hw);
    if (!io_new(&io, ctx->dev, s, hid, hw)) goto out;
    if (!(m = sft_layer(s, c, w, &L))) goto out;
    g.dx = &io.dx;
    g.dw = &io.dw;
    g.gate_da = &L.tg[0], g.gate_db = &L.tg[1];
    g.up_da = &L.tg[2], g.up_db = &L.tg[3];
    g.down_da = &L.tg[4], g.down_db = &L.tg[5];
    if (time_pairs(ctx, m, &io, &g, med, mn, ph)) goto out;
    ompk_moe_info info;
    ompk_moe_stats st;
    ompk_moe_get_info(m, &info);
    ompk_moe_get_stats(m, &st);
    char shape[96], variant[64];
    snprintf(shape, sizeof shape, "E%lld H%lld I%lld k%d T%lld r%d", (long long)s->E,
             (long long)s->H, (long long)s->I, s->k, (long long)s->T, c->rank);
    snprintf(variant, sizeof variant, "%s-%dt%s%s", ompk_moe_isa_name(info.isa), info.threads,
             c->grad == OMPK_MOE_GRAD_BF16 ? "-gbf16" : "", host ? "" : "+staged");
    const double tkhi = (double)nk * (double)s->H * (double)s->I;
    const double act = 2.0 * (double)s->T * (double)s->H * 2; /* bf16 in + out */
    ompk_bench_record r = {0};
    r.dtype = c->fmt == OMPK_MOE_BF16 ? "bf16" : "int8";
    r.shape = shape;
    r.variant = variant;
    /* the weights once per pass over them (twice in a step), and the activations */
    r.bytes = (which == SFT_STEP ? 2.0 : 1.0) * ((double)info.weight_bytes + act);
    r.extra_mem_bytes = (double)info.cache_bytes_per_token * (double)s->T;
    r.peak = c->fmt == OMPK_MOE_BF16 ? "bf16" : NULL;
    /* phase times (ms) of the forward (moe_sft_fwd, _step) and the backward (_bwd, _step) */
    char xj[320], row[2][96];
    int xn = 0;
    for (int f = 0; f < 2; f++) {
        snprintf(row[f], sizeof row[f], "%.2f %.2f %.2f %.2f %.2f", ph[f][0], ph[f][1], ph[f][2],
                 ph[f][3], ph[f][4]);
        if ((f == 0 && which == SFT_BWD) || (f == 1 && which == SFT_FWD)) continue;
        xn += snprintf(xj + xn, sizeof xj - (size_t)xn,
                       "%s\"%s_phase_ms\": [%.4g, %.4g, %.4g, %.4g, %.4g]", xn ? ", " : "",
                       f ? "bwd" : "fwd", ph[f][0], ph[f][1], ph[f][2], ph[f][3], ph[f][4]);
    }
    r.extra_json = xj;
    emit(ctx, sft_kernel[which], &r, med[which], mn[which], sft_flops[which] * tkhi);
    const double tfs = sft_flops[which] * tkhi / (med[which] * 1e9);
    printf("      moe_sft %s %s: %.2f TFLOP/s = %.3f TFLOP/s/core (%d threads); fwd %.3f bwd %.3f "
           "step %.3f ms, bwd/fwd %.2f; cache %zu B/token (%.1f MiB for T%lld; arena %.1f MiB)\n",
           r.dtype, shape, tfs, tfs / info.threads, info.threads, med[0], med[1], med[2],
           med[1] / med[0], info.cache_bytes_per_token, r.extra_mem_bytes / 1048576.0,
           (long long)s->T, (double)info.cache_bytes / 1048576.0);
    printf("      moe_sft phases (ms, last pair): fwd %s | bwd %s\n", row[0], row[1]);
    if (!host && which == SFT_FWD)
        emit(ctx, "moe_sft_fwd_staging", &r, st.stage_in_ms + st.stage_out_ms,
             st.stage_in_ms + st.stage_out_ms, 0);
    if (!host && which == SFT_BWD) {
        /* the same backward on host tensors, same layer: the difference is the staging */
        double hmed[3], hmn[3];
        ompk_moe_grads hg = g;
        hg.dx = &hio.dx;
        hg.dw = &hio.dw;
        if (!io_new(&hio, ompk_device_host(), s, hid, hw) ||
            time_pairs(ctx, m, &hio, &hg, hmed, hmn, ph))
            goto out;
        emit(ctx, "moe_sft_bwd_staging", &r, med[1] - hmed[1], mn[1] - hmn[1], 0);
    }
    rc = 0;
out:
    ompk_moe_destroy(m);
    io_free(&io);
    io_free(&hio);
    lora_free(&L);
    free(hid);
    free(hw);
    return rc;
}

static int bench_sft(ompk_bench_ctx *ctx, int which) {
    const int host = ctx->dev.type == OMPK_HOST;
    const sft_shape full[2] = {{64, 2048, 1408, 4096, 6}, {128, 2048, 768, 1024, 8}};
    const sft_shape quick[1] = {{16, 512, 256, 128, 4}};
    const sft_case cases[5] = {{OMPK_MOE_BF16, 8, OMPK_MOE_GRAD_SPLIT},
                               {OMPK_MOE_BF16, 32, OMPK_MOE_GRAD_SPLIT},
                               {OMPK_MOE_INT8, 8, OMPK_MOE_GRAD_SPLIT},
                               {OMPK_MOE_BF16, 8, OMPK_MOE_GRAD_BF16},
                               {OMPK_MOE_INT8, 8, OMPK_MOE_GRAD_BF16}};
    const sft_shape *shapes = ctx->quick ? quick : full;
    const int nshapes = ctx->quick ? 1 : 2;
    ompk_bench_ctx h = *ctx;
    h.dev = ompk_device_host();
    int rc = 0;
    for (int si = 0; si < nshapes; si++) {
        const sft_shape *s = &shapes[si];
        const int64_t n = s->E * s->I * s->H, s1[3] = {s->E, s->I, s->H},
                      s2[3] = {s->E, s->H, s->I};
        void *p[3];
        for (int i = 0; i < 3; i++) p[i] = ompk_bench_alloc_random(&h, OMPK_BF16, n, 21 + i);
        const int ok = p[0] && p[1] && p[2];
        rc |= !ok;
        const ompk_tensor w[3] = {ompk_tensor_make(p[0], OMPK_BF16, 3, s1, h.dev),
                                  ompk_tensor_make(p[1], OMPK_BF16, 3, s1, h.dev),
                                  ompk_tensor_make(p[2], OMPK_BF16, 3, s2, h.dev)};
        /* r8 and r32 on bf16, r8 on int8, each r8 also with bf16 gradient operands (--quick: no
         * r32); a GPU pass measures staging, bf16 r8 split only */
        for (int ci = 0; ci < 5 && ok; ci++) {
            if ((ctx->quick || !host) && cases[ci].rank == 32) continue;
            if (!host && (cases[ci].fmt != OMPK_MOE_BF16 || cases[ci].grad)) continue;
            rc |= run_case(ctx, which, s, &cases[ci], w);
        }
        for (int i = 0; i < 3; i++) ompk_bench_free(&h, p[i]);
    }
    return rc;
}

static int bench_sft_fwd(ompk_bench_ctx *ctx) {
    return bench_sft(ctx, SFT_FWD);
}
static int bench_sft_bwd(ompk_bench_ctx *ctx) {
    return bench_sft(ctx, SFT_BWD);
}
static int bench_sft_step(ompk_bench_ctx *ctx) {
    return bench_sft(ctx, SFT_STEP);
}

OMPK_BENCH_REGISTER(bench_sft_fwd, "moe_sft_fwd", 1, 1)
OMPK_BENCH_REGISTER(bench_sft_bwd, "moe_sft_bwd", 1, 1)
OMPK_BENCH_REGISTER(bench_sft_step, "moe_sft_step", 1, 1)
