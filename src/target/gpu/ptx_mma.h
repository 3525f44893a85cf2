/* Warp-level PTX for ompx_bare kernels on sm_80 and later: bf16 tensor-core mma.sync, ldmatrix,
 * cp.async, shuffles and bf16 packing, as nvptx64 variants of plain C functions.
 *
 * Each function has a host body beside its nvptx64 variant because the host compilation of a
 * bare target region still needs one. Only ptx_pack_bf16x2 means the same thing on the host; the
 * warp-collective ones (mma, ldmatrix, shuffles, cp.async groups) have no single-thread meaning,
 * so their host bodies are placeholders and callers must launch such regions on devices only
 * (their dispatch checks ex.on_target). Available when OMPK_NV_DEVICE is defined (bare.h): clang
 * NVPTX offload builds; elsewhere only the host bodies exist. With OMPK_EMULATE (tests) the host
 * bodies emulate the warp collectives instead (below).
 *
 * Fragment layouts (m16n8k16, row.col; lane = 4 * g + t, g = lane / 4, t = lane % 4):
 *   A (16 x 16, two bf16 per register): a[0] = A[g][2t..2t+1], a[1] = A[g+8][2t..2t+1],
 *     a[2] = A[g][2t+8..2t+9], a[3] = A[g+8][2t+8..2t+9];
 *   B (16 x 8): b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g];
 *   C (16 x 8, f32): c[0..1] = C[g][2t..2t+1], c[2..3] = C[g+8][2t..2t+1].
 * The reduction index k occurs in A and B alike, so any permutation of k applied to both gives
 * the same product: a lane may load 8 consecutive elements of a row as 16 bytes and use them as
 * its k-slots of two consecutive k16 steps. */
#ifndef OMPK_PTX_MMA_H
#define OMPK_PTX_MMA_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bare.h"

#define PTX_INLINE static inline __attribute__((always_inline, unused))

/* Round two floats to bf16 (nearest even; NaN stays NaN) and pack them, lo in the low half. */
PTX_INLINE uint32_t ptx_pack_bf16x2(float lo, float hi) {
    union {
        float f;
        uint32_t u;
    } a, b;
    a.f = lo;
    b.f = hi;
    const uint32_t ra = (a.u + 0x7fffu + ((a.u >> 16) & 1u)) >> 16;
    const uint32_t rb = (b.u + 0x7fffu + ((b.u >> 16) & 1u)) & 0xffff0000u;
    const uint32_t na = (a.u >> 16) | 0x40u, nb = (b.u | 0x400000u) & 0xffff0000u;
    return ((a.u & 0x7fffffffu) > 0x7f800000u ? na : ra) |
           ((b.u & 0x7fffffffu) > 0x7f800000u ? nb : rb);
}

/* The low (hi = 0) or high (hi = 1) bf16 of a packed pair as f32 (exact). */
PTX_INLINE float ptx_bf16_half(uint32_t w, int hi) {
    union {
        uint32_t u;
        float f;
    } x;
    x.u = hi ? (w & 0xffff0000u) : (w << 16);
    return x.f;
}

#ifdef OMPK_EMULATE
/* Host emulation for tests: a team runs as an emulated team (bare.h: thread number = thread id in
 * the team, a warp = 32 consecutive threads), every thread makes the same calls, and the
 * collectives exchange fragments through memory between two barriers. */
#define PTX_EMU_THREADS 1024
/* out of line: each call is two barriers anyway */
#define PTX_EMU_FN static __attribute__((noinline, unused))
static uint32_t ptx_emu_u[PTX_EMU_THREADS][6];
static const uint16_t *ptx_emu_p[PTX_EMU_THREADS];
static float ptx_emu_f[PTX_EMU_THREADS];

/* The GPU's arithmetic returns its one canonical NaN, 0x7fffffff (an x86 NaN is 0xffc00000 or
 * the operand's): the emulated instructions do the same, so bit tricks on a NaN act as there. */
static inline float ptx_emu_canon(float x) {
    union {
        uint32_t u;
        float f;
    } c;
    c.f = x;
    if (x != x) c.u = 0x7fffffffu;
    return c.f;
}

/* Element kk of a fragment register: bf16 operands hold two k in a register (low half first),
 * tf32 operands one (f32 bit patterns of which the tensor cores read the top 19 bits). Products
 * of two such values are exact in f32. */
static inline float ptx_emu_elem(uint32_t w, int kk, int tf32) {
    union {
        uint32_t u;
        float f;
    } x;
    x.u = w & 0xffffe000u;
    return tf32 ? x.f : ptx_bf16_half(w, kk & 1);
}

/* c += A * B for the warp's m16n8k16 bf16 or m16n8k8 tf32 tile, from the 32 lanes' fragments:
 * a register holds P = 2 (bf16) or 1 (tf32) consecutive k, a lane 4 P of them per register. */
PTX_EMU_FN void ptx_emu_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1, int tf32) {
    const int tid = OMPK_TID(), w0 = tid & ~31, lane = tid & 31;
    const int P = tf32 ? 1 : 2, KG = 4 * P;
    for (int i = 0; i < 4; i++) ptx_emu_u[tid][i] = a[i];
    ptx_emu_u[tid][4] = b0;
    ptx_emu_u[tid][5] = b1;
    OMPK_SYNC();
    const int g = lane >> 2, t = lane & 3;
    for (int e = 0; e < 4; e++) {
        const int row = g + (e >= 2 ? 8 : 0), col = t * 2 + (e & 1);
        float acc = c[e];
        for (int kk = 0; kk < 2 * KG; kk++) {
            /* A[row][kk]: lane (row % 8) * 4 + (kk % KG) / P, register row / 8 + 2 (kk / KG) */
            const int al = (row & 7) * 4 + (kk % KG) / P, ar = (row >> 3) + 2 * (kk / KG);
            /* B[kk][col]: lane col * 4 + (kk % KG) / P, register 4 + kk / KG */
            const int bl = col * 4 + (kk % KG) / P, br = 4 + kk / KG;
            acc += ptx_emu_elem(ptx_emu_u[w0 + al][ar], kk, tf32) *
                   ptx_emu_elem(ptx_emu_u[w0 + bl][br], kk, tf32);
        }
        c[e] = ptx_emu_canon(acc);
    }
    OMPK_SYNC();
}

PTX_EMU_FN void ptx_mma_bf16_16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    ptx_emu_mma(c, a, b0, b1, 0);
}

PTX_EMU_FN void ptx_mma_tf32_1688(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    ptx_emu_mma(c, a, b0, b1, 1);
}

PTX_EMU_FN void ptx_emu_ldsm(uint32_t r[4], const uint16_t *p, int trans) {
    const int tid = OMPK_TID(), w0 = tid & ~31, lane = tid & 31;
    ptx_emu_p[tid] = p;
    OMPK_SYNC();
    const int g = lane >> 2, t = lane & 3;
    for (int mi = 0; mi < 4; mi++) {
        if (trans) {
            const uint16_t *r0 = ptx_emu_p[w0 + mi * 8 + t * 2],
                           *r1 = ptx_emu_p[w0 + mi * 8 + t * 2 + 1];
            r[mi] = (uint32_t)r0[g] | ((uint32_t)r1[g] << 16);
        } else {
            const uint16_t *rp = ptx_emu_p[w0 + mi * 8 + g];
            r[mi] = (uint32_t)rp[2 * t] | ((uint32_t)rp[2 * t + 1] << 16);
        }
    }
    OMPK_SYNC();
}
PTX_EMU_FN void ptx_ldsm_x4(uint32_t r[4], const uint16_t *p) {
    ptx_emu_ldsm(r, p, 0);
}
PTX_EMU_FN void ptx_ldsm_x4_trans(uint32_t r[4], const uint16_t *p) {
    ptx_emu_ldsm(r, p, 1);
}

PTX_EMU_FN float ptx_shfl_xor(float v, int mask) {
    const int tid = OMPK_TID();
    ptx_emu_f[tid] = v;
    OMPK_SYNC();
    const float o = ptx_emu_f[tid ^ mask];
    OMPK_SYNC();
    return o;
}
#else
/* c += A * B for one m16n8k16 tile, bf16 inputs, f32 accumulation (layouts above). */
PTX_INLINE void ptx_mma_bf16_16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    (void)c, (void)a, (void)b0, (void)b1;
}
/* c += A * B for one m16n8k8 tile, tf32 inputs (f32 bit patterns), f32 accumulation. */
PTX_INLINE void ptx_mma_tf32_1688(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    (void)c, (void)a, (void)b0, (void)b1;
}

/* ldmatrix .x4 (.trans): lane l gives the shared address of row l % 8 of 8x8 matrix l / 8. */
PTX_INLINE void ptx_ldsm_x4(uint32_t r[4], const uint16_t *p) {
    (void)p;
    r[0] = r[1] = r[2] = r[3] = 0;
}
PTX_INLINE void ptx_ldsm_x4_trans(uint32_t r[4], const uint16_t *p) {
    (void)p;
    r[0] = r[1] = r[2] = r[3] = 0;
}

/* butterfly shuffle across the full warp */
PTX_INLINE float ptx_shfl_xor(float v, int mask) {
    (void)mask;
    return v;
}
#endif

/* 2^x; the GPU's ex2.approx (2 ulp) */
PTX_INLINE float ptx_ex2(float x) {
#ifdef OMPK_EMULATE
    return ptx_emu_canon(exp2f(x));
#else
    return exp2f(x);
#endif
}

/* 16 bytes global -> shared without a register round trip; groups complete in commit order */
PTX_INLINE void ptx_cp_async16(void *dst_shared, const void *src_global) {
    memcpy(dst_shared, src_global, 16);
}
PTX_INLINE void ptx_cp_async_commit(void) {}
/* wait until at most `n` (a constant 0 or 1) of this thread's committed groups are pending */
PTX_INLINE void ptx_cp_async_wait0(void) {}
PTX_INLINE void ptx_cp_async_wait1(void) {}

#ifdef OMPK_NV_DEVICE
#pragma omp begin declare variant match(device = {arch(nvptx64)})
PTX_INLINE uint32_t ptx_shared_addr(const void *p) {
    uint32_t addr;
    __asm__("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(addr) : "l"(p));
    return addr;
}
PTX_INLINE void ptx_mma_bf16_16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    __asm__ volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
PTX_INLINE void ptx_mma_tf32_1688(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    __asm__ volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
PTX_INLINE float ptx_ex2(float x) {
    return __nvvm_ex2_approx_f(x);
}
PTX_INLINE void ptx_ldsm_x4(uint32_t r[4], const uint16_t *p) {
    __asm__ volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(ptx_shared_addr(p)));
}
PTX_INLINE void ptx_ldsm_x4_trans(uint32_t r[4], const uint16_t *p) {
    __asm__ volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(ptx_shared_addr(p)));
}
PTX_INLINE float ptx_shfl_xor(float v, int mask) {
    return __nvvm_shfl_sync_bfly_f32(0xffffffffu, v, mask, 0x1f);
}
PTX_INLINE void ptx_cp_async16(void *dst_shared, const void *src_global) {
    __asm__ volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(ptx_shared_addr(dst_shared)),
                     "l"(src_global)
                     : "memory");
}
PTX_INLINE void ptx_cp_async_commit(void) {
    __asm__ volatile("cp.async.commit_group;" ::: "memory");
}
PTX_INLINE void ptx_cp_async_wait0(void) {
    __asm__ volatile("cp.async.wait_group 0;" ::: "memory");
}
PTX_INLINE void ptx_cp_async_wait1(void) {
    __asm__ volatile("cp.async.wait_group 1;" ::: "memory");
}
#pragma omp end declare variant
#endif

/* Added for mhc_pre_bwd_tc.h: wait until at most 2 of this thread's committed cp.async groups
 * are pending (a ring of 4 stages keeps 3 in flight); 8-byte copies; and two floats to packed bf16
 * by the hardware conversion (round to nearest even, as ptx_pack_bf16x2; a NaN becomes the
 * canonical bf16 NaN). */
PTX_INLINE void ptx_cp_async_wait2(void) {}
PTX_INLINE uint32_t ptx_cvt_bf16x2(float lo, float hi) {
    return ptx_pack_bf16x2(lo, hi);
}
/* 8 bytes global -> shared (cp.async.cg takes only 16: .ca) */
PTX_INLINE void ptx_cp_async8(void *dst_shared, const void *src_global) {
    memcpy(dst_shared, src_global, 8);
}
#ifdef OMPK_NV_DEVICE
#pragma omp begin declare variant match(device = {arch(nvptx64)})
PTX_INLINE void ptx_cp_async_wait2(void) {
    __asm__ volatile("cp.async.wait_group 2;" ::: "memory");
}
PTX_INLINE void ptx_cp_async8(void *dst_shared, const void *src_global) {
    __asm__ volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(ptx_shared_addr(dst_shared)),
                     "l"(src_global)
                     : "memory");
}
PTX_INLINE uint32_t ptx_cvt_bf16x2(float lo, float hi) {
    uint32_t r;
    __asm__("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
#pragma omp end declare variant
#endif

/* 16 read-only global bytes, asking L2 to fill the whole 256-byte block around them from DRAM:
 * loads of 64 bytes a row (the mma fragment layout) then reach DRAM as 256-byte requests
 * (bench/results/INDEX.md, Decisions: the DRAM probe of the mHC pre forward). */
PTX_INLINE void ptx_ld16_l2fill(const void *p, uint32_t w[4]) {
    memcpy(w, p, 16);
}
#ifdef OMPK_NV_DEVICE
#pragma omp begin declare variant match(device = {arch(nvptx64)})
PTX_INLINE void ptx_ld16_l2fill(const void *p, uint32_t w[4]) {
    __asm__("ld.global.nc.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
            : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
            : "l"(p));
}
#pragma omp end declare variant
#endif

#endif
