/* Internal: the host form of the mHC pre forward's GEMM + sum of squares (mhc_pre_fwd.c, launch 1)
 * for a tile of tokens, on 8-float vectors (mhc_host_vec.h).
 *
 * The GPU's work items (a 32-element K chunk of two tokens, one partial row of M + 1 floats
 * each) cost the host a partial row per 64 multiply-adds a token: 26 MB of partials written and
 * summed again at B1 S1024 n4 D2048, and 2 x M scalar accumulators that spill on AVX2's 16
 * registers. Here k runs along the vector lanes: a token's M + 1 sums are 8-lane vectors kept
 * over its whole row, and the GEMM is a register tile of PRE_HMB weight rows x 2 tokens (12 FMAs
 * for 2 x loads and 6 weight loads) over a K block of PRE_HKB elements, converted to f32 once
 * and reused by every weight row. Each lane sums its k in ascending order and the lanes are added
 * in a fixed order at the end, so the result does not depend on the tile size or the thread
 * count. */
#ifndef OMPK_MHC_PRE_FWD_HOST_H
#define OMPK_MHC_PRE_FWD_HOST_H

#include "mhc_host_vec.h"
#include "mhc_kern.h"

#define PRE_HTB 8   /* tokens a tile */
#define PRE_HKB 128 /* elements a K block: 4 KB of x and M x 512 B of weights in L1 */
#define PRE_HMB 6   /* weight rows of the register tile */

/* Weights of the host form: phi * gamma as [M][n * DP], each stream's D elements padded with
 * zeros to DP, a multiple of 8, so a K block's last vector never reads the next stream's. */
static inline int64_t pre_host_dp(int64_t D) {
    return (D + 7) & ~(int64_t)7;
}

/* acc0[r] (and acc1[r] when TU = 2) += x row u . weight row r over nv vectors: the register
 * tile. R and TU are compile-time constants once inlined. */
MHC_INLINE void pre_host_mk(const int R, const int TU, int nv, const float *xf, const float *w,
                            int64_t KP, mhc_f8 *acc0, mhc_f8 *acc1) {
    mhc_f8 a[2][PRE_HMB];
    MHC_UNROLL
    for (int r = 0; r < PRE_HMB; r++) {
        if (r >= R) continue;
        a[0][r] = acc0[r];
        a[1][r] = TU == 2 ? acc1[r] : (mhc_f8){0};
    }
    for (int s = 0; s < nv; s++) {
        mhc_f8 x0, x1;
        __builtin_memcpy(&x0, xf + 8 * s, sizeof x0);
        if (TU == 2) __builtin_memcpy(&x1, xf + PRE_HKB + 8 * s, sizeof x1);
        MHC_UNROLL
        for (int r = 0; r < PRE_HMB; r++) {
            if (r >= R) continue;
            mhc_f8 wv;
            __builtin_memcpy(&wv, w + r * KP + 8 * s, sizeof wv);
            a[0][r] += x0 * wv;
            if (TU == 2) a[1][r] += x1 * wv;
        }
    }
    MHC_UNROLL
    for (int r = 0; r < PRE_HMB; r++) {
        if (r >= R) continue;
        acc0[r] = a[0][r];
        if (TU == 2) acc1[r] = a[1][r];
    }
}

/* Weight rows [m0, m0 + R) against the nt tokens of the K block in xf. */
MHC_INLINE void pre_host_rows(const int R, int nt, int nv, const float *xf, const float *w,
                              int64_t KP, int m0, mhc_f8 (*acc)[MMAX + 1]) {
    int u = 0;
    for (; u + 2 <= nt; u += 2)
        pre_host_mk(R, 2, nv, xf + u * PRE_HKB, w + m0 * KP, KP, &acc[u][m0], &acc[u + 1][m0]);
    if (u < nt) pre_host_mk(R, 1, nv, xf + u * PRE_HKB, w + m0 * KP, KP, &acc[u][m0], NULL);
}

/* The M GEMM sums and the sum of squares of tokens t0 .. t0 + nt - 1 (nt <= PRE_HTB) over the
 * whole K: part row t (M + 1 floats) for each. x rows have unit element stride (the API checks
 * it); wh as pre_host_dp says. */
MHC_INLINE void pre_host_tile(const int N, const char *x, const int64_t sx[3], int64_t S, int64_t D,
                              int bf16, const float *wh, int64_t t0, int nt, float *part) {
    const int M = 2 * N + N * N, esz = bf16 ? 2 : 4;
    const int64_t DP = pre_host_dp(D), KP = N * DP;
    mhc_f8 acc[PRE_HTB][MMAX + 1];
    float xf[PRE_HTB * PRE_HKB] __attribute__((aligned(32)));
    const char *row[PRE_HTB];
    for (int u = 0; u < nt; u++) {
        const int64_t t = t0 + u;
        row[u] = x + ((t / S) * sx[0] + (t % S) * sx[1]) * esz;
        for (int m = 0; m <= M; m++) acc[u][m] = (mhc_f8){0};
    }
    for (int i = 0; i < N; i++)
        for (int64_t d0 = 0; d0 < D; d0 += PRE_HKB) {
            const int nk = D - d0 < PRE_HKB ? (int)(D - d0) : PRE_HKB, nv = (nk + 7) / 8;
            for (int u = 0; u < nt; u++) {
                const char *p = row[u] + (i * sx[2] + d0) * esz;
                for (int s = 0; s < nv; s++) {
                    const int ne = nk - 8 * s;
                    const mhc_f8 v = mhc_f8_load(p + 8 * s * esz, 1, bf16, ne >= 8, ne);
                    __builtin_memcpy(xf + u * PRE_HKB + 8 * s, &v, sizeof v);
                    acc[u][M] += v * v;
                }
            }
            /* the next block's x lines are requested now: they arrive during this block's
             * GEMM instead of stalling the next conversion (tile rows are 8 short streams) */
            const int64_t nd0 = d0 + PRE_HKB < D ? d0 + PRE_HKB : 0, ni = nd0 ? i : i + 1;
            if (ni < N)
                for (int u = 0; u < nt; u++) {
                    const int64_t nn = D - nd0 < PRE_HKB ? D - nd0 : PRE_HKB;
                    const char *p = row[u] + (ni * sx[2] + nd0) * esz;
                    for (int64_t o = 0; o < nn * esz; o += 64) __builtin_prefetch(p + o);
                }
            const float *w = wh + i * DP + d0;
            int m0 = 0;
            for (; m0 + PRE_HMB <= M; m0 += PRE_HMB)
                pre_host_rows(PRE_HMB, nt, nv, xf, w, KP, m0, acc);
            if (M % PRE_HMB) pre_host_rows(M % PRE_HMB, nt, nv, xf, w, KP, m0, acc);
        }
    for (int u = 0; u < nt; u++) {
        float *p = part + (t0 + u) * (M + 1);
        for (int m = 0; m <= M; m++) {
            float s = 0.f;
            for (int e = 0; e < 8; e++) s += acc[u][m][e];
            p[m] = s;
        }
    }
}

/* h_in of token row xrow (n streams sx2 elements apart) into out: sum_i hp[i] * x_i, i in
 * order, as pre_hin does. */
MHC_INLINE void pre_host_hin(const int N, const char *xrow, int64_t sx2, const float *hp, char *out,
                             int64_t D, int bf16) {
    const int esz = bf16 ? 2 : 4;
    for (int64_t d = 0; d < D; d += 8) {
        const int ne = D - d < 8 ? (int)(D - d) : 8;
        mhc_f8 acc = {0};
        MHC_UNROLL
        for (int i = 0; i < NMAX; i++)
            if (i < N) acc += hp[i] * mhc_f8_load(xrow + (i * sx2 + d) * esz, 1, bf16, ne == 8, ne);
        mhc_f8_store(out + d * esz, 1, bf16, ne == 8, ne, acc);
    }
}

#endif
