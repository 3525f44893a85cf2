/* Diagnostic (not part of the library): bit-identity and phase timing of the MoE fine-tuning
 * step through the public API, so one source runs against any build of libompk.
 *
 *   moe_sft_hash hash        one line per case (format x LoRA rank x dropout x ISA (those this
 *                            CPU has) x threads / NUMA split): FNV-1a hashes of y, dx, dw, each
 * LoRA gradient and (bf16) the full-weight gradients; diff two builds' outputs moe_sft_hash time E
 * H I k T r fmt reps minimum forward / backward ms and phase times over reps pairs
 *
 * Build: bench/diag/moe_sft/build.sh BUILD_DIR OUT (links BUILD_DIR's libompk). */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ompk/moe.h"

static uint64_t rng_state;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return rng_state;
}
/* roughly normal, unit variance */
static float nrm(void) {
    float a = 0.0f;
    for (int i = 0; i < 4; i++) a += (float)(rnd() >> 40) / 16777216.0f - 0.5f;
    return a * 1.7320508f;
}
static uint16_t bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}
static uint16_t *bfbuf(int64_t n, float scale) {
    uint16_t *p = malloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++) p[i] = bf(nrm() * scale);
    return p;
}

typedef struct cs {
    int64_t E, H, I, T;
    int k, r, threads, split, reps;
    float drop;
    ompk_moe_format fmt;
    ompk_moe_isa isa;
} cs;

typedef struct res {
    uint64_t h[12]; /* y dx dw gA gB uA uB dA dB Wg Wu Wd */
    double fwd, bwd, ph[2][5];
    int parts;
} res;

static int run(const cs *c, res *o, int timing) {
    const int64_t E = c->E, H = c->H, I = c->I, T = c->T, k = c->k, r = c->r;
    rng_state = 0x9E3779B97F4A7C15ull ^ (uint64_t)(E * 131 + H * 7 + I + T * 3 + k);
    ompk_moe_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.experts = E, cfg.hidden = H, cfg.intermediate = I, cfg.top_k = (int)k;
    cfg.max_tokens = T, cfg.format = c->fmt, cfg.group_size = 64;
    cfg.numa = c->split > 1 ? OMPK_MOE_NUMA_FORCED : OMPK_MOE_NUMA_AUTO;
    cfg.numa_split = c->split;
    cfg.threads = c->threads, cfg.isa = c->isa, cfg.cache_depth = 1;
    cfg.lora_max_rank = r > 0 ? (int)r : 1;
    ompk_moe *m = NULL;
    if (ompk_moe_create(&cfg, &m) != OMPK_OK) {
        fprintf(stderr, "create: %s\n", ompk_last_error());
        return 1;
    }
    const float ws = 1.0f / sqrtf((float)H), wd = 1.0f / sqrtf((float)I);
    uint16_t *W[3] = {bfbuf(E * I * H, ws), bfbuf(E * I * H, ws), bfbuf(E * H * I, wd)};
    int64_t sgu[3] = {E, I, H}, sdn[3] = {E, H, I};
    ompk_device hd = ompk_device_host();
    ompk_tensor tw[3] = {ompk_tensor_make(W[0], OMPK_BF16, 3, sgu, hd),
                         ompk_tensor_make(W[1], OMPK_BF16, 3, sgu, hd),
                         ompk_tensor_make(W[2], OMPK_BF16, 3, sdn, hd)};
    int rc = ompk_moe_load_weights(m, &tw[0], &tw[1], &tw[2]) != OMPK_OK;
    uint16_t *la[6] = {0};
    float *lg[6] = {0};
    ompk_tensor tl[6], tg[6];
    if (r > 0 && !rc) {
        for (int i = 0; i < 6; i++) {
            const int64_t in = i < 4 ? H : I, out = i < 4 ? I : H;
            int64_t sh[3] = {E, i % 2 ? out : r, i % 2 ? r : in};
            const int64_t n = E * r * in * (i % 2 ? 0 : 1) + E * r * out * (i % 2);
            la[i] = bfbuf(n, i % 2 ? 0.5f : 1.0f / sqrtf((float)in));
            lg[i] = malloc((size_t)n * 4);
            tl[i] = ompk_tensor_make(la[i], OMPK_BF16, 3, sh, hd);
            tg[i] = ompk_tensor_make(lg[i], OMPK_F32, 3, sh, hd);
        }
        ompk_moe_lora L;
        memset(&L, 0, sizeof L);
        L.rank = (int)r, L.alpha = 2.0f * (float)r, L.dropout = c->drop, L.seed = 1234;
        L.gate_a = &tl[0], L.gate_b = &tl[1], L.up_a = &tl[2], L.up_b = &tl[3];
        L.down_a = &tl[4], L.down_b = &tl[5];
        rc |= ompk_moe_set_lora(m, &L) != OMPK_OK;
    }
    int32_t *ids = malloc((size_t)(T * k) * 4);
    float *w = malloc((size_t)(T * k) * 4);
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < k; j++) {
            int64_t e, dup;
            do {
                e = (int64_t)(rnd() % (uint64_t)E);
                dup = 0;
                for (int64_t q = 0; q < j; q++) dup |= ids[t * k + q] == e;
            } while (dup);
            ids[t * k + j] = (int32_t)e;
            if (!timing && (t * k + j) % 17 == 5) ids[t * k + j] = -1; /* padding slots */
            w[t * k + j] = 0.05f + (float)(rnd() >> 40) / 16777216.0f * 0.3f;
        }
    uint16_t *x = bfbuf(T * H, 1.0f), *dy = bfbuf(T * H, 1.0f);
    uint16_t *y = malloc((size_t)(T * H) * 2), *dx = malloc((size_t)(T * H) * 2);
    float *dw = malloc((size_t)(T * k) * 4);
    float *dW[3] = {0};
    int64_t sx[2] = {T, H}, sk[2] = {T, k};
    ompk_tensor tx = ompk_tensor_make(x, OMPK_BF16, 2, sx, hd);
    ompk_tensor ty = ompk_tensor_make(y, OMPK_BF16, 2, sx, hd);
    ompk_tensor tdy = ompk_tensor_make(dy, OMPK_BF16, 2, sx, hd);
    ompk_tensor tdx = ompk_tensor_make(dx, OMPK_BF16, 2, sx, hd);
    ompk_tensor tid = ompk_tensor_make(ids, OMPK_I32, 2, sk, hd);
    ompk_tensor twt = ompk_tensor_make(w, OMPK_F32, 2, sk, hd);
    ompk_tensor tdw = ompk_tensor_make(dw, OMPK_F32, 2, sk, hd);
    ompk_tensor tW[3];
    ompk_moe_grads g;
    memset(&g, 0, sizeof g);
    g.dx = &tdx, g.dw = &tdw;
    if (r > 0) {
        g.gate_da = &tg[0], g.gate_db = &tg[1], g.up_da = &tg[2], g.up_db = &tg[3];
        g.down_da = &tg[4], g.down_db = &tg[5];
    }
    if (c->fmt == OMPK_MOE_BF16 && !timing) {
        for (int p = 0; p < 3; p++) {
            dW[p] = malloc((size_t)(E * H * I) * 4);
            tW[p] = ompk_tensor_make(dW[p], OMPK_F32, 3, p < 2 ? sgu : sdn, hd);
        }
        g.gate_dw = &tW[0], g.up_dw = &tW[1], g.down_dw = &tW[2];
    }
    ompk_moe_info info;
    ompk_moe_get_info(m, &info);
    o->parts = info.partitions;
    const int reps = timing ? c->reps : 1;
    double *tf = calloc((size_t)reps, sizeof(double)), *tb = calloc((size_t)reps, sizeof(double));
    for (int i = -(timing ? 1 : 0); i < reps && !rc; i++) {
        double t0 = omp_get_wtime();
        rc |= ompk_moe_fwd_train(m, &tx, &tid, &twt, &ty, OMPK_MOE_CACHE_PUSH) != OMPK_OK;
        double t1 = omp_get_wtime();
        ompk_moe_stats st;
        ompk_moe_get_stats(m, &st);
        for (int q = 0; q < 5; q++) /* phase times: the minimum over the timed pairs */
            o->ph[0][q] = i > 0 && o->ph[0][q] < st.phase_ms[q] ? o->ph[0][q] : st.phase_ms[q];
        rc |= rc || ompk_moe_bwd(m, &tdy, &g) != OMPK_OK;
        double t2 = omp_get_wtime();
        ompk_moe_get_stats(m, &st);
        for (int q = 0; q < 5; q++)
            o->ph[1][q] = i > 0 && o->ph[1][q] < st.phase_ms[q] ? o->ph[1][q] : st.phase_ms[q];
        if (i >= 0) tf[i] = (t1 - t0) * 1e3, tb[i] = (t2 - t1) * 1e3;
    }
    if (rc) fprintf(stderr, "call failed: %s\n", ompk_last_error());
    for (int i = 0; i < reps; i++) /* medians (insertion sort) */
        for (int j = i; j > 0 && tf[j] < tf[j - 1]; j--) {
            double a = tf[j];
            tf[j] = tf[j - 1], tf[j - 1] = a;
        }
    for (int i = 0; i < reps; i++)
        for (int j = i; j > 0 && tb[j] < tb[j - 1]; j--) {
            double a = tb[j];
            tb[j] = tb[j - 1], tb[j - 1] = a;
        }
    o->fwd = tf[0], o->bwd = tb[0]; /* minimum: this machine is shared */
    const uint64_t h0 = 0xcbf29ce484222325ull;
    memset(o->h, 0, sizeof o->h);
    o->h[0] = fnv(h0, y, (size_t)(T * H) * 2);
    o->h[1] = fnv(h0, dx, (size_t)(T * H) * 2);
    o->h[2] = fnv(h0, dw, (size_t)(T * k) * 4);
    for (int i = 0; i < 6 && r > 0; i++) {
        const int64_t n = tg[i].shape[0] * tg[i].shape[1] * tg[i].shape[2];
        o->h[3 + i] = fnv(h0, lg[i], (size_t)n * 4);
    }
    for (int p = 0; p < 3; p++)
        if (dW[p]) o->h[9 + p] = fnv(h0, dW[p], (size_t)(E * H * I) * 4);
    for (int i = 0; i < 6; i++) free(la[i]), free(lg[i]);
    for (int p = 0; p < 3; p++) free(W[p]), free(dW[p]);
    free(ids), free(w), free(x), free(dy), free(y), free(dx), free(dw), free(tf), free(tb);
    ompk_moe_destroy(m);
    return rc;
}

static const char *fmtn[4] = {"bf16", "int8", "int4", "int4zp"};

int main(int argc, char **argv) {
    if (argc >= 10 && !strcmp(argv[1], "time")) {
        cs c = {atoll(argv[2]),
                atoll(argv[3]),
                atoll(argv[4]),
                atoll(argv[6]),
                atoi(argv[5]),
                atoi(argv[7]),
                0,
                1,
                atoi(argv[9]),
                0.0f,
                OMPK_MOE_BF16,
                OMPK_MOE_ISA_AUTO};
        for (int f = 0; f < 4; f++)
            if (!strcmp(argv[8], fmtn[f])) c.fmt = (ompk_moe_format)f;
        res o;
        if (run(&c, &o, 1)) return 1;
        printf("%s E%lld H%lld I%lld k%d T%lld r%d: fwd %.2f ms bwd %.2f ms step %.2f ms bwd/fwd "
               "%.2f\n  fwd phases %.2f %.2f %.2f %.2f %.2f\n  bwd phases %.2f %.2f %.2f %.2f "
               "%.2f\n",
               fmtn[c.fmt], (long long)c.E, (long long)c.H, (long long)c.I, c.k, (long long)c.T,
               c.r, o.fwd, o.bwd, o.fwd + o.bwd, o.bwd / o.fwd, o.ph[0][0], o.ph[0][1], o.ph[0][2],
               o.ph[0][3], o.ph[0][4], o.ph[1][0], o.ph[1][1], o.ph[1][2], o.ph[1][3], o.ph[1][4]);
        return 0;
    }
    if (argc < 2 || strcmp(argv[1], "hash")) {
        fprintf(stderr, "usage: %s hash | time E H I k T r fmt reps\n", argv[0]);
        return 2;
    }
    static const ompk_moe_isa isas[4] = {OMPK_MOE_ISA_AVX512BF16, OMPK_MOE_ISA_PORTABLE,
                                         OMPK_MOE_ISA_AMX_EMULATED, OMPK_MOE_ISA_AMX};
    static const int ranks[4] = {0, 8, 13, 32};
    static const int tsplit[3][2] = {{1, 1}, {2, 1}, {2, 2}}; /* threads, NUMA split */
    int bad = 0;
    for (int ii = 0; ii < 4; ii++) {
        if (!ompk_moe_isa_available(isas[ii])) continue; /* amx: on an AMX machine only */
        for (int f = 0; f < 4; f++)
            for (int ri = 0; ri < 4; ri++)
                for (int d = 0; d < 2; d++) {
                    if (ranks[ri] == 0 && d) continue;
                    uint64_t ref[12];
                    for (int ts = 0; ts < 3; ts++) {
                        cs c = {6,
                                192,
                                176,
                                96,
                                3,
                                ranks[ri],
                                tsplit[ts][0],
                                tsplit[ts][1],
                                1,
                                d ? 0.1f : 0.0f,
                                (ompk_moe_format)f,
                                isas[ii]};
                        res o;
                        if (run(&c, &o, 0)) return 1;
                        printf("%-12s %-6s r%-2d drop%.1f t%d P%d", ompk_moe_isa_name(c.isa),
                               fmtn[f], c.r, (double)c.drop, c.threads, o.parts);
                        for (int q = 0; q < 12; q++) printf(" %016llx", (unsigned long long)o.h[q]);
                        printf("\n");
                        if (ts == 0) memcpy(ref, o.h, sizeof ref);
                        /* the split changes the sum order of the down partials; threads must not */
                        if (ts == 1 && memcmp(ref, o.h, sizeof ref)) {
                            printf("  ^ differs from 1 thread\n");
                            bad = 1;
                        }
                    }
                }
    }
    return bad;
}
