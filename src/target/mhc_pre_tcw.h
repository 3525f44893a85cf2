/* mHC pre forward, launch 1 as a tensor-core GEMM that reads x in wide row pieces (n <= 4; the
 * team function is also run on the host by tests/test_mhc_pre_tc_emu.c with PTX_MMA_EMULATE).
 *
 * Why another GEMM: x is T rows of n*D bf16 (32 KB at the benchmark shape), and the GEMM of
 * mhc_pre_tc.h loads it straight into mma fragments, where one warp load covers 8 rows x 64
 * bytes. A read-only probe with that kernel's geometry and no arithmetic (bench/diag/
 * dram_probe.c, bench/results/2026-11-21-s4-mhc-pre-fwd/dram-probe.json) moved 512 MiB at 1.5
 * and 2.7 TB/s in two H200 leases; the same teams reading 2 rows x 256 bytes a load reached 2.9
 * and 3.1 TB/s. So here a warp load covers 2 rows x 256 contiguous bytes, and the tile goes
 * through team-shared memory to reach the fragment layout.
 *
 * A team is PRE_TCW_THREADS threads on PRE_TCW_TOK tokens and one contiguous K split; a stage is
 * PRE_TCW_SC 32-wide chunks (256 bytes of a row inside one stream). Warp w takes chunk w % 4 of
 * every stage (its k quarter) for token tiles 2 (w / 4) and 2 (w / 4) + 1, so a warp needs one
 * 16-byte piece of a row and of a weight row a k16 pair (the k permutation of ptx_mma.h: the
 * lane's 8 consecutive k are its k-slots of two k16 steps, in A and B alike). Weights are
 * (phi*gamma) split into bf16 hi + mid + lo as in mhc_pre_tc.h, but split once a call into a
 * global buffer laid out as the shared tile (pre_tcw_wpair): with 64 tokens a team, forming them
 * in every team made the kernel issue-bound (ncu: 65% SM throughput, 21% DRAM). The next
 * stage's x and weights are loaded into registers while the current one multiplies from shared
 * memory, then stored between two barriers. At the end the four k-quarter sums of each token are
 * added in quarter order through shared memory (deterministic) and written in the partial layout of
 * the other GEMMs, part[(split * T + t) * (M + 1) + m] with the sum of squares at m = M.
 *
 * Shared tiles are rows of 16 pieces of 16 bytes; piece p of row r sits in slot p ^ 4 (r & 1),
 * so the 8 lanes of a quarter-warp (rows r, r + 1 x 4 pieces on reads, 8 pieces of one row on
 * writes) touch all 32 banks once. */
#ifndef OMPK_MHC_PRE_TCW_H
#define OMPK_MHC_PRE_TCW_H

#include "mhc_pre_tc.h"

#define PRE_TCW_WARPS 8
#define PRE_TCW_THREADS (PRE_TCW_WARPS * 32)
#define PRE_TCW_FITS(N) (PRE_TC_NT(N) <= 3) /* M <= 24: three n8 tiles, 24 weight rows */
#define PRE_TCW_XS (PRE_TCW_TOK * 128)      /* bf16 of the x tile */
#define PRE_TCW_WS (3 * 24 * 128)           /* bf16 of the weights: 3 parts x 24 rows */
#define PRE_TCW_RED (4 * PRE_TCW_TOK * 25)  /* floats of the k-quarter sums (M + 1 <= 25) */

/* Team-shared memory: the tiles while multiplying, the quarter sums after. */
typedef union pre_tcw_smem {
    struct {
        uint16_t x[PRE_TCW_XS];
        uint16_t w[PRE_TCW_WS];
    } t;
    float red[PRE_TCW_RED];
} __attribute__((aligned(16))) pre_tcw_smem;

/* launches of mhc_pre_tcw.c: the weight precompute into wp (sized by pre_tc_workspace), then
 * the GEMM */
void mhc_pre_tcw_gemm(ompk_exec ex, const pre_tc_geom *g, int n, const char *x, const float *phi,
                      const float *gamma, uint16_t *wp, float *part);

static inline pre_tc_geom pre_tcw_geometry(const mhc_pre_fwd_args *a, int64_t teams) {
    return pre_tc_geometry_tok(a, 0, teams, PRE_TCW_TOK, PRE_TCW_SC);
}

MHC_INLINE int pre_tcw_slot(int p, int r) {
    return p ^ ((r & 1) << 2);
}

/* This thread's 4 pieces of the x tile of the stage starting at chunk qs: rows 2 (4 w + j) +
 * lane / 16, piece lane % 16 (zeros past the split or past D). */
MHC_INLINE void pre_tcw_loadx(uint32_t v[4][4], const char *x, const int64_t ro[4],
                              const pre_tc_geom *g, int qs, int q1, int lane) {
    const int p = lane & 15;
    int64_t off;
    const int ok = pre_tc_chunk_off(g, qs + (p >> 2), q1, 8 * (p & 3), &off);
    MHC_UNROLL
    for (int j = 0; j < 4; j++) {
        ompk_u128 t = {{0u, 0u, 0u, 0u}};
        if (ok) t = *(const ompk_u128 *)(x + ro[j] + off);
        MHC_UNROLL
        for (int w = 0; w < 4; w++) v[j][w] = t.w[w];
    }
}

MHC_INLINE void pre_tcw_storex(uint32_t v[4][4], uint16_t *xs, int warp, int lane) {
    const int p = lane & 15;
    MHC_UNROLL
    for (int j = 0; j < 4; j++) {
        const int r = 2 * (4 * warp + j) + (lane >> 4);
        ompk_u128 t;
        MHC_UNROLL
        for (int w = 0; w < 4; w++) t.w[w] = v[j][w];
        *(ompk_u128 *)(xs + r * 128 + pre_tcw_slot(p, r) * 8) = t;
    }
}

#define PRE_TCW_WPT 5 /* 16-byte weight pieces a thread a stage: 3 * 24 * 16 / 256, rounded up */

/* Work item e of the weight precompute (before the GEMM, once a call): block e / (ROWS * 64),
 * row, k pair -> (phi*gamma) split into bf16 hi + mid + lo at the row's swizzled slots. Rows past
 * M and k past K are zeros (x past the split is zero in the tile, so block edges need no more). */
static inline void pre_tcw_wpair(int n, const pre_tc_geom *g, const float *phi, const float *gamma,
                                 uint16_t *wp, int64_t e) {
    const int M = 2 * n + n * n, ROWS = PRE_TC_NT(n) * 8;
    const int64_t blk = e / (ROWS * 64);
    const int r = (int)(e / 64 % ROWS), pp = (int)(e % 64);
    const int64_t q = blk * PRE_TCW_SC + (pp >> 4);
    const int64_t i = q / g->NDC;
    const int64_t d = (q - i * g->NDC) * 32 + (pp & 15) * 2;
    const int live = q < g->NCH && d < g->D && r < M;
    const int64_t k = i * g->D + d;
    float w0 = 0.f, w1 = 0.f;
    if (live) {
        w0 = phi[r * g->sphi + k] * (g->has_gamma ? gamma[k] : 1.f);
        w1 = phi[r * g->sphi + k + 1] * (g->has_gamma ? gamma[k + 1] : 1.f);
    }
    const uint32_t hi = ptx_pack_bf16x2(w0, w1);
    const float e0 = w0 - ptx_bf16_half(hi, 0), e1 = w1 - ptx_bf16_half(hi, 1);
    const uint32_t mid = ptx_pack_bf16x2(e0, e1);
    const uint32_t lo = ptx_pack_bf16x2(e0 - ptx_bf16_half(mid, 0), e1 - ptx_bf16_half(mid, 1));
    const int p = pp >> 2, at = r * 128 + (p ^ ((r & 1) << 2)) * 8 + (pp & 3) * 2;
    uint16_t *b = wp + blk * PRE_TCW_WBLK(n);
    memcpy(b + 0 * ROWS * 128 + at, &hi, 4);
    memcpy(b + 1 * ROWS * 128 + at, &mid, 4);
    memcpy(b + 2 * ROWS * 128 + at, &lo, 4);
}

#ifdef PRE_TC_HAVE
/* The warp's products of one stage: its k quarter of its two token tiles. (The sums of squares
 * as the diagonal of each tile times itself on the tensor cores measured slower: 0.487 ms, and
 * the GEMM 302 us under ncu against 285; the tensor pipe is busy enough with the three weight
 * parts.) */
MHC_INLINE void pre_tcw_stage(const int N, float acc[2][3][4], float ss[2][2], const uint16_t *xs,
                              const uint16_t *ws, int half, int quarter, int gq, int t4) {
    const int NT = PRE_TC_NT(N), ROWS = NT * 8, p = 4 * quarter + t4;
    uint32_t xa[2][2][4];
    MHC_UNROLL
    for (int mt = 0; mt < 2; mt++) MHC_UNROLL
    for (int h = 0; h < 2; h++) {
        const int r = (2 * half + mt) * 16 + h * 8 + gq;
        const ompk_u128 v = *(const ompk_u128 *)(xs + r * 128 + pre_tcw_slot(p, r) * 8);
        MHC_UNROLL
        for (int w = 0; w < 4; w++) {
            xa[mt][h][w] = v.w[w];
            const float lo = ptx_bf16_half(v.w[w], 0), hi = ptx_bf16_half(v.w[w], 1);
            ss[mt][h] = fmaf(hi, hi, fmaf(lo, lo, ss[mt][h]));
        }
    }
    /* the small parts first, as in pre_tc_stage */
    MHC_UNROLL
    for (int s = 2; s >= 0; s--) MHC_UNROLL
    for (int nt = 0; nt < 3; nt++) {
        if (nt >= NT) continue;
        const int r = nt * 8 + gq;
        const ompk_u128 wv =
            *(const ompk_u128 *)(ws + (s * ROWS + r) * 128 + pre_tcw_slot(p, r) * 8);
        MHC_UNROLL
        for (int kh = 0; kh < 2; kh++) MHC_UNROLL
        for (int mt = 0; mt < 2; mt++) {
            const uint32_t *r0 = xa[mt][0], *r1 = xa[mt][1];
            const uint32_t af[4] = {r0[2 * kh], r1[2 * kh], r0[2 * kh + 1], r1[2 * kh + 1]};
            ptx_mma_bf16_16816(acc[mt][nt], af, wv.w[2 * kh], wv.w[2 * kh + 1]);
        }
    }
}

/* This thread's pieces of the precomputed weights of the stage at chunk qs: pieces tid + 256 j
 * of the block (a team load covers 4 KB contiguous). */
MHC_INLINE void pre_tcw_loadw(const int N, uint32_t v[PRE_TCW_WPT][4], const uint16_t *wp, int qs,
                              int tid) {
    const int NPC = PRE_TCW_WBLK(N) / 8; /* pieces a block */
    const uint16_t *b = wp + (int64_t)(qs / PRE_TCW_SC) * PRE_TCW_WBLK(N);
    MHC_UNROLL
    for (int j = 0; j < PRE_TCW_WPT; j++) {
        const int pc = tid + PRE_TCW_THREADS * j;
        ompk_u128 t = {{0u, 0u, 0u, 0u}};
        if (pc < NPC) t = *(const ompk_u128 *)(b + pc * 8);
        MHC_UNROLL
        for (int w = 0; w < 4; w++) v[j][w] = t.w[w];
    }
}

MHC_INLINE void pre_tcw_storew(const int N, uint32_t v[PRE_TCW_WPT][4], uint16_t *ws, int tid) {
    const int NPC = PRE_TCW_WBLK(N) / 8;
    MHC_UNROLL
    for (int j = 0; j < PRE_TCW_WPT; j++) {
        const int pc = tid + PRE_TCW_THREADS * j;
        if (pc >= NPC) continue;
        ompk_u128 t;
        MHC_UNROLL
        for (int w = 0; w < 4; w++) t.w[w] = v[j][w];
        *(ompk_u128 *)(ws + pc * 8) = t;
    }
}

/* One team (N <= 4); wp: the precomputed weights (pre_tcw_wpair). With g->ROT the team walks its
 * stages from stage block % nst, wrapping (a fixed order either way). */
MHC_INLINE void pre_tcw_team(const int N, const pre_tc_geom *g, const char *x, const uint16_t *wp,
                             float *part, pre_tcw_smem *sm) {
    const int M = 2 * N + N * N, MP = M + 1, NT = PRE_TC_NT(N), SC = PRE_TCW_SC;
    const int tid = PRE_TC_TID(), lane = tid & 31, warp = tid >> 5;
    const int gq = lane >> 2, t4 = lane & 3, quarter = warp & 3, half = warp >> 2;
    const int blk = PRE_TC_BID();
    const int c = blk / g->NG, grp = blk - c * g->NG;
    const int64_t T = g->T, t0 = (int64_t)grp * PRE_TCW_TOK;
    const int q0 = c * g->CPS, q1 = q0 + g->CPS > g->NCH ? g->NCH : q0 + g->CPS;
    const int nst = (q1 - q0 + SC - 1) / SC;
    const int rot = g->ROT && nst > 0 ? blk % nst : 0;
#define PRE_TCW_Q(s) (q0 + ((s) + rot < nst ? (s) + rot : (s) + rot - nst) * SC)
    /* byte offsets of this thread's 4 tile rows (past T: the last token, never written) */
    int64_t ro[4];
    MHC_UNROLL
    for (int j = 0; j < 4; j++) {
        int64_t t = t0 + 2 * (4 * warp + j) + (lane >> 4);
        t = t < T ? t : T - 1;
        ro[j] = ((t / g->S) * g->sx0 + (t % g->S) * g->sx1) * 2;
    }
    float acc[2][3][4], ss[2][2];
    MHC_UNROLL
    for (int mt = 0; mt < 2; mt++) {
        ss[mt][0] = ss[mt][1] = 0.f;
        MHC_UNROLL
        for (int nt = 0; nt < 3; nt++) MHC_UNROLL
        for (int e = 0; e < 4; e++) acc[mt][nt][e] = 0.f;
    }
    uint32_t xv[4][4], wv[PRE_TCW_WPT][4];
    if (nst > 0) {
        pre_tcw_loadx(xv, x, ro, g, PRE_TCW_Q(0), q1, lane);
        pre_tcw_loadw(N, wv, wp, PRE_TCW_Q(0), tid);
        pre_tcw_storex(xv, sm->t.x, warp, lane);
        pre_tcw_storew(N, wv, sm->t.w, tid);
    }
    PRE_TC_SYNC();
    for (int st = 0; st < nst; st++) {
        const int more = st + 1 < nst;
        if (more) {
            pre_tcw_loadx(xv, x, ro, g, PRE_TCW_Q(st + 1), q1, lane);
            pre_tcw_loadw(N, wv, wp, PRE_TCW_Q(st + 1), tid);
        }
        pre_tcw_stage(N, acc, ss, sm->t.x, sm->t.w, half, quarter, gq, t4);
        PRE_TC_SYNC();
        if (more) {
            pre_tcw_storex(xv, sm->t.x, warp, lane);
            pre_tcw_storew(N, wv, sm->t.w, tid);
        }
        PRE_TC_SYNC();
    }
#undef PRE_TCW_Q
    /* quarter sums: red[(quarter * TOK + token) * MP + m] (the tiles are dead after the last
     * barrier) */
    MHC_UNROLL
    for (int mt = 0; mt < 2; mt++) MHC_UNROLL
    for (int h = 0; h < 2; h++) {
        /* the 4 lanes of a row hold disjoint k: their sum is the row's */
        ss[mt][h] += ptx_shfl_xor(ss[mt][h], 1);
        ss[mt][h] += ptx_shfl_xor(ss[mt][h], 2);
        pre_tc_put_row(NT, M, acc[mt], h, t4, ss[mt][h],
                       sm->red + (quarter * PRE_TCW_TOK + (2 * half + mt) * 16 + h * 8 + gq) * MP);
    }
    PRE_TC_SYNC();
    for (int e = tid; e < PRE_TCW_TOK * MP; e += PRE_TCW_THREADS) {
        const int tok = e / MP;
        if (t0 + tok >= T) continue;
        const float *rr = sm->red + e;
        const int qs = PRE_TCW_TOK * MP;
        part[((int64_t)c * T + t0) * MP + e] = ((rr[0] + rr[qs]) + rr[2 * qs]) + rr[3 * qs];
    }
}
#endif /* PRE_TC_HAVE */

#endif
