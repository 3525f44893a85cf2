/* Fast GPU forward for bf16 attention: an ompx_bare kernel in the FlashAttention-2 shape.
 *
 * One team of 4 warps owns 64 query rows of one (b, h); each warp owns 16 rows and keeps their
 * Q fragments, the O accumulator and the softmax statistics (running max m, running sum l) in
 * registers. Key/value tiles of 64 rows go through team-shared memory (34 KB, under LLVM 19's
 * 48 KB cap), copied by cp.async so that the next K tile lands while P*V runs. S = Q K^T and
 * O += P V run on the tensor cores through mma.sync m16n8k16 bf16 (fp32 accumulation); the S
 * accumulator fragments are re-packed in registers as the A operand of P V, and V's B fragments
 * come from ldmatrix.trans, so V needs no transposed copy. Scores live only in registers: no
 * [N, M] matrix, no workspace.
 *
 * Used for target tensors when the shape fits (bf16, dh in {32, 64, 80, 96, 128}, rows 16-byte
 * aligned); OMPK_ATTN_VARIANT=portable forces the portable kernel. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention_kernels.h"
#include "bf16.h"

/* Register arrays must be indexed by constants only (a run-time index puts them in local
 * memory): their loops are unrolled completely. */
#if defined(__clang__)
#define ATTF_UNROLL _Pragma("unroll")
#else
#define ATTF_UNROLL _Pragma("GCC unroll 16")
#endif

/* The team's ids and barrier come from bare.h, the warp instructions (mma.sync, ldmatrix.trans,
 * shuffles, cp.async) from ptx_mma.h. tests/test_attention_fast_emu.c runs the kernel emulated
 * (OMPK_EMULATE): the team's 128 threads on the host and the warp instructions exchanging
 * fragments through memory, so CI runs the tensor-core algorithm itself (fragment layouts,
 * masking, online softmax) against the reference; the GPU run checks the real instructions. */
#include "bare.h"

#ifdef OMPK_NV_KERNELS
#include <math.h>

#include "attention_softmax.h"
#include "ptx_mma.h"
#define ATTF_BQ 64 /* query rows per team, 16 per warp */
#define ATTF_BK 64 /* keys per shared tile */
#define ATTF_PAD 8 /* bf16 elements of row padding: conflict-free fragment loads */
#define ATTF_LD (128 + ATTF_PAD)
#define ATTF_LOG2E 1.4426950408889634f
#define ATTF_LN2 0.6931471805599453f
#define ATTF_INLINE static inline __attribute__((always_inline))
#define attf_mma ptx_mma_bf16_16816
#define attf_ldsm_x4_t ptx_ldsm_x4_trans
#define attf_xor ptx_shfl_xor
#define attf_cp16 ptx_cp_async16
#define attf_cp_commit ptx_cp_async_commit
#define attf_cp_wait0 ptx_cp_async_wait0
#define attf_cp_wait1 ptx_cp_async_wait1
#define attf_ex2 ptx_ex2
/* NaN-safe: the GPU's NaN is 0x7fffffff, which plain rounding would carry into -0 */
#define attf_pack ptx_pack_bf16x2

#ifdef OMPK_EMULATE
static uint16_t attf_emu_sk[ATTF_BK * ATTF_LD] __attribute__((aligned(16)));
static uint16_t attf_emu_sv[ATTF_BK * ATTF_LD] __attribute__((aligned(16)));
#endif
#endif

#ifdef OMPK_NV_KERNELS

typedef struct attf_u4 {
    uint32_t w[4];
} __attribute__((aligned(16))) attf_u4;

/* Rows kt .. kt+63 of one head's K or V into a shared tile (zeros past M), by the team's nthr
 * threads. */
ATTF_INLINE void attf_load_tile_n(uint16_t *tile, const uint16_t *base, int64_t rs, int64_t kt,
                                  int64_t M, int tid, const int DH, const int nthr) {
    for (int c = tid; c < ATTF_BK * DH / 8; c += nthr) {
        const int rr = c / (DH / 8), cc = (c - rr * (DH / 8)) * 8;
        uint16_t *d = tile + rr * ATTF_LD + cc;
        if (kt + rr < M) {
            attf_cp16(d, base + (kt + rr) * rs + cc);
        } else {
            attf_u4 z = {{0, 0, 0, 0}};
            *(attf_u4 *)d = z;
        }
    }
}

ATTF_INLINE void attf_load_tile(uint16_t *tile, const uint16_t *base, int64_t rs, int64_t kt,
                                int64_t M, int tid, const int DH) {
    attf_load_tile_n(tile, base, rs, kt, M, tid, DH, 128);
}

/* The key loop of a team: keys kb .. ke-1 (kb a multiple of ATTF_BK) of kv head (kh, vh)
 * against the warp's two rows, whose visible keys end at lim0 / lim1 (already clipped to ke):
 * the O accumulator and the running maxima m and sums l (per lane, log2 domain) move over them. */
ATTF_INLINE void attf_fwd_keys(const ompk_attn_geom *g, const uint16_t *kh, const uint16_t *vh,
                               int64_t kb, int64_t ke, int64_t lim0, int64_t lim1,
                               uint32_t qa[8][4], float o[16][4], float *m0, float *m1, float *l0,
                               float *l1, uint16_t *sk, uint16_t *sv, const int DH,
                               const int nthr) {
    const int tid = OMPK_TID(), lane = tid & 31;
    const int gq = lane >> 2, t4 = lane & 3;
    const int64_t M = g->M;
    const float sl2 = g->scale * ATTF_LOG2E;
    /* K and V tiles stream through one shared buffer each: a tile's V is still landing while
     * its S runs on the tensor cores, and the next K lands while P*V runs (cp.async groups,
     * committed K0 V0 K1 V1 ..., so "all but the newest group" is always the one needed). */
    if (ke > kb) {
        attf_load_tile_n(sk, kh, g->ks[2], kb, M, tid, DH, nthr);
        attf_cp_commit();
        attf_load_tile_n(sv, vh, g->vs[2], kb, M, tid, DH, nthr);
        attf_cp_commit();
    }
    for (int64_t kt = kb; kt < ke; kt += ATTF_BK) {
        attf_cp_wait1();
        OMPK_SYNC();

        float s[8][4];
        ATTF_UNROLL
        for (int nt = 0; nt < 8; nt++) {
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
            const uint16_t *kr = sk + (nt * 8 + gq) * ATTF_LD + t4 * 2;
            ATTF_UNROLL
            for (int ks = 0; ks < DH / 16; ks++)
                attf_mma(s[nt], qa[ks], *(const uint32_t *)(kr + ks * 16),
                         *(const uint32_t *)(kr + ks * 16 + 8));
        }
        OMPK_SYNC(); /* every warp is done with this K tile */
        if (kt + ATTF_BK < ke) attf_load_tile_n(sk, kh, g->ks[2], kt + ATTF_BK, M, tid, DH, nthr);
        attf_cp_commit();

        /* visible keys of this tile for rows r0 and r1, as tile-relative counts */
        const int c0 = (int)(lim0 - kt < ATTF_BK ? lim0 - kt : ATTF_BK);
        const int c1 = (int)(lim1 - kt < ATTF_BK ? lim1 - kt : ATTF_BK);
        att_softmax_tile(s, 8, o, DH, t4, c0, c1, sl2, m0, m1, l0, l1);
        attf_cp_wait1();
        OMPK_SYNC(); /* this V tile has landed */
        ATTF_UNROLL
        for (int kk = 0; kk < 4; kk++) {
            uint32_t pa[4];
            pa[0] = attf_pack(s[2 * kk][0], s[2 * kk][1]);
            pa[1] = attf_pack(s[2 * kk][2], s[2 * kk][3]);
            pa[2] = attf_pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            pa[3] = attf_pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
            const int mi = lane >> 3, rr = lane & 7;
            const uint16_t *vp = sv + (kk * 16 + (mi & 1) * 8 + rr) * ATTF_LD + (mi >> 1) * 8;
            ATTF_UNROLL
            for (int nd = 0; nd < DH / 16; nd++) {
                uint32_t vb[4];
                attf_ldsm_x4_t(vb, vp + nd * 16);
                attf_mma(o[2 * nd], pa, vb[0], vb[1]);
                attf_mma(o[2 * nd + 1], pa, vb[2], vb[3]);
            }
        }
        OMPK_SYNC(); /* every warp is done with this V tile */
        if (kt + ATTF_BK < ke) attf_load_tile_n(sv, vh, g->vs[2], kt + ATTF_BK, M, tid, DH, nthr);
        attf_cp_commit();
    }
    *l0 += attf_xor(*l0, 1);
    *l0 += attf_xor(*l0, 2);
    *l1 += attf_xor(*l1, 1);
    *l1 += attf_xor(*l1, 2);
}

/* The A fragments of the warp's two query rows (q0, q1; NULL: a row past the end, zeros). */
ATTF_INLINE void attf_load_q(uint32_t qa[8][4], const uint16_t *q0, const uint16_t *q1, int t4,
                             const int DH) {
    ATTF_UNROLL
    for (int ks = 0; ks < DH / 16; ks++) {
        const int c = ks * 16 + t4 * 2;
        qa[ks][0] = q0 ? *(const uint32_t *)(q0 + c) : 0u;
        qa[ks][1] = q1 ? *(const uint32_t *)(q1 + c) : 0u;
        qa[ks][2] = q0 ? *(const uint32_t *)(q0 + c + 8) : 0u;
        qa[ks][3] = q1 ? *(const uint32_t *)(q1 + c + 8) : 0u;
    }
}

/* One team: 64 query rows (block qb of head (b, h)), DH a compile-time constant. */
ATTF_INLINE void attf_fwd_team(const ompk_attn_geom *g, const uint16_t *q, const uint16_t *k,
                               const uint16_t *v, uint16_t *out, float *lse, uint16_t *sk,
                               uint16_t *sv, const int DH) {
    const int tid = OMPK_TID(), lane = tid & 31, warp = tid >> 5;
    const int gq = lane >> 2, t4 = lane & 3;
    const int64_t N = g->N, M = g->M;
    const int64_t nqb = (N + ATTF_BQ - 1) / ATTF_BQ;
    const int64_t blk = OMPK_BID();
    const int64_t bh = blk / nqb;
    /* heaviest (last, under a causal mask) query blocks first */
    const int64_t qb = nqb - 1 - (blk - bh * nqb);
    const int64_t b = bh / g->Hq, h = bh - b * g->Hq, hk = h / (g->Hq / g->Hkv);
    const int64_t row0 = qb * ATTF_BQ + warp * 16;
    const int64_t r0 = row0 + gq, r1 = row0 + gq + 8;

    uint32_t qa[8][4];
    const uint16_t *qh = q + b * g->qs[0] + h * g->qs[1];
    attf_load_q(qa, r0 < N ? qh + r0 * g->qs[2] : NULL, r1 < N ? qh + r1 * g->qs[2] : NULL, t4, DH);
    const int64_t lim0 = r0 < N ? ompk_attn_key_limit(g->mask, r0, N, M) : 0;
    const int64_t lim1 = r1 < N ? ompk_attn_key_limit(g->mask, r1, N, M) : 0;
    const int64_t last = (qb + 1) * ATTF_BQ - 1 < N - 1 ? (qb + 1) * ATTF_BQ - 1 : N - 1;
    const int64_t jmax = ompk_attn_key_limit(g->mask, last, N, M);

    float o[16][4];
    ATTF_UNROLL
    for (int n = 0; n < DH / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    attf_fwd_keys(g, k + b * g->ks[0] + hk * g->ks[1], v + b * g->vs[0] + hk * g->vs[1], 0, jmax,
                  lim0, lim1, qa, o, &m0, &m1, &l0, &l1, sk, sv, DH, 128);
    /* 0 / -inf only for a row that sees no key; a NaN sum (a NaN score) stays NaN */
    const float i0 = lim0 > 0 ? 1.f / l0 : 0.f, i1 = lim1 > 0 ? 1.f / l1 : 0.f;
    uint16_t *o0 = out + b * g->os[0] + h * g->os[1] + r0 * g->os[2];
    uint16_t *o1 = out + b * g->os[0] + h * g->os[1] + r1 * g->os[2];
    ATTF_UNROLL
    for (int n = 0; n < DH / 8; n++) {
        const int c = n * 8 + t4 * 2;
        if (r0 < N) *(uint32_t *)(o0 + c) = attf_pack(o[n][0] * i0, o[n][1] * i0);
        if (r1 < N) *(uint32_t *)(o1 + c) = attf_pack(o[n][2] * i1, o[n][3] * i1);
    }
    if (lse && t4 == 0) {
        const int64_t lb = b * g->ls[0] + h * g->ls[1];
        if (r0 < N)
            lse[lb + r0 * g->ls[2]] = lim0 == 0  ? -INFINITY
                                      : l0 > 0.f ? (m0 + log2f(l0)) * ATTF_LN2
                                                 : NAN;
        if (r1 < N)
            lse[lb + r1 * g->ls[2]] = lim1 == 0  ? -INFINITY
                                      : l1 > 0.f ? (m1 + log2f(l1)) * ATTF_LN2
                                                 : NAN;
    }
}

/* ---- split-KV forward for few queries (decode) ----------------------------------------------
 * With N <= ATTF_DEC_NMAX a team's rows are (query head of the group, query) pairs of one kv
 * head, so K and V are read once per group, and the keys are cut into S splits of a whole number
 * of tiles, one team per (b, kv head, row block, split): enough teams to fill the GPU at any M.
 * Up to 16 rows per kv head a team is one warp (16 rows): small teams keep more of them, and more
 * tile loads, resident per SM; more rows: 4 warps, 64 rows, as the forward. A team leaves its
 * split's unnormalised O, running max and sum per row in a workspace; attf_dec_merge merges the
 * splits in order (deterministic). */
#define ATTF_DEC_NMAX 16

/* warps per team */
ATTF_INLINE int attf_dec_warps(const ompk_attn_geom *g) {
    return (g->Hq / g->Hkv) * g->N > 16 ? 4 : 1;
}

/* Row rho of the group's G*N rows: query head and query. */
ATTF_INLINE void attf_dec_row(const ompk_attn_geom *g, int64_t hk, int64_t rho, int64_t *h,
                              int64_t *i) {
    *h = hk * (g->Hq / g->Hkv) + rho / g->N;
    *i = rho % g->N;
}

/* ws: o [B*Hq*N][S][DH] then m, l [B*Hq*N][S] (log2 domain) */
ATTF_INLINE void attf_dec_team(const ompk_attn_geom *g, const uint16_t *q, const uint16_t *k,
                               const uint16_t *v, float *ws, int64_t S, int64_t chunk, uint16_t *sk,
                               uint16_t *sv, const int DH, const int NW) {
    const int tid = OMPK_TID(), lane = tid & 31, warp = tid >> 5;
    const int gq = lane >> 2, t4 = lane & 3;
    const int64_t N = g->N, M = g->M, R = (g->Hq / g->Hkv) * N, nrb = (R + 16 * NW - 1) / (16 * NW);
    const int64_t blk = OMPK_BID();
    const int64_t sp = blk % S, rest = blk / S, rb = rest % nrb, bk = rest / nrb;
    const int64_t b = bk / g->Hkv, hk = bk - b * g->Hkv;
    const int64_t rho0 = rb * 16 * NW + warp * 16 + gq, rho1 = rho0 + 8;
    int64_t h0 = 0, i0 = 0, h1 = 0, i1 = 0;
    if (rho0 < R) attf_dec_row(g, hk, rho0, &h0, &i0);
    if (rho1 < R) attf_dec_row(g, hk, rho1, &h1, &i1);

    uint32_t qa[8][4];
    attf_load_q(qa, rho0 < R ? q + b * g->qs[0] + h0 * g->qs[1] + i0 * g->qs[2] : NULL,
                rho1 < R ? q + b * g->qs[0] + h1 * g->qs[1] + i1 * g->qs[2] : NULL, t4, DH);
    const int64_t kb = sp * chunk, ke = kb + chunk < M ? kb + chunk : M;
    int64_t lim0 = rho0 < R ? ompk_attn_key_limit(g->mask, i0, N, M) : 0;
    int64_t lim1 = rho1 < R ? ompk_attn_key_limit(g->mask, i1, N, M) : 0;
    lim0 = lim0 < ke ? lim0 : ke;
    lim1 = lim1 < ke ? lim1 : ke;
    /* the keys any row of the group sees end at the last query's limit */
    const int64_t jmax = ompk_attn_key_limit(g->mask, N - 1, N, M);
    const int64_t kend = ke < jmax ? ke : jmax;

    float o[16][4];
    ATTF_UNROLL
    for (int n = 0; n < DH / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    attf_fwd_keys(g, k + b * g->ks[0] + hk * g->ks[1], v + b * g->vs[0] + hk * g->vs[1], kb, kend,
                  lim0, lim1, qa, o, &m0, &m1, &l0, &l1, sk, sv, DH, 32 * NW);
    const int64_t rows = g->B * g->Hq * N;
    const int64_t row0 = (b * g->Hq + h0) * N + i0, row1 = (b * g->Hq + h1) * N + i1;
    float *wo0 = ws + (row0 * S + sp) * DH, *wo1 = ws + (row1 * S + sp) * DH;
    ATTF_UNROLL
    for (int n = 0; n < DH / 8; n++) {
        const int c = n * 8 + t4 * 2;
        if (rho0 < R) wo0[c] = o[n][0], wo0[c + 1] = o[n][1];
        if (rho1 < R) wo1[c] = o[n][2], wo1[c + 1] = o[n][3];
    }
    if (t4 == 0) {
        float *wm = ws + rows * S * DH, *wl = wm + rows * S;
        if (rho0 < R) wm[row0 * S + sp] = m0, wl[row0 * S + sp] = l0;
        if (rho1 < R) wm[row1 * S + sp] = m1, wl[row1 * S + sp] = l1;
    }
}

/* Split-KV forward: the keys any row sees cut into chunks of whole tiles, at least 256 keys, so
 * that groups x splits gives about 2048 one-warp or 1024 four-warp teams (several waves of resident
 * teams, a short tail), with the splits' partial O (written, then read by the merge) held to
 * about half the K and V bytes. A function of the shape only: a call's result does not depend on
 * the GPU it runs on. */
ATTF_INLINE int64_t attf_dec_splits(const ompk_attn_geom *g, int64_t *chunk) {
    const int nw = attf_dec_warps(g);
    const int64_t R = (g->Hq / g->Hkv) * g->N, rpt = 16 * nw, teams = nw == 1 ? 2048 : 1024;
    const int64_t groups = g->B * g->Hkv * ((R + rpt - 1) / rpt);
    const int64_t jmax = g->N > 0 ? ompk_attn_key_limit(g->mask, g->N - 1, g->N, g->M) : 0;
    int64_t want = groups >= teams ? 1 : (teams + groups - 1) / groups;
    const int64_t cap = jmax / (4 * R > 0 ? 4 * R : 1);
    want = want < cap ? want : cap > 1 ? cap : 1;
    int64_t c = (jmax + want - 1) / want;
    c = (c + ATTF_BK - 1) / ATTF_BK * ATTF_BK;
    *chunk = c < 256 ? 256 : c;
    return jmax > 0 ? (jmax + *chunk - 1) / *chunk : 1;
}

/* Element t of out (row-major over b, h, i, d) from the splits, merged in split order against
 * their largest maximum: a split that saw no key (m = -inf, l = 0) weighs 0; NaN in a split's sum
 * or O reaches the row. d == 0 also writes the row's lse. */
ATTF_INLINE void attf_dec_merge(const ompk_attn_geom *g, const float *ws, int64_t S, int64_t t,
                                uint16_t *out, float *lse) {
    const int64_t DH = g->dh, rows = g->B * g->Hq * g->N;
    const int64_t row = t / DH, d = t - row * DH, i = row % g->N, bh = row / g->N;
    const int64_t b = bh / g->Hq, h = bh - b * g->Hq;
    const float *wm = ws + rows * S * DH + row * S, *wl = wm + rows * S;
    float mx = -INFINITY;
    for (int64_t sp = 0; sp < S; sp++) mx = wm[sp] > mx ? wm[sp] : mx;
    const float base = mx == -INFINITY ? 0.f : mx;
    float L = 0.f, O = 0.f;
    for (int64_t sp = 0; sp < S; sp++) {
        const float w = exp2f(wm[sp] - base);
        L += wl[sp] * w;
        O += ws[(row * S + sp) * DH + d] * w;
    }
    const int sees = ompk_attn_key_limit(g->mask, i, g->N, g->M) > 0;
    out[b * g->os[0] + h * g->os[1] + i * g->os[2] + d] =
        ompk_f32_to_bf16(sees ? O * (1.f / L) : 0.f);
    if (lse && d == 0)
        lse[b * g->ls[0] + h * g->ls[1] + i * g->ls[2]] = !sees     ? -INFINITY
                                                          : L > 0.f ? (mx + log2f(L)) * ATTF_LN2
                                                                    : NAN;
}

/* ---- backward (FlashAttention-2 recompute, two kernels, no atomics) ---------------------
 * dK/dV: a team owns 64 keys of (b, hk) (16 per warp, K and V fragments in registers) and
 * walks the group's query heads and their 64-row query tiles in a fixed order:
 *     S^T = K Q^T, P^T = 2^(S^T scale log2e - lse2), dP^T = V dO^T, dS^T = P^T (dP^T - D),
 *     dV += P^T dO, dK += dS^T Q (scale applied at the end).
 * dQ: a team owns 64 query rows (as the forward) and walks the visible key tiles:
 *     S = Q K^T, P, dP = dO V^T, dS = P (dP - D), dQ += dS K.
 * P and dS enter the tensor cores as bf16, as in FlashAttention-2. Each output row is written
 * by exactly one thread: the sums run in one fixed order (deterministic). */
#define ATTF_BQB 64 /* query rows per tile in the dK/dV kernel */

ATTF_INLINE void attf_load_frags(uint32_t fa[8][4], const uint16_t *base, int64_t rs, int64_t r0,
                                 int64_t r1, int64_t n, int t4, const int DH) {
    ATTF_UNROLL
    for (int ks = 0; ks < DH / 16; ks++) {
        const int c = ks * 16 + t4 * 2;
        fa[ks][0] = r0 < n ? *(const uint32_t *)(base + r0 * rs + c) : 0u;
        fa[ks][1] = r1 < n ? *(const uint32_t *)(base + r1 * rs + c) : 0u;
        fa[ks][2] = r0 < n ? *(const uint32_t *)(base + r0 * rs + c + 8) : 0u;
        fa[ks][3] = r1 < n ? *(const uint32_t *)(base + r1 * rs + c + 8) : 0u;
    }
}

/* acc (16 x 64 tile, 8 n-tiles) = A (16 x DH fragments) * tile^T, the tile's rows in shared. */
ATTF_INLINE void attf_mm_nt(float acc[8][4], const uint32_t fa[8][4], const uint16_t *tile, int gq,
                            int t4, const int DH) {
    ATTF_UNROLL
    for (int nt = 0; nt < 8; nt++) {
        acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
        const uint16_t *r = tile + (nt * 8 + gq) * ATTF_LD + t4 * 2;
        ATTF_UNROLL
        for (int ks = 0; ks < DH / 16; ks++)
            attf_mma(acc[nt], fa[ks], *(const uint32_t *)(r + ks * 16),
                     *(const uint32_t *)(r + ks * 16 + 8));
    }
}

/* o (16 x DH) += W (16 x 64, C fragments, rounded to bf16) * tile (64 x DH, rows in shared). */
ATTF_INLINE void attf_mm_acc(float o[16][4], float w[8][4], const uint16_t *tile, int lane,
                             const int DH) {
    ATTF_UNROLL
    for (int kk = 0; kk < 4; kk++) {
        uint32_t pa[4];
        pa[0] = attf_pack(w[2 * kk][0], w[2 * kk][1]);
        pa[1] = attf_pack(w[2 * kk][2], w[2 * kk][3]);
        pa[2] = attf_pack(w[2 * kk + 1][0], w[2 * kk + 1][1]);
        pa[3] = attf_pack(w[2 * kk + 1][2], w[2 * kk + 1][3]);
        const int mi = lane >> 3, rr = lane & 7;
        const uint16_t *tp = tile + (kk * 16 + (mi & 1) * 8 + rr) * ATTF_LD + (mi >> 1) * 8;
        ATTF_UNROLL
        for (int nd = 0; nd < DH / 16; nd++) {
            uint32_t vb[4];
            attf_ldsm_x4_t(vb, tp + nd * 16);
            attf_mma(o[2 * nd], pa, vb[0], vb[1]);
            attf_mma(o[2 * nd + 1], pa, vb[2], vb[3]);
        }
    }
}

/* Rows r0 (C elements 0, 1) and r1 (2, 3) of a 16 x DH accumulator, times mul, as bf16. */
ATTF_INLINE void attf_store_rows(uint16_t *base, int64_t rs, int64_t r0, int64_t r1, int64_t n,
                                 float o[16][4], float mul, int t4, const int DH) {
    ATTF_UNROLL
    for (int nd = 0; nd < DH / 8; nd++) {
        const int c = nd * 8 + t4 * 2;
        if (r0 < n) *(uint32_t *)(base + r0 * rs + c) = attf_pack(o[nd][0] * mul, o[nd][1] * mul);
        if (r1 < n) *(uint32_t *)(base + r1 * rs + c) = attf_pack(o[nd][2] * mul, o[nd][3] * mul);
    }
}

ATTF_INLINE void attf_dkdv_team(const ompk_attn_geom *g, const uint16_t *q, const uint16_t *k,
                                const uint16_t *v, const uint16_t *dout, const float *lse,
                                const float *dsum, uint16_t *dk, uint16_t *dv, uint16_t *sq,
                                uint16_t *sdo, float *sl, float *sd, int *slim, const int DH) {
    const int tid = OMPK_TID(), lane = tid & 31, warp = tid >> 5;
    const int gq = lane >> 2, t4 = lane & 3;
    const int64_t N = g->N, M = g->M, G = g->Hq / g->Hkv;
    const int64_t nkb = (M + ATTF_BK - 1) / ATTF_BK;
    const int64_t blk = OMPK_BID();
    const int64_t bh = blk / nkb, kb = blk - bh * nkb;
    const int64_t b = bh / g->Hkv, hk = bh - b * g->Hkv;
    const int64_t key0 = kb * ATTF_BK;
    const int64_t kr0 = key0 + warp * 16 + gq, kr1 = kr0 + 8;
    const float sl2 = g->scale * ATTF_LOG2E;
    uint32_t ka[8][4], va[8][4];
    attf_load_frags(ka, k + b * g->ks[0] + hk * g->ks[1], g->ks[2], kr0, kr1, M, t4, DH);
    attf_load_frags(va, v + b * g->vs[0] + hk * g->vs[1], g->vs[2], kr0, kr1, M, t4, DH);
    float adk[16][4], adv[16][4];
    ATTF_UNROLL
    for (int n = 0; n < DH / 8; n++) {
        adk[n][0] = adk[n][1] = adk[n][2] = adk[n][3] = 0.f;
        adv[n][0] = adv[n][1] = adv[n][2] = adv[n][3] = 0.f;
    }
    /* first query row that sees the team's first key */
    int64_t ifirst = 0;
    if (g->mask == 1)
        ifirst = key0;
    else if (g->mask == 2)
        ifirst = key0 - (M - N);
    ifirst = ifirst < 0 ? 0 : ifirst;
    const int kl0 = warp * 16 + gq, kl1 = kl0 + 8; /* team-relative key rows */
    for (int64_t h = hk * G; h < (hk + 1) * G; h++) {
        const uint16_t *qh = q + b * g->qs[0] + h * g->qs[1];
        const uint16_t *oh = dout + b * g->dos[0] + h * g->dos[1];
        for (int64_t i0 = ifirst; i0 < N; i0 += ATTF_BQB) {
            OMPK_SYNC(); /* the previous tiles are no longer read */
            attf_load_tile(sq, qh, g->qs[2], i0, N, tid, DH);
            attf_load_tile(sdo, oh, g->dos[2], i0, N, tid, DH);
            attf_cp_commit();
            if (tid < ATTF_BQB) {
                const int64_t i = i0 + tid;
                const float l = i < N ? lse[b * g->ls[0] + h * g->ls[1] + i * g->ls[2]] : -INFINITY;
                /* a row past N or fully masked contributes nothing: lse2 = +inf gives p = 0 */
                sl[tid] = l == -INFINITY ? INFINITY : l * ATTF_LOG2E;
                sd[tid] = i < N ? dsum[(b * g->Hq + h) * N + i] : 0.f;
                int64_t lim = M;
                if (g->mask == 1)
                    lim = i + 1;
                else if (g->mask == 2)
                    lim = i + 1 + M - N;
                lim = lim > M ? M : lim;
                /* keys of this team that row i sees */
                lim -= key0;
                slim[tid] = (int)(lim < 0 ? 0 : lim > ATTF_BK ? ATTF_BK : lim);
            }
            attf_cp_wait0();
            OMPK_SYNC();
            float st[8][4], dpt[8][4];
            attf_mm_nt(st, ka, sq, gq, t4, DH);
            attf_mm_nt(dpt, va, sdo, gq, t4, DH);
            ATTF_UNROLL
            for (int nt = 0; nt < 8; nt++) {
                ATTF_UNROLL
                for (int e = 0; e < 4; e++) {
                    const int col = nt * 8 + t4 * 2 + (e & 1);
                    const int vis = (e < 2 ? kl0 : kl1) < slim[col];
                    const float p = vis ? attf_ex2(st[nt][e] * sl2 - sl[col]) : 0.f;
                    st[nt][e] = p;
                    /* a select: a masked pair's dS is 0 even where dP or D is NaN */
                    dpt[nt][e] = vis ? p * (dpt[nt][e] - sd[col]) : 0.f;
                }
            }
            attf_mm_acc(adv, st, sdo, lane, DH);
            attf_mm_acc(adk, dpt, sq, lane, DH);
        }
    }
    attf_store_rows(dk + b * g->dks[0] + hk * g->dks[1], g->dks[2], kr0, kr1, M, adk, g->scale, t4,
                    DH);
    attf_store_rows(dv + b * g->dvs[0] + hk * g->dvs[1], g->dvs[2], kr0, kr1, M, adv, 1.f, t4, DH);
}

ATTF_INLINE void attf_dq_team(const ompk_attn_geom *g, const uint16_t *q, const uint16_t *k,
                              const uint16_t *v, const uint16_t *dout, const float *lse,
                              const float *dsum, uint16_t *dq, uint16_t *sk, uint16_t *sv,
                              const int DH) {
    const int tid = OMPK_TID(), lane = tid & 31, warp = tid >> 5;
    const int gq = lane >> 2, t4 = lane & 3;
    const int64_t N = g->N, M = g->M;
    const int64_t nqb = (N + ATTF_BQ - 1) / ATTF_BQ;
    const int64_t blk = OMPK_BID();
    const int64_t bh = blk / nqb;
    const int64_t qb = nqb - 1 - (blk - bh * nqb);
    const int64_t b = bh / g->Hq, h = bh - b * g->Hq, hk = h / (g->Hq / g->Hkv);
    const int64_t r0 = qb * ATTF_BQ + warp * 16 + gq, r1 = r0 + 8;
    const float sl2 = g->scale * ATTF_LOG2E;
    uint32_t qa[8][4], da[8][4];
    attf_load_frags(qa, q + b * g->qs[0] + h * g->qs[1], g->qs[2], r0, r1, N, t4, DH);
    attf_load_frags(da, dout + b * g->dos[0] + h * g->dos[1], g->dos[2], r0, r1, N, t4, DH);
    const int64_t lb = b * g->ls[0] + h * g->ls[1];
    const float la = r0 < N ? lse[lb + r0 * g->ls[2]] : -INFINITY;
    const float lc = r1 < N ? lse[lb + r1 * g->ls[2]] : -INFINITY;
    /* a fully masked row (lse = -inf) sees no key: its dq is 0 */
    const int64_t lim0 = r0 < N && la != -INFINITY ? ompk_attn_key_limit(g->mask, r0, N, M) : 0;
    const int64_t lim1 = r1 < N && lc != -INFINITY ? ompk_attn_key_limit(g->mask, r1, N, M) : 0;
    const float l0 = la == -INFINITY ? 0.f : la * ATTF_LOG2E;
    const float l1 = lc == -INFINITY ? 0.f : lc * ATTF_LOG2E;
    const float d0 = r0 < N ? dsum[(b * g->Hq + h) * N + r0] : 0.f;
    const float d1 = r1 < N ? dsum[(b * g->Hq + h) * N + r1] : 0.f;
    const int64_t last = (qb + 1) * ATTF_BQ - 1 < N - 1 ? (qb + 1) * ATTF_BQ - 1 : N - 1;
    const int64_t jmax = ompk_attn_key_limit(g->mask, last, N, M);
    float adq[16][4];
    ATTF_UNROLL
    for (int n = 0; n < DH / 8; n++) adq[n][0] = adq[n][1] = adq[n][2] = adq[n][3] = 0.f;
    const uint16_t *kh = k + b * g->ks[0] + hk * g->ks[1];
    const uint16_t *vh = v + b * g->vs[0] + hk * g->vs[1];
    for (int64_t kt = 0; kt < jmax; kt += ATTF_BK) {
        OMPK_SYNC(); /* the previous tiles are no longer read */
        attf_load_tile(sk, kh, g->ks[2], kt, M, tid, DH);
        attf_load_tile(sv, vh, g->vs[2], kt, M, tid, DH);
        attf_cp_commit();
        attf_cp_wait0();
        OMPK_SYNC();
        float s[8][4], dp[8][4];
        attf_mm_nt(s, qa, sk, gq, t4, DH);
        attf_mm_nt(dp, da, sv, gq, t4, DH);
        const int c0 = (int)(lim0 - kt < ATTF_BK ? lim0 - kt : ATTF_BK);
        const int c1 = (int)(lim1 - kt < ATTF_BK ? lim1 - kt : ATTF_BK);
        ATTF_UNROLL
        for (int nt = 0; nt < 8; nt++) {
            ATTF_UNROLL
            for (int e = 0; e < 4; e++) {
                const int key = nt * 8 + t4 * 2 + (e & 1);
                const int vis = key < (e < 2 ? c0 : c1);
                const float p = vis ? attf_ex2(s[nt][e] * sl2 - (e < 2 ? l0 : l1)) : 0.f;
                s[nt][e] = vis ? p * (dp[nt][e] - (e < 2 ? d0 : d1)) : 0.f;
            }
        }
        attf_mm_acc(adq, s, sk, lane, DH);
    }
    attf_store_rows(dq + b * g->dqs[0] + h * g->dqs[1], g->dqs[2], r0, r1, N, adq, g->scale, t4,
                    DH);
}

#ifdef OMPK_NV_DEVICE
static int attf_aligned(const void *p, const int64_t s[3]) {
    return ((uintptr_t)p & 15) == 0 && s[0] % 8 == 0 && s[1] % 8 == 0 && s[2] % 8 == 0;
}

int ompk_attn_fwd_fast_ok(ompk_exec ex, const ompk_attn_geom *g, const void *q, const void *k,
                          const void *v, const void *out) {
    if (!ex.on_target || !g->bf16) return 0;
    if (g->dh != 32 && g->dh != 64 && g->dh != 80 && g->dh != 96 && g->dh != 128) return 0;
    const int64_t nqb = (g->N + ATTF_BQ - 1) / ATTF_BQ;
    if (g->B * g->Hq * nqb > 0x7fffffff) return 0;
    return attf_aligned(q, g->qs) && attf_aligned(k, g->ks) && attf_aligned(v, g->vs) &&
           attf_aligned(out, g->os);
}

/* One kernel per head dim, so each gets its own register allocation. */
// clang-format off
#define ATTF_LAUNCH(DH)                                                                            \
    static void attf_launch_##DH(ompk_exec ex, const ompk_attn_geom *gp, const uint16_t *q,        \
                                 const uint16_t *k, const uint16_t *v, uint16_t *out,               \
                                 float *lse) {                                                      \
        const ompk_attn_geom g = *gp;                                                              \
        const int teams = (int)(g.B * g.Hq * ((g.N + ATTF_BQ - 1) / ATTF_BQ));                     \
        _Pragma("omp target teams ompx_bare num_teams(teams) thread_limit(128) device(ex.device) is_device_ptr(q, k, v, out, lse) firstprivate(g)") \
        {                                                                                          \
            static uint16_t sk[ATTF_BK * ATTF_LD] __attribute__((aligned(16)));                    \
            static uint16_t sv[ATTF_BK * ATTF_LD] __attribute__((aligned(16)));                    \
            _Pragma("omp allocate(sk, sv) allocator(omp_pteam_mem_alloc)")                         \
            attf_fwd_team(&g, q, k, v, out, lse, sk, sv, DH);                                      \
        }                                                                                          \
    }
ATTF_LAUNCH(32)
ATTF_LAUNCH(64)
ATTF_LAUNCH(80)
ATTF_LAUNCH(96)
ATTF_LAUNCH(128)
// clang-format on

// clang-format off
#define ATTF_LAUNCH_BWD(DH)                                                                        \
    static void attf_bwd_##DH(ompk_exec ex, const ompk_attn_geom *gp, const uint16_t *q,           \
                              const uint16_t *k, const uint16_t *v, const uint16_t *dout,          \
                              const float *lse, const float *dsum, uint16_t *dq, uint16_t *dk,     \
                              uint16_t *dv) {                                                      \
        const ompk_attn_geom g = *gp;                                                              \
        const int kteams = (int)(g.B * g.Hkv * ((g.M + ATTF_BK - 1) / ATTF_BK));                   \
        const int qteams = (int)(g.B * g.Hq * ((g.N + ATTF_BQ - 1) / ATTF_BQ));                    \
        if (kteams > 0)                                                                            \
        _Pragma("omp target teams ompx_bare num_teams(kteams) thread_limit(128) device(ex.device) is_device_ptr(q, k, v, dout, lse, dsum, dk, dv) firstprivate(g)") \
        {                                                                                          \
            static uint16_t sq[ATTF_BQB * ATTF_LD] __attribute__((aligned(16)));                   \
            static uint16_t sdo[ATTF_BQB * ATTF_LD] __attribute__((aligned(16)));                  \
            static float sl[ATTF_BQB], sd[ATTF_BQB];                                               \
            static int slim[ATTF_BQB];                                                             \
            _Pragma("omp allocate(sq, sdo, sl, sd, slim) allocator(omp_pteam_mem_alloc)")          \
            attf_dkdv_team(&g, q, k, v, dout, lse, dsum, dk, dv, sq, sdo, sl, sd, slim, DH);       \
        }                                                                                          \
        if (qteams > 0)                                                                            \
        _Pragma("omp target teams ompx_bare num_teams(qteams) thread_limit(128) device(ex.device) is_device_ptr(q, k, v, dout, lse, dsum, dq) firstprivate(g)") \
        {                                                                                          \
            static uint16_t sk[ATTF_BK * ATTF_LD] __attribute__((aligned(16)));                    \
            static uint16_t sv[ATTF_BK * ATTF_LD] __attribute__((aligned(16)));                    \
            _Pragma("omp allocate(sk, sv) allocator(omp_pteam_mem_alloc)")                         \
            attf_dq_team(&g, q, k, v, dout, lse, dsum, dq, sk, sv, DH);                            \
        }                                                                                          \
    }
ATTF_LAUNCH_BWD(32)
ATTF_LAUNCH_BWD(64)
ATTF_LAUNCH_BWD(80)
ATTF_LAUNCH_BWD(96)
ATTF_LAUNCH_BWD(128)
// clang-format on

int ompk_attn_bwd_fast_ok(ompk_exec ex, const ompk_attn_geom *g, const void *const ptrs[8]) {
    if (!ex.on_target || !g->bf16) return 0;
    if (g->dh != 32 && g->dh != 64 && g->dh != 80 && g->dh != 96 && g->dh != 128) return 0;
    if (g->B * g->Hq * ((g->N + ATTF_BQ - 1) / ATTF_BQ) > 0x7fffffff) return 0;
    if (g->B * g->Hkv * ((g->M + ATTF_BK - 1) / ATTF_BK) > 0x7fffffff) return 0;
    const int64_t *st[8] = {g->qs, g->ks, g->vs, g->os, g->dos, g->dqs, g->dks, g->dvs};
    for (int i = 0; i < 8; i++)
        if (!attf_aligned(ptrs[i], st[i])) return 0;
    return 1;
}

void ompk_attn_bwd_fast(ompk_exec ex, const ompk_attn_geom *g, const void *dout, const void *q,
                        const void *k, const void *v, const void *out, const float *lse, void *dq,
                        void *dk, void *dv, float *dsum) {
    ompk_attn_rowsum(ex, g, dout, out, dsum);
#define ATTF_BWD(D) attf_bwd_##D(ex, g, q, k, v, dout, lse, dsum, dq, dk, dv)
    ATT_SWITCH_DH_TC(g->dh, ATTF_BWD)
#undef ATTF_BWD
}

int64_t ompk_attn_fwd_decode_ws(const ompk_attn_geom *g) {
    int64_t chunk;
    const int64_t S = attf_dec_splits(g, &chunk);
    return (int64_t)sizeof(float) * g->B * g->Hq * g->N * S * (g->dh + 2);
}

int ompk_attn_fwd_decode_ok(ompk_exec ex, const ompk_attn_geom *g, const void *q, const void *k,
                            const void *v, const void *out) {
    if (g->N > ATTF_DEC_NMAX || g->N < 1 || !ompk_attn_fwd_fast_ok(ex, g, q, k, v, out)) return 0;
    int64_t chunk;
    const int64_t R = (g->Hq / g->Hkv) * g->N, rpt = 16 * attf_dec_warps(g),
                  nrb = (R + rpt - 1) / rpt;
    return g->B * g->Hkv * nrb * attf_dec_splits(g, &chunk) <= 0x7fffffff;
}

// clang-format off
#define ATTF_LAUNCH_DEC(DH, NW)                                                                    \
    static void attf_dec_##DH##_##NW(ompk_exec ex, const ompk_attn_geom *gp, const uint16_t *q,    \
                                     const uint16_t *k, const uint16_t *v, float *ws, int64_t S,   \
                                     int64_t chunk) {                                              \
        const ompk_attn_geom g = *gp;                                                              \
        const int64_t R = (g.Hq / g.Hkv) * g.N, nrb = (R + 16 * NW - 1) / (16 * NW);               \
        const int teams = (int)(g.B * g.Hkv * nrb * S), nthr = 32 * NW;                            \
        _Pragma("omp target teams ompx_bare num_teams(teams) thread_limit(nthr) device(ex.device) is_device_ptr(q, k, v, ws) firstprivate(g, S, chunk)") \
        {                                                                                          \
            static uint16_t sk[ATTF_BK * ATTF_LD] __attribute__((aligned(16)));                    \
            static uint16_t sv[ATTF_BK * ATTF_LD] __attribute__((aligned(16)));                    \
            _Pragma("omp allocate(sk, sv) allocator(omp_pteam_mem_alloc)")                         \
            attf_dec_team(&g, q, k, v, ws, S, chunk, sk, sv, DH, NW);                              \
        }                                                                                          \
    }
#define ATTF_LAUNCH_DEC_NW(DH) ATTF_LAUNCH_DEC(DH, 1) ATTF_LAUNCH_DEC(DH, 4)
ATTF_LAUNCH_DEC_NW(32)
ATTF_LAUNCH_DEC_NW(64)
ATTF_LAUNCH_DEC_NW(80)
ATTF_LAUNCH_DEC_NW(96)
ATTF_LAUNCH_DEC_NW(128)
// clang-format on

static void attf_dec_combine(ompk_exec ex, const ompk_attn_geom *gp, const float *ws, int64_t S,
                             uint16_t *out, float *lse) {
    const ompk_attn_geom g = *gp;
    const int64_t n = g.B * g.Hq * g.N * g.dh;
#pragma omp target teams distribute parallel for thread_limit(128) device(ex.device)               \
    is_device_ptr(ws, out, lse) firstprivate(g, S)
    for (int64_t t = 0; t < n; t++) attf_dec_merge(&g, ws, S, t, out, lse);
}

void ompk_attn_fwd_decode(ompk_exec ex, const ompk_attn_geom *g, const void *q, const void *k,
                          const void *v, void *out, float *lse, float *ws) {
    int64_t chunk;
    const int64_t S = attf_dec_splits(g, &chunk);
#define ATTF_DEC1(D) attf_dec_##D##_1(ex, g, q, k, v, ws, S, chunk)
#define ATTF_DEC4(D) attf_dec_##D##_4(ex, g, q, k, v, ws, S, chunk)
    if (attf_dec_warps(g) == 1) {
        ATT_SWITCH_DH_TC(g->dh, ATTF_DEC1)
    } else {
        ATT_SWITCH_DH_TC(g->dh, ATTF_DEC4)
    }
#undef ATTF_DEC1
#undef ATTF_DEC4
    attf_dec_combine(ex, g, ws, S, out, lse);
}

void ompk_attn_fwd_fast(ompk_exec ex, const ompk_attn_geom *g, const void *q, const void *k,
                        const void *v, void *out, float *lse) {
#define ATTF_FWD(D) attf_launch_##D(ex, g, q, k, v, out, lse)
    ATT_SWITCH_DH_TC(g->dh, ATTF_FWD)
#undef ATTF_FWD
}

#endif /* OMPK_NV_DEVICE */

#endif /* OMPK_NV_KERNELS */

#ifndef OMPK_NV_KERNELS
int ompk_attn_fwd_fast_ok(ompk_exec ex, const ompk_attn_geom *g, const void *q, const void *k,
                          const void *v, const void *out) {
    (void)ex, (void)g, (void)q, (void)k, (void)v, (void)out;
    return 0; /* no GPU image in this build: the portable kernel serves every call */
}

void ompk_attn_fwd_fast(ompk_exec ex, const ompk_attn_geom *g, const void *q, const void *k,
                        const void *v, void *out, float *lse) {
    ompk_attn_fwd_portable(ex, g, q, k, v, out, lse);
}

int ompk_attn_fwd_decode_ok(ompk_exec ex, const ompk_attn_geom *g, const void *q, const void *k,
                            const void *v, const void *out) {
    (void)ex, (void)g, (void)q, (void)k, (void)v, (void)out;
    return 0;
}

int64_t ompk_attn_fwd_decode_ws(const ompk_attn_geom *g) {
    (void)g;
    return 0;
}

void ompk_attn_fwd_decode(ompk_exec ex, const ompk_attn_geom *g, const void *q, const void *k,
                          const void *v, void *out, float *lse, float *ws) {
    (void)ws;
    ompk_attn_fwd_portable(ex, g, q, k, v, out, lse);
}

int ompk_attn_bwd_fast_ok(ompk_exec ex, const ompk_attn_geom *g, const void *const ptrs[8]) {
    (void)ex, (void)g, (void)ptrs;
    return 0;
}

void ompk_attn_bwd_fast(ompk_exec ex, const ompk_attn_geom *g, const void *dout, const void *q,
                        const void *k, const void *v, const void *out, const float *lse, void *dq,
                        void *dk, void *dv, float *dsum) {
    ompk_attn_bwd_portable(ex, g, dout, q, k, v, out, lse, dq, dk, dv, dsum);
}
#endif
