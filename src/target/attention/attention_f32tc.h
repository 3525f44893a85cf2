/* The 3xTF32 tensor-core pieces shared by the f32 GPU forward (attention_f32tc.c) and backward
 * (attention_f32tc_bwd.c): the operand split, the three-mma product, tile loads, and the two
 * warp products every f32 kernel is made of. A warp owns 16 rows (r0 = gq, r1 = gq + 8 of its
 * block; lanes gq = lane / 4, t4 = lane % 4); a tile is ATTT rows of a [row][dh] operand in
 * team-shared memory.
 *  - attt_mm_nt: acc[nt] += own rows x tile rows^T over dh (Q K^T in the forward). The own rows
 *    are raw f32 registers xr[c][0|1][4] = columns 16c + 4 t4 .. + 3 of r0 / r1, split per use;
 *    the tile is read at pitch ATTT_LDK. C layout: acc[nt][0..1] row r0, tile rows nt*8 + 2 t4
 *    (+1); [2..3] row r1.
 *    TR: the own rows play the forward's K (S^T = K Q^T): the bits of S's elements, transposed.
 *  - attt_mm_nn: o += w x tile over the tile's rows (P V in the forward): w in that C layout,
 *    the tile read at pitch ATTT_LDV; o's n-tile 2j + h, column n is dh column 16j + 2n + h.
 * SAFE: the split that keeps NaN and inf (attt_split), for calls with a non-finite operand;
 * else attt_split_finite.
 * The k index of every mma is permuted (a dot product allows it) so that fragments come from
 * wide loads and from registers; attention_f32tc.c says how. */
#ifndef OMPK_ATTENTION_F32TC_H
#define OMPK_ATTENTION_F32TC_H

#include <stdint.h>

#include "attention_kernels.h"
#include "bare.h"

#if defined(__clang__)
#define ATTT_UNROLL _Pragma("unroll")
#define ATTT_NO_UNROLL _Pragma("unroll 1")
#else
#define ATTT_UNROLL _Pragma("GCC unroll 16")
#define ATTT_NO_UNROLL _Pragma("GCC unroll 1")
#endif

/* Row pitches in floats: rows read 16 bytes per lane (attt_mm_nt, pitch 16 mod 32 floats) or 8
 * bytes per lane two rows apart (attt_mm_nn, pitch 4 mod 16 floats); both keep 16-byte row
 * starts. */
#define ATTT_LDK(DH) ((DH) % 32 == 0 ? (DH) + 16 : (DH) + 32)
#define ATTT_LDV(DH) ((DH) + 4)
#define ATTT_LOG2E 1.4426950408889634f
#define ATTT_LN2 0.6931471805599453f

#ifdef OMPK_NV_KERNELS
#include "ptx_mma.h"
#define ATTT_INLINE static inline __attribute__((always_inline))
#define attt_mma ptx_mma_tf32_1688
#define attt_xor ptx_shfl_xor
#define attt_ex2 ptx_ex2
#define attt_cp16 ptx_cp_async16
#define attt_cp_commit ptx_cp_async_commit
#define attt_cp_wait1 ptx_cp_async_wait1

#ifdef OMPK_EMULATE
ATTT_INLINE float attt_opaque(float x) {
    return x;
}
#else
ATTT_INLINE __attribute__((unused)) float attt_opaque(float x) {
    return x;
}
#pragma omp begin declare variant match(device = {arch(nvptx64)})
/* x, as a value the compiler cannot see through: keeps the split of loop-invariant own-row
 * fragments inside the tile loop (hoisted, hi and lo would take DH registers more and spill at
 * dh 128). */
ATTT_INLINE __attribute__((unused)) float attt_opaque(float x) {
    float y;
    __asm__ volatile("mov.b32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
#pragma omp end declare variant
#endif

typedef struct attt_f4 {
    float v[4];
} __attribute__((aligned(16))) attt_f4;

typedef struct attt_f2 {
    float v[2];
} __attribute__((aligned(8))) attt_f2;

ATTT_INLINE uint32_t attt_bits(float x) {
    union {
        float f;
        uint32_t u;
    } c;
    c.f = x;
    return c.u;
}

ATTT_INLINE float attt_float(uint32_t u) {
    union {
        uint32_t u;
        float f;
    } c;
    c.u = u;
    return c.f;
}

/* x = hi + lo: hi is x truncated to tf32, lo the exact remainder (|lo| < 2^-10 |x|, the sign
 * of x) truncated to tf32. An infinite operand b meets a_lo * b_hi + a_hi * b_hi (+ a_hi * b_lo)
 * and must give sign(a) * inf, as one product would: so lo never has the opposite sign of hi
 * (rounding hi would allow it, and inf - inf), and a nonzero x never has lo = 0 (0 * inf): lo is
 * then the smallest normal with x's sign, whose products are negligible or flushed. NaN stays
 * NaN in hi (truncation could turn a NaN with a small payload into inf). */
ATTT_INLINE void attt_split(float x, uint32_t *hi, uint32_t *lo) {
    const uint32_t u = attt_bits(x), mag = u & 0x7fffffffu, tiny = (u & 0x80000000u) | 0x00800000u;
    const uint32_t h = mag > 0x7f800000u ? 0x7fffffffu : u & 0xffffe000u;
    const uint32_t l = attt_bits(x - attt_float(h)) & 0xffffe000u;
    *hi = h;
    *lo = mag == 0u ? 0u : mag >= 0x7f800000u || (l & 0x7fffffffu) == 0u ? tiny : l;
}

/* The split for a call whose operands are all finite (then every operand a kernel splits is
 * finite): hi truncated to tf32, lo the remainder rounded to tf32 (half away from zero), so
 * hi + lo is x to 2^-22 |x| (attt_split's truncated lo: 2^-21). About a third of attt_split's
 * instructions: the split runs for every operand of every mma, and the kernels issue-bound. */
ATTT_INLINE void attt_split_finite(float x, uint32_t *hi, uint32_t *lo) {
    const uint32_t h = attt_bits(x) & 0xffffe000u;
    *hi = h;
    *lo = (attt_bits(x - attt_float(h)) + 0x1000u) & 0xffffe000u;
}

/* attt_split (SAFE: some operand of the call is not finite) or attt_split_finite */
ATTT_INLINE void attt_split2(const int SAFE, float x, uint32_t *hi, uint32_t *lo) {
    if (SAFE)
        attt_split(x, hi, lo);
    else
        attt_split_finite(x, hi, lo);
}

/* c += a * b in 3xTF32: the two small cross terms first, then the large one. */
ATTT_INLINE void attt_mma3(float c[4], const uint32_t ah[4], const uint32_t al[4], uint32_t bh0,
                           uint32_t bh1, uint32_t bl0, uint32_t bl1) {
    attt_mma(c, al, bh0, bh1);
    attt_mma(c, ah, bl0, bl1);
    attt_mma(c, ah, bh0, bh1);
}

/* attt_mma3 for a product whose operands swap roles (x^T y^T of the y x that attt_mma3 takes):
 * the same products added in the same order (lo of the B side first), so every element of the
 * result has the bits of the transposed element of attt_mma3's. */
ATTT_INLINE void attt_mma3t(float c[4], const uint32_t ah[4], const uint32_t al[4], uint32_t bh0,
                            uint32_t bh1, uint32_t bl0, uint32_t bl1) {
    attt_mma(c, ah, bl0, bl1);
    attt_mma(c, al, bh0, bh1);
    attt_mma(c, ah, bh0, bh1);
}

/* Rows r0 .. r0 + rows - 1 of a [row][dh] operand (row stride rs) into a shared tile of pitch
 * ld, zeros past n, by the team's 128 threads. */
ATTT_INLINE void attt_load_rows(float *tile, const float *base, int64_t rs, int64_t r0, int64_t n,
                                int tid, int ld, const int rows, const int DH) {
    for (int c = tid; c < rows * DH / 4; c += 128) {
        const int rr = c / (DH / 4), cc = (c - rr * (DH / 4)) * 4;
        float *d = tile + rr * ld + cc;
        if (r0 + rr < n) {
            attt_cp16(d, base + (r0 + rr) * rs + cc);
        } else {
            attt_f4 z = {{0.f, 0.f, 0.f, 0.f}};
            *(attt_f4 *)d = z;
        }
    }
}

/* The warp's own rows r0, r1 of a [row][dh] operand (NULL: a row past the end, zeros) as the
 * raw fragments attt_mm_nt takes. */
ATTT_INLINE void attt_own_rows(float xr[][2][4], const float *p0, const float *p1, int t4,
                               const int DH) {
    ATTT_UNROLL
    for (int c = 0; c < DH / 16; c++) {
        const attt_f4 z = {{0.f, 0.f, 0.f, 0.f}};
        const attt_f4 x0 = p0 ? *(const attt_f4 *)(p0 + c * 16 + t4 * 4) : z;
        const attt_f4 x1 = p1 ? *(const attt_f4 *)(p1 + c * 16 + t4 * 4) : z;
        ATTT_UNROLL
        for (int i = 0; i < 4; i++) {
            xr[c][0][i] = x0.v[i];
            xr[c][1][i] = x1.v[i];
        }
    }
}

/* acc[nt] (NT n-tiles of 8 tile rows) += own rows x tile rows^T over the 16 columns 16c .. 16c + 15
 * (xc = xr[c]; tile at column 16c, pitch ld), into a fresh accumulator first: large logits
 * would otherwise round every product into a sum of their full size. */
ATTT_INLINE void attt_mm_nt16(float (*acc)[4], const int NT, float xc[2][4], const float *tile,
                              int ld, int gq, int t4, const int SAFE, const int TR) {
    /* A fragments of k-steps 2c (columns +0, +1) and 2c+1 (+2, +3) */
    uint32_t ah[2][4], al[2][4];
    ATTT_UNROLL
    for (int st = 0; st < 2; st++) {
        attt_split2(SAFE, attt_opaque(xc[0][2 * st]), &ah[st][0], &al[st][0]);
        attt_split2(SAFE, attt_opaque(xc[1][2 * st]), &ah[st][1], &al[st][1]);
        attt_split2(SAFE, attt_opaque(xc[0][2 * st + 1]), &ah[st][2], &al[st][2]);
        attt_split2(SAFE, attt_opaque(xc[1][2 * st + 1]), &ah[st][3], &al[st][3]);
    }
    ATTT_UNROLL
    for (int nt = 0; nt < NT; nt++) {
        const attt_f4 kv = *(const attt_f4 *)(tile + (nt * 8 + gq) * ld + t4 * 4);
        uint32_t bh[4], bl[4];
        ATTT_UNROLL
        for (int i = 0; i < 4; i++) attt_split2(SAFE, kv.v[i], &bh[i], &bl[i]);
        float t[4] = {0.f, 0.f, 0.f, 0.f};
        if (TR) {
            attt_mma3t(t, ah[0], al[0], bh[0], bh[1], bl[0], bl[1]);
            attt_mma3t(t, ah[1], al[1], bh[2], bh[3], bl[2], bl[3]);
        } else {
            attt_mma3(t, ah[0], al[0], bh[0], bh[1], bl[0], bl[1]);
            attt_mma3(t, ah[1], al[1], bh[2], bh[3], bl[2], bl[3]);
        }
        ATTT_UNROLL
        for (int e = 0; e < 4; e++) acc[nt][e] += t[e];
    }
}

/* acc[nt] += own rows (registers) x tile rows^T over dh (tile pitch ATTT_LDK). */
ATTT_INLINE void attt_mm_nt(float (*acc)[4], const int NT, float xr[][2][4], const float *tile,
                            int gq, int t4, const int DH, const int SAFE, const int TR) {
    ATTT_UNROLL
    for (int c = 0; c < DH / 16; c++)
        attt_mm_nt16(acc, NT, xr[c], tile + c * 16, ATTT_LDK(DH), gq, t4, SAFE, TR);
}

/* attt_mm_nt with the own rows read from memory (p0, p1; NULL: zeros) 16 columns at a time, for
 * a kernel whose registers hold other row sets: the loads stay inside the tile loop. */
ATTT_INLINE void attt_mm_nt_mem(float (*acc)[4], const int NT, const float *p0, const float *p1,
                                const float *tile, int gq, int t4, const int DH, const int SAFE,
                                const int TR) {
    /* not unrolled: nothing here is indexed by c in registers, and unrolling would let the
     * scheduler hoist every chunk's loads */
    ATTT_NO_UNROLL
    for (int c = 0; c < DH / 16; c++) {
        float xc[2][4];
        const attt_f4 z = {{0.f, 0.f, 0.f, 0.f}};
        const attt_f4 x0 = p0 ? *(const attt_f4 *)(p0 + c * 16 + t4 * 4) : z;
        const attt_f4 x1 = p1 ? *(const attt_f4 *)(p1 + c * 16 + t4 * 4) : z;
        ATTT_UNROLL
        for (int i = 0; i < 4; i++) {
            xc[0][i] = x0.v[i];
            xc[1][i] = x1.v[i];
        }
        attt_mm_nt16(acc, NT, xc, tile + c * 16, ATTT_LDK(DH), gq, t4, SAFE, TR);
    }
}

/* o (DH / 8 n-tiles) += w x tile: w holds KT groups of 8 tile rows in the C layout of
 * attt_mm_nt (k = t4 is tile row 8 kk + 2 t4, element 0 / 2; k = t4 + 4 the next row). */
ATTT_INLINE void attt_mm_nn(float (*o)[4], float (*w)[4], const int KT, const float *tile, int gq,
                            int t4, const int DH, const int SAFE) {
    const int ld = ATTT_LDV(DH);
    ATTT_UNROLL
    for (int kk = 0; kk < KT; kk++) {
        uint32_t ph[4], pl[4];
        attt_split2(SAFE, w[kk][0], &ph[0], &pl[0]);
        attt_split2(SAFE, w[kk][2], &ph[1], &pl[1]);
        attt_split2(SAFE, w[kk][1], &ph[2], &pl[2]);
        attt_split2(SAFE, w[kk][3], &ph[3], &pl[3]);
        const float *v0 = tile + (kk * 8 + t4 * 2) * ld + gq * 2;
        ATTT_UNROLL
        for (int j = 0; j < DH / 16; j++) {
            /* x0 / x1: tile rows 2 t4 / 2 t4 + 1 (B rows k = t4 / t4 + 4) of n-tiles 2j, 2j+1 */
            const attt_f2 x0 = *(const attt_f2 *)(v0 + j * 16);
            const attt_f2 x1 = *(const attt_f2 *)(v0 + ld + j * 16);
            uint32_t bh[4], bl[4];
            attt_split2(SAFE, x0.v[0], &bh[0], &bl[0]);
            attt_split2(SAFE, x1.v[0], &bh[1], &bl[1]);
            attt_split2(SAFE, x0.v[1], &bh[2], &bl[2]);
            attt_split2(SAFE, x1.v[1], &bh[3], &bl[3]);
            attt_mma3(o[2 * j], ph, pl, bh[0], bh[1], bl[0], bl[1]);
            attt_mma3(o[2 * j + 1], ph, pl, bh[2], bh[3], bl[2], bl[3]);
        }
    }
}

/* Rows r0, r1 of a DH-wide accumulator in attt_mm_nn's layout, times mul, to rows of stride rs
 * (a row at or past n is not written). */
ATTT_INLINE void attt_store_rows(float *base, int64_t rs, int64_t r0, int64_t r1, int64_t n,
                                 float (*o)[4], float mul0, float mul1, int t4, const int DH) {
    ATTT_UNROLL
    for (int j = 0; j < DH / 16; j++) {
        /* columns 16j + 4 t4 .. + 3 are elements 0 and 1 of n-tiles 2j, 2j+1 interleaved */
        const attt_f4 y0 = {{o[2 * j][0] * mul0, o[2 * j + 1][0] * mul0, o[2 * j][1] * mul0,
                             o[2 * j + 1][1] * mul0}};
        const attt_f4 y1 = {{o[2 * j][2] * mul1, o[2 * j + 1][2] * mul1, o[2 * j][3] * mul1,
                             o[2 * j + 1][3] * mul1}};
        if (r0 < n) *(attt_f4 *)(base + r0 * rs + j * 16 + t4 * 4) = y0;
        if (r1 < n) *(attt_f4 *)(base + r1 * rs + j * 16 + t4 * 4) = y1;
    }
}

#endif /* OMPK_NV_KERNELS */
#endif
