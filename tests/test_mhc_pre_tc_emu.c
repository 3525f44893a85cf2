/* The tensor-core GEMM of the mHC pre forward (src/target/mhc/mhc_pre_tc.h) run on the host:
 * with OMPK_EMULATE a team is PRE_TC_THREADS emulated threads (emu_team.h: fibers on one host
 * thread) and mma.sync and the shuffles exchange fragments through memory, so CI checks the
 * kernel's own algorithm (the k permutation shared by A and B, the hi/mid/lo weight split, stage
 * double buffering, split and token tails, strides, the partial layout) against a double reference;
 * the GPU run of test_mhc_pre checks the real instructions. The wide-load GEMM (mhc_pre_tcw.h) runs
 * the same checks as a team of PRE_TCW_THREADS threads. */
#define OMPK_EMULATE 1
#include "emu_team.h"

#include "mhc_pre_tc.h"
#include "mhc_pre_tcw.h"
#include "emu_common.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

#include "bf16.h"
#include "mhc_ref_pre.h"
#include "tolerance.h"

static uint16_t emu_xs[PRE_TCA_NS * PRE_TCA_XBUF] __attribute__((aligned(16)));
static uint16_t
    emu_ws[2 * PRE_TC_BUF(1) > 2 * PRE_TC_BUF(8) ? 2 * PRE_TC_BUF(1) : 2 * PRE_TC_BUF(8)]
    __attribute__((aligned(16)));

static void team(int n, const pre_tc_geom *g, const char *x, const float *phi, const float *gamma,
                 float *part) {
#define EMU_TEAM(N) pre_tc_team(N, 1, g, x, phi, gamma, part, emu_ws)
    MHC_SWITCH_N(n, EMU_TEAM)
#undef EMU_TEAM
}

static void team_async(int n, const pre_tc_geom *g, const char *x, const float *phi,
                       const float *gamma, float *part) {
    switch (n) {
    case 1:
        pre_tca_team(1, 1, g, x, phi, gamma, part, emu_ws, emu_xs);
        break;
    case 2:
        pre_tca_team(2, 1, g, x, phi, gamma, part, emu_ws, emu_xs);
        break;
    case 3:
        pre_tca_team(3, 1, g, x, phi, gamma, part, emu_ws, emu_xs);
        break;
    case 4:
        pre_tca_team(4, 1, g, x, phi, gamma, part, emu_ws, emu_xs);
        break;
    case 5:
        pre_tca_team(5, 1, g, x, phi, gamma, part, emu_ws, emu_xs);
        break;
    default:
        pre_tca_team(6, 1, g, x, phi, gamma, part, emu_ws, emu_xs);
        break;
    }
}

static uint16_t emu_ring[PRE_TCW_RING(3)] __attribute__((aligned(16)));

/* the wide-load GEMM with a ring of nb x tiles (the device runs 3, or 2 for n = 4 on request) */
static void team_wide(int n, int nb, const pre_tc_geom *g, const char *x, const uint16_t *wp,
                      float *part) {
#define EMU_TCW(N)                                                                                 \
    nb == 3 ? pre_tcw_team(N, 3, g, x, wp, part, emu_ring)                                         \
            : pre_tcw_team(N, 2, g, x, wp, part, emu_ring)
    switch (n) {
    case 1:
        EMU_TCW(1);
        break;
    case 2:
        EMU_TCW(2);
        break;
    case 3:
        EMU_TCW(3);
        break;
    default:
        EMU_TCW(4);
        break;
    }
#undef EMU_TCW
}

static void hin(int n, const pre_tc_geom *g, const char *x, const float *hp, char *h_in, int64_t t,
                int64_t d) {
#define EMU_HIN(N) pre_tc_hin(N, g, x, hp, h_in, t, d)
    MHC_SWITCH_N(n, EMU_HIN)
#undef EMU_HIN
}

/* one emulated thread of a GEMM launch (check below): async 0, 1 or >= 2 as there */
typedef struct {
    int n, async;
    const pre_tc_geom *g;
    const char *x;
    const uint16_t *wp;
    const float *phi, *gamma;
    float *part;
} gemm_args;

static void gemm_team(void *p) {
    const gemm_args *a = p;
    if (a->async >= 2)
        team_wide(a->n, a->async, a->g, a->x, a->wp, a->part);
    else if (a->async)
        team_async(a->n, a->g, a->x, a->phi, a->gamma, a->part);
    else
        team(a->n, a->g, a->x, a->phi, a->gamma, a->part);
}

/* x [B,S,n,D] bf16 with row strides padded by `pad` elements (a multiple of 8); async: 0 the
 * register GEMM, 1 the cp.async one, 2 the wide-load one (ring of 2 x tiles), 3 the same with a
 * ring of 3 */
static void check(int64_t B, int64_t S, int n, int64_t D, int64_t pad, int with_gamma,
                  int interleave, int64_t teams, int async, int rot) {
    const int64_t T = B * S, K = n * D, M = 2 * n + n * n;
    const int64_t sx2 = D + pad, sx1 = n * sx2 + pad, sx0 = S * sx1;
    uint16_t *x = aligned_alloc(16, (size_t)((B * sx0 * 2 + 15) / 16 * 16));
    float *phi = malloc(sizeof(float) * (size_t)(M * K)), *gamma = malloc(sizeof(float) * K);
    for (int64_t i = 0; i < B * sx0; i++) x[i] = ompk_f32_to_bf16((float)(2.0 * emu_rnd()));
    for (int64_t i = 0; i < M * K; i++) phi[i] = (float)(emu_rnd() / sqrt((double)K));
    for (int64_t k = 0; k < K; k++) gamma[k] = (float)(1.0 + 0.3 * emu_rnd());

    mhc_pre_fwd_args a;
    memset(&a, 0, sizeof a);
    a.B = B, a.S = S, a.D = D, a.n = n, a.bf16 = 1;
    a.sx[0] = sx0, a.sx[1] = sx1, a.sx[2] = sx2, a.sx[3] = 1;
    a.phi = phi, a.sphi = K, a.gamma = with_gamma ? gamma : NULL;
    a.shin[0] = S * D, a.shin[1] = D, a.shin[2] = 1;
    pre_tc_geom g = async >= 2 ? pre_tcw_geometry(&a, teams)
                               : pre_tc_geometry_for(&a, interleave, teams, async);
    g.ROT = rot;
    const int nthr = async >= 2 ? PRE_TCW_THREADS : PRE_TC_THREADS;
    cr_assert(g.KS >= 1);
    float *part = malloc(sizeof(float) * (size_t)(g.KS * T * (M + 1)));
    for (int64_t i = 0; i < g.KS * T * (M + 1); i++) part[i] = NAN;

    /* the wide-load GEMM's weights, precomputed as its launch does (NaN-filled first, so a
     * piece the precompute misses shows) */
    uint16_t *wp = NULL;
    if (async >= 2) {
        const int64_t items = (g.NCH + PRE_TCW_SC - 1) / PRE_TCW_SC * (PRE_TC_NT(n) * 8) * 64;
        wp = malloc(sizeof(uint16_t) * (size_t)(items * 6));
        for (int64_t i = 0; i < items * 6; i++) wp[i] = 0x7fc0;
        for (int64_t e = 0; e < items; e++) pre_tcw_wpair(n, &g, phi, a.gamma, wp, e);
    }
    gemm_args ga = {n, async, &g, (const char *)x, wp, phi, a.gamma, part};
    for (int blk = 0; blk < g.NG * g.KS; blk++) {
        ompk_emu_block = blk;
        cr_assert_eq(emu_team_run(nthr, gemm_team, &ga), 0, "block %d: the team diverged", blk);
    }

    /* partials summed in split order against the double sums */
    double *ref = calloc((size_t)(T * (M + 1)), sizeof(double)), smax = 0, qmax = 0;
    for (int64_t t = 0; t < T; t++) {
        const uint16_t *xt = x + (t / S) * sx0 + (t % S) * sx1;
        for (int i = 0; i < n; i++)
            for (int64_t d = 0; d < D; d++) {
                const double v = ompk_bf16_to_f32(xt[i * sx2 + d]);
                const int64_t k = i * D + d;
                for (int64_t m = 0; m < M; m++)
                    ref[t * (M + 1) + m] += v * phi[m * K + k] * (with_gamma ? gamma[k] : 1.0);
                ref[t * (M + 1) + M] += v * v;
            }
        for (int64_t m = 0; m < M; m++) smax = fmax(smax, fabs(ref[t * (M + 1) + m]));
        qmax = fmax(qmax, ref[t * (M + 1) + M]);
    }
    const ompk_tol tm = ompk_tol_for(OMPK_F32, smax), tq = ompk_tol_for(OMPK_F32, qmax);
    int bad = 0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t m = 0; m <= M; m++) {
            float s = 0.f;
            for (int c = 0; c < g.KS; c++) s += part[((int64_t)c * T + t) * (M + 1) + m];
            const double r = ref[t * (M + 1) + m];
            const ompk_tol tl = m < M ? tm : tq;
            if (!(fabs(s - r) <= tl.atol + tl.rtol * fabs(r)) && bad++ < 5)
                cr_log_error("n=%d D=%lld t=%lld m=%lld: %.9g vs %.9g", n, (long long)D,
                             (long long)t, (long long)m, s, r);
        }
    cr_expect_eq(bad, 0, "n=%d D=%lld pad=%lld gamma=%d interleave=%d async=%d: %d sums differ", n,
                 (long long)D, (long long)pad, with_gamma, interleave, async, bad);

    /* h_in pieces from given h_pre */
    float *hp = malloc(sizeof(float) * (size_t)(T * n));
    for (int64_t i = 0; i < T * n; i++) hp[i] = (float)(0.5 + 0.5 * emu_rnd());
    uint16_t *h_in = aligned_alloc(16, (size_t)((T * D * 2 + 15) / 16 * 16));
    for (int64_t t = 0; t < T; t++)
        for (int64_t d = 0; d < D; d += 8) hin(n, &g, (const char *)x, hp, (char *)h_in, t, d);
    int hbad = 0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t d = 0; d < D; d++) {
            const uint16_t *xt = x + (t / S) * sx0 + (t % S) * sx1;
            double r = 0;
            for (int i = 0; i < n; i++) r += hp[t * n + i] * ompk_bf16_to_f32(xt[i * sx2 + d]);
            const ompk_tol tl = ompk_tol_for(OMPK_BF16, 2.0);
            if (!(fabs(ompk_bf16_to_f32(h_in[t * D + d]) - r) <= tl.atol + tl.rtol * fabs(r)))
                hbad++;
        }
    cr_expect_eq(hbad, 0, "n=%d D=%lld: %d h_in elements differ", n, (long long)D, hbad);
    free(x), free(phi), free(gamma), free(part), free(ref), free(hp), free(h_in), free(wp);
}

/* token tail (300 = 256 + 44 tokens over two batches), a D tail inside a 32-wide chunk, padded
 * strides, with and without gamma, interleaved and contiguous splits */
Test(mhc_pre_tc_emu, n4_tails_and_strides) {
    emu_seed(1);
    check(2, 150, 4, 40, 8, 1, 1, 512, 0, 0);
    check(1, 37, 4, 96, 0, 0, 1, 512, 0, 0);
    check(2, 150, 4, 40, 8, 1, 0, 512, 0, 0);
}

/* every stream count: one stage a chunk (n >= 5) or two (n <= 4), M not a multiple of 8 */
Test(mhc_pre_tc_emu, all_n) {
    emu_seed(2);
    for (int n = 1; n <= 8; n++) check(1, 20, n, 24 + 8 * (n & 2), 0, n & 1, n != 3, 512, 0, 0);
}

/* several stages a team (fewer teams than stages): the double-buffered weights and the x
 * prefetch across stages, with 1, 2 and 3 splits, interleaved and contiguous, and a split whose
 * last stage is past K */
Test(mhc_pre_tc_emu, multi_stage) {
    emu_seed(3);
    check(1, 40, 4, 200, 0, 1, 1, 1, 0, 0);
    check(1, 40, 4, 200, 8, 1, 1, 2, 0, 0);
    check(1, 40, 4, 200, 0, 0, 0, 3, 0, 0);
    check(1, 30, 5, 72, 0, 1, 1, 3, 0, 0);
    check(1, 30, 7, 40, 0, 1, 0, 2, 0, 0);
}

/* the cp.async variant (n <= 6): ring slots reused across many stages, split and token tails */
Test(mhc_pre_tc_emu, async_stages) {
    emu_seed(4);
    check(1, 40, 4, 200, 0, 1, 1, 1, 1, 0);
    check(2, 150, 4, 40, 8, 0, 0, 512, 1, 0);
    check(1, 30, 6, 72, 0, 1, 1, 3, 1, 0);
    check(1, 20, 1, 24, 0, 1, 0, 2, 1, 0);
    check(1, 140, 3, 64, 8, 1, 0, 2, 1, 0);
}

/* rotated stage order (tc-rot, tc-async-rot): every team starts at stage block % nst and wraps;
 * the same sums with the split tails, D tails, padded strides and one to many stages a team */
Test(mhc_pre_tc_emu, rotated_stages) {
    emu_seed(5);
    check(1, 40, 4, 200, 0, 1, 0, 1, 0, 1);
    check(1, 40, 4, 200, 8, 1, 0, 3, 0, 1);
    check(2, 150, 4, 40, 8, 1, 0, 512, 0, 1);
    check(1, 30, 7, 72, 0, 1, 0, 3, 0, 1);
    check(1, 30, 5, 104, 8, 0, 1, 2, 0, 1);
    check(1, 40, 4, 200, 0, 1, 0, 2, 1, 1);
    check(1, 140, 3, 64, 8, 1, 0, 3, 1, 1);
    check(1, 30, 6, 72, 0, 0, 1, 3, 1, 1);
}

/* the wide-load GEMM (n <= 4): token tail (300 = 4 x 64 + 44 over two batches), D tails inside
 * a chunk and stages that straddle streams (D = 40, 200), padded strides, one to many stages a
 * split, a split whose last stage is past K, rotated and unrotated stage order */
Test(mhc_pre_tc_emu, wide_loads) {
    emu_seed(8);
    check(2, 150, 4, 40, 8, 1, 0, 64, 2, 1);
    check(1, 40, 4, 200, 0, 1, 0, 1, 2, 0);
    check(1, 40, 4, 200, 8, 0, 0, 3, 2, 1);
    check(1, 70, 4, 64, 0, 1, 0, 2, 2, 1);
    for (int n = 1; n <= 3; n++) check(1, 20, n, 24 + 8 * (n & 2), 8 * (n & 1), n & 1, 0, 3, 2, 1);
    /* a ring of 3 x tiles: one to many stages a split (1, 2 and more than 3) */
    check(2, 150, 4, 40, 8, 1, 0, 64, 3, 1);
    check(1, 40, 4, 200, 0, 1, 0, 1, 3, 0);
    check(1, 70, 4, 64, 0, 1, 0, 2, 3, 1);
    check(1, 20, 2, 40, 8, 0, 0, 3, 3, 1);
}

static float emu_es[PRE_EPI_SMEM];

static void epi(int n, int fused, const pre_tc_geom *g, int KS, const float *part,
                const mhc_pre_fwd_args *a, float *hp_ws, char *h_in) {
#define EMU_EPI(N)                                                                                 \
    pre_epi_team(N, g, KS, part, a, a->alpha, a->bias, hp_ws, a->h_post, a->logits, a->comb,       \
                 a->h_mix, a->inv_rms, a->h_pre, emu_es)
#define EMU_EPI_HIN(N)                                                                             \
    pre_epi_hin_team(N, g, KS, part, a, a->alpha, a->bias, hp_ws, a->h_post, a->logits, a->comb,   \
                     a->h_mix, a->inv_rms, a->h_pre, emu_es, (const char *)a->x, h_in)
    if (fused) {
        MHC_SWITCH_N(n, EMU_EPI_HIN)
    } else {
        MHC_SWITCH_N(n, EMU_EPI)
    }
#undef EMU_EPI
#undef EMU_EPI_HIN
}

/* one emulated thread of an epilogue launch (check_epi below) */
typedef struct {
    int n, fused;
    const pre_tc_geom *g;
    int KS;
    const float *part;
    const mhc_pre_fwd_args *a;
    float *hp_ws;
    char *h_in;
} epi_args;

static void epi_team(void *p) {
    const epi_args *e = p;
    epi(e->n, e->fused, e->g, e->KS, e->part, e->a, e->hp_ws, e->h_in);
}

/* Launch 2, lane-parallel: partials of KS splits -> every output against a double computation
 * (Sinkhorn by the reference), h_mix bit-identical to the split-order float sum; token tail, two
 * batches, optional outputs absent */
static void check_epi(int n, int64_t B, int64_t S, int KS, int all_outputs, int fused) {
    const int64_t T = B * S, D = 48, K = n * D;
    const int M = 2 * n + n * n;
    float *part = malloc(sizeof(float) * (size_t)(KS * T * (M + 1)));
    for (int c = 0; c < KS; c++)
        for (int64_t t = 0; t < T; t++)
            for (int m = 0; m <= M; m++)
                part[((int64_t)c * T + t) * (M + 1) + m] =
                    m < M ? (float)(3.0 * emu_rnd()) : (float)(K * (0.6 + 0.5 * emu_rnd()) / KS);
    float alpha[3] = {0.8f, 1.1f, 1.3f}, bias[80];
    for (int m = 0; m < M; m++) bias[m] = (float)(0.5 * emu_rnd());
    float *h_post = calloc(T * n, 4), *lg = calloc(T * n * n, 4), *comb = calloc(T * n * n, 4);
    float *h_mix = calloc(T * M, 4), *inv = calloc(T, 4), *h_pre = calloc(T * n, 4);
    float *hp_ws = calloc(T * n, 4);
    uint16_t *x = aligned_alloc(16, (size_t)(T * K * 2)),
             *h_in = aligned_alloc(16, (size_t)(T * D * 2));
    for (int64_t i = 0; i < T * K; i++) x[i] = ompk_f32_to_bf16((float)(2.0 * emu_rnd()));
    memset(h_in, 0xff, (size_t)(T * D * 2));
    mhc_pre_fwd_args a;
    memset(&a, 0, sizeof a);
    a.B = B, a.S = S, a.D = D, a.n = n, a.bf16 = 1;
    a.sx[0] = S * K, a.sx[1] = K, a.sx[2] = D, a.sx[3] = 1;
    a.alpha = alpha, a.salpha = 1, a.bias = bias, a.sbias = 1, a.x = x;
    a.h_post = h_post, a.shpost[0] = S * n, a.shpost[1] = n, a.shpost[2] = 1;
    if (all_outputs) {
        a.logits = lg, a.comb = comb, a.h_mix = h_mix, a.inv_rms = inv, a.h_pre = h_pre;
    }
    a.slog[0] = a.scomb[0] = S * n * n, a.slog[1] = a.scomb[1] = n * n;
    a.slog[2] = a.scomb[2] = n, a.slog[3] = a.scomb[3] = 1;
    a.shmix[0] = M, a.shmix[1] = 1, a.sinv = 1, a.shpre[0] = n, a.shpre[1] = 1;
    a.norm_eps = 1e-6f, a.hc_eps = 1e-6f, a.post_mult = 2.f, a.sk_eps = 1e-6f, a.repeat = 20;
    pre_tc_geom g;
    memset(&g, 0, sizeof g);
    g.T = T, g.S = S, g.D = D, g.sx0 = S * K, g.sx1 = K, g.sx2 = D, g.shin0 = S * D, g.shin1 = D;
    const int64_t teams = (T + PRE_EPI_TOK(n) - 1) / PRE_EPI_TOK(n);
    epi_args ea = {n, fused, &g, KS, part, &a, hp_ws, (char *)h_in};
    for (int64_t blk = 0; blk < teams; blk++) {
        ompk_emu_block = (int)blk;
        cr_assert_eq(emu_team_run(PRE_TC_THREADS, epi_team, &ea), 0,
                     "block %lld: the team diverged", (long long)blk);
    }

    double *dl = malloc(sizeof(double) * (size_t)(T * n * n)),
           *dc = malloc(sizeof(double) * (size_t)(T * n * n));
    int bad = 0;
    const ompk_tol tl = ompk_tol_for(OMPK_F32, 4.0);
#define EPI_CHECK(what, got, want)                                                                 \
    do {                                                                                           \
        const double w_ = (want), g_ = (got);                                                      \
        if (!(fabs(g_ - w_) <= tl.atol + tl.rtol * fabs(w_)) && bad++ < 5)                         \
            cr_log_error("n=%d t=%lld %s: %.9g vs %.9g", n, (long long)t, what, g_, w_);           \
    } while (0)
    for (int64_t t = 0; t < T; t++) {
        double sum[81];
        for (int m = 0; m <= M; m++) {
            float f = 0.f;
            sum[m] = 0;
            for (int c = 0; c < KS; c++) {
                f += part[((int64_t)c * T + t) * (M + 1) + m];
                sum[m] += part[((int64_t)c * T + t) * (M + 1) + m];
            }
            if (all_outputs && m < M && h_mix[t * M + m] != f && bad++ < 5)
                cr_log_error("n=%d t=%lld h_mix[%d] %.9g is not the split-order sum %.9g", n,
                             (long long)t, m, h_mix[t * M + m], f);
        }
        const double r = 1.0 / sqrt(sum[M] / (double)K + 1e-6);
        for (int i = 0; i < n; i++) {
            const double hp = 1.0 / (1.0 + exp(-(0.8 * sum[i] * r + bias[i]))) + 1e-6;
            EPI_CHECK("hp_ws", hp_ws[t * n + i], hp);
            if (all_outputs) EPI_CHECK("h_pre", h_pre[t * n + i], hp);
            EPI_CHECK("h_post", h_post[t * n + i],
                      2.0 / (1.0 + exp(-(1.1 * sum[n + i] * r + bias[n + i]))));
        }
        if (all_outputs) EPI_CHECK("inv_rms", inv[t], r);
        for (int e = 0; e < n * n; e++)
            dl[t * n * n + e] = 1.3 * sum[2 * n + e] * r + bias[2 * n + e];
    }
    if (all_outputs) {
        ompk_mhc_ref_sinkhorn_fwd(T, n, 20, 1e-6, dl, dc);
        for (int64_t t = 0; t < T; t++)
            for (int e = 0; e < n * n; e++) {
                EPI_CHECK("res_logits", lg[t * n * n + e], dl[t * n * n + e]);
                EPI_CHECK("comb", comb[t * n * n + e], dc[t * n * n + e]);
            }
    }
    if (fused) {
        const ompk_tol th = ompk_tol_for(OMPK_BF16, 2.0);
        for (int64_t t = 0; t < T; t++)
            for (int64_t d = 0; d < D; d++) {
                double ref = 0;
                for (int i = 0; i < n; i++)
                    ref += hp_ws[t * n + i] * ompk_bf16_to_f32(x[t * K + i * D + d]);
                const double got = ompk_bf16_to_f32(h_in[t * D + d]);
                if (!(fabs(got - ref) <= th.atol + th.rtol * fabs(ref)) && bad++ < 5)
                    cr_log_error("n=%d t=%lld d=%lld h_in %.9g vs %.9g", n, (long long)t,
                                 (long long)d, got, ref);
            }
    }
#undef EPI_CHECK
    cr_expect_eq(bad, 0, "n=%d T=%lld KS=%d outputs=%d fused=%d: %d values differ", n, (long long)T,
                 KS, all_outputs, fused, bad);
    free(x), free(h_in);
    free(part), free(h_post), free(lg), free(comb), free(h_mix), free(inv), free(h_pre);
    free(hp_ws), free(dl), free(dc);
}

Test(mhc_pre_tc_emu, epilogue_lanes) {
    emu_seed(6);
    for (int n = 1; n <= 8; n++) check_epi(n, 2, 19, 1 + n % 3, 1, 0);
    check_epi(4, 1, 13, 2, 0, 0);
    check_epi(7, 3, 3, 3, 0, 0);
}

/* the same fused with h_in (launches 2 + 3 as one) */
Test(mhc_pre_tc_emu, epilogue_fused_hin) {
    emu_seed(7);
    for (int n = 1; n <= 8; n++) check_epi(n, 2, 19, 1 + n % 3, 1, 1);
    check_epi(4, 1, 13, 2, 0, 1);
}
