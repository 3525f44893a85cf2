/* mHC pre forward, launch 1 as a tensor-core GEMM that reads x in wide row pieces (n <= 4; the
 * team function is also run on the host by tests/test_mhc_pre_tc_emu.c with OMPK_EMULATE).
 *
 * Why another GEMM: x is T rows of n*D bf16 (32 KB at the benchmark shape), and the GEMM of
 * mhc_pre_tc.h loads it straight into mma fragments, where one warp load covers 8 rows x 64
 * bytes, and a read-only probe of that geometry (bench/diag/dram_probe.c) reads DRAM well below
 * what 2 rows x 256 bytes a load reach (figures: bench/results/INDEX.md, Decisions). So here a
 * warp load covers 2 rows x 256 contiguous bytes, and the tile goes through team-shared memory
 * to reach the fragment layout.
 *
 * A team is PRE_TCW_THREADS threads on PRE_TCW_TOK tokens and one contiguous K split; a stage is
 * PRE_TCW_SC 32-wide chunks (256 bytes of a row inside one stream). Warp w takes chunk w % 4 of
 * every stage (its k quarter) for token tiles 2 (w / 4) and 2 (w / 4) + 1. x goes global ->
 * shared by cp.async into a ring of 3 tiles (48 KB, the LLVM 19 cap), two stages ahead of the
 * multiply, so no register holds it in flight; the A fragments come out of the tile by ldmatrix,
 * straight into the four consecutive registers mma wants. Weights are (phi*gamma) split into
 * bf16 hi + mid + lo as in mhc_pre_tc.h, split once a call into a global buffer already in
 * B-fragment order (pre_tcw_wpair): a lane reads its two k16 steps' b0, b1 of one n8 tile as one
 * 16-byte word, a warp 512 contiguous bytes, straight from L2 (18 KB a stage; there is no room
 * for them in shared memory next to the ring). At the end the four k-quarter sums of each token
 * are added in quarter order through shared memory (deterministic) and written in the partial
 * layout of the other GEMMs, part[(split * T + t) * (M + 1) + m] with the sum of squares at
 * m = M.
 *
 * ldmatrix replaces the register moves that assembled A fragments, and the cp.async ring frees
 * the staging registers; the measured steps are in bench/results/INDEX.md (Decisions).
 *
 * An x tile is rows of 16 pieces of 16 bytes; piece p of row r sits in slot p ^ (r & 7), so the 8
 * row addresses of one ldmatrix matrix (same piece, rows r..r+7) and the 8 pieces of one row a
 * quarter-warp writes touch all 32 banks once. */
#ifndef OMPK_MHC_PRE_TCW_H
#define OMPK_MHC_PRE_TCW_H

#include "mhc_pre_tc.h"

#define PRE_TCW_WARPS 8
#define PRE_TCW_THREADS (PRE_TCW_WARPS * 32)
#define PRE_TCW_FITS(N) (PRE_TC_NT(N) <= 3) /* M <= 24: three n8 tiles, 24 weight rows */
#define PRE_TCW_NMAX 4                      /* the largest n that PRE_TCW_FITS */
#define PRE_TCW_XS (PRE_TCW_TOK * 128)      /* bf16 of one x tile */
#define PRE_TCW_RED (4 * PRE_TCW_TOK * 25)  /* floats of the k-quarter sums (M + 1 <= 25) */
/* Team-shared memory is a ring of NB x tiles (3, the default: 48 KB, the cap; or 2), the quarter
 * sums in its first bytes after the last stage (2 tiles hold them). */
#define PRE_TCW_RING(NB) ((NB) * PRE_TCW_XS)

/* launches of mhc_pre_tcw.c: the weight precompute into wp (sized by pre_tc_workspace), then
 * the GEMM with a ring of `ring` x tiles (2 at n = 4 only, else 3) */
void mhc_pre_tcw_gemm(ompk_exec ex, const pre_tc_geom *g, int n, int ring, const char *x,
                      const float *phi, const float *gamma, uint16_t *wp, float *part);

static inline pre_tc_geom pre_tcw_geometry(const mhc_pre_fwd_args *a, int64_t teams) {
    return pre_tc_geometry_tok(a, 0, teams, PRE_TCW_TOK, PRE_TCW_SC);
}

MHC_INLINE int pre_tcw_slot(int p, int r) {
    return p ^ (r & 7);
}

/* Where this thread's x piece of a stage is: chunk q = stream i, d chunk dc. Stages advance by
 * stepping (q, i, dc) instead of dividing by NDC every stage (the division was about 30 of a
 * warp's stage instructions). */
typedef struct pre_tcw_pos {
    int q, i, dc;
} pre_tcw_pos;

MHC_INLINE pre_tcw_pos pre_tcw_pos_at(int q, int ndc) {
    pre_tcw_pos ps;
    ps.q = q, ps.i = q / ndc, ps.dc = q - ps.i * ndc;
    return ps;
}

MHC_INLINE void pre_tcw_pos_step(pre_tcw_pos *ps, int ndc) {
    ps->q += PRE_TCW_SC, ps->dc += PRE_TCW_SC;
    while (ps->dc >= ndc) ps->dc -= ndc, ps->i++;
}

/* This thread's 4 pieces of the x tile of a stage into ring tile xs by cp.async: rows 2 w +
 * lane / 16 + 16 j, piece lane % 16 at ps; past the split or past D zeros are stored directly.
 * Rows 16 apart keep r & 7, and so the swizzle, the same for the four: their shared addresses
 * differ by constants. */
MHC_INLINE void pre_tcw_issue(uint16_t *xs, const char *x, const int64_t ro[4], pre_tcw_pos ps,
                              int64_t D, int64_t sx2, int q1, int warp, int lane) {
    const int p = lane & 15;
    const int64_t d = (int64_t)ps.dc * 32 + 8 * (lane & 3);
    const int64_t off = (ps.i * sx2 + d) * 2;
    const int ok = ps.q < q1 && d < D;
    MHC_UNROLL
    for (int j = 0; j < 4; j++) {
        const int r = 2 * warp + (lane >> 4) + 16 * j;
        uint16_t *dst = xs + r * 128 + pre_tcw_slot(p, r) * 8;
        if (ok) {
            ptx_cp_async16(dst, x + ro[j] + off);
        } else {
            const ompk_u128 z = {{0u, 0u, 0u, 0u}};
            *(ompk_u128 *)dst = z;
        }
    }
}

/* Work item e of the weight precompute (before the GEMM, once a call): block e / (ROWS * 64),
 * row, k pair -> (phi*gamma) split into bf16 hi + mid + lo. Rows past M and k past K are zeros (x
 * past the split is zero in the tile, so block edges need no more). A block is [part][n8 tile]
 * [k quarter][lane][4 words]: the B fragment (ptx_mma.h) of n8 tile nt and a quarter's two k16
 * steps, word j of lane 4 g + t holding row 8 nt + g at k 8 j + 2 t, + 1 of the quarter (b0, b1
 * of the first step, then of the second: the k order ldmatrix gives the A side). */
static inline void pre_tcw_wpair(int n, const pre_tc_geom *g, const float *phi, const float *gamma,
                                 uint16_t *wp, int64_t e) {
    const int M = 2 * n + n * n, NT = PRE_TC_NT(n), ROWS = NT * 8;
    const int64_t blk = e / (ROWS * 64);
    const int r = (int)(e / 64 % ROWS), pp = (int)(e % 64);
    const int quarter = pp >> 4, kq = (pp & 15) * 2; /* k within the quarter */
    const int64_t q = blk * PRE_TCW_SC + quarter;
    const int64_t i = q / g->NDC;
    const int64_t d = (q - i * g->NDC) * 32 + kq;
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
    const int lane = (r & 7) * 4 + ((kq & 7) >> 1), j = kq >> 3;
    const int at = ((r >> 3) * 4 + quarter) * 256 + lane * 8 + j * 2;
    uint16_t *b = wp + blk * PRE_TCW_WBLK(n);
    memcpy(b + 0 * NT * 1024 + at, &hi, 4);
    memcpy(b + 1 * NT * 1024 + at, &mid, 4);
    memcpy(b + 2 * NT * 1024 + at, &lo, 4);
}

#ifdef OMPK_NV_KERNELS
/* f32 sum of squares of the two bf16 in a packed pair, added to s */
MHC_INLINE float pre_tcw_sq2(uint32_t w, float s) {
    const float lo = ptx_bf16_half(w, 0), hi = ptx_bf16_half(w, 1);
    return fmaf(hi, hi, fmaf(lo, lo, s));
}

/* The warp's products of one stage: its k quarter of its two token tiles, x from ring tile xs,
 * weights straight from their global block wb (L2-resident; the two warps of a quarter read the
 * same lines, so L1 serves about one read in two: with prefetch.global.L1 one or two stages
 * ahead, ncu still counted 37% L1 sector hits over weights and x, what that alone gives, so
 * there is no prefetch). xa[mt][kh] is the A
 * fragment of token tile mt, k16 step kh (ldmatrix: matrix l / 8 = rows + 8 (l / 8 % 2), piece
 * 2 kh + l / 16 of the quarter; registers 0 and 2 are row g, 1 and 3 row g + 8). (The sums of
 * squares stay off the tensor cores: the pipe is busy enough with the three weight parts.) */
MHC_INLINE void pre_tcw_stage(const int N, float acc[2][3][4], float ss[2][2], const uint16_t *xs,
                              const uint16_t *wb, int half, int quarter, int lane) {
    const int NT = PRE_TC_NT(N), mi = lane >> 3;
    uint32_t xa[2][2][4];
    MHC_UNROLL
    for (int mt = 0; mt < 2; mt++) MHC_UNROLL
    for (int kh = 0; kh < 2; kh++) {
        const int r = (2 * half + mt) * 16 + (mi & 1) * 8 + (lane & 7);
        const int p = 4 * quarter + 2 * kh + (mi >> 1);
        ptx_ldsm_x4(xa[mt][kh], xs + r * 128 + pre_tcw_slot(p, r) * 8);
        ss[mt][0] = pre_tcw_sq2(xa[mt][kh][2], pre_tcw_sq2(xa[mt][kh][0], ss[mt][0]));
        ss[mt][1] = pre_tcw_sq2(xa[mt][kh][3], pre_tcw_sq2(xa[mt][kh][1], ss[mt][1]));
    }
    /* the small parts first, as in pre_tc_stage */
    MHC_UNROLL
    for (int s = 2; s >= 0; s--) MHC_UNROLL
    for (int nt = 0; nt < 3; nt++) {
        if (nt >= NT) continue;
        const ompk_u128 wv =
            *(const ompk_u128 *)(wb + ((s * NT + nt) * 4 + quarter) * 256 + lane * 8);
        MHC_UNROLL
        for (int kh = 0; kh < 2; kh++) MHC_UNROLL
        for (int mt = 0; mt < 2; mt++)
            ptx_mma_bf16_16816(acc[mt][nt], xa[mt][kh], wv.w[2 * kh], wv.w[2 * kh + 1]);
    }
}

/* Next stage in the rotated order, and this thread's x position in it. */
MHC_INLINE void pre_tcw_advance(int *sr, pre_tcw_pos *ps, int nst, int q0, int pq, int ndc) {
    if (++*sr == nst)
        *sr = 0, *ps = pre_tcw_pos_at(q0 + pq, ndc);
    else
        pre_tcw_pos_step(ps, ndc);
}

/* One team (N <= 4); wp: the precomputed weights (pre_tcw_wpair); ring: NB x tiles (2 or 3).
 * Stage st + NB - 1 is copied into the ring (cp.async) while stage st multiplies, so x waits in
 * no register; one barrier a stage. With g->ROT the team walks its stages from stage
 * block % nst, wrapping (a fixed order either way). */
MHC_INLINE void pre_tcw_team(const int N, const int NB, const pre_tc_geom *g, const char *x,
                             const uint16_t *wp, float *part, uint16_t *ring) {
    /* a private copy: read through the kernel-argument pointer, the fields were reloaded from
     * global memory every stage (the barriers and stores may alias it) */
    const pre_tc_geom G = *g;
    const int M = 2 * N + N * N, MP = M + 1, NT = PRE_TC_NT(N), SC = PRE_TCW_SC;
    const int tid = OMPK_TID(), lane = tid & 31, warp = tid >> 5;
    const int gq = lane >> 2, t4 = lane & 3, quarter = warp & 3, half = warp >> 2;
    const int blk = OMPK_BID();
    const int c = blk / G.NG, grp = blk - c * G.NG;
    const int64_t T = G.T, t0 = (int64_t)grp * PRE_TCW_TOK;
    const int q0 = c * G.CPS, q1 = q0 + G.CPS > G.NCH ? G.NCH : q0 + G.CPS;
    const int nst = (q1 - q0 + SC - 1) / SC;
    const int rot = G.ROT && nst > 0 ? blk % nst : 0;
    /* this thread's x piece sits in chunk + (lane / 4) % 4 of a stage */
    const int pq = (lane >> 2) & 3, b0 = q0 / SC;
    /* byte offsets of this thread's 4 tile rows (past T: the last token, never written) */
    int64_t ro[4];
    MHC_UNROLL
    for (int j = 0; j < 4; j++) {
        int64_t t = t0 + 2 * warp + (lane >> 4) + 16 * j;
        t = t < T ? t : T - 1;
        ro[j] = ((t / G.S) * G.sx0 + (t % G.S) * G.sx1) * 2;
    }
    float acc[2][3][4], ss[2][2];
    MHC_UNROLL
    for (int mt = 0; mt < 2; mt++) {
        ss[mt][0] = ss[mt][1] = 0.f;
        MHC_UNROLL
        for (int nt = 0; nt < 3; nt++) MHC_UNROLL
        for (int e = 0; e < 4; e++) acc[mt][nt][e] = 0.f;
    }
    /* issue cursor: stages issued, the next one's rotated index and x position, its ring tile */
    int nis = 0, sl = rot, tl = 0;
    pre_tcw_pos ps = pre_tcw_pos_at(q0 + sl * SC + pq, G.NDC);
    MHC_UNROLL
    for (int k = 0; k + 1 < NB; k++) {
        if (nis < nst) {
            pre_tcw_issue(ring + tl * PRE_TCW_XS, x, ro, ps, G.D, G.sx2, q1, warp, lane);
            tl = tl + 1 == NB ? 0 : tl + 1;
            if (++nis < nst) pre_tcw_advance(&sl, &ps, nst, q0, pq, G.NDC);
        }
        ptx_cp_async_commit();
    }
    int sc = rot, tc = 0; /* the stage being multiplied and its ring tile */
    for (int st = 0; st < nst; st++) {
        /* stage st's group done (NB - 2 younger ones may be pending), and every warp past stage
         * st - 1, whose tile the next copy reuses */
        if (NB == 2)
            ptx_cp_async_wait0();
        else
            ptx_cp_async_wait1();
        OMPK_SYNC();
        if (nis < nst) {
            pre_tcw_issue(ring + tl * PRE_TCW_XS, x, ro, ps, G.D, G.sx2, q1, warp, lane);
            tl = tl + 1 == NB ? 0 : tl + 1;
            if (++nis < nst) pre_tcw_advance(&sl, &ps, nst, q0, pq, G.NDC);
        }
        ptx_cp_async_commit();
        pre_tcw_stage(N, acc, ss, ring + tc * PRE_TCW_XS, wp + (int64_t)(b0 + sc) * PRE_TCW_WBLK(N),
                      half, quarter, lane);
        sc = sc + 1 == nst ? 0 : sc + 1;
        tc = tc + 1 == NB ? 0 : tc + 1;
    }
    OMPK_SYNC(); /* the ring is dead: the quarter sums reuse it */
    float *red = (float *)ring;
    /* quarter sums: red[(quarter * TOK + token) * MP + m] */
    MHC_UNROLL
    for (int mt = 0; mt < 2; mt++) MHC_UNROLL
    for (int h = 0; h < 2; h++) {
        /* the 4 lanes of a row hold disjoint k: their sum is the row's */
        ss[mt][h] += ptx_shfl_xor(ss[mt][h], 1);
        ss[mt][h] += ptx_shfl_xor(ss[mt][h], 2);
        pre_tc_put_row(NT, M, acc[mt], h, t4, ss[mt][h],
                       red + (quarter * PRE_TCW_TOK + (2 * half + mt) * 16 + h * 8 + gq) * MP);
    }
    OMPK_SYNC();
    for (int e = tid; e < PRE_TCW_TOK * MP; e += PRE_TCW_THREADS) {
        const int tok = e / MP;
        if (t0 + tok >= T) continue;
        const float *rr = red + e;
        const int qs = PRE_TCW_TOK * MP;
        part[((int64_t)c * T + t0) * MP + e] = ((rr[0] + rr[qs]) + rr[2 * qs]) + rr[3 * qs];
    }
}
#endif /* OMPK_NV_KERNELS */

#endif
