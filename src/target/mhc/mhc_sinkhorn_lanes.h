/* Sinkhorn backward on a GPU with a token's rows spread over G lanes of a warp (lane i of the
 * group holds row i; G = 4 for n <= 4, else 8), 32 / G tokens per warp.
 *
 * Why: the portable kernel gives each token one thread, and at T = 16384 that is 512 warps on
 * a GPU with room for 8448: a single thread's chain of 2 * repeat dependent steps, each with n^2
 * divisions and a load from the state workspace, sets the time (bench/results/INDEX.md). Spread
 * over G lanes, each step is n divisions per lane and the column sums are
 * butterfly shuffles; the state loads of the next step are issued before the current step's
 * arithmetic.
 *
 * The arithmetic is the portable kernel's (mhc_sinkhorn.c), except that a column's sum is
 * formed as a butterfly over the lanes instead of in row order: every lane of the group gets the
 * same bits (IEEE addition commutes), so the result is deterministic, and it differs from the
 * host's only by that rounding order. Every lane of the warp runs every step (padding rows and
 * the missing tokens of a last group hold zeros and store nothing), as the shuffles require.
 *
 * tests/test_mhc_sinkhorn_lanes_emu.c runs skl_token on an emulated warp (OMPK_EMULATE); the
 * GPU run of test_mhc_sinkhorn checks the real kernel. */
#ifndef OMPK_MHC_SINKHORN_LANES_H
#define OMPK_MHC_SINKHORN_LANES_H

#include <math.h>
#include <stdint.h>

#include "ptx_mma.h"

#if defined(__clang__)
#define SKL_UNROLL _Pragma("unroll")
#else
#define SKL_UNROLL _Pragma("GCC unroll 8")
#endif
#define SKL_INLINE static inline __attribute__((always_inline, unused))

/* lanes per token for n streams */
#define SKL_G(N) ((N) <= 4 ? 4 : 8)

/* the sum of v over the G lanes of this lane's group, the same bits in every lane */
SKL_INLINE float skl_group_sum(float v, const int G) {
    SKL_UNROLL
    for (int m = 1; m < 8; m <<= 1)
        if (m < G) v += ptx_shfl_xor(v, m);
    return v;
}

/* The state rows of one step: st points at this lane's row of state 0 (row i of the token). */
SKL_INLINE void skl_load(const int N, float z[8], const float *st, int row, float add) {
    SKL_UNROLL
    for (int j = 0; j < 8; j++) z[j] = row && j < N ? st[j] + add : 0.f;
}

/* One token's backward, run by each of its G lanes (lane i of the group, row = i < N and the
 * token exists). lp/dp/op: the token's logits, dcomb and dlogits ([n][n] with strides l2/l3
 * etc.); st: this lane's row in state 0 of the workspace, states sstride floats apart. */
SKL_INLINE void skl_token(const int N, const int G, int i, int row, const float *lp, int64_t l2,
                          int64_t l3, const float *dp, int64_t d2, int64_t d3, float *op,
                          int64_t o2, int64_t o3, int repeat, float eps, float *st,
                          int64_t sstride) {
    float c[8], g[8];
    SKL_UNROLL
    for (int j = 0; j < 8; j++) {
        c[j] = row && j < N ? lp[i * l2 + j * l3] : 0.f;
        g[j] = row && j < N ? dp[i * d2 + j * d3] : 0.f;
    }
    /* the forward again, storing its 2 * repeat intermediate matrices */
    if (row) {
        float mx = c[0], s = 0.f;
        SKL_UNROLL
        for (int j = 1; j < 8; j++)
            if (j < N) mx = c[j] > mx ? c[j] : mx;
        SKL_UNROLL
        for (int j = 0; j < 8; j++)
            if (j < N) {
                c[j] = expf(c[j] - mx);
                s += c[j];
            }
        SKL_UNROLL
        for (int j = 0; j < 8; j++)
            if (j < N) {
                c[j] = c[j] / s;
                st[j] = c[j];
                c[j] += eps;
            }
    }
    for (int r = 0; r < repeat; r++) {
        if (r > 0 && row) {
            float s = 0.f;
            SKL_UNROLL
            for (int j = 0; j < 8; j++)
                if (j < N) s += c[j];
            s += eps;
            SKL_UNROLL
            for (int j = 0; j < 8; j++)
                if (j < N) {
                    c[j] = c[j] / s;
                    st[2 * r * sstride + j] = c[j];
                }
        }
        SKL_UNROLL
        for (int j = 0; j < 8; j++) {
            if (j >= N) continue;
            const float s = skl_group_sum(c[j], G) + eps;
            if (row) {
                c[j] = c[j] / s;
                st[(2 * r + 1) * sstride + j] = c[j];
            }
        }
    }

    /* the steps in reverse; step s normalised state s-1 (columns when s is odd), and the input
     * of step 1 was the softmax plus eps */
    float zn[8];
    skl_load(N, zn, st + (2 * repeat - 2) * sstride, row, 2 * repeat - 1 == 1 ? eps : 0.f);
    for (int s = 2 * repeat - 1; s >= 1; s--) {
        float z[8];
        SKL_UNROLL
        for (int j = 0; j < 8; j++) z[j] = zn[j];
        if (s > 1) skl_load(N, zn, st + (s - 2) * sstride, row, s - 1 == 1 ? eps : 0.f);
        if (s & 1) {
            SKL_UNROLL
            for (int j = 0; j < 8; j++) {
                if (j >= N) continue;
                const float den = skl_group_sum(z[j], G) + eps;
                const float q = skl_group_sum(g[j] * z[j], G) / den;
                if (row) g[j] = (g[j] - q) / den;
            }
        } else if (row) {
            float sz = 0.f, gz = 0.f;
            SKL_UNROLL
            for (int j = 0; j < 8; j++)
                if (j < N) {
                    sz += z[j];
                    gz += g[j] * z[j];
                }
            const float den = sz + eps, q = gz / den;
            SKL_UNROLL
            for (int j = 0; j < 8; j++)
                if (j < N) g[j] = (g[j] - q) / den;
        }
    }
    /* softmax: dlogit = (g - sum_j g*p) * p, p = state 0 */
    if (row) {
        float p[8], gp = 0.f;
        SKL_UNROLL
        for (int j = 0; j < 8; j++) {
            p[j] = j < N ? st[j] : 0.f;
            if (j < N) gp += g[j] * p[j];
        }
        SKL_UNROLL
        for (int j = 0; j < 8; j++)
            if (j < N) op[i * o2 + j * o3] = (g[j] - gp) * p[j];
    }
}

#endif
