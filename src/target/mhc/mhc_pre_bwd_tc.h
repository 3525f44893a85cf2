/* mHC pre backward on tensor cores, for bf16 x, dh_in and grad_x_post on the GPU (used by
 * mhc_pre_bwd.c; the team functions also run on the host in tests/test_mhc_pre_bwd_tc_emu.c with
 * OMPK_EMULATE). Four launches instead of six:
 *  - Stages 1 + 2 fused, a warp a token (bwd_tc_dhpre_warp: 16-byte loads of x and dh_in, lane
 *    sums reduced by shuffles); lane 0 then runs the portable stage-2 body and writes the token's
 *    dh_mix, coef and h_pre in the order the mma fragments need (bwd_tc_frag_tok: one
 *    "fragment tile" of FW words per 16 tokens, bf16 parts packed), so stage 4 moves a tile's
 *    operands with plain 16-byte copies and never re-splits them.
 *  - Stage 4 (dx and the dW partials in one pass over x; bwd_tc_team). The portable kernel keeps
 *    a run of k's weights and dW sums in registers and reads each token's dh_mix row per thread;
 *    it is latency bound (237 registers, 12.5% occupancy). Here an ompx_bare team of 4 warps
 *    owns 128 consecutive k (32 a warp, inside one stream; for n > 4 64 and 16, BWD_TC_BIG) and
 *    a block of tokens, walked in tiles of 16 tokens:
 *    . The x tile [16 tokens][128 k] and the lanes' dh_in pieces go global -> team-shared memory
 *      by cp.async through a ring of BWD_TC_NS stages (DRAM loads run NS - 1 = 3 tiles ahead
 *      without holding registers); the fragment tile (L2-resident) is loaded into registers a
 *      tile ahead and stored into one of two shared buffers (n > 4: it rides in the ring with
 *      the x tile). One barrier a tile.
 *    . dW^T[k][m] += x^T[k][tok] * dh_mix[tok][m] by mma.sync m16n8k16 (A = x tile via
 *      ldmatrix.trans, B = dh_mix split into bf16 hi + mid + lo: x is exact in bf16, so the sums
 *      keep f32-level accuracy); the accumulators stay in registers over the token block and
 *      are written as the block's partial, summed in fixed order by stage 5.
 *    . dx[tok][k] = sum_m dh_mix[tok][m] w[m][k] by mma as well: the reduction index runs over
 *      3M slots (dh_hi w_hi | dh_hi w_mid | dh_mid w_hi, ~2^-16 relative, far below dx's one
 *      bf16 rounding), w = phi*gamma held as B fragments in registers for the whole block.
 *      Column j of n-tile nt is k = NTD j + nt of the warp's 8 NTD, so each lane's accumulators
 *      are 2 NTD consecutive k of two token rows: the epilogue adds -coef*x (x from the shared
 *      tile) + h_pre*dh_in (+ grad_x_post), rounds once and stores 16 (n > 4: 8) bytes a row.
 *    . Stage 3 folded in: the block's sums of the per-token dz / dalpha rows, one column per
 *      team of the block; stage 5 sums the blocks.
 * Deterministic: every sum has a fixed order; no atomics. */
#ifndef OMPK_MHC_PRE_BWD_TC_H
#define OMPK_MHC_PRE_BWD_TC_H

#include <stdint.h>
#include <string.h>

#include "mhc_kern.h"
#include "ptx_mma.h"

#if defined(__clang__)
#define BWD_TC_UNROLL2 _Pragma("unroll 2")
#elif defined(__GNUC__)
#define BWD_TC_UNROLL2 _Pragma("GCC unroll 2")
#else
#define BWD_TC_UNROLL2
#endif

#define BWD_TC_NMAX 8 /* stream counts served: every n of the contract */
#define BWD_TC_THREADS 128
/* n > 4 (M up to 80): 16 k a warp instead of 32, so that the dW sums and the w fragments still
 * fit the register cap; the fragment tile rides in the cp.async ring (no register double
 * buffer), and the three dx slot blocks start at multiples of 16 so the third block (w_hi again)
 * reuses the first block's w fragments. n <= 4 keeps its own parameters. */
#define BWD_TC_BIG(N) ((N) > 4)
#define BWD_TC_KW(N) (BWD_TC_BIG(N) ? 16 : 32) /* k per warp */
#define BWD_TC_KT(N) (4 * BWD_TC_KW(N))        /* k per team */
#define BWD_TC_NTD(N) (BWD_TC_KW(N) / 8)       /* n8 tiles of k (dx) per warp */
#define BWD_TC_KTW(N) (BWD_TC_KW(N) / 16)      /* k16 tiles (dW) per warp */
#define BWD_TC_M(N) (2 * (N) + (N) * (N))
#define BWD_TC_MT(N) ((BWD_TC_M(N) + 7) / 8) /* n8 tiles of m (dW) */
/* slots of one dx reduction block (dh_hi w_hi | dh_hi w_mid | dh_mid w_hi) */
#define BWD_TC_MS(N) (BWD_TC_BIG(N) ? (BWD_TC_M(N) + 15) / 16 * 16 : BWD_TC_M(N))
#define BWD_TC_KS(N) ((3 * BWD_TC_MS(N) + 15) / 16) /* k16 steps of the dx reduction */
#define BWD_TC_KSW(N) (BWD_TC_BIG(N) ? 2 * BWD_TC_MS(N) / 16 : BWD_TC_KS(N)) /* w steps held */
/* words of a fragment tile: dW B fragments [part][mt][lane][2], dx A fragments [ks][lane][4],
 * coef [16], h_pre [N][16] */
#define BWD_TC_WB(N) (3 * BWD_TC_MT(N) * 64)
#define BWD_TC_WA(N) (BWD_TC_KS(N) * 128)
#define BWD_TC_FW(N) ((BWD_TC_WB(N) + BWD_TC_WA(N) + 16 + 16 * (N) + 3) & ~3)
/* x tile rows of KT + 8 bf16 (272 or 144 bytes, an odd number of 16-byte units), so the 8 rows
 * an ldmatrix reads fall in 8 different 16-byte bank groups */
#define BWD_TC_XLD(N) (BWD_TC_KT(N) + 8)
#define BWD_TC_XW(N) (16 * BWD_TC_XLD(N) / 2) /* words of an x tile */
/* dh_in of a tile: each thread's two pieces of NTD words (rows gq and gq + 8 at its 2 NTD d),
 * stored at piece h * 128 + tid: copied and read back by the same thread */
#define BWD_TC_DW(N) (2 * BWD_TC_THREADS * BWD_TC_NTD(N))
/* words of a ring stage: x tile, dh_in pieces, and for n > 4 the fragment tile */
#define BWD_TC_SW(N) (BWD_TC_XW(N) + BWD_TC_DW(N) + (BWD_TC_BIG(N) ? BWD_TC_FW(N) : 0))
/* team-shared memory: LLVM's runtime gives a team at most 48 KB */
#define BWD_TC_SMEM_WORDS 12288
/* ring stages: 4 (3 tiles in flight), or as many as fit for n > 4 (2 or 3) */
#define BWD_TC_NSMAX 4
#define BWD_TC_NS(N)                                                                               \
    (BWD_TC_BIG(N) && BWD_TC_SMEM_WORDS / BWD_TC_SW(N) < BWD_TC_NSMAX                              \
         ? BWD_TC_SMEM_WORDS / BWD_TC_SW(N)                                                        \
         : BWD_TC_NSMAX)
/* the ring, then (n <= 4) two fragment-tile buffers */
#define BWD_TC_SMEM(N) (BWD_TC_NS(N) * BWD_TC_SW(N) + (BWD_TC_BIG(N) ? 0 : 2 * BWD_TC_FW(N)))
/* 16-byte pieces of a fragment tile per thread (n <= 4: the register double buffer) */
#define BWD_TC_FP ((BWD_TC_FW(4) / 4 + BWD_TC_THREADS - 1) / BWD_TC_THREADS)

typedef struct bwd_tc_geom {
    int64_t T, S, D, K, TBK; /* TBK: tokens per team, a multiple of 16 */
    int64_t sx0, sx1, sx2, sdh0, sdh1, sg0, sg1, sg2, sdx0, sdx1, sdx2, sphi, shp0, shp1;
    int NKT, NB, has_gamma, has_gxp;
} bwd_tc_geom;

/* Fragment tiles cover the tokens rounded up to 16. */
static inline int64_t bwd_tc_frag_words(int n, int64_t T) {
    return (T + 15) / 16 * BWD_TC_FW(n);
}

/* The bf16 bits of v (round to nearest even) and of what is left after them. */
MHC_INLINE uint16_t bwd_tc_hi(float v) {
    return ompk_f32_to_bf16(v);
}
MHC_INLINE float bwd_tc_rest(float v) {
    ompk_f32_bits b;
    b.u = (uint32_t)ompk_f32_to_bf16(v) << 16;
    return v - b.f;
}

/* Token t's operands into its fragment tile (frag: the tile array as bf16 halves). dhm: the
 * token's M dh_mix values, or NULL for a padding token (t >= T: zeros everywhere). */
MHC_INLINE void bwd_tc_frag_tok(const int N, uint16_t *frag, int64_t t, const float *dhm,
                                float coef, const float *hp, int64_t shp1) {
    const int M = BWD_TC_M(N), MT = BWD_TC_MT(N), KS = BWD_TC_KS(N), WB = BWD_TC_WB(N);
    const int WA = BWD_TC_WA(N), MS = BWD_TC_MS(N);
    uint16_t *f = frag + (t >> 4) * (2 * BWD_TC_FW(N));
    const int r = (int)(t & 15);
    /* dW B: b[reg] = B[2tq + 8 reg .. +1][g], B[tok][n] = part_p(dh[mt*8 + n]) */
    MHC_UNROLL
    for (int m = 0; m < MT * 8; m++) {
        const float v = dhm && m < M ? dhm[m] : 0.f;
        const float v1 = bwd_tc_rest(v), v2 = bwd_tc_rest(v1);
        const uint16_t part[3] = {bwd_tc_hi(v), bwd_tc_hi(v1), bwd_tc_hi(v2)};
        const int lane = 4 * (m & 7) + ((r & 7) >> 1);
        MHC_UNROLL
        for (int p = 0; p < 3; p++) {
            const int word = ((p * MT + (m >> 3)) * 32 + lane) * 2 + (r >> 3);
            f[2 * word + (r & 1)] = part[p];
        }
    }
    /* dx A: a[reg] as in ptx_mma.h, row = token, column = slot; slot s = b MS + m (m < M, else
     * zero): block b = 0 dh_hi[m] (against w_hi), 1 dh_hi[m] (w_mid), 2 dh_mid[m] (w_hi), then
     * zeros */
    MHC_UNROLL
    for (int s = 0; s < KS * 16; s++) {
        const int b = s / MS, m = s - b * MS;
        float v = 0.f;
        if (dhm && m < M && b < 2) v = dhm[m];
        if (dhm && m < M && b == 2) v = bwd_tc_rest(dhm[m]);
        const int c = s & 15;
        const int lane = 4 * (r & 7) + ((c & 7) >> 1), reg = (r >> 3) + 2 * (c >> 3);
        const int word = WB + ((s >> 4) * 32 + lane) * 4 + reg;
        f[2 * word + (c & 1)] = bwd_tc_hi(v);
    }
    float *fw = (float *)f;
    fw[WB + WA + r] = dhm ? coef : 0.f;
    MHC_UNROLL
    for (int i = 0; i < N; i++) fw[WB + WA + 16 + i * 16 + r] = dhm ? hp[i * shp1] : 0.f;
}

#ifdef OMPK_NV_KERNELS

/* (b, s) of a token, stepped by 16 tokens without divisions (T < 2^31: 32-bit halves, fewer
 * registers) */
typedef struct bwd_tc_cur {
    int b, s;
} bwd_tc_cur;

MHC_INLINE bwd_tc_cur bwd_tc_cur_at(int64_t t, int64_t S) {
    bwd_tc_cur c;
    c.b = (int)(t / S);
    c.s = (int)(t - (int64_t)c.b * S);
    return c;
}

MHC_INLINE void bwd_tc_cur_step(bwd_tc_cur *c, int S) {
    c->s += 16;
    while (c->s >= S) c->s -= S, c->b++;
}

MHC_INLINE int64_t bwd_tc_row(bwd_tc_cur c, int64_t s0, int64_t s1) {
    return (int64_t)c.b * s0 + (int64_t)c.s * s1;
}

/* NW (4 or 2) words at p as the first NW words of a 16-byte vector (16- or 8-byte accesses). */
typedef uint32_t bwd_tc_v2 __attribute__((vector_size(8)));
MHC_INLINE ompk_u128 bwd_tc_ld(const int NW, const void *p) {
    if (NW == 4) return *(const ompk_u128 *)p;
    const bwd_tc_v2 v = *(const bwd_tc_v2 *)p;
    const ompk_u128 r = {{v[0], v[1], 0u, 0u}};
    return r;
}
MHC_INLINE void bwd_tc_st(const int NW, void *p, ompk_u128 v) {
    if (NW == 4) {
        *(ompk_u128 *)p = v;
    } else {
        const bwd_tc_v2 w = {v.w[0], v.w[1]};
        *(bwd_tc_v2 *)p = w;
    }
}

/* wait until tile j's group has landed: NS - 2 newer ones may be pending */
MHC_INLINE void bwd_tc_wait(const int NS) {
    if (NS >= 4)
        ptx_cp_async_wait2();
    else if (NS == 3)
        ptx_cp_async_wait1();
    else
        ptx_cp_async_wait0();
}

/* Tile j's x rows, dh_in pieces and (n > 4) fragment tile ftile into ring slot st (words). Each
 * thread copies 16 bytes of x rows r0, r0 + XR, ... at column piece cx (token cursors xc[h] point
 * at tile j's rows), its two dh_in pieces, and pieces tid, tid + 128, ... of the fragment tile.
 * Rows past the block's tokens are zeros. */
MHC_INLINE void bwd_tc_issue(const int N, const bwd_tc_geom *g, const char *x, int64_t xoff,
                             const bwd_tc_cur xc[2], int64_t tr0, const char *dh, int64_t dw,
                             const bwd_tc_cur ec[2], int64_t te0, int64_t t1, const uint32_t *ftile,
                             uint32_t *st, int tid) {
    const int XP = BWD_TC_KT(N) / 8, XR = BWD_TC_THREADS / XP, XLD = BWD_TC_XLD(N);
    const int XW = BWD_TC_XW(N), DP = BWD_TC_NTD(N);
    uint16_t *xs = (uint16_t *)st;
    const int r0 = (int)((unsigned)tid / XP), cx = tid & (XP - 1);
    const ompk_u128 z = {{0u, 0u, 0u, 0u}};
    MHC_UNROLL
    for (int h = 0; h < 2; h++) {
        if (h < 16 / XR) {
            uint16_t *dst = xs + (r0 + XR * h) * XLD + cx * 8;
            if (tr0 + XR * h < t1)
                ptx_cp_async16(dst, x + bwd_tc_row(xc[h], g->sx0, g->sx1) * 2 + xoff);
            else
                *(ompk_u128 *)dst = z;
        }
        uint32_t *dd = st + XW + (h * BWD_TC_THREADS + tid) * DP;
        const char *src = dh + (bwd_tc_row(ec[h], g->sdh0, g->sdh1) + dw) * 2;
        if (te0 + 8 * h < t1) {
            if (DP == 4)
                ptx_cp_async16(dd, src);
            else
                ptx_cp_async8(dd, src);
        } else {
            bwd_tc_st(DP, dd, z);
        }
    }
    if (BWD_TC_BIG(N)) {
        uint32_t *fs = st + XW + BWD_TC_DW(N);
        const int np = BWD_TC_FW(N) / 4;
        MHC_UNROLL
        for (int p = 0; p < (np + BWD_TC_THREADS - 1) / BWD_TC_THREADS; p++) {
            const int i = tid + p * BWD_TC_THREADS;
            if (i < np) ptx_cp_async16(fs + 4 * i, ftile + 4 * i);
        }
    }
}

/* This thread's pieces of a fragment tile (pieces tid, tid + 128, tid + 256) into registers,
 * and from there into a shared buffer: as 16-byte vectors in three named variables (a struct
 * of uint32_t[4] here was copied as 8-byte halves through local memory). */
typedef uint32_t bwd_tc_v4 __attribute__((vector_size(16)));
_Static_assert(BWD_TC_FP <= 3, "fragment tile pieces per thread");

MHC_INLINE void bwd_tc_fload(const int N, bwd_tc_v4 *f0, bwd_tc_v4 *f1, bwd_tc_v4 *f2,
                             const uint32_t *ftile, int tid) {
    const int np = BWD_TC_FW(N) / 4;
    if (tid < np) *f0 = *(const bwd_tc_v4 *)(ftile + 4 * tid);
    if (tid + BWD_TC_THREADS < np) *f1 = *(const bwd_tc_v4 *)(ftile + 4 * (tid + BWD_TC_THREADS));
    if (tid + 2 * BWD_TC_THREADS < np)
        *f2 = *(const bwd_tc_v4 *)(ftile + 4 * (tid + 2 * BWD_TC_THREADS));
}

MHC_INLINE void bwd_tc_fstore(const int N, bwd_tc_v4 f0, bwd_tc_v4 f1, bwd_tc_v4 f2, uint32_t *fb,
                              int tid) {
    const int np = BWD_TC_FW(N) / 4;
    if (tid < np) *(bwd_tc_v4 *)(fb + 4 * tid) = f0;
    if (tid + BWD_TC_THREADS < np) *(bwd_tc_v4 *)(fb + 4 * (tid + BWD_TC_THREADS)) = f1;
    if (tid + 2 * BWD_TC_THREADS < np) *(bwd_tc_v4 *)(fb + 4 * (tid + 2 * BWD_TC_THREADS)) = f2;
}

/* Stage 1 for token t by one warp (the tensor-core path fuses stages 1 and 2 into one bare
 * kernel, a warp a token): dh_pre[i] = sum_d dh_in[t][d] x[t][i][d] with each lane on 8
 * consecutive d (16-byte loads: a warp reads 512 contiguous bytes of a row), then the lane sums
 * reduced by xor shuffles, a fixed pattern that leaves the same bits in every lane. */
MHC_INLINE void bwd_tc_dhpre_warp(const int N, const bwd_tc_geom *g, const char *x, const char *dh,
                                  int64_t t, int lane, float dhp[8]) {
    const int64_t b = t / g->S, s = t - b * g->S;
    const char *xr = x + (b * g->sx0 + s * g->sx1) * 2, *dr = dh + (b * g->sdh0 + s * g->sdh1) * 2;
    float acc[BWD_TC_NMAX][2];
    MHC_UNROLL
    for (int i = 0; i < BWD_TC_NMAX; i++) acc[i][0] = acc[i][1] = 0.f;
    BWD_TC_UNROLL2
    for (int64_t d = 8 * lane; d < g->D; d += 256) {
        const ompk_u128 dv = *(const ompk_u128 *)(dr + d * 2);
        ompk_u128 xv[BWD_TC_NMAX];
        MHC_UNROLL
        for (int i = 0; i < BWD_TC_NMAX; i++)
            if (i < N) xv[i] = *(const ompk_u128 *)(xr + (i * g->sx2 + d) * 2);
        MHC_UNROLL
        for (int i = 0; i < BWD_TC_NMAX; i++) MHC_UNROLL
        for (int w = 0; w < 4; w++) {
            if (i >= N) continue;
            acc[i][w & 1] += ptx_bf16_half(dv.w[w], 0) * ptx_bf16_half(xv[i].w[w], 0) +
                             ptx_bf16_half(dv.w[w], 1) * ptx_bf16_half(xv[i].w[w], 1);
        }
    }
    MHC_UNROLL
    for (int i = 0; i < BWD_TC_NMAX; i++) {
        if (i >= N) continue;
        float v = acc[i][0] + acc[i][1];
        MHC_UNROLL
        for (int mask = 16; mask >= 1; mask >>= 1) v += ptx_shfl_xor(v, mask);
        dhp[i] = v;
    }
}

/* One team: dx of its tokens at its KT k, its token block's dW partial pw[m][k] (pw = the
 * block's [M][K] slice), and (stage 3 folded in) the block's sums of the per-token dz / dalpha
 * rows tok [T][M + 3] at columns kb, kb + NKT, ... into blk [NB][M + 3]. sm: BWD_TC_SMEM(N)
 * words of team-shared memory. */
MHC_INLINE void bwd_tc_team(const int N, const bwd_tc_geom *g, const char *x, const char *dh,
                            const char *gxp, char *dx, const float *phi, const float *gamma,
                            const uint32_t *frag, const float *tok, float *pw_all, float *blk,
                            uint32_t *sm) {
    const int M = BWD_TC_M(N), MT = BWD_TC_MT(N), KS = BWD_TC_KS(N), FW = BWD_TC_FW(N);
    const int WB = BWD_TC_WB(N), WA = BWD_TC_WA(N), SW = BWD_TC_SW(N), NS = BWD_TC_NS(N);
    const int KW = BWD_TC_KW(N), NTD = BWD_TC_NTD(N), KTW = BWD_TC_KTW(N), KSW = BWD_TC_KSW(N);
    const int MS = BWD_TC_MS(N), XLD = BWD_TC_XLD(N), XW = BWD_TC_XW(N), BIG = BWD_TC_BIG(N);
    const int XP = BWD_TC_KT(N) / 8, XR = BWD_TC_THREADS / XP;
    const int tid = OMPK_TID(), lane = tid & 31, warp = tid >> 5;
    const int gq = lane >> 2, t4 = lane & 3;
    const int bid = OMPK_BID();
    const int kb = bid % g->NKT, q = bid / g->NKT;
    const int64_t S = g->S, D = g->D, K = g->K;
    const int64_t k0 = (int64_t)kb * BWD_TC_KT(N), kw0 = k0 + KW * warp;
    const int64_t iw = kw0 / D, dw = kw0 - iw * D + 2 * NTD * t4; /* lane's stream, first d */
    const int64_t t0 = (int64_t)q * g->TBK;
    const int64_t t1 = t0 + g->TBK < g->T ? t0 + g->TBK : g->T;
    const int ntile = (int)((t1 - t0 + 15) / 16);
    const uint32_t *ftile = frag + (t0 / 16) * FW;
    float *pw = pw_all + (int64_t)q * M * K;

    /* w = phi*gamma as the dx B fragments: slot s of n-tile nt at column gq is
     * part(s)(w[m(s)][kw0 + NTD gq + nt]); for n > 4 (wfb) only blocks 0 and 1, block 2 being
     * block 0 again */
    uint32_t wf[4][BWD_TC_KS(4)][2], wfb[2][BWD_TC_KSW(BWD_TC_NMAX)][2];
    if (!BIG) {
        MHC_UNROLL
        for (int nt = 0; nt < 4; nt++) {
            const int64_t k = kw0 + 4 * gq + nt;
            const float gk = g->has_gamma ? gamma[k] : 1.f;
            MHC_UNROLL
            for (int ks = 0; ks < BWD_TC_KS(4); ks++) MHC_UNROLL
            for (int reg = 0; reg < 2; reg++) {
                if (ks >= KS) continue;
                uint16_t h[2];
                MHC_UNROLL
                for (int e = 0; e < 2; e++) {
                    const int s = ks * 16 + 2 * t4 + 8 * reg + e;
                    const int m = s < M ? s : (s < 2 * M ? s - M : s - 2 * M);
                    const float w = s < 3 * M ? phi[m * g->sphi + k] * gk : 0.f;
                    h[e] = bwd_tc_hi(s >= M && s < 2 * M ? bwd_tc_rest(w) : w);
                }
                wf[nt][ks][reg] = (uint32_t)h[0] | ((uint32_t)h[1] << 16);
            }
        }
    } else {
        MHC_UNROLL
        for (int nt = 0; nt < 2; nt++) {
            const int64_t k = kw0 + 2 * gq + nt;
            const float gk = g->has_gamma ? gamma[k] : 1.f;
            MHC_UNROLL
            for (int ks = 0; ks < BWD_TC_KSW(BWD_TC_NMAX); ks++) MHC_UNROLL
            for (int reg = 0; reg < 2; reg++) {
                if (ks >= KSW) continue;
                uint16_t h[2];
                MHC_UNROLL
                for (int e = 0; e < 2; e++) {
                    const int s = ks * 16 + 2 * t4 + 8 * reg + e;
                    const int m = s < MS ? s : s - MS;
                    const float w = m < M ? phi[m * g->sphi + k] * gk : 0.f;
                    h[e] = bwd_tc_hi(s >= MS ? bwd_tc_rest(w) : w);
                }
                wfb[nt][ks][reg] = (uint32_t)h[0] | ((uint32_t)h[1] << 16);
            }
        }
    }
    float accw[2][BWD_TC_MT(BWD_TC_NMAX)][4];
    MHC_UNROLL
    for (int kt = 0; kt < 2; kt++) MHC_UNROLL
    for (int mt = 0; mt < BWD_TC_MT(BWD_TC_NMAX); mt++) MHC_UNROLL
    for (int e = 0; e < 4; e++) accw[kt][mt][e] = 0.f;

    /* copy cursors: x rows tid / XP (and + XR) of each tile at this thread's x column piece;
     * dh_in / epilogue rows gq and gq + 8 at the lane's 2 NTD d */
    const int S32 = (int)S;
    const int r0 = (int)((unsigned)tid / XP);
    const int64_t kc = k0 + 8 * (tid & (XP - 1)), ic = kc / D;
    const int64_t xoff = (ic * g->sx2 + (kc - ic * D)) * 2;
    bwd_tc_cur xc[2] = {bwd_tc_cur_at(t0 + r0, S), bwd_tc_cur_at(t0 + r0 + XR, S)};
    bwd_tc_cur dc[2] = {bwd_tc_cur_at(t0 + gq, S), bwd_tc_cur_at(t0 + gq + 8, S)};
    bwd_tc_cur ec[2] = {dc[0], dc[1]};

    MHC_UNROLL
    for (int j = 0; j < BWD_TC_NSMAX - 1; j++) {
        if (j >= NS - 1) continue;
        if (j < ntile) {
            bwd_tc_issue(N, g, x, xoff, xc, t0 + 16 * j + r0, dh, dw, dc, t0 + 16 * j + gq, t1,
                         ftile + j * FW, sm + j * SW, tid);
            MHC_UNROLL
            for (int h = 0; h < 2; h++) bwd_tc_cur_step(&xc[h], S32), bwd_tc_cur_step(&dc[h], S32);
        }
        ptx_cp_async_commit();
    }
    /* n <= 4, fragment tiles: tile 0 straight into buffer 0, tile 1 into registers */
    uint32_t *fbuf = sm + NS * SW;
    bwd_tc_v4 f0 = {0u, 0u, 0u, 0u}, f1 = f0, f2 = f0;
    if (!BIG) {
        bwd_tc_fload(N, &f0, &f1, &f2, ftile, tid);
        bwd_tc_fstore(N, f0, f1, f2, fbuf, tid);
        if (ntile > 1) bwd_tc_fload(N, &f0, &f1, &f2, ftile + FW, tid);
    }
    int slot = 0;
    for (int j = 0; j < ntile; j++) {
        bwd_tc_wait(NS); /* tile j's group has landed (NS - 2 newer ones may be pending) */
        OMPK_SYNC();
        {
            const int jn = j + NS - 1, sn = slot == 0 ? NS - 1 : slot - 1;
            if (jn < ntile) {
                bwd_tc_issue(N, g, x, xoff, xc, t0 + 16 * jn + r0, dh, dw, dc, t0 + 16 * jn + gq,
                             t1, ftile + jn * FW, sm + sn * SW, tid);
                MHC_UNROLL
                for (int h = 0; h < 2; h++)
                    bwd_tc_cur_step(&xc[h], S32), bwd_tc_cur_step(&dc[h], S32);
            }
            ptx_cp_async_commit();
            /* tile j + 1's fragments into the buffer tile j - 1 used (every warp is past it),
             * visible after the next barrier; tile j + 2's loads in flight meanwhile */
            if (!BIG && j + 1 < ntile) bwd_tc_fstore(N, f0, f1, f2, fbuf + ((j + 1) & 1) * FW, tid);
            if (!BIG && j + 2 < ntile) bwd_tc_fload(N, &f0, &f1, &f2, ftile + (j + 2) * FW, tid);
        }
        const int64_t tr = t0 + 16 * j + gq; /* epilogue rows tr, tr + 8 */
        ompk_u128 gxv[2];
        MHC_UNROLL
        for (int h = 0; h < 2; h++) {
            const ompk_u128 z = {{0u, 0u, 0u, 0u}};
            gxv[h] = z;
            if (g->has_gxp && tr + 8 * h < t1)
                gxv[h] = bwd_tc_ld(
                    NTD, gxp + (bwd_tc_row(ec[h], g->sg0, g->sg1) + iw * g->sg2 + dw) * 2);
        }
        const uint32_t *st = sm + slot * SW;
        const uint16_t *xs = (const uint16_t *)st;
        const uint32_t *fs = BIG ? st + XW + BWD_TC_DW(N) : fbuf + (j & 1) * FW;
        /* dW: A = x^T (16 k x 16 tokens) by ldmatrix.trans, B = dh parts, small parts first */
        MHC_UNROLL
        for (int kt = 0; kt < 2; kt++) {
            if (kt >= KTW) continue;
            uint32_t a[4];
            const int jm = lane >> 3;
            ptx_ldsm_x4_trans(a, xs + ((lane & 7) + 8 * (jm >> 1)) * XLD + KW * warp + 16 * kt +
                                     8 * (jm & 1));
            MHC_UNROLL
            for (int p = 2; p >= 0; p--) MHC_UNROLL
            for (int mt = 0; mt < BWD_TC_MT(BWD_TC_NMAX); mt++) {
                if (mt >= MT) continue;
                const uint32_t *b = fs + ((p * MT + mt) * 32 + lane) * 2;
                ptx_mma_bf16_16816(accw[kt][mt], a, b[0], b[1]);
            }
        }
        /* dx: A = the dh slots, B = the w fragments */
        float acc[4][4];
        MHC_UNROLL
        for (int nt = 0; nt < 4; nt++) MHC_UNROLL
        for (int e = 0; e < 4; e++) acc[nt][e] = 0.f;
        MHC_UNROLL
        for (int ks = 0; ks < BWD_TC_KS(BWD_TC_NMAX); ks++) {
            if (ks >= KS) continue;
            const ompk_u128 av = *(const ompk_u128 *)(fs + WB + (ks * 32 + lane) * 4);
            const int kw = ks < KSW ? ks : ks - KSW;
            MHC_UNROLL
            for (int nt = 0; nt < 4; nt++) {
                if (nt >= NTD) continue;
                if (BIG)
                    ptx_mma_bf16_16816(acc[nt], av.w, wfb[nt & 1][kw][0], wfb[nt & 1][kw][1]);
                else if (ks < BWD_TC_KS(4))
                    ptx_mma_bf16_16816(acc[nt], av.w, wf[nt][ks][0], wf[nt][ks][1]);
            }
        }
        const float *fc = (const float *)(fs + WB + WA);
        MHC_UNROLL
        for (int h = 0; h < 2; h++) {
            const int r = gq + 8 * h;
            if (tr + 8 * h < t1) {
                const float cf = fc[r], hp = fc[16 + iw * 16 + r];
                const ompk_u128 xv = bwd_tc_ld(NTD, xs + r * XLD + KW * warp + 2 * NTD * t4);
                const ompk_u128 dv = bwd_tc_ld(NTD, st + XW + (h * BWD_TC_THREADS + tid) * NTD);
                ompk_u128 o = {{0u, 0u, 0u, 0u}};
                MHC_UNROLL
                for (int w = 0; w < 4; w++) {
                    if (w >= NTD) continue;
                    float v[2];
                    MHC_UNROLL
                    for (int e = 0; e < 2; e++) {
                        /* element 2w + e of the run: column parity (2w + e) / NTD, n-tile
                         * (2w + e) % NTD */
                        const int el = 2 * w + e;
                        v[e] = acc[el % NTD][2 * h + el / NTD] - cf * ptx_bf16_half(xv.w[w], e) +
                               hp * ptx_bf16_half(dv.w[w], e);
                        if (g->has_gxp) v[e] += ptx_bf16_half(gxv[h].w[w], e);
                    }
                    o.w[w] = ptx_cvt_bf16x2(v[0], v[1]);
                }
                bwd_tc_st(NTD, dx + (bwd_tc_row(ec[h], g->sdx0, g->sdx1) + iw * g->sdx2 + dw) * 2,
                          o);
            }
            bwd_tc_cur_step(&ec[h], S32);
        }
        slot = slot == NS - 1 ? 0 : slot + 1;
    }
    ptx_cp_async_wait0();
    /* dW^T rows k = kw0 + 16 kt + gq (+8), columns m = 8 mt + 2 t4 (+1) */
    MHC_UNROLL
    for (int kt = 0; kt < 2; kt++) MHC_UNROLL
    for (int mt = 0; mt < BWD_TC_MT(BWD_TC_NMAX); mt++) MHC_UNROLL
    for (int e = 0; e < 4; e++) {
        if (kt >= KTW || mt >= MT) continue;
        const int m = 8 * mt + 2 * t4 + (e & 1);
        const int64_t k = kw0 + 16 * kt + gq + 8 * (e >> 1);
        if (m < M) pw[m * K + k] = accw[kt][mt][e];
    }
    /* block sums: each thread a run of consecutive tokens, then a fixed tree over the threads
     * in shared memory (the ring is free once every warp passed this barrier) */
    OMPK_SYNC();
    float *red = (float *)sm;
    const int R = M + 3;
    const int64_t per = (t1 - t0 + BWD_TC_THREADS - 1) / BWD_TC_THREADS;
    const int64_t a0 = t0 + tid * per, a1 = a0 + per < t1 ? a0 + per : t1;
    for (int j = kb; j < R; j += g->NKT) {
        float v = 0.f;
        for (int64_t t = a0; t < a1; t++) v += tok[t * R + j];
        red[tid] = v;
        OMPK_SYNC();
        for (int w = BWD_TC_THREADS / 2; w >= 1; w >>= 1) {
            if (tid < w) red[tid] += red[tid + w];
            OMPK_SYNC();
        }
        if (tid == 0) blk[(int64_t)q * R + j] = red[0];
        OMPK_SYNC();
    }
}

/* Stage 4 on tensor cores, one ompx_bare launch of NKT * NB teams (mhc_pre_bwd_tc_launch.inc),
 * built with two register caps: 168 (default) and 128 (the mhc_pre_bwd entry tc-r128). */
void mhc_pre_bwd_tc_stage4(ompk_exec ex, int n, const bwd_tc_geom *g, const char *x, const char *dh,
                           const char *gxp, char *dx, const float *phi, const float *gamma,
                           const uint32_t *frag, const float *tok, float *pw, float *blk);
void mhc_pre_bwd_tc_stage4_r128(ompk_exec ex, int n, const bwd_tc_geom *g, const char *x,
                                const char *dh, const char *gxp, char *dx, const float *phi,
                                const float *gamma, const uint32_t *frag, const float *tok,
                                float *pw, float *blk);
#endif /* OMPK_NV_KERNELS */

#endif
