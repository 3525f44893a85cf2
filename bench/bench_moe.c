/* ompk-bench entries for the MoE experts (a layer shaped like Qwen3-30B-A3B: E128 H2048 I768
 * top-8): prefill (1024 tokens) per weight format and ISA, decode (1 token) round-robin over 8
 * distinct layers (8 x 75 MB of routed bf16 experts: twice the 300 MB L3 of the Xeon it runs on) so
 * the experts' weights come from memory, and a STREAM-like read of the same run as the decode
 * roofline. On a GPU pass x/y/ids/weights live on the device and the staging through host buffers
 * is reported as its own record. --quick: a small set for the CI machine. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "bench.h"
#include "ompk/moe.h"
#include "variant.h"

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
    return ompk_moe_fwd(m, &a->x, &a->ids, &a->w, &a->y);
}

static double stream_read_gbs, stream_best_gbs;
static const char *stream_best_name = "omp-sum";

/* One read of [p, p+n) by the calling thread: 8 independent 512-bit accumulators (and a software
 * prefetch pf bytes ahead when pf > 0), so the loop is bound by the memory requests one core
 * keeps in flight, not by its adds. */
__attribute__((target("avx512f"))) static uint64_t read_avx512(const uint8_t *p, size_t n, int pf) {
    __m512i acc[8];
    for (int j = 0; j < 8; j++) acc[j] = _mm512_setzero_si512();
    for (size_t i = 0; i + 512 <= n; i += 512) {
        if (pf > 0) {
            _mm_prefetch((const char *)(p + i + pf), _MM_HINT_T1);
            _mm_prefetch((const char *)(p + i + pf + 64), _MM_HINT_T1);
            _mm_prefetch((const char *)(p + i + pf + 128), _MM_HINT_T1);
            _mm_prefetch((const char *)(p + i + pf + 192), _MM_HINT_T1);
            _mm_prefetch((const char *)(p + i + pf + 256), _MM_HINT_T1);
            _mm_prefetch((const char *)(p + i + pf + 320), _MM_HINT_T1);
            _mm_prefetch((const char *)(p + i + pf + 384), _MM_HINT_T1);
            _mm_prefetch((const char *)(p + i + pf + 448), _MM_HINT_T1);
        }
        for (int j = 0; j < 8; j++)
            acc[j] = _mm512_add_epi64(acc[j], _mm512_load_si512((const void *)(p + i + 64 * j)));
    }
    for (int j = 1; j < 8; j++) acc[0] = _mm512_add_epi64(acc[0], acc[j]);
    return (uint64_t)_mm512_reduce_add_epi64(acc[0]);
}

/* Pin OpenMP thread tid to the tid-th CPU of the process's affinity mask (0 when it could not). */
static int pin_to_nth_cpu(const cpu_set_t *all, int tid) {
    int seen = 0;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, all) && seen++ == tid) {
            cpu_set_t one;
            CPU_ZERO(&one);
            CPU_SET(c, &one);
            return pthread_setaffinity_np(pthread_self(), sizeof one, &one) == 0;
        }
    return 0;
}

/* all_cores: a candidate for the machine's read roofline */
static void emit_read(ompk_bench_ctx *ctx, const char *variant, size_t bytes, double best,
                      int all_cores) {
    char shape[32];
    snprintf(shape, sizeof shape, "%zu MiB", bytes >> 20);
    ompk_bench_record r = {0};
    r.kernel = "moe_stream_read";
    r.dtype = "u64";
    r.shape = shape;
    r.variant = variant;
    r.ms = best * 1e3;
    r.ms_min = best * 1e3;
    r.bytes = (double)bytes;
    r.extra_mem_bytes = 0;
    ompk_bench_emit(ctx, &r);
    double gbs = (double)bytes / best / 1e9;
    if (all_cores && gbs > stream_best_gbs) {
        stream_best_gbs = gbs;
        stream_best_name = variant;
    }
}

/* Transparent huge pages: the kernel's policy and how much of this process is on them. */
static void print_thp(const char *when) {
    char pol[128] = "?";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (f) {
        if (!fgets(pol, sizeof pol, f)) pol[0] = 0;
        fclose(f);
        pol[strcspn(pol, "\n")] = 0;
    }
    long anon = -1, rss = -1;
    f = fopen("/proc/self/smaps_rollup", "r");
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f)) {
            if (!strncmp(line, "AnonHugePages:", 14)) anon = atol(line + 14);
            if (!strncmp(line, "Rss:", 4)) rss = atol(line + 4);
        }
        fclose(f);
    }
    printf("      moe THP (%s): policy [%s], process RSS %ld MiB of which %ld MiB on huge pages\n",
           when, pol, rss / 1024, anon / 1024);
}

/* The read roofline. omp-sum: a plain OpenMP sum (the earlier entry, kept for comparison);
 * avx512*: threads pinned one per CPU, each reading its own contiguous slice that it
 * first-touched, on 2 MB pages (thp) or 4 KB pages (4k), with a software prefetch (pfN: N bytes
 * ahead) or without. Best of 5 after one warm-up each. */
static void stream_read(ompk_bench_ctx *ctx) {
    size_t bytes = ctx->quick ? ((size_t)256 << 20) : ((size_t)2 << 30), n = bytes / 8;
    uint64_t *a = aligned_alloc((size_t)2 << 20, bytes);
    if (!a) return;
    madvise(a, bytes, MADV_HUGEPAGE);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) a[i] = i;
    double best = 1e30;
    uint64_t sink = 0;
    for (int r = 0; r < 6; r++) {
        double t0 = omp_get_wtime();
        uint64_t s = 0;
#pragma omp parallel for schedule(static) reduction(+ : s)
        for (size_t i = 0; i < n; i++) s += a[i];
        double t = omp_get_wtime() - t0;
        sink += s;
        if (r > 0 && t < best) best = t;
    }
    stream_read_gbs = (double)bytes / best / 1e9;
    emit_read(ctx, "omp-sum", bytes, best, 1);
    free(a);
    cpu_set_t all;
    if (!__builtin_cpu_supports("avx512f") || sched_getaffinity(0, sizeof all, &all) != 0) return;
    static const struct {
        const char *name;
        int huge, pf, one;
    } vs[] = {{"avx512-thp", 1, 0, 0},
              {"avx512-thp-pf1k", 1, 1024, 0},
              {"avx512-thp-pf8k", 1, 8192, 0},
              {"avx512-4k", 0, 0, 0},
              {"avx512-thp-1core", 1, 0, 1}};
    for (size_t v = 0; v < sizeof vs / sizeof vs[0]; v++) {
        /* one core reads half (its own limit, not the machine's) */
        const int nth = vs[v].one ? 1 : omp_get_max_threads();
        const size_t vb = vs[v].one ? bytes / 2 : bytes;
        uint8_t *b = aligned_alloc((size_t)2 << 20, vb);
        if (!b) return;
        madvise(b, vb, vs[v].huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
        const size_t chunk = vb / (size_t)nth / 4096 * 4096;
        double tb = 1e30;
#pragma omp parallel num_threads(nth)
        {
            const int tid = omp_get_thread_num();
            pin_to_nth_cpu(&all, tid);
            uint8_t *mine = b + (size_t)tid * chunk;
            memset(mine, tid + 1, chunk);
            for (int r = 0; r < 6; r++) {
#pragma omp barrier
                double t0 = omp_get_wtime();
                uint64_t s = read_avx512(mine, chunk, vs[v].pf);
#pragma omp barrier
                double t = omp_get_wtime() - t0;
#pragma omp atomic
                sink += s;
#pragma omp master
                if (r > 0 && t < tb) tb = t;
            }
            /* give the threads back to the whole mask */
            pthread_setaffinity_np(pthread_self(), sizeof all, &all);
        }
        emit_read(ctx, vs[v].name, chunk * (size_t)nth, tb, !vs[v].one);
        free(b);
    }
    /* keep the sums alive */
    if (sink == 1) printf("      moe stream read: checksum %llu\n", (unsigned long long)sink);
}

static ompk_moe *make_layer(const moe_shape *s, ompk_moe_format f, ompk_moe_isa isa, int64_t Tmax,
                            const ompk_tensor *g, const ompk_tensor *u, const ompk_tensor *d,
                            int kblock, int prefetch) {
    ompk_moe_config c;
    memset(&c, 0, sizeof c);
    c.experts = s->E;
    c.hidden = s->H;
    c.intermediate = s->I;
    c.top_k = s->k;
    c.max_tokens = Tmax;
    c.format = f;
    c.isa = isa;
    ompk_moe *m = NULL;
    if (ompk_moe_create(&c, &m) != OMPK_OK) {
        fprintf(stderr, "moe bench: create: %s\n", ompk_last_error());
        return NULL;
    }
    if (ompk_moe_tuning_set(m, kblock, prefetch) != OMPK_OK) {
        fprintf(stderr, "moe bench: tuning: %s\n", ompk_last_error());
        ompk_moe_destroy(m);
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
                   "omp-sum read (%.1f GB/s), %.1f%% of best read (%s, %.1f GB/s); experts amx %d "
                   "/ vector %d\n",
                   r.dtype, (long long)T, tfs / info.threads, info.threads, gbs,
                   stream_read_gbs > 0 ? 100 * gbs / stream_read_gbs : NAN, stream_read_gbs,
                   stream_best_gbs > 0 ? 100 * gbs / stream_best_gbs : NAN, stream_best_name,
                   stream_best_gbs, st.experts_amx, st.experts_vector);
            /* per phase: the fastest of a few more calls, each phase on its own (phases of one
             * call are separated by barriers, so they add up) */
            double ph[5] = {1e30, 1e30, 1e30, 1e30, 1e30}, fork = 1e30;
            for (int i = 0; i < 5; i++) {
                const int li = a.cur;
                if (moe_call(&a) != OMPK_OK) break;
                ompk_moe_get_stats(layers[li], &st);
                for (int q = 0; q < 5; q++) ph[q] = st.phase_ms[q] < ph[q] ? st.phase_ms[q] : ph[q];
                fork = st.fork_ms < fork ? st.fork_ms : fork;
            }
            /* packed weights per expert by matrix (padding and scales left out) */
            const double bpw = f == OMPK_MOE_BF16 ? 2.0 : f == OMPK_MOE_INT8 ? 1.0 : 0.5;
            const double wgu = 2.0 * (double)s->I * (double)s->H * bpw * (double)nused,
                         wdn = (double)s->I * (double)s->H * bpw * (double)nused;
            const double fgu = 4.0 * (double)s->H * (double)s->I * (double)T * s->k, fdn = fgu / 2;
            printf("      moe %s T%lld phases (best of 5, ms): gather %.3f (team start %.3f) | "
                   "gate/up %.3f = %.1f GB/s "
                   "%.2f TFLOP/s | quant-a %.3f | down %.3f = %.1f GB/s %.2f TFLOP/s | reduce "
                   "%.3f | sum %.3f\n",
                   r.dtype, (long long)T, ph[0], fork, ph[1], wgu / (ph[1] * 1e6),
                   fgu / (ph[1] * 1e9), ph[2], ph[3], wdn / (ph[3] * 1e6), fdn / (ph[3] * 1e9),
                   ph[4], ph[0] + ph[1] + ph[2] + ph[3] + ph[4]);
            if (T > 1 && ctx->dev.type == OMPK_HOST) {
                static const char *pn[5] = {"gather", "gateup", "quant-a", "down", "reduce"};
                for (int q = 0; q < 5; q++) {
                    if (q == 2 && f == OMPK_MOE_BF16) continue;
                    char pv[64];
                    snprintf(pv, sizeof pv, "%s-%s", variant, pn[q]);
                    ompk_bench_record pr = r;
                    pr.kernel = "moe_fwd_phase";
                    pr.variant = pv;
                    pr.ms = pr.ms_min = ph[q];
                    pr.bytes = q == 1 ? wgu : q == 3 ? wdn : 0;
                    pr.flops = q == 1 ? fgu : q == 3 ? fdn : 0;
                    ompk_bench_emit(ctx, &pr);
                }
            }
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
            ok = (layers[l] = make_layer(&s, f, OMPK_MOE_ISA_AUTO, Tp, &g, &u, &d, 0, 0)) != NULL;
        if (ok)
            printf("      moe %s: %d layer(s) created and packed in %.2f s\n", fmt_name(f), nl,
                   omp_get_wtime() - t0);
        if (ok && host) print_thp(fmt_name(f));
        if (ok) rc |= run_case(ctx, &s, layers, 1, Tp, f, "");
        if (ok) rc |= run_case(ctx, &s, layers, nl, 1, f, "");
        for (int l = 0; l < nl; l++) ompk_moe_destroy(layers[l]);
        if (!ok) rc = 1;
        /* the same prefill on the vector path, and on AMX with the other K-blocking and
         * prefetch choices (each differs from the default in one of them) */
        if (host && f != OMPK_MOE_INT4 && ompk_moe_isa_available(OMPK_MOE_ISA_AMX) &&
            ompk_moe_isa_available(OMPK_MOE_ISA_AVX512BF16)) {
            ompk_moe *v = make_layer(&s, f, OMPK_MOE_ISA_AVX512BF16, Tp, &g, &u, &d, 0, 0);
            if (v) rc |= run_case(ctx, &s, &v, 1, Tp, f, "");
            ompk_moe_destroy(v);
            static const struct {
                int kblock, prefetch;
                const char *name;
            } av[] = {{1, 0, "-kblock"},
                      {-1, 0, "-nokblock"},
                      {0, 1, "-selfpf"},
                      {0, 2, "-nopf"},
                      {0, 3, "-pfdense"}};
            for (size_t i = 0; i < sizeof av / sizeof av[0]; i++) {
                /* skip the one that equals the default (bf16: no K-blocking; int8: K-blocked) */
                if (av[i].kblock == (f == OMPK_MOE_BF16 ? -1 : 1)) continue;
                v = make_layer(&s, f, OMPK_MOE_ISA_AMX, Tp, &g, &u, &d, av[i].kblock,
                               av[i].prefetch);
                if (v) rc |= run_case(ctx, &s, &v, 1, Tp, f, av[i].name);
                ompk_moe_destroy(v);
            }
        }
    }
    ompk_bench_free(&hctx, gw);
    ompk_bench_free(&hctx, uw);
    ompk_bench_free(&hctx, dw);
    return rc;
}

OMPK_BENCH_REGISTER(bench_moe, "moe_fwd", 1, 1)
