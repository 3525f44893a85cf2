/* The tensor-core stage 4 of the mHC pre backward (src/target/mhc/mhc_pre_bwd_tc.h) run on the
 * host: with OMPK_EMULATE a team is BWD_TC_THREADS emulated threads (emu_team.h) and mma.sync,
 * ldmatrix and the shuffles exchange fragments through memory, so CI checks the kernel's own
 * algorithm (the fragment tiles stage 2 writes, the hi/mid/lo splits, the column permutation of the
 * dx tiles, the cp.async ring over many tiles, token tails inside a tile and across batches, padded
 * strides, gamma and grad_x_post optional, several token blocks) against a double reference:
 *   dx[t,k] = sum_m dh_mix[t,m] w[m,k] - coef[t] x[t,k] + h_pre[t,i] dh_in[t,d] (+ gxp[t,k])
 *   dW[m,k] = sum_t dh_mix[t,m] x[t,k]   (partials per token block, summed in block order)
 * The GPU run of test_ops (ops::mhc_pre_bwd, every implementation) checks the real instructions. */
#define OMPK_EMULATE 1
#include "emu_team.h"

#include "mhc_pre_bwd_tc.h"
#include "emu_common.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

#include "bf16.h"
#include "tolerance.h"

static uint32_t emu_sm[BWD_TC_SMEM_WORDS] __attribute__((aligned(16)));

/* the team functions at a run-time n: one instantiation a stream count */
#define EMU_SWITCH_N(n, CALL)                                                                      \
    switch (n) {                                                                                   \
    case 1:                                                                                        \
        CALL(1);                                                                                   \
        break;                                                                                     \
    case 2:                                                                                        \
        CALL(2);                                                                                   \
        break;                                                                                     \
    case 3:                                                                                        \
        CALL(3);                                                                                   \
        break;                                                                                     \
    case 4:                                                                                        \
        CALL(4);                                                                                   \
        break;                                                                                     \
    case 5:                                                                                        \
        CALL(5);                                                                                   \
        break;                                                                                     \
    case 6:                                                                                        \
        CALL(6);                                                                                   \
        break;                                                                                     \
    case 7:                                                                                        \
        CALL(7);                                                                                   \
        break;                                                                                     \
    default:                                                                                       \
        CALL(8);                                                                                   \
        break;                                                                                     \
    }

static void team(int n, const bwd_tc_geom *g, const char *x, const char *dh, const char *gxp,
                 char *dx, const float *phi, const float *gamma, const uint32_t *frag,
                 const float *tok, float *pw, float *blk) {
#define TEAM(N) bwd_tc_team(N, g, x, dh, gxp, dx, phi, gamma, frag, tok, pw, blk, emu_sm)
    EMU_SWITCH_N(n, TEAM)
#undef TEAM
}

static void frag_tok(int n, uint16_t *frag, int64_t t, const float *dhm, float coef,
                     const float *hp, int64_t shp1) {
#define FRAG(N) bwd_tc_frag_tok(N, frag, t, dhm, coef, hp, shp1)
    EMU_SWITCH_N(n, FRAG)
#undef FRAG
}

/* one emulated thread of a stage-4 launch (check below) */
typedef struct {
    int n;
    const bwd_tc_geom *g;
    const char *x, *dh, *gxp;
    char *dx;
    const float *phi, *gamma;
    uint32_t *frag;
    float *tok, *pw, *blk;
} team_args;

static void team_thread(void *p) {
    const team_args *a = p;
    team(a->n, a->g, a->x, a->dh, a->gxp, a->dx, a->phi, a->gamma, a->frag, a->tok, a->pw, a->blk);
}

/* x, dx, grad_x_post [B,S,n,D] with rows padded by `pad` elements (a multiple of 8); dh_in
 * [B,S,D] padded likewise; TBK tokens a team */
static void check(int64_t B, int64_t S, int n, int64_t D, int64_t pad, int with_gamma, int with_gxp,
                  int64_t TBK) {
    const int64_t T = B * S, K = n * D, M = 2 * n + n * n;
    const int64_t sx2 = D + pad, sx1 = n * sx2 + pad, sx0 = S * sx1;
    const int64_t sdh1 = D + pad, sdh0 = S * sdh1;
    uint16_t *x = emu_bf16_tensor(B * sx0, 2.0), *gx = emu_bf16_tensor(B * sx0, 1.0);
    uint16_t *dh = emu_bf16_tensor(B * sdh0, 1.0);
    uint16_t *dx = aligned_alloc(16, (size_t)((B * sx0 * 2 + 15) / 16 * 16));
    for (int64_t i = 0; i < B * sx0; i++) dx[i] = 0x7fc1; /* NaN where nothing was written */
    float *phi = malloc(sizeof(float) * (size_t)(M * K)), *gamma = malloc(sizeof(float) * K);
    for (int64_t i = 0; i < M * K; i++) phi[i] = (float)(emu_rnd() / sqrt((double)K));
    for (int64_t k = 0; k < K; k++) gamma[k] = (float)(1.0 + 0.3 * emu_rnd());
    float *dhm = malloc(sizeof(float) * (size_t)(T * M)), *coef = malloc(sizeof(float) * T);
    float *hp = malloc(sizeof(float) * (size_t)(T * n));
    for (int64_t i = 0; i < T * M; i++) dhm[i] = (float)(0.5 * emu_rnd());
    for (int64_t t = 0; t < T; t++) coef[t] = (float)(1e-3 * emu_rnd());
    for (int64_t i = 0; i < T * n; i++) hp[i] = (float)(0.5 + 0.5 * emu_rnd());

    bwd_tc_geom g;
    memset(&g, 0, sizeof g);
    g.T = T, g.S = S, g.D = D, g.K = K, g.TBK = TBK;
    g.sx0 = sx0, g.sx1 = sx1, g.sx2 = sx2, g.sdh0 = sdh0, g.sdh1 = sdh1;
    g.sg0 = sx0, g.sg1 = sx1, g.sg2 = sx2, g.sdx0 = sx0, g.sdx1 = sx1, g.sdx2 = sx2;
    g.sphi = K, g.shp0 = n, g.shp1 = 1;
    g.NKT = (int)(K / BWD_TC_KT(n)), g.NB = (int)((T + TBK - 1) / TBK);
    g.has_gamma = with_gamma, g.has_gxp = with_gxp;
    cr_assert(K % BWD_TC_KT(n) == 0 && D % BWD_TC_KW(n) == 0 && TBK % 16 == 0);

    const int64_t nfw = bwd_tc_frag_words(n, T);
    uint32_t *frag = aligned_alloc(16, (size_t)(nfw * 4));
    for (int64_t i = 0; i < nfw; i++) frag[i] = 0xffc1ffc1u; /* every word must be written */
    for (int64_t t = 0; t < (T + 15) / 16 * 16; t++)
        frag_tok(n, (uint16_t *)frag, t, t < T ? dhm + t * M : NULL, t < T ? coef[t] : 0.f,
                 hp + (t < T ? t : 0) * n, 1);
    for (int64_t i = 0; i < nfw; i++)
        cr_assert(frag[i] != 0xffc1ffc1u, "fragment word %lld not written", (long long)i);

    const int64_t R = M + 3;
    float *tok = malloc(sizeof(float) * (size_t)(T * R)), *blk = malloc(sizeof(float) * (g.NB * R));
    for (int64_t i = 0; i < T * R; i++) tok[i] = (float)emu_rnd();
    for (int64_t i = 0; i < g.NB * R; i++) blk[i] = NAN;
    float *pw = malloc(sizeof(float) * (size_t)(g.NB * M * K));
    for (int64_t i = 0; i < g.NB * M * K; i++) pw[i] = NAN;
    team_args ta = {n,
                    &g,
                    (const char *)x,
                    (const char *)dh,
                    with_gxp ? (const char *)gx : NULL,
                    (char *)dx,
                    phi,
                    with_gamma ? gamma : NULL,
                    frag,
                    tok,
                    pw,
                    blk};
    for (int bid = 0; bid < g.NKT * g.NB; bid++) {
        ompk_emu_block = bid;
        cr_assert_eq(emu_team_run(BWD_TC_THREADS, team_thread, &ta), 0,
                     "block %d: the emulated team diverged", bid);
    }

    /* double reference */
    double *rdx = calloc((size_t)(T * K), sizeof(double)), *rdw = calloc((size_t)(M * K), 8);
    double xmax = 0, wmax = 0;
    for (int64_t t = 0; t < T; t++) {
        const int64_t b = t / S, s = t % S;
        for (int i = 0; i < n; i++)
            for (int64_t d = 0; d < D; d++) {
                const int64_t k = i * D + d, xo = b * sx0 + s * sx1 + i * sx2 + d;
                const double xv = ompk_bf16_to_f32(x[xo]);
                double acc = 0;
                for (int64_t m = 0; m < M; m++) {
                    const double w = (double)phi[m * K + k] * (with_gamma ? gamma[k] : 1.0);
                    acc += (double)dhm[t * M + m] * w;
                    rdw[m * K + k] += (double)dhm[t * M + m] * xv;
                }
                acc += -(double)coef[t] * xv +
                       (double)hp[t * n + i] * ompk_bf16_to_f32(dh[b * sdh0 + s * sdh1 + d]);
                if (with_gxp) acc += ompk_bf16_to_f32(gx[xo]);
                rdx[t * K + k] = acc;
                xmax = fmax(xmax, fabs(acc));
            }
    }
    for (int64_t i = 0; i < M * K; i++) wmax = fmax(wmax, fabs(rdw[i]));
    const ompk_tol tx = ompk_tol_for(OMPK_BF16, xmax), tw = ompk_tol_for(OMPK_F32, wmax);
    int bad = 0, wbad = 0;
    for (int64_t t = 0; t < T; t++) {
        const int64_t b = t / S, s = t % S;
        for (int i = 0; i < n; i++)
            for (int64_t d = 0; d < D; d++) {
                const int64_t k = i * D + d;
                const double got = ompk_bf16_to_f32(dx[b * sx0 + s * sx1 + i * sx2 + d]);
                const double r = rdx[t * K + k];
                if (!(fabs(got - r) <= tx.atol + tx.rtol * fabs(r)) && bad++ < 5)
                    cr_log_error("dx n=%d D=%lld t=%lld k=%lld: %.6g vs %.6g", n, (long long)D,
                                 (long long)t, (long long)k, got, r);
            }
    }
    for (int64_t m = 0; m < M; m++)
        for (int64_t k = 0; k < K; k++) {
            float s = 0.f;
            for (int q = 0; q < g.NB; q++) s += pw[(q * M + m) * K + k];
            const double r = rdw[m * K + k];
            if (!(fabs(s - r) <= tw.atol + tw.rtol * fabs(r)) && wbad++ < 5)
                cr_log_error("dW n=%d D=%lld m=%lld k=%lld: %.9g vs %.9g", n, (long long)D,
                             (long long)m, (long long)k, s, r);
        }
    /* block sums of the token rows */
    int bbad = 0;
    for (int q = 0; q < g.NB; q++)
        for (int64_t j = 0; j < R; j++) {
            double r = 0, sc = 0;
            for (int64_t t = q * TBK; t < T && t < (q + 1) * TBK; t++)
                r += tok[t * R + j], sc += fabs(tok[t * R + j]);
            const ompk_tol tb = ompk_tol_for(OMPK_F32, sc);
            if (!(fabs(blk[q * R + j] - r) <= tb.atol + tb.rtol * fabs(r)) && bbad++ < 5)
                cr_log_error("blk q=%d j=%lld: %.9g vs %.9g", q, (long long)j, blk[q * R + j], r);
        }
    cr_expect_eq(bbad, 0, "n=%d TBK=%lld: %d block sums differ", n, (long long)TBK, bbad);
    /* padding between rows stays untouched */
    int touched = 0;
    for (int64_t i = 0; i < B * sx0; i++) {
        const int64_t s = (i % sx0) / sx1, rem = (i % sx0) % sx1;
        const int inside = s < S && rem / sx2 < n && rem % sx2 < D;
        if (!inside && dx[i] != 0x7fc1) touched++;
    }
    cr_expect_eq(bad, 0, "n=%d D=%lld pad=%lld gamma=%d gxp=%d TBK=%lld: %d dx differ", n,
                 (long long)D, (long long)pad, with_gamma, with_gxp, (long long)TBK, bad);
    cr_expect_eq(wbad, 0, "n=%d D=%lld pad=%lld gamma=%d TBK=%lld: %d dW sums differ", n,
                 (long long)D, (long long)pad, with_gamma, (long long)TBK, wbad);
    cr_expect_eq(touched, 0, "%d padding elements of dx written", touched);
    free(x), free(gx), free(dh), free(dx), free(phi), free(gamma), free(dhm), free(coef);
    free(hp), free(frag), free(pw), free(rdx), free(rdw), free(tok), free(blk);
}

static void dhpre(int n, const bwd_tc_geom *g, const char *x, const char *dh, int64_t t, int lane,
                  float *out) {
#define DHPRE(N) bwd_tc_dhpre_warp(N, g, x, dh, t, lane, out)
    EMU_SWITCH_N(n, DHPRE)
#undef DHPRE
}

/* one emulated thread of a stage-1 launch of 4 tokens from t0 (check_dhpre below) */
typedef struct {
    int n;
    const bwd_tc_geom *g;
    const char *x, *dh;
    int64_t t0, T;
    float (*out)[8];
} dhpre_args;

static void dhpre_thread(void *p) {
    const dhpre_args *a = p;
    const int tid = emu_tid();
    const int64_t t = a->t0 + tid / 32 < a->T ? a->t0 + tid / 32 : a->T - 1;
    dhpre(a->n, a->g, a->x, a->dh, t, tid & 31, a->out[tid]);
}

/* The fused stage 1: a warp a token (4 tokens a 128-thread team), dh_pre[t][i] against the
 * double sums, every lane with the same bits; D with and without a tail of the 256-wide d
 * blocks, padded strides. */
static void check_dhpre(int64_t B, int64_t S, int n, int64_t D, int64_t pad) {
    const int64_t T = B * S;
    const int64_t sx2 = D + pad, sx1 = n * sx2 + pad, sx0 = S * sx1;
    const int64_t sdh1 = D + pad, sdh0 = S * sdh1;
    uint16_t *x = emu_bf16_tensor(B * sx0, 2.0), *dh = emu_bf16_tensor(B * sdh0, 1.0);
    bwd_tc_geom g;
    memset(&g, 0, sizeof g);
    g.T = T, g.S = S, g.D = D, g.K = n * D;
    g.sx0 = sx0, g.sx1 = sx1, g.sx2 = sx2, g.sdh0 = sdh0, g.sdh1 = sdh1;
    static float out[BWD_TC_THREADS][8];
    int bad = 0;
    for (int64_t t0 = 0; t0 < T; t0 += 4) {
        dhpre_args da = {n, &g, (const char *)x, (const char *)dh, t0, T, out};
        cr_assert_eq(emu_team_run(BWD_TC_THREADS, dhpre_thread, &da), 0,
                     "tokens %lld..: the emulated team diverged", (long long)t0);
        for (int w = 0; w < 4 && t0 + w < T; w++) {
            const int64_t t = t0 + w, b = t / S, s = t % S;
            for (int i = 0; i < n; i++) {
                double r = 0, sc = 0;
                for (int64_t d = 0; d < D; d++) {
                    const double p = (double)ompk_bf16_to_f32(dh[b * sdh0 + s * sdh1 + d]) *
                                     ompk_bf16_to_f32(x[b * sx0 + s * sx1 + i * sx2 + d]);
                    r += p, sc += fabs(p);
                }
                const ompk_tol tl = ompk_tol_for(OMPK_F32, sc);
                for (int l = 0; l < 32; l++) {
                    const float v = out[w * 32 + l][i];
                    if (memcmp(&v, &out[w * 32][i], sizeof v) != 0) bad++;
                }
                if (!(fabs(out[w * 32][i] - r) <= tl.atol + tl.rtol * fabs(r)) && bad++ < 5)
                    cr_log_error("dh_pre t=%lld i=%d: %.9g vs %.9g", (long long)t, i,
                                 out[w * 32][i], r);
            }
        }
    }
    cr_expect_eq(bad, 0, "n=%d D=%lld pad=%lld: %d dh_pre sums differ", n, (long long)D,
                 (long long)pad, bad);
    free(x), free(dh);
}

Test(mhc_pre_bwd_tc_emu, fused_dh_pre) {
    emu_seed(3);
    check_dhpre(2, 5, 4, 4096, 0);
    check_dhpre(1, 7, 3, 296, 8);
    check_dhpre(1, 6, 1, 64, 0);
    check_dhpre(3, 2, 2, 520, 16);
    check_dhpre(1, 5, 8, 264, 8);
    check_dhpre(2, 3, 6, 128, 0);
}

/* token tails inside a tile and across batches (S not a multiple of 16), several tiles a team
 * (the ring wraps), several token blocks, padded strides, gamma and grad_x_post each way */
Test(mhc_pre_bwd_tc_emu, n4_tails_blocks_strides) {
    emu_seed(1);
    check(2, 75, 4, 32, 8, 1, 1, 96);
    check(3, 21, 4, 64, 0, 0, 0, 16);
    check(1, 150, 4, 32, 0, 1, 0, 160);
}

/* every stream count the path serves: M = 3, 8, 15, 24 (M not a multiple of 8, 1 to 5 dx
 * reduction steps), K of one or several team tiles */
Test(mhc_pre_bwd_tc_emu, n1_to_n4) {
    emu_seed(2);
    check(1, 40, 1, 128, 0, 1, 1, 32);
    check(2, 19, 2, 64, 8, 0, 1, 48);
    check(1, 37, 3, 128, 0, 1, 0, 16);
    check(1, 50, 4, 96, 0, 1, 1, 64);
}

/* n > 4 (16 k a warp, the fragment tile in a ring of 3 or 2 stages, dx slot blocks at multiples
 * of 16): M = 35, 48, 63, 80; teams whose warps span streams (D = 16), the ring wrapping, tails,
 * padded strides, gamma and grad_x_post each way */
Test(mhc_pre_bwd_tc_emu, n5_to_n8) {
    emu_seed(4);
    check(1, 37, 5, 64, 8, 1, 1, 48);
    check(2, 19, 6, 32, 0, 0, 1, 48);
    check(1, 40, 7, 64, 0, 1, 0, 48);
    check(3, 11, 8, 16, 8, 0, 0, 32);
    check(1, 70, 8, 48, 0, 1, 1, 64);
}
