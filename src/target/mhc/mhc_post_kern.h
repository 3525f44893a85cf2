/* Internal: pieces the mHC post-forward kernel files share (header-only, usable in target
 * regions): the token's weights, raw 16-byte chunks, and the streaming GPU variant, which
 * mhc_post_fwd_stream.c instantiates. */
#ifndef OMPK_MHC_POST_KERN_H
#define OMPK_MHC_POST_KERN_H

#include <math.h>
#include <stdint.h>

#include "bare.h"
#include "mhc_each_n.h"
#include "mhc_post.h"
#include "vec8.h"

#define NMAX 8

/* The token's mixing weights, transposed into cw[o][i] so the compute loop reads them in order. */
static inline __attribute__((always_inline)) void
post_weights(const int n, const float *comb, int64_t csi, int64_t cso, const float *post,
             int64_t pso, float cw[NMAX][NMAX], float pw[NMAX]) {
#pragma GCC unroll 8
    for (int o = 0; o < NMAX; o++) {
        if (o >= n) continue;
        pw[o] = post[o * pso];
#pragma GCC unroll 8
        for (int i = 0; i < NMAX; i++)
            if (i < n) cw[o][i] = comb[i * csi + o * cso];
    }
}

#ifdef OMPK_BARE_DEVICE
/* Element e of a chunk held as raw 16-byte words: bf16 (one word) or f32 (two words). Unpacking
 * at the point of use keeps the chunk in 4 (bf16) or 8 (f32) registers per stream instead of 8
 * floats, which is what bounds occupancy for the memory-bound GPU variant. */
static inline __attribute__((always_inline)) float raw_elem(const ompk_u128 r[2], int e,
                                                            const int bf16) {
    ompk_f32_bits b;
    if (bf16)
        b.u = (e & 1) ? (r[0].w[e >> 1] & 0xffff0000u) : (r[0].w[e >> 1] << 16);
    else
        b.u = r[e >> 2].w[e & 3];
    return b.f;
}
#endif

#ifdef OMPK_NV_DEVICE
/* 16-byte global moves of the streaming variant, by hint level: 0 plain moves; 1 loads through
 * the non-coherent path without L1 allocation, evict-first stores (x and f are read once, out is
 * written once, and the API rejects an out that overlaps an input); 2 as 1, the loads also asking
 * L2 for a 256-byte fetch. The host bodies only satisfy the host compilation of the bare regions,
 * which the dispatch launches on target tensors only. */
#define PS_INLINE static inline __attribute__((always_inline))
#define PS_DEVICE static inline __attribute__((always_inline, unused))
PS_INLINE ompk_u128 ps_ld(const char *p, const int hint) {
    (void)hint;
    return *(const ompk_u128 *)p;
}
PS_INLINE void ps_st(char *p, ompk_u128 v, const int hint) {
    (void)hint;
    *(ompk_u128 *)p = v;
}
/* thread/team indices read from the special registers (the ompx_ functions are calls into
 * the device runtime, which this image is not linked with at compile time) */
PS_INLINE int ps_thread_id(void) {
    return 0;
}
PS_INLINE int ps_block_dim(void) {
    return 1;
}
PS_INLINE int ps_block_id(void) {
    return 0;
}
/* two floats rounded to bf16 (nearest even) and packed, lo in the low half */
PS_INLINE uint32_t ps_pack(float lo, float hi) {
    return (uint32_t)ompk_f32_to_bf16(lo) | ((uint32_t)ompk_f32_to_bf16(hi) << 16);
}

#pragma omp begin declare variant match(device = {arch(nvptx64)})
PS_DEVICE int ps_thread_id(void) {
    return __nvvm_read_ptx_sreg_tid_x();
}
PS_DEVICE int ps_block_dim(void) {
    return __nvvm_read_ptx_sreg_ntid_x();
}
PS_DEVICE int ps_block_id(void) {
    return __nvvm_read_ptx_sreg_ctaid_x();
}
PS_DEVICE ompk_u128 ps_ld(const char *p, const int hint) {
    ompk_u128 r;
    if (hint == 2)
        __asm__("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                : "=r"(r.w[0]), "=r"(r.w[1]), "=r"(r.w[2]), "=r"(r.w[3])
                : "l"(p));
    else if (hint == 1)
        __asm__("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                : "=r"(r.w[0]), "=r"(r.w[1]), "=r"(r.w[2]), "=r"(r.w[3])
                : "l"(p));
    else
        r = *(const ompk_u128 *)p;
    return r;
}
PS_DEVICE void ps_st(char *p, ompk_u128 v, const int hint) {
    if (hint)
        __asm__ volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.w[0]),
                         "r"(v.w[1]), "r"(v.w[2]), "r"(v.w[3]));
    else
        *(ompk_u128 *)p = v;
}
/* one cvt per pair instead of the integer rounding sequence per element (same nearest-even
 * result; a NaN comes out as the canonical quiet NaN) */
PS_DEVICE uint32_t ps_pack(float lo, float hi) {
    uint32_t r;
    __asm__("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
#pragma omp end declare variant

#define UMAX 4

/* Loads chunks c0, c0 + step, ... (U of them) of every stream and of f: all loads are issued
 * before any is used. */
PS_INLINE void ps_load_chunks(const int n, const int bf16, const int U, const int hint,
                              const char *restrict xt, int64_t xsb, const char *restrict ft,
                              int64_t c0, int64_t step, ompk_u128 xr[UMAX][NMAX][2],
                              ompk_u128 fr[UMAX][2]) {
    const int words = bf16 ? 1 : 2, cb = bf16 ? 16 : 32;
#pragma GCC unroll 4
    for (int u = 0; u < UMAX; u++) {
        if (u >= U) continue;
        const int64_t off = (c0 + u * step) * cb;
#pragma GCC unroll 8
        for (int i = 0; i < NMAX; i++)
            if (i < n)
#pragma GCC unroll 2
                for (int w = 0; w < 2; w++)
                    if (w < words) xr[u][i][w] = ps_ld(xt + i * xsb + off + 16 * w, hint);
#pragma GCC unroll 2
        for (int w = 0; w < 2; w++)
            if (w < words) fr[u][w] = ps_ld(ft + off + 16 * w, hint);
    }
}

/* The n outputs of chunks c0, c0 + step, ... (U of them). */
PS_INLINE void ps_mix_chunks(const int n, const int bf16, const int U, const int hint,
                             const float cw[NMAX][NMAX], const float pw[NMAX], char *restrict ot,
                             int64_t osb, int64_t c0, int64_t step, ompk_u128 xr[UMAX][NMAX][2],
                             ompk_u128 fr[UMAX][2]) {
    const int cb = bf16 ? 16 : 32;
#pragma GCC unroll 4
    for (int u = 0; u < UMAX; u++) {
        if (u >= U) continue;
        const int64_t off = (c0 + u * step) * cb;
#pragma GCC unroll 8
        for (int o = 0; o < NMAX; o++) {
            if (o >= n) continue;
            float acc[8];
#pragma GCC unroll 8
            for (int e = 0; e < 8; e++) acc[e] = pw[o] * raw_elem(fr[u], e, bf16);
#pragma GCC unroll 8
            for (int i = 0; i < NMAX; i++) {
                if (i >= n) continue;
#pragma GCC unroll 8
                for (int e = 0; e < 8; e++)
                    acc[e] = fmaf(cw[o][i], raw_elem(xr[u][i], e, bf16), acc[e]);
            }
            char *dst = ot + o * osb + off;
            if (bf16) {
                ompk_u128 v;
#pragma GCC unroll 4
                for (int k = 0; k < 4; k++) v.w[k] = ps_pack(acc[2 * k], acc[2 * k + 1]);
                ps_st(dst, v, hint);
            } else {
#pragma GCC unroll 2
                for (int w = 0; w < 2; w++) {
                    ompk_u128 v;
#pragma GCC unroll 4
                    for (int k = 0; k < 4; k++) {
                        ompk_f32_bits b;
                        b.f = acc[4 * w + k];
                        v.w[k] = b.u;
                    }
                    ps_st(dst + 16 * w, v, hint);
                }
            }
        }
    }
}

/* Streaming variant body for one token: each thread takes U chunks nthr apart per step (each
 * warp access stays coalesced) and issues every 16-byte load of those chunks (all n streams and
 * f) before any arithmetic, so U*(n+1) loads are in flight per thread; then writes the n outputs
 * of each chunk. Full steps run unguarded; the token's last chunks (fewer than U*nthr) go one at
 * a time. The token's weights stay in registers. */
PS_INLINE void post_token_stream(const int n, const int bf16, const int U, const int hint,
                                 const char *restrict xt, int64_t xsi, const float *comb,
                                 int64_t csi, int64_t cso, const float *post, int64_t pso,
                                 const char *restrict ft, char *restrict ot, int64_t osi, int64_t C,
                                 int64_t tid, int64_t nthr) {
    const int esz = bf16 ? 2 : 4;
    const int64_t xsb = xsi * esz, osb = osi * esz;
    float cw[NMAX][NMAX], pw[NMAX];
    post_weights(n, comb, csi, cso, post, pso, cw, pw);
    ompk_u128 xr[UMAX][NMAX][2], fr[UMAX][2];
    int64_t c0 = tid;
    for (; c0 + (U - 1) * nthr < C; c0 += U * nthr) {
        ps_load_chunks(n, bf16, U, hint, xt, xsb, ft, c0, nthr, xr, fr);
        ps_mix_chunks(n, bf16, U, hint, cw, pw, ot, osb, c0, nthr, xr, fr);
    }
    for (; c0 < C; c0 += nthr) {
        ps_load_chunks(n, bf16, 1, hint, xt, xsb, ft, c0, nthr, xr, fr);
        ps_mix_chunks(n, bf16, 1, hint, cw, pw, ot, osb, c0, nthr, xr, fr);
    }
}
#endif

// clang-format off
#define OMPK_PRAGMA(...) _Pragma(#__VA_ARGS__)

#define POST_UNPACK(a)                                                                             \
    const char *x = (const char *)(a)->x, *f = (const char *)(a)->f;                               \
    char *out = (char *)(a)->out;                                                                  \
    const float *comb = (a)->comb, *post = (a)->post;                                              \
    const int64_t B = (a)->B, S = (a)->S, D = (a)->D, C = (a)->D / 8;                              \
    const int bf16 = (a)->is_bf16, esz = (a)->is_bf16 ? 2 : 4;                                     \
    const int64_t sx0 = (a)->sx[0], sx1 = (a)->sx[1], sx2 = (a)->sx[2], sx3 = (a)->sx[3];          \
    const int64_t sc0 = (a)->sc[0], sc1 = (a)->sc[1], sc2 = (a)->sc[2], sc3 = (a)->sc[3];          \
    const int64_t sp0 = (a)->sp[0], sp1 = (a)->sp[1], sp2 = (a)->sp[2];                            \
    const int64_t sf0 = (a)->sf[0], sf1 = (a)->sf[1], sf2 = (a)->sf[2];                            \
    const int64_t so0 = (a)->so[0], so1 = (a)->so[1], so2 = (a)->so[2], so3 = (a)->so[3];          \
    (void)B, (void)S, (void)D, (void)C, (void)sx3, (void)sf2, (void)so3, (void)esz, (void)bf16


/* Streaming GPU variant, one instance per (dtype, U, hint) of the stream count MHC_N
 * (mhc_post_fwd_stream_n.inc): a bare kernel with one team per token (no token loop: per-token
 * strides and bases would stay live in registers across it), its threads covering the token's
 * chunks U at a time (see post_token_stream). The team size is a launch argument: a team needs
 * no more threads than C/U. Callers keep T < 2^31. */
#ifdef OMPK_NV_DEVICE
#define POST_STREAM_KERNEL(BF, U, H, NAME)                                                         \
    static void NAME(ompk_exec ex, const ompk_mhc_post_args *a, int threads) {                     \
        POST_UNPACK(a);                                                                            \
        const int teams = (int)(B * S);                                                            \
        OMPK_PRAGMA(omp target teams ompx_bare num_teams(teams) thread_limit(threads)              \
                    device(ex.device) is_device_ptr(x, f, out, comb, post))                        \
        {                                                                                          \
            const int64_t t = ps_block_id(), b = t / S, s = t - b * S;                             \
            post_token_stream(MHC_N, BF, U, H, x + (b * sx0 + s * sx1) * esz, sx2,                 \
                              comb + b * sc0 + s * sc1, sc2, sc3, post + b * sp0 + s * sp1, sp2,   \
                              f + (b * sf0 + s * sf1) * esz, out + (b * so0 + s * so1) * esz, so2, \
                              C, ps_thread_id(), ps_block_dim());                                  \
        }                                                                                          \
    }
#else
#define POST_STREAM_KERNEL(BF, U, H, NAME)                                                         \
    static void NAME(ompk_exec ex, const ompk_mhc_post_args *a, int threads) {                     \
        (void)ex, (void)a, (void)threads;                                                          \
    }
#endif

// clang-format on

#endif
