/* Internal: 8-element chunks moved as 16-byte words (one ld.v4 / st.v4 per 16 bytes on the GPU,
 * plain vector moves on the host). Callers guarantee 16-byte alignment. Header-only, usable in
 * target regions. */
#ifndef OMPK_VEC8_H
#define OMPK_VEC8_H

#include <stdint.h>

#include "bf16.h"

typedef struct ompk_u128 {
    uint32_t w[4];
} __attribute__((aligned(16))) ompk_u128;

static inline void ompk_load8(const void *p, int is_bf16, float v[8]) {
    if (is_bf16) {
        ompk_u128 a = *(const ompk_u128 *)p;
#pragma GCC unroll 8
        for (int k = 0; k < 4; k++) {
            ompk_f32_bits lo, hi;
            lo.u = a.w[k] << 16;
            hi.u = a.w[k] & 0xffff0000u;
            v[2 * k] = lo.f;
            v[2 * k + 1] = hi.f;
        }
    } else {
        ompk_u128 a = ((const ompk_u128 *)p)[0], b = ((const ompk_u128 *)p)[1];
#pragma GCC unroll 8
        for (int k = 0; k < 4; k++) {
            ompk_f32_bits x, y;
            x.u = a.w[k];
            y.u = b.w[k];
            v[k] = x.f;
            v[4 + k] = y.f;
        }
    }
}

static inline void ompk_store8(void *p, int is_bf16, const float v[8]) {
    if (is_bf16) {
        ompk_u128 a;
#pragma GCC unroll 8
        for (int k = 0; k < 4; k++)
            a.w[k] = (uint32_t)ompk_f32_to_bf16(v[2 * k]) |
                     ((uint32_t)ompk_f32_to_bf16(v[2 * k + 1]) << 16);
        *(ompk_u128 *)p = a;
    } else {
        ompk_u128 a, b;
#pragma GCC unroll 8
        for (int k = 0; k < 4; k++) {
            ompk_f32_bits x, y;
            x.f = v[k];
            y.f = v[4 + k];
            a.w[k] = x.u;
            b.w[k] = y.u;
        }
        ((ompk_u128 *)p)[0] = a;
        ((ompk_u128 *)p)[1] = b;
    }
}

#endif
