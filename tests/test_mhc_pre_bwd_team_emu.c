/* The portable GPU stage 4 of the mHC pre backward on a team (src/target/mhc/mhc_pre_bwd_team.h)
 * run on the host: with OMPK_EMULATE a team is BWD_TT(n) emulated threads (emu_team.h) sharing
 * the staged chunks, so CI checks the team algorithm itself (the two chunk buffers alternating
 * over token blocks of several chunks, blocks ending inside a chunk and inside a group of tokens
 * loaded ahead, runs past the last stream, gamma and grad_x_post optional, padded strides of
 * the flat token index) against a double reference:
 *   dx[t,k] = sum_m dh_mix[t,m] w[m,k] - coef[t] x[t,k] + h_pre[t,i] dh_in[t,d] (+ gxp[t,k])
 *   dW[m,k] = sum_t dh_mix[t,m] x[t,k]   (partials per token block, summed in block order)
 * The GPU run of test_mhc_pre and test_ops checks the real threads and barriers. */
#define OMPK_EMULATE 1
#include "emu_team.h"

#include "mhc_pre_bwd_team.h"
#include "emu_common.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "tolerance.h"

/* team-shared arrays, sized for the largest n's chunks */
static mhc_f4 emu_srow[2 * 64 * 20];
static float emu_sco[2 * 64], emu_shp[2 * 64 * 8];

typedef struct {
    int n;
    const bwd_io *io;
    int64_t t0, t1, c0, NCH, CPS;
    const char *x, *dh, *gxp;
    char *dx;
    const float *phi, *gamma, *hp, *dhm, *coef;
    float *pw;
} team_args;

#define EMU_ITEM(N)                                                                                \
    bwd_team_item(N, (N) <= 4 ? 2 : 1, BWD_CT(N), BWD_TT(N), a->io, a->t0, a->t1, a->c0, a->NCH,   \
                  a->CPS, a->x, a->dh, a->gxp, a->dx, a->phi, a->gamma, a->hp, a->dhm, a->coef,    \
                  a->pw, emu_srow, emu_sco, emu_shp)

static void team_thread(void *p) {
    const team_args *a = p;
    switch (a->n) {
    case 1:
        EMU_ITEM(1);
        break;
    case 2:
        EMU_ITEM(2);
        break;
    case 3:
        EMU_ITEM(3);
        break;
    case 4:
        EMU_ITEM(4);
        break;
    case 5:
        EMU_ITEM(5);
        break;
    case 6:
        EMU_ITEM(6);
        break;
    case 7:
        EMU_ITEM(7);
        break;
    default:
        EMU_ITEM(8);
        break;
    }
}

/* x, dx, grad_x_post [B,S,n,D] with stream rows padded by `pad` elements (even) and tokens by
 * `pad` more (the b stride S s strides: one flat token index); dh_in [T,D] padded likewise;
 * TBK tokens a block */
static void check(int64_t B, int64_t S, int n, int64_t D, int64_t pad, int with_gamma, int with_gxp,
                  int64_t TBK, int rows) {
    const int KC = n <= 4 ? 2 : 1, TT = BWD_TT(n), M = 2 * n + n * n, MW = 4 * BWD_MW4(n);
    const int64_t T = B * S, K = n * D, CPS = D / KC, NCH = n * CPS, NCB = (NCH + TT - 1) / TT;
    const int64_t NB = (T + TBK - 1) / TBK;
    const int64_t sx2 = D + pad, sx1 = n * sx2 + pad, sdh1 = D + pad;
    cr_assert(D % KC == 0 && pad % 2 == 0);
    uint16_t *x = emu_bf16_tensor(T * sx1, 2.0), *gx = emu_bf16_tensor(T * sx1, 1.0);
    uint16_t *dh = emu_bf16_tensor(T * sdh1, 1.0);
    uint16_t *dx = aligned_alloc(16, (size_t)((T * sx1 * 2 + 15) / 16 * 16));
    for (int64_t i = 0; i < T * sx1; i++) dx[i] = 0x7fc1; /* NaN where nothing was written */
    float *phi = malloc(sizeof(float) * (size_t)(M * K)), *gamma = malloc(sizeof(float) * K);
    for (int64_t i = 0; i < M * K; i++) phi[i] = (float)(emu_rnd() / sqrt((double)K));
    for (int64_t k = 0; k < K; k++) gamma[k] = (float)(1.0 + 0.3 * emu_rnd());
    float *dhm = aligned_alloc(16, sizeof(float) * (size_t)(T * MW));
    float *coef = malloc(sizeof(float) * T), *hp = malloc(sizeof(float) * (size_t)(T * n));
    for (int64_t t = 0; t < T; t++)
        for (int m = 0; m < MW; m++) dhm[t * MW + m] = m < M ? (float)(0.5 * emu_rnd()) : 0.f;
    for (int64_t t = 0; t < T; t++) coef[t] = (float)(1e-3 * emu_rnd());
    for (int64_t i = 0; i < T * n; i++) hp[i] = (float)(0.5 + 0.5 * emu_rnd());
    float *pw = malloc(sizeof(float) * (size_t)(NB * M * K));
    for (int64_t i = 0; i < NB * M * K; i++) pw[i] = NAN;

    bwd_io io;
    memset(&io, 0, sizeof io);
    const int64_t sx[4] = {S * sx1, sx1, sx2, 1};
    for (int k = 0; k < 4; k++) io.sx[k] = io.sg[k] = io.sdx[k] = sx[k];
    io.sdh[0] = S * sdh1, io.sdh[1] = sdh1, io.sdh[2] = 1;
    io.shpre[0] = n, io.shpre[1] = 1;
    io.S = S, io.D = D, io.K = K, io.sphi = K;
    io.bf16 = io.dbf16 = io.gbf16 = 1, io.MW = MW;
    team_args ta = {n,    &io,  0,    0,  0,   NCH,  CPS, (const char *)x, (const char *)dh, NULL,
                    NULL, NULL, NULL, hp, dhm, coef, NULL};
    ta.gxp = with_gxp ? (const char *)gx : NULL;
    ta.dx = (char *)dx, ta.phi = phi, ta.gamma = with_gamma ? gamma : NULL;
    for (int64_t q = 0; q < NB; q++)
        for (int64_t cb = 0; cb < NCB; cb++) {
            ta.t0 = q * TBK, ta.t1 = ta.t0 + TBK < T ? ta.t0 + TBK : T, ta.c0 = cb * TT;
            ta.pw = pw + q * M * K;
            if (rows) { /* a team of 3 threads */
                for (int th = 0; th < 3; th++)
                    bwd_team_rows(n, KC, TT, &io, ta.t0, ta.t1, ta.c0, NCH, CPS, th, 3, ta.x, ta.dh,
                                  ta.gxp, ta.dx, phi, ta.gamma, hp, dhm, coef, ta.pw);
                continue;
            }
            cr_assert_eq(emu_team_run(TT, team_thread, &ta), 0,
                         "block %lld, runs %lld: the emulated team diverged", (long long)q,
                         (long long)cb);
        }

    /* double reference */
    double *rdx = calloc((size_t)(T * K), sizeof(double)), *rdw = calloc((size_t)(M * K), 8);
    double xmax = 0, wmax = 0;
    for (int64_t t = 0; t < T; t++)
        for (int i = 0; i < n; i++)
            for (int64_t d = 0; d < D; d++) {
                const int64_t k = i * D + d, xo = t * sx1 + i * sx2 + d;
                const double xv = ompk_bf16_to_f32(x[xo]);
                double acc = 0;
                for (int m = 0; m < M; m++) {
                    const double w = (double)phi[m * K + k] * (with_gamma ? gamma[k] : 1.0);
                    acc += (double)dhm[t * MW + m] * w;
                    rdw[m * K + k] += (double)dhm[t * MW + m] * xv;
                }
                acc += -(double)coef[t] * xv +
                       (double)hp[t * n + i] * ompk_bf16_to_f32(dh[t * sdh1 + d]);
                if (with_gxp) acc += ompk_bf16_to_f32(gx[xo]);
                rdx[t * K + k] = acc;
                xmax = fmax(xmax, fabs(acc));
            }
    for (int64_t i = 0; i < M * K; i++) wmax = fmax(wmax, fabs(rdw[i]));
    const ompk_tol tx = ompk_tol_for(OMPK_BF16, xmax), tw = ompk_tol_for(OMPK_F32, wmax);
    int bad = 0, wbad = 0, touched = 0;
    for (int64_t t = 0; t < T; t++)
        for (int i = 0; i < n; i++)
            for (int64_t d = 0; d < D; d++) {
                const double got = ompk_bf16_to_f32(dx[t * sx1 + i * sx2 + d]);
                const double r = rdx[t * K + i * D + d];
                if (!(fabs(got - r) <= tx.atol + tx.rtol * fabs(r)) && bad++ < 5)
                    cr_log_error("dx n=%d D=%lld t=%lld i=%d d=%lld: %.6g vs %.6g", n, (long long)D,
                                 (long long)t, i, (long long)d, got, r);
            }
    for (int m = 0; m < M; m++)
        for (int64_t k = 0; k < K; k++) {
            float s = 0.f;
            for (int64_t q = 0; q < NB; q++) s += pw[(q * M + m) * K + k];
            const double r = rdw[m * K + k];
            if (!(fabs(s - r) <= tw.atol + tw.rtol * fabs(r)) && wbad++ < 5)
                cr_log_error("dW n=%d D=%lld m=%d k=%lld: %.9g vs %.9g", n, (long long)D, m,
                             (long long)k, s, r);
        }
    for (int64_t i = 0; i < T * sx1; i++) {
        const int64_t rem = i % sx1;
        if (!(rem / sx2 < n && rem % sx2 < D) && dx[i] != 0x7fc1) touched++;
    }
    cr_expect_eq(bad, 0, "n=%d D=%lld pad=%lld gamma=%d gxp=%d TBK=%lld rows=%d: %d dx differ", n,
                 (long long)D, (long long)pad, with_gamma, with_gxp, (long long)TBK, rows, bad);
    cr_expect_eq(wbad, 0, "n=%d D=%lld gamma=%d TBK=%lld rows=%d: %d dW sums differ", n,
                 (long long)D, with_gamma, (long long)TBK, rows, wbad);
    cr_expect_eq(touched, 0, "%d padding elements of dx written", touched);
    free(x), free(gx), free(dh), free(dx), free(phi), free(gamma), free(dhm), free(coef);
    free(hp), free(pw), free(rdx), free(rdw);
}

/* n = 4: 64-token chunks; 150 tokens in blocks of 130 (two full chunks and 2 tokens, then a
 * block of 20), 40 runs of the 384 threads own one */
Test(mhc_pre_bwd_team_emu, n4_multi_chunk) {
    emu_seed(1);
    check(2, 75, 4, 20, 0, 1, 1, 130, 0);
    check(3, 50, 4, 8, 4, 0, 0, 67, 0);
}

/* the other chunk sizes and team sizes: n = 1, 2, 3 (64 tokens), 5, 6 (32), 7, 8 (16 tokens on
 * 128 threads, three row words a thread to stage) */
Test(mhc_pre_bwd_team_emu, every_n) {
    emu_seed(2);
    const int ns[] = {1, 2, 3, 5, 6, 7, 8};
    for (int k = 0; k < 7; k++) {
        const int n = ns[k];
        check(1, 71, n, n <= 4 ? 12 : 9, 2, k & 1, !(k & 1), n <= 4 ? 70 : 37, 0);
    }
}

/* more runs than a team: every thread owns one, teams beyond the first */
Test(mhc_pre_bwd_team_emu, several_run_blocks) {
    emu_seed(3);
    check(1, 9, 4, 200, 2, 1, 1, 64, 0);
    check(1, 20, 8, 24, 0, 1, 0, 20, 0);
}

/* the form for a team that got fewer threads (bwd_team_rows), on the same items */
Test(mhc_pre_bwd_team_emu, fewer_threads) {
    emu_seed(4);
    check(2, 75, 4, 20, 0, 1, 1, 130, 1);
    check(1, 9, 4, 200, 2, 0, 0, 64, 1);
    check(1, 37, 7, 9, 2, 1, 1, 16, 1);
}
