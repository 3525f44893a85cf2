/* The AMX tile kernel on the real instructions (moe_amx_tmpl.h). Only called after
 * moe_cpu_has_amx() confirmed CPUID, XCR0 and the XTILEDATA permission. */
#include <math.h>

#include "moe_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define MOE_AMX_FN                                                                                 \
    __attribute__((target("amx-tile,amx-bf16,amx-int8,avx512f,avx512bw,avx512vl,fma")))
#define MOE_AMX_NAME moe_kern_amx
#define MOE_AMX_NAME_N moe_kern_amx_n
#define MOE_AMX_FLUSH moe_amx_flush
#define T_CFG(c) OMPK_AMX_LOADCFG(c)
#define T_LOAD(i, p, s) _tile_loadd(i, p, s)
#define T_STORE(i, p, s) _tile_stored(i, p, s)
#define T_ZERO(i) _tile_zero(i)
#define T_DPBF16(c, a, b) _tile_dpbf16ps(c, a, b)
#define T_DPBSSD(c, a, b) _tile_dpbssd(c, a, b)
#define T_UNPACK4(d, s, z) moe_amx_unpack4(d, s, z)
#define T_PF(p0, p1, n) moe_amx_prefetch(p0, p1, n)
#define T_PF1(p) _mm_prefetch((const char *)(p), _MM_HINT_T1)
#define MOE_AMX_PIPE moe_amx_pipe

MOE_AMX_FN static inline void moe_amx_prefetch(const uint8_t *p0, const uint8_t *p1, int n) {
    for (int o = 0; o < n; o += 64) {
        _mm_prefetch((const char *)(p0 + o), _MM_HINT_T1);
        _mm_prefetch((const char *)(p1 + o), _MM_HINT_T1);
    }
}

/* 16 rows of 32 nibble bytes -> 16 rows of 64 int8 (low nibbles first), minus the zero vector */
MOE_AMX_FN static inline void moe_amx_unpack4(uint8_t *dst, const uint8_t *src, const uint8_t *z) {
    const __m512i zv = _mm512_loadu_si512((const void *)z);
    const __m256i m = _mm256_set1_epi8(0x0f);
    for (int r = 0; r < 16; r++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(src + r * 32));
        __m256i lo = _mm256_and_si256(v, m), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);
        __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        _mm512_storeu_si512((void *)(dst + r * 64), _mm512_sub_epi8(w, zv));
    }
}

#include "moe_amx_tmpl.h"

MOE_AMX_FN void moe_amx_release(void) {
    _tile_release();
}

#else
void moe_kern_amx(const moe_kargs *k) {
    moe_kern_portable(k);
}
void moe_amx_release(void) {}
#endif
