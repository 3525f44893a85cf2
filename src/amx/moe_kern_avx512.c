/* AVX-512 kernel (BF16 dot products for bf16, VNNI u8*s8 for int formats) over the same packed
 * tiles. A tile row of 64 bytes is exactly one zmm of weights for 16 columns; one activation
 * pair (bf16) or quad (int8) is broadcast against it. Rows are processed in chunks of 8, 4, 2, 1
 * so a decode call (m = 1) does no wasted work. */
#include "moe_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define AVX_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx512vnni,fma")))
#define AVX_INLINE AVX_FN static inline __attribute__((always_inline))

AVX_INLINE void bf16_rows(const moe_kargs *k, int r0, const int rn) {
    __m512 acc0[8], acc1[8];
    for (int r = 0; r < rn; r++) acc0[r] = acc1[r] = _mm512_setzero_ps();
    const uint8_t *a = k->a + r0 * k->lda;
    for (int t = 0; t < k->kt; t++) {
        const uint8_t *b0 = k->b[0] + t * k->bstride, *b1 = k->b[1] + t * k->bstride;
        for (int kp = 0; kp < 16; kp++) {
            __m512i w0 = _mm512_loadu_si512((const void *)(b0 + kp * 64));
            __m512i w1 = _mm512_loadu_si512((const void *)(b1 + kp * 64));
            for (int r = 0; r < rn; r++) {
                int32_t x2;
                __builtin_memcpy(&x2, a + r * k->lda + t * 64 + kp * 4, 4);
                __m512i xb = _mm512_set1_epi32(x2);
                acc0[r] = _mm512_dpbf16_ps(acc0[r], (__m512bh)xb, (__m512bh)w0);
                acc1[r] = _mm512_dpbf16_ps(acc1[r], (__m512bh)xb, (__m512bh)w1);
            }
        }
    }
    for (int r = 0; r < rn; r++) {
        _mm512_storeu_ps(k->out + (r0 + r) * 16, acc0[r]);
        _mm512_storeu_ps(k->out + (32 + r0 + r) * 16, acc1[r]);
    }
}

/* One activation row (decode): the weights stream from memory once, so the loop is about
 * bytes in flight: four independent accumulators per stream (no add-latency chain) and a
 * software prefetch a few k-tiles ahead. */
#define MOE_PF_TILES 4
AVX_INLINE void pf_tile(const uint8_t *p, int bytes) {
    for (int o = 0; o < bytes; o += 64) _mm_prefetch((const char *)(p + o), _MM_HINT_T0);
}

AVX_FN static void bf16_row1(const moe_kargs *k, int r0) {
    __m512 a0[4], a1[4];
    for (int i = 0; i < 4; i++) a0[i] = a1[i] = _mm512_setzero_ps();
    const int tb = 1024;
    for (int t = 0; t < k->kt; t++) {
        const uint8_t *b0 = k->b[0] + t * k->bstride, *b1 = k->b[1] + t * k->bstride;
        if (t + MOE_PF_TILES < k->kt) {
            pf_tile(b0 + MOE_PF_TILES * k->bstride, tb);
            pf_tile(b1 + MOE_PF_TILES * k->bstride, tb);
        }
        const uint8_t *x = k->a + r0 * k->lda + t * 64;
        for (int kp = 0; kp < 16; kp += 4)
            for (int i = 0; i < 4; i++) {
                int32_t x2;
                __builtin_memcpy(&x2, x + (kp + i) * 4, 4);
                __m512bh xb = (__m512bh)_mm512_set1_epi32(x2);
                a0[i] = _mm512_dpbf16_ps(
                    a0[i], xb, (__m512bh)_mm512_loadu_si512((const void *)(b0 + (kp + i) * 64)));
                a1[i] = _mm512_dpbf16_ps(
                    a1[i], xb, (__m512bh)_mm512_loadu_si512((const void *)(b1 + (kp + i) * 64)));
            }
    }
    _mm512_storeu_ps(k->out + r0 * 16,
                     _mm512_add_ps(_mm512_add_ps(a0[0], a0[1]), _mm512_add_ps(a0[2], a0[3])));
    _mm512_storeu_ps(k->out + (32 + r0) * 16,
                     _mm512_add_ps(_mm512_add_ps(a1[0], a1[1]), _mm512_add_ps(a1[2], a1[3])));
}

AVX_INLINE __m512i int4_row(const uint8_t *src, __m512i z) {
    __m256i v = _mm256_loadu_si256((const __m256i *)src);
    __m256i m = _mm256_set1_epi8(0x0f);
    __m256i lo = _mm256_and_si256(v, m), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);
    return _mm512_sub_epi8(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), z);
}

AVX_INLINE void int_rows(const moe_kargs *k, int r0, const int rn) {
    __m512 acc0[8], acc1[8];
    __m512i d0[8], d1[8];
    for (int r = 0; r < rn; r++) {
        acc0[r] = acc1[r] = _mm512_setzero_ps();
        d0[r] = d1[r] = _mm512_setzero_si512();
    }
    const uint8_t *a = k->a + r0 * k->lda;
    const __m512i bias = _mm512_set1_epi32((int)0x80808080u);
    const int is4 = k->fmt != OMPK_MOE_INT8;
    int g0 = k->ktg0 / k->ktpg, gcur = 0;
    __m512i z0 = _mm512_setzero_si512(), z1 = z0;
    if (is4) {
        z0 = _mm512_loadu_si512((const void *)k->z[0]);
        z1 = _mm512_loadu_si512((const void *)k->z[1]);
    }
    for (int t = 0; t < k->kt; t++) {
        int g = (k->ktg0 + t) / k->ktpg - g0;
        if (g != gcur) {
            __m512 s0 = _mm512_loadu_ps(k->s[0] + (size_t)gcur * k->sstride);
            __m512 s1 = _mm512_loadu_ps(k->s[1] + (size_t)gcur * k->sstride);
            __m512i c0 = _mm512_slli_epi32(
                _mm512_loadu_si512((const void *)(k->ws[0] + (size_t)gcur * k->sstride)), 7);
            __m512i c1 = _mm512_slli_epi32(
                _mm512_loadu_si512((const void *)(k->ws[1] + (size_t)gcur * k->sstride)), 7);
            for (int r = 0; r < rn; r++) {
                acc0[r] =
                    _mm512_fmadd_ps(s0, _mm512_cvtepi32_ps(_mm512_sub_epi32(d0[r], c0)), acc0[r]);
                acc1[r] =
                    _mm512_fmadd_ps(s1, _mm512_cvtepi32_ps(_mm512_sub_epi32(d1[r], c1)), acc1[r]);
                d0[r] = d1[r] = _mm512_setzero_si512();
            }
            gcur = g;
            if (is4) {
                z0 = _mm512_loadu_si512((const void *)(k->z[0] + (size_t)g * k->zstride));
                z1 = _mm512_loadu_si512((const void *)(k->z[1] + (size_t)g * k->zstride));
            }
        }
        const uint8_t *b0 = k->b[0] + t * k->bstride, *b1 = k->b[1] + t * k->bstride;
        if (rn <= 2 && t + MOE_PF_TILES < k->kt) {
            pf_tile(b0 + MOE_PF_TILES * k->bstride, is4 ? 512 : 1024);
            pf_tile(b1 + MOE_PF_TILES * k->bstride, is4 ? 512 : 1024);
        }
        for (int kq = 0; kq < 16; kq++) {
            __m512i w0, w1;
            if (is4) {
                w0 = int4_row(b0 + kq * 32, z0);
                w1 = int4_row(b1 + kq * 32, z1);
            } else {
                w0 = _mm512_loadu_si512((const void *)(b0 + kq * 64));
                w1 = _mm512_loadu_si512((const void *)(b1 + kq * 64));
            }
            for (int r = 0; r < rn; r++) {
                int32_t x4;
                __builtin_memcpy(&x4, a + r * k->lda + t * 64 + kq * 4, 4);
                __m512i xb = _mm512_xor_si512(_mm512_set1_epi32(x4), bias);
                d0[r] = _mm512_dpbusd_epi32(d0[r], xb, w0);
                d1[r] = _mm512_dpbusd_epi32(d1[r], xb, w1);
            }
        }
    }
    __m512 s0 = _mm512_loadu_ps(k->s[0] + (size_t)gcur * k->sstride);
    __m512 s1 = _mm512_loadu_ps(k->s[1] + (size_t)gcur * k->sstride);
    __m512i c0 = _mm512_slli_epi32(
        _mm512_loadu_si512((const void *)(k->ws[0] + (size_t)gcur * k->sstride)), 7);
    __m512i c1 = _mm512_slli_epi32(
        _mm512_loadu_si512((const void *)(k->ws[1] + (size_t)gcur * k->sstride)), 7);
    for (int r = 0; r < rn; r++) {
        acc0[r] = _mm512_fmadd_ps(s0, _mm512_cvtepi32_ps(_mm512_sub_epi32(d0[r], c0)), acc0[r]);
        acc1[r] = _mm512_fmadd_ps(s1, _mm512_cvtepi32_ps(_mm512_sub_epi32(d1[r], c1)), acc1[r]);
        __m512 as = _mm512_set1_ps(k->ascale[r0 + r]);
        _mm512_storeu_ps(k->out + (r0 + r) * 16, _mm512_mul_ps(acc0[r], as));
        _mm512_storeu_ps(k->out + (32 + r0 + r) * 16, _mm512_mul_ps(acc1[r], as));
    }
}

AVX_FN void moe_kern_avx512(const moe_kargs *k) {
    int r = 0;
    if (k->fmt == OMPK_MOE_BF16) {
        for (; r + 8 <= k->m; r += 8) bf16_rows(k, r, 8);
        if (r + 4 <= k->m) bf16_rows(k, r, 4), r += 4;
        if (r + 2 <= k->m) bf16_rows(k, r, 2), r += 2;
        if (r < k->m) bf16_row1(k, r);
    } else {
        for (; r + 8 <= k->m; r += 8) int_rows(k, r, 8);
        if (r + 4 <= k->m) int_rows(k, r, 4), r += 4;
        if (r + 2 <= k->m) int_rows(k, r, 2), r += 2;
        if (r < k->m) int_rows(k, r, 1);
    }
}

#else
void moe_kern_avx512(const moe_kargs *k) {
    moe_kern_portable(k);
}
#endif

/* ---- epilogues (AVX-512): SiLU*up and the weighted scatter into y partials ------------ */
#if defined(__x86_64__)
/* exp(x) for the SiLU: Cody-Waite reduction by ln2 and a degree-6 polynomial (about 1 ulp),
 * 2^n applied with scalef so overflow gives inf and underflow 0 */
AVX_INLINE __m512 exp512(__m512 x) {
    const __m512 l2e = _mm512_set1_ps(1.44269504088896341f);
    const __m512 c1 = _mm512_set1_ps(0.693359375f), c2 = _mm512_set1_ps(-2.12194440e-4f);
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(100.0f)), _mm512_set1_ps(-100.0f));
    __m512 n =
        _mm512_roundscale_ps(_mm512_mul_ps(x, l2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, c1, x);
    r = _mm512_fnmadd_ps(n, c2, r);
    __m512 p = _mm512_set1_ps(1.0f / 720.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

AVX_FN void moe_epi_silu_avx512(const float *out, int mr, void *dst, int64_t ld, int to_bf16) {
    for (int r = 0; r < mr; r++) {
        __m512 g = _mm512_loadu_ps(out + r * 16), u = _mm512_loadu_ps(out + (32 + r) * 16);
        __m512 den =
            _mm512_add_ps(_mm512_set1_ps(1.0f), exp512(_mm512_sub_ps(_mm512_setzero_ps(), g)));
        __m512 a = _mm512_mul_ps(_mm512_div_ps(g, den), u);
        if (to_bf16)
            _mm256_storeu_si256((__m256i *)((uint16_t *)dst + r * ld),
                                (__m256i)_mm512_cvtneps_pbh(a));
        else
            _mm512_storeu_ps((float *)dst + r * ld, a);
    }
}

AVX_FN void moe_epi_axpy_avx512(float *y, const float *out, int r, float w) {
    __m512 wv = _mm512_set1_ps(w);
    _mm512_storeu_ps(y, _mm512_fmadd_ps(wv, _mm512_loadu_ps(out + r * 16), _mm512_loadu_ps(y)));
    _mm512_storeu_ps(
        y + 16, _mm512_fmadd_ps(wv, _mm512_loadu_ps(out + (32 + r) * 16), _mm512_loadu_ps(y + 16)));
}
#else
void moe_epi_silu_avx512(const float *out, int mr, void *dst, int64_t ld, int to_bf16) {
    (void)out, (void)mr, (void)dst, (void)ld, (void)to_bf16;
}
void moe_epi_axpy_avx512(float *y, const float *out, int r, float w) {
    (void)y, (void)out, (void)r, (void)w;
}
#endif
