/* Internal: 8-float vectors for the host forms of the mHC kernels (GCC/Clang vector extensions,
 * so both host compilers emit whole-vector FMAs on AVX2). Used outside target regions only. The
 * vectors move by memcpy: no alignment is needed. */
#ifndef OMPK_MHC_HOST_VEC_H
#define OMPK_MHC_HOST_VEC_H

#include <stdint.h>

#include "bf16.h"

typedef float mhc_f8 __attribute__((vector_size(32)));
typedef uint32_t mhc_u8 __attribute__((vector_size(32)));
typedef int32_t mhc_i8 __attribute__((vector_size(32)));
typedef uint16_t mhc_h8 __attribute__((vector_size(16)));

/* 8 elements (f32|bf16) at p: one vector move when vec (consecutive elements), else ne elements
 * st apart and zeros after them */
static inline mhc_f8 mhc_f8_load(const char *p, int64_t st, int bf16, int vec, int ne) {
    mhc_f8 f;
    if (vec && bf16) {
        mhc_h8 h;
        __builtin_memcpy(&h, p, sizeof h);
        const mhc_u8 u = __builtin_convertvector(h, mhc_u8) << 16;
        __builtin_memcpy(&f, &u, sizeof f);
    } else if (vec) {
        __builtin_memcpy(&f, p, sizeof f);
    } else {
        for (int e = 0; e < 8; e++) f[e] = e < ne ? ompk_load_f(p, e * st, bf16) : 0.f;
    }
    return f;
}

static inline void mhc_f8_store(char *p, int64_t st, int bf16, int vec, int ne, mhc_f8 f) {
    if (vec && bf16) {
        /* ompk_f32_to_bf16 on 8 lanes */
        mhc_u8 u;
        __builtin_memcpy(&u, &f, sizeof u);
        const mhc_u8 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
        const mhc_u8 nan = (u >> 16) | 0x40u;
        const mhc_u8 isnan = (mhc_u8)((mhc_i8)(u & 0x7fffffffu) > 0x7f800000);
        const mhc_h8 h = __builtin_convertvector((isnan & nan) | (~isnan & rounded), mhc_h8);
        __builtin_memcpy(p, &h, sizeof h);
    } else if (vec) {
        __builtin_memcpy(p, &f, sizeof f);
    } else {
        for (int e = 0; e < ne; e++) ompk_store_f(p, e * st, f[e], bf16);
    }
}

#endif
