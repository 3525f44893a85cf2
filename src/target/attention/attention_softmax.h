/* The online-softmax step shared by the tensor-core attention forwards (attention_fast.c, bf16;
 * attention_f32tc.c, 3xTF32), on a warp's mma C fragments: a lane holds two query rows, r0 in
 * elements 0-1 and r1 in elements 2-3 of each 8-key n-tile, and a row's scores are spread over
 * the 4 lanes t4 = 0..3 of its quad. Needs ptx_mma.h (ptx_shfl_xor, ptx_ex2). */
#ifndef OMPK_ATTENTION_SOFTMAX_H
#define OMPK_ATTENTION_SOFTMAX_H

#include <math.h>

#include "ptx_mma.h"

#if defined(__clang__)
#define ATTS_UNROLL _Pragma("unroll")
#else
#define ATTS_UNROLL _Pragma("GCC unroll 16")
#endif

/* One key tile of NT n-tiles: scores s (scaled by sl2 = softmax scale * log2 e) become
 * unnormalised probabilities in place, keys at tile-relative positions >= c0 (row r0) or c1
 * (row r1) masked out; the running maxima m (log2 domain) and sums l move to the tile, and the
 * O accumulator (DH / 8 n-tiles) is rescaled to the new maxima. Rows with nothing visible yet
 * keep m = -inf, and their exponentials are taken against 0 so that p = 0. */
static inline __attribute__((always_inline)) void
att_softmax_tile(float (*s)[4], const int NT, float (*o)[4], const int DH, int t4, int c0, int c1,
                 float sl2, float *m0, float *m1, float *l0, float *l1) {
    float mx0 = *m0, mx1 = *m1;
    ATTS_UNROLL
    for (int nt = 0; nt < NT; nt++) ATTS_UNROLL
    for (int e = 0; e < 4; e++) {
        const int key = nt * 8 + t4 * 2 + (e & 1);
        const float x = key < (e < 2 ? c0 : c1) ? s[nt][e] * sl2 : -INFINITY;
        s[nt][e] = x;
        if (e < 2)
            mx0 = x > mx0 ? x : mx0;
        else
            mx1 = x > mx1 ? x : mx1;
    }
    mx0 = fmaxf(mx0, ptx_shfl_xor(mx0, 1));
    mx0 = fmaxf(mx0, ptx_shfl_xor(mx0, 2));
    mx1 = fmaxf(mx1, ptx_shfl_xor(mx1, 1));
    mx1 = fmaxf(mx1, ptx_shfl_xor(mx1, 2));
    const float base0 = mx0 == -INFINITY ? 0.f : mx0, base1 = mx1 == -INFINITY ? 0.f : mx1;
    const float a0 = ptx_ex2(*m0 - base0), a1 = ptx_ex2(*m1 - base1);
    *m0 = mx0;
    *m1 = mx1;
    float ps0 = 0.f, ps1 = 0.f;
    ATTS_UNROLL
    for (int nt = 0; nt < NT; nt++) {
        s[nt][0] = ptx_ex2(s[nt][0] - base0);
        s[nt][1] = ptx_ex2(s[nt][1] - base0);
        s[nt][2] = ptx_ex2(s[nt][2] - base1);
        s[nt][3] = ptx_ex2(s[nt][3] - base1);
        ps0 += s[nt][0] + s[nt][1];
        ps1 += s[nt][2] + s[nt][3];
    }
    *l0 = *l0 * a0 + ps0;
    *l1 = *l1 * a1 + ps1;
    ATTS_UNROLL
    for (int n = 0; n < DH / 8; n++) {
        o[n][0] *= a0;
        o[n][1] *= a0;
        o[n][2] *= a1;
        o[n][3] *= a1;
    }
}

#endif
