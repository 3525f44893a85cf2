/* Internal: bf16 <-> f32 conversions usable inside target regions (header-only, static inline,
 * no libc calls). Rounding is round-to-nearest-even; NaN stays NaN (quiet). */
#ifndef OMPK_BF16_H
#define OMPK_BF16_H

#include <stdint.h>

typedef union ompk_f32_bits {
    float f;
    uint32_t u;
} ompk_f32_bits;

static inline float ompk_bf16_to_f32(uint16_t h) {
    ompk_f32_bits b;
    b.u = (uint32_t)h << 16;
    return b.f;
}

static inline uint16_t ompk_f32_to_bf16(float f) {
    ompk_f32_bits b;
    b.f = f;
    /* branch-free, so loops over it vectorise on the host and stay uniform on the GPU */
    uint32_t rounded = (b.u + 0x7fffu + ((b.u >> 16) & 1u)) >> 16;
    uint32_t quiet_nan = (b.u >> 16) | 0x40u;
    return (uint16_t)((b.u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

/* Round an f32 value to the nearest bf16 and back (what storing to bf16 does to it). */
static inline float ompk_round_bf16(float f) {
    return ompk_bf16_to_f32(ompk_f32_to_bf16(f));
}

/* Load element `i` of a float array stored as f32 (is_bf16 == 0) or bf16. */
static inline float ompk_load_f(const void *p, int64_t i, int is_bf16) {
    return is_bf16 ? ompk_bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static inline void ompk_store_f(void *p, int64_t i, float v, int is_bf16) {
    if (is_bf16)
        ((uint16_t *)p)[i] = ompk_f32_to_bf16(v);
    else
        ((float *)p)[i] = v;
}

#endif
