/* Internal: the pieces the portable attention kernels share (attention_portable.c, and the
 * GPU forward on team-shared tiles in attention_portable_tiled.c): the exp2 they all use, score
 * rounding, loads and stores of bf16 or f32, the row results, and the per-row forward block.
 * Every function is declare target, for the GPU image and the host alike. */
#ifndef OMPK_ATTENTION_PORTABLE_H
#define OMPK_ATTENTION_PORTABLE_H

#include <math.h>
#include <stdint.h>

#include "attention_kernels.h"
#include "bf16.h"

#define ATT_DMAX 256
#define ATT_BK 32
#define ATT_LOG2E 1.4426950408889634f
#define ATT_LN2 0.6931471805599453f

#define ATT_INLINE static inline __attribute__((always_inline))

/* Reductions the host may reorder into vector lanes. Not in a GPU image: clang compiles the
 * source again for the GPU (__NVPTX__, __AMDGCN__); GCC preprocesses it once, for the host, and
 * its GPU image runs a simd loop across a warp's lanes in an order that changes with the context,
 * so two dot products of one score round differently. GCC offload builds go without. */
#if defined(__NVPTX__) || defined(__AMDGCN__) || defined(OMPK_OFFLOAD_GCC_NVPTX)
#define ATT_SIMD_SUM(x)
#else
#define ATT_SIMD_SUM(x) _Pragma(ATT_STR(omp simd reduction(+ : x)))
#endif
#define ATT_STR(x) #x

/* Emulated builds (tests) are host code only: no offload image for GCC's linker to ask for. */
#ifndef OMPK_EMULATE
#pragma omp declare target
#endif

/* 2^x for x <= 127, exact 0 below -126.5 (masked and underflowing terms), NaN for NaN. Degree-6
 * Taylor on the rounded-off fraction in [-0.5, 0.5]: relative error about 1e-7. The clamps are
 * written so that NaN becomes 127 before the integer conversion (converting NaN is undefined). */
ATT_INLINE float att_exp2(float x0) {
    float x = x0 < 127.f ? x0 : 127.f;
    x = x > -127.f ? x : -127.f;
    /* round to nearest by the 1.5 * 2^23 shift: plain arithmetic, so the loop around a call
     * vectorizes with every compiler (floorf stays a libm call in some builds) */
    float n = (x + 12582912.f) - 12582912.f;
    float f = x - n;
    float p = 1.5403530e-4f;
    p = p * f + 1.3333558e-3f;
    p = p * f + 9.6181291e-3f;
    p = p * f + 5.5504109e-2f;
    p = p * f + 2.4022651e-1f;
    p = p * f + 6.9314718e-1f;
    p = p * f + 1.0f;
    ompk_f32_bits e;
    e.u = (uint32_t)((int32_t)n + 127) << 23;
    return x0 == x0 ? p * e.f : x0;
}

/* A score in natural units, rounded to fp32 on every compiler (see ATT_ROUNDED_MUL). */
ATT_INLINE float att_score(float dot, float scale) {
    return ATT_ROUNDED_MUL(dot, scale);
}

ATT_INLINE float att_ld(const void *p, int64_t i, const int bf) {
    return bf ? ompk_bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

ATT_INLINE void att_st(void *p, int64_t i, float v, const int bf) {
    if (bf)
        ((uint16_t *)p)[i] = ompk_f32_to_bf16(v);
    else
        ((float *)p)[i] = v;
}

/* The forward's row results from its running max m (natural units) and sum l. A row that sees
 * no key gives o = 0 and lse = -inf; a row that sees keys gives whatever the float math gives,
 * NaN included: a NaN sum stays NaN, and l = 0 (every visible score -inf, or only NaN seen
 * before) is NaN rather than the fully masked row's 0 / -inf. */
ATT_INLINE float att_inv_l(int sees, float l) {
    return sees ? 1.f / l : 0.f;
}

ATT_INLINE float att_lse(int sees, float m, float l) {
    return !sees ? -INFINITY : l > 0.f ? m + log2f(l) * ATT_LN2 : NAN;
}

/* Row n of head (b, h) of a [B,H,L,dh] tensor with strides s. */
ATT_INLINE int64_t att_row(const int64_t s[3], int64_t b, int64_t h, int64_t n) {
    return b * s[0] + h * s[1] + n * s[2];
}

ATT_INLINE void att_load_row(float *dst, const void *src, int64_t off, int64_t dh, float mul,
                             const int bf) {
    for (int64_t d = 0; d < dh; d++) dst[d] = att_ld(src, off + d, bf) * mul;
}

ATT_INLINE float att_dot(const float *restrict a, const float *restrict b, int64_t dh) {
    float acc = 0.f;
    ATT_SIMD_SUM(acc)
    for (int64_t d = 0; d < dh; d++) acc += a[d] * b[d];
    return acc;
}

/* Forward for rows i0 .. i0+rb-1 of head (b, h). */
ATT_INLINE void att_fwd_block(const ompk_attn_geom *g, const void *q, const void *k, const void *v,
                              void *out, float *lse, int64_t b, int64_t h, int64_t i0, const int RB,
                              const int bf) {
    const int64_t dh = g->dh, N = g->N, M = g->M;
    const int64_t hk = h / (g->Hq / g->Hkv);
    int rb = (int)(N - i0 < RB ? N - i0 : RB);
    float qf[RB][ATT_DMAX], acc[RB][ATT_DMAX], s[RB][ATT_BK];
    float kf[ATT_DMAX], mrow[RB], lrow[RB];
    int64_t lim[RB];
    int64_t jmax = 0;
    for (int r = 0; r < rb; r++) {
        att_load_row(qf[r], q, att_row(g->qs, b, h, i0 + r), dh, 1.f, bf);
        for (int64_t d = 0; d < dh; d++) acc[r][d] = 0.f;
        mrow[r] = -INFINITY;
        lrow[r] = 0.f;
        lim[r] = ompk_attn_key_limit(g->mask, i0 + r, N, M);
        jmax = lim[r] > jmax ? lim[r] : jmax;
    }
    for (int64_t j0 = 0; j0 < jmax; j0 += ATT_BK) {
        int jn = (int)(jmax - j0 < ATT_BK ? jmax - j0 : ATT_BK);
        for (int jj = 0; jj < jn; jj++) {
            int64_t koff = att_row(g->ks, b, hk, j0 + jj);
            const float *kr = (const float *)k + koff;
            if (bf) {
                att_load_row(kf, k, koff, dh, 1.f, bf);
                kr = kf;
            }
            for (int r = 0; r < rb; r++)
                s[r][jj] =
                    j0 + jj < lim[r] ? att_score(att_dot(qf[r], kr, dh), g->scale) : -INFINITY;
        }
        for (int r = 0; r < rb; r++) {
            float mx = mrow[r];
            for (int jj = 0; jj < jn; jj++) mx = s[r][jj] > mx ? s[r][jj] : mx;
            /* nothing visible (or only NaN) yet: exponentials against 0 give p = 0 or NaN */
            const float base = mx == -INFINITY ? 0.f : mx;
            float alpha = att_exp2((mrow[r] - base) * ATT_LOG2E), sum = 0.f;
            ATT_SIMD_SUM(sum)
            for (int jj = 0; jj < jn; jj++) {
                float p = att_exp2((s[r][jj] - base) * ATT_LOG2E);
                s[r][jj] = p;
                sum += p;
            }
            lrow[r] = lrow[r] * alpha + sum;
            mrow[r] = mx;
            if (alpha != 1.f)
                for (int64_t d = 0; d < dh; d++) acc[r][d] *= alpha;
        }
        for (int jj = 0; jj < jn; jj++) {
            int64_t voff = att_row(g->vs, b, hk, j0 + jj);
            const float *vr = (const float *)v + voff;
            if (bf) {
                att_load_row(kf, v, voff, dh, 1.f, bf);
                vr = kf;
            }
            for (int r = 0; r < rb; r++) {
                float p = s[r][jj];
                if (j0 + jj >= lim[r]) continue;
                float *restrict a = acc[r];
                for (int64_t d = 0; d < dh; d++) a[d] += p * vr[d];
            }
        }
    }
    for (int r = 0; r < rb; r++) {
        int64_t ooff = att_row(g->os, b, h, i0 + r);
        float inv = att_inv_l(lim[r] > 0, lrow[r]);
        for (int64_t d = 0; d < dh; d++) att_st(out, ooff + d, acc[r][d] * inv, bf);
        if (lse) lse[att_row(g->ls, b, h, i0 + r)] = att_lse(lim[r] > 0, mrow[r], lrow[r]);
    }
}

#ifndef OMPK_EMULATE
#pragma omp end declare target
#endif

#endif
