/* Internal: what the host attention kernels on AVX-512 (attention_host.c) and on AMX
 * (attention_amx.c) share: the target attribute, exp2, the mask's row and key bounds, and the
 * row statistics' conventions. x86-64 only. */
#ifndef OMPK_ATTENTION_X86_H
#define OMPK_ATTENTION_X86_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "target/attention/attention_kernels.h"

#define ATH_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")))
#define ATH_INLINE static inline __attribute__((always_inline)) ATH_TARGET

#define ATH_LOG2E 1.4426950408889634f
#define ATH_LN2 0.6931471805599453f

typedef uint16_t ath_bf;

/* 2^x, lane-wise, for x <= 127; underflows to (nearly) 0 below -126; NaN stays NaN (vmaxps and
 * vminps return their second operand when either is NaN). */
ATH_INLINE __m512 ath_exp2(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-150.f), x);
    x = _mm512_min_ps(_mm512_set1_ps(127.f), x);
    __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(1.5403530e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504109e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022651e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* Row n of head (b, h) of a [B,H,L,dh] tensor with strides s. */
static inline int64_t ath_row(const int64_t s[3], int64_t b, int64_t h, int64_t n) {
    return b * s[0] + h * s[1] + n * s[2];
}

/* p = exp(s * scale - lse) for raw dot products s: scores rounded as the forward rounds them,
 * the difference taken in natural units before the scaling to log2 e (scaling first would lose
 * the low bits of large logits, and the one-hot p = 1 with them). */
ATH_INLINE __m512 ath_p_of(__m512 s, __m512 scale, __m512 lse) {
    const __m512 l2e = _mm512_set1_ps(ATH_LOG2E);
    const __m512 x = ATT_ROUNDED(_mm512_mul_ps(s, scale));
    return ath_exp2(_mm512_mul_ps(_mm512_sub_ps(x, lse), l2e));
}

/* The forward's row results (see att_lse in attention_portable.c): o = 0, lse = -inf only for a
 * row that sees no key; NaN where the float math gives it. */
static inline float ath_inv_l(int sees, float l) {
    return sees ? 1.f / l : 0.f;
}
static inline float ath_lse(int sees, float m, float l) {
    return !sees ? -INFINITY : l > 0.f ? m + log2f(l) * ATH_LN2 : NAN;
}

#endif
