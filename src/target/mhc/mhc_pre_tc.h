/* mHC pre forward, tensor-core GEMM for bf16 x on the GPU (used by mhc_pre_fwd.c; the team
 * function is also run on the host by tests/test_mhc_pre_tc_emu.c with OMPK_EMULATE).
 *
 * Launch 1 of the pre forward becomes an ompx_bare kernel on mma.sync m16n8k16 (bf16 in, f32
 * accumulate). A team of PRE_TC_WARPS warps owns PRE_TC_TOK(n) tokens and one K split; each
 * warp owns PRE_TC_TM(n) m16 tiles of tokens, their M sums (M padded to n8 tiles) and their sums of
 * squares in registers. A operand = x itself: per 32-wide k chunk every lane loads 16 bytes of
 * each of its token rows and uses them as its k-slots of two k16 steps (B uses the same k
 * permutation; see ptx_mma.h), so x goes global -> registers in whole 32-byte sectors. B operand =
 * (phi*gamma)^T, formed per stage in team-shared memory from phi and gamma (no separate launch)
 * and split into three bf16 parts hi + mid + lo: the three products carry the f32 weight to
 * ~2^-24 relative, x is exact in bf16, so the result keeps f32-level accuracy. The sum of squares
 * comes from the same x registers in f32. Weights are double buffered (one barrier per stage)
 * and the next stage's x is in flight while the current one multiplies. Each team writes its
 * split's partial sums in the SIMT path's layout, part[(split * T + t) * (M + 1) + m] (m = M:
 * sum of squares), so the fixed-order reduce and the Sinkhorn launch are shared.
 * Launch 3 (h_in) becomes a bare kernel of 16-byte loads and stores, one 8-element piece of h_in
 * per thread. */
#ifndef OMPK_MHC_PRE_TC_H
#define OMPK_MHC_PRE_TC_H

#include <stdint.h>
#include <string.h>

#include "mhc_kern.h"
#include "ptx_mma.h"

#define PRE_TC_WARPS 4
#define PRE_TC_THREADS (PRE_TC_WARPS * 32)
#define PRE_TC_NT(N) ((2 * (N) + (N) * (N) + 7) / 8)
/* m16 token tiles per warp: 4 while the accumulators leave room (n <= 5; ptxas: no spills),
 * else 2; register arrays are sized for the largest */
#define PRE_TC_TM(N) (PRE_TC_NT(N) <= 5 ? 4 : 2)
#define PRE_TC_TMMAX 4
#define PRE_TC_TOK(N) (PRE_TC_WARPS * PRE_TC_TM(N) * 16) /* tokens per team */
/* 32-wide k chunks per stage: 2 where the double-buffered weights stay small (n <= 4) */
#define PRE_TC_SC(N) (PRE_TC_NT(N) <= 3 ? 2 : 1)
/* bf16 per shared weight row: a row stride of 64 mod 128 bytes makes the 8 lanes of a
 * quarter-warp (two rows, 64 bytes each) hit all 32 banks once */
#define PRE_TC_LDW(N) (PRE_TC_SC(N) == 2 ? 96 : 32)
#define PRE_TC_BUF(N) (3 * 8 * PRE_TC_NT(N) * PRE_TC_LDW(N)) /* one stage, 3 parts */
/* The cp.async variant (pre_tca_team): 2 m16 tiles a warp, one 32-wide chunk a stage, x staged
 * through a ring of PRE_TCA_NS team-shared tiles (bytes in flight without registers), weights
 * rows of 64 bytes; for n <= 6, where ring and weights fit 48 KB */
#define PRE_TCA_TM 2
#define PRE_TCA_TOK (PRE_TC_WARPS * PRE_TCA_TM * 16)
#define PRE_TCA_NS 3
#define PRE_TCA_XBUF (PRE_TCA_TOK * 32)             /* bf16 of one x stage */
#define PRE_TCA_WBUF(N) (3 * 8 * PRE_TC_NT(N) * 32) /* bf16 of one weight stage */
#define PRE_TCA_FITS(N) (PRE_TC_NT(N) <= 6)

/* The wide-load GEMM (mhc_pre_tcw.h): tokens a team, chunks a stage, teams aimed at (and the
 * most OMPK_MHC_PRE_TCW_TEAMS may ask for; the workspace is sized for it). About 256 teams: one
 * wave at two teams an SM on 132 SMs, no K split at the benchmark shape, and the steadiest of the
 * team counts measured (bench/results/INDEX.md, Decisions). */
#define PRE_TCW_TOK 64
#define PRE_TCW_SC 4
#define PRE_TCW_TEAMS 256
#define PRE_TCW_TEAMS_MAX 2048
/* bf16 of one stage's precomputed weights: 3 parts x the padded rows x 128 k */
#define PRE_TCW_WBLK(N) (3 * PRE_TC_NT(N) * 8 * 128)

typedef struct pre_tc_geom {
    int64_t T, S, D, sx0, sx1, sx2, sphi, shin0, shin1;
    int NDC, NCH, CPS, KS, NG, has_gamma; /* d chunks per stream, chunks, chunks per split */
    int ILV; /* splits interleaved by stage (1) or contiguous K ranges (0) */
    int ROT; /* stage order rotated by the team number (1), see pre_tc_team */
} pre_tc_geom;

/* KS = 0 when the shape does not fit the path's index types. `tok` tokens a team, stages of
 * `sc` 32-wide chunks (a split is a whole number of stages).
 * Interleaved splits: split c takes stages c, c + KS, c + 2 KS, ... and the KS teams of a token
 * group have adjacent team numbers, so the co-running teams of a group read adjacent 128-byte
 * pieces of the same token rows (KS * 128 contiguous bytes a row at a time) instead of 128 bytes
 * in each of KS far-apart ranges: fewer DRAM pages opened per byte. Either way each split's sum
 * has a fixed order (deterministic). */
static inline pre_tc_geom pre_tc_geometry_tok(const mhc_pre_fwd_args *a, int interleave,
                                              int64_t teams, int64_t tok, int sc) {
    pre_tc_geom g;
    memset(&g, 0, sizeof g);
    g.ILV = interleave;
    g.T = a->B * a->S, g.S = a->S, g.D = a->D;
    g.sx0 = a->sx[0], g.sx1 = a->sx[1], g.sx2 = a->sx[2], g.sphi = a->sphi;
    g.shin0 = a->shin[0], g.shin1 = a->shin[1];
    g.has_gamma = a->gamma != NULL;
    const int64_t ng = (g.T + tok - 1) / tok, ndc = (a->D + 31) / 32;
    if (ng > 0x7fffffff || ndc * a->n > 0x7fffffff) return g;
    g.NG = (int)ng, g.NDC = (int)ndc, g.NCH = (int)ndc * a->n;
    /* about `teams` teams; fewer splits when there are enough token groups, since each split
     * costs M + 1 floats a token */
    int64_t want = (teams + ng - 1) / ng;
    if (want > g.NCH) want = g.NCH;
    int64_t cps = (g.NCH + want - 1) / want;
    cps = (cps + sc - 1) / sc * sc;
    g.CPS = (int)cps;
    g.KS = (int)((g.NCH + cps - 1) / cps);
    return g;
}

static inline pre_tc_geom pre_tc_geometry_for(const mhc_pre_fwd_args *a, int interleave,
                                              int64_t teams, int async) {
    return pre_tc_geometry_tok(a, interleave, teams, async ? PRE_TCA_TOK : PRE_TC_TOK(a->n),
                               async ? 1 : PRE_TC_SC(a->n));
}

/* about 512 teams: a few full waves on a 132-SM GPU */
static inline pre_tc_geom pre_tc_geometry(const mhc_pre_fwd_args *a, int interleave, int async) {
    return pre_tc_geometry_for(a, interleave, 512, async);
}

/* enough for either GEMM kernel's partials */
static inline int64_t pre_tc_workspace(const mhc_pre_fwd_args *a) {
    const pre_tc_geom g0 = pre_tc_geometry(a, 1, 0), g1 = pre_tc_geometry(a, 1, 1);
    const pre_tc_geom g2 = pre_tc_geometry_tok(a, 0, PRE_TCW_TEAMS_MAX, PRE_TCW_TOK, PRE_TCW_SC);
    int64_t ks = g0.KS > g1.KS ? g0.KS : g1.KS;
    ks = ks > g2.KS ? ks : g2.KS;
    const int M = 2 * a->n + a->n * a->n;
    /* the wide-load GEMM's weights: 3 bf16 parts of its padded rows, a block every 4 chunks */
    const int64_t wide =
        a->n <= 4 ? (g2.NCH + PRE_TCW_SC - 1) / PRE_TCW_SC * PRE_TCW_WBLK(a->n) * 2 : 0;
    return (int64_t)sizeof(float) * (ks * g0.T * (M + 1) + g0.T * a->n) + wide + 64;
}

/* Element e of 32-wide chunk q (chunk q is d in [32 (q % NDC), +32) of stream q / NDC): its byte
 * offset in a token row; returns 0 past the split (q >= q1) or past D, where loads give zeros. */
MHC_INLINE int pre_tc_chunk_off(const pre_tc_geom *g, int q, int q1, int e, int64_t *off) {
    const int i = q / g->NDC;
    const int64_t d = (int64_t)(q - i * g->NDC) * 32 + e;
    *off = ((int64_t)i * g->sx2 + d) * 2;
    return q < q1 && d < g->D;
}

#ifdef OMPK_NV_KERNELS

/* x of chunk q (zeros past the split or past D) for the lane's 2 * TM token rows */
MHC_INLINE void pre_tc_loadx(const int TM, const int L2F, uint32_t xv[PRE_TC_TMMAX][2][4],
                             const char *const xr[PRE_TC_TMMAX][2], const pre_tc_geom *g, int q,
                             int q1, int t4) {
    int64_t off;
    const int ok = pre_tc_chunk_off(g, q, q1, 8 * t4, &off);
    MHC_UNROLL
    for (int mt = 0; mt < PRE_TC_TMMAX; mt++) MHC_UNROLL
    for (int h = 0; h < 2; h++) {
        if (mt >= TM) continue;
        ompk_u128 v = {{0u, 0u, 0u, 0u}};
        if (ok && L2F)
            ptx_ld16_l2fill(xr[mt][h] + off, v.w);
        else if (ok)
            v = *(const ompk_u128 *)(xr[mt][h] + off);
        MHC_UNROLL
        for (int w = 0; w < 4; w++) xv[mt][h][w] = v.w[w];
    }
}

/* This thread's share of the weights of the stage starting at chunk qs: (phi*gamma)[m][k] for a
 * pair of k and rows r0, r0 + RP, ... (zeros past M, the split or D). */
MHC_INLINE void pre_tc_fetchw(const int N, const int SC, float pw[][2], const float *phi,
                              const float *gamma, const pre_tc_geom *g, int qs, int q1, int tid) {
    const int M = 2 * N + N * N, PP = SC * 16, RP = PRE_TC_THREADS / PP;
    const int NPASS = (PRE_TC_NT(N) * 8 + RP - 1) / RP;
    const int p = tid % PP, r0 = tid / PP;
    const int q = qs + p / 16;
    const int i = q / g->NDC;
    const int64_t d = (int64_t)(q - i * g->NDC) * 32 + (p % 16) * 2;
    const int ok = q < q1 && d < g->D;
    const int64_t k = (int64_t)i * g->D + d;
    const float g0 = ok && g->has_gamma ? gamma[k] : 1.f;
    const float g1 = ok && g->has_gamma ? gamma[k + 1] : 1.f;
    MHC_UNROLL
    for (int j = 0; j < 16; j++) {
        if (j >= NPASS) continue;
        const int r = r0 + j * RP;
        const int live = ok && r < M;
        pw[j][0] = live ? phi[r * g->sphi + k] * g0 : 0.f;
        pw[j][1] = live ? phi[r * g->sphi + k + 1] * g1 : 0.f;
    }
}

/* The fetched weights as hi, mid, lo bf16 parts into one stage buffer [part][row][LDW]. */
MHC_INLINE void pre_tc_storew(const int N, const int SC, const int LDW, float pw[][2], uint16_t *wb,
                              int tid) {
    const int ROWS = PRE_TC_NT(N) * 8, PP = SC * 16, RP = PRE_TC_THREADS / PP;
    const int NPASS = (ROWS + RP - 1) / RP;
    const int p = tid % PP, r0 = tid / PP, col = (p / 16) * 32 + (p % 16) * 2;
    MHC_UNROLL
    for (int j = 0; j < 16; j++) {
        if (j >= NPASS) continue;
        const int r = r0 + j * RP;
        if (r >= ROWS) continue;
        const uint32_t hi = ptx_pack_bf16x2(pw[j][0], pw[j][1]);
        const float e0 = pw[j][0] - ptx_bf16_half(hi, 0), e1 = pw[j][1] - ptx_bf16_half(hi, 1);
        const uint32_t mid = ptx_pack_bf16x2(e0, e1);
        const uint32_t lo = ptx_pack_bf16x2(e0 - ptx_bf16_half(mid, 0), e1 - ptx_bf16_half(mid, 1));
        *(uint32_t *)(wb + (0 * ROWS + r) * LDW + col) = hi;
        *(uint32_t *)(wb + (1 * ROWS + r) * LDW + col) = mid;
        *(uint32_t *)(wb + (2 * ROWS + r) * LDW + col) = lo;
    }
}

/* One stage's products: the SC chunks in xa against the weights in wb. */
MHC_INLINE void pre_tc_stage(const int N, const int SC, const int LDW, const int TM,
                             float acc[PRE_TC_TMMAX][10][4], float ss[PRE_TC_TMMAX][2],
                             uint32_t xa[2][PRE_TC_TMMAX][2][4], const uint16_t *wb, int gq,
                             int t4) {
    const int NT = PRE_TC_NT(N), ROWS = NT * 8;
    MHC_UNROLL
    for (int cc = 0; cc < 2; cc++) {
        if (cc >= SC) continue;
        /* the small parts first */
        MHC_UNROLL
        for (int s = 2; s >= 0; s--) MHC_UNROLL
        for (int nt = 0; nt < 10; nt++) {
            if (nt >= NT) continue;
            const ompk_u128 wv =
                *(const ompk_u128 *)(wb + (s * ROWS + nt * 8 + gq) * LDW + cc * 32 + 8 * t4);
            /* k16 step outer, token tile inner: back-to-back mma.sync go to different
             * accumulators (each accumulator still sees the same order) */
            MHC_UNROLL
            for (int kh = 0; kh < 2; kh++) MHC_UNROLL
            for (int mt = 0; mt < PRE_TC_TMMAX; mt++) {
                if (mt >= TM) continue;
                const uint32_t *r0 = xa[cc][mt][0], *r1 = xa[cc][mt][1];
                const uint32_t af[4] = {r0[2 * kh], r1[2 * kh], r0[2 * kh + 1], r1[2 * kh + 1]};
                ptx_mma_bf16_16816(acc[mt][nt], af, wv.w[2 * kh], wv.w[2 * kh + 1]);
            }
        }
        MHC_UNROLL
        for (int mt = 0; mt < PRE_TC_TMMAX; mt++) MHC_UNROLL
        for (int h = 0; h < 2; h++) MHC_UNROLL
        for (int w = 0; w < 4; w++) {
            if (mt >= TM) continue;
            const float lo = ptx_bf16_half(xa[cc][mt][h][w], 0);
            const float hi = ptx_bf16_half(xa[cc][mt][h][w], 1);
            ss[mt][h] += lo * lo + hi * hi;
        }
    }
}

/* One row of a warp's C fragments (token gq + 8 h of an m16 tile) into a partial row p: the NT
 * n8 tiles' sums to p[0..M), the row's sum of squares to p[M] (lane t4 0 holds it). */
MHC_INLINE void pre_tc_put_row(const int NT, const int M, float acc[][4], int h, int t4, float ss,
                               float *p) {
    MHC_UNROLL
    for (int nt = 0; nt < 10; nt++) {
        if (nt >= NT) continue;
        const int m = nt * 8 + 2 * t4;
        if (m < M) p[m] = acc[nt][2 * h];
        if (m + 1 < M) p[m + 1] = acc[nt][2 * h + 1];
    }
    if (t4 == 0) p[M] = ss;
}

/* Compile-time options of pre_tc_team (each combination is a kernel of its own, so the others
 * keep their registers): the rotated stage order, and x loads that ask L2 for 256-byte fills. */
#define PRE_TC_OPT_ROT 1
#define PRE_TC_OPT_L2F 2

/* One team: partial GEMM rows and sums of squares of its tokens over its K split. ws is the
 * team-shared weight buffer (two stages). With OPT & PRE_TC_OPT_ROT and g->ROT, the team walks its
 * stages starting at stage block % nst and wrapping around: teams that run at the same time then
 * read different column offsets of their rows instead of all the same one (whether lockstep offsets
 * crowd the requests onto few DRAM channels is what this variant measures). Each team's order is
 * still fixed (deterministic). */
MHC_INLINE void pre_tc_team(const int N, const int OPT, const pre_tc_geom *g, const char *x,
                            const float *phi, const float *gamma, float *part, uint16_t *ws) {
    const int ROTON = OPT & PRE_TC_OPT_ROT, L2F = (OPT & PRE_TC_OPT_L2F) != 0;
    const int M = 2 * N + N * N, NT = PRE_TC_NT(N), SC = PRE_TC_SC(N), BUF = PRE_TC_BUF(N);
    const int TM = PRE_TC_TM(N), LDW = PRE_TC_LDW(N);
    const int tid = OMPK_TID(), lane = tid & 31, warp = tid >> 5;
    const int gq = lane >> 2, t4 = lane & 3;
    const int blk = OMPK_BID();
    const int c = g->ILV ? blk % g->KS : blk / g->NG;
    const int grp = g->ILV ? blk / g->KS : blk - c * g->NG;
    const int64_t T = g->T;
    /* stage j starts at chunk q0 + j * qstep; chunks from q1 on are zeros */
    const int nstall = (g->NCH + SC - 1) / SC;
    const int q0 = g->ILV ? c * SC : c * g->CPS, qstep = g->ILV ? g->KS * SC : SC;
    const int q1 = g->ILV || q0 + g->CPS > g->NCH ? g->NCH : q0 + g->CPS;
    const int nst = g->ILV ? (nstall - c + g->KS - 1) / g->KS : (q1 - q0 + SC - 1) / SC;
    const int rot = ROTON && g->ROT && nst > 0 ? blk % nst : 0;
    const int64_t tb = (int64_t)grp * PRE_TC_TOK(N) + warp * (TM * 16) + gq;
    const char *xr[PRE_TC_TMMAX][2];
    MHC_UNROLL
    for (int mt = 0; mt < PRE_TC_TMMAX; mt++) MHC_UNROLL
    for (int h = 0; h < 2; h++) {
        if (mt >= TM) continue;
        int64_t t = tb + mt * 16 + h * 8;
        t = t < T ? t : T - 1;
        xr[mt][h] = x + ((t / g->S) * g->sx0 + (t % g->S) * g->sx1) * 2;
    }
    float acc[PRE_TC_TMMAX][10][4], ss[PRE_TC_TMMAX][2];
    MHC_UNROLL
    for (int mt = 0; mt < PRE_TC_TMMAX; mt++) {
        ss[mt][0] = ss[mt][1] = 0.f;
        MHC_UNROLL
        for (int nt = 0; nt < 10; nt++) MHC_UNROLL
        for (int e = 0; e < 4; e++) acc[mt][nt][e] = 0.f;
    }
    uint32_t xa[2][PRE_TC_TMMAX][2][4], xb[2][PRE_TC_TMMAX][2][4];
    float pw[16][2];
    MHC_UNROLL
    for (int cc = 0; cc < 2; cc++)
        if (cc < SC) pre_tc_loadx(TM, L2F, xa[cc], xr, g, q0 + rot * qstep + cc, q1, t4);
    pre_tc_fetchw(N, SC, pw, phi, gamma, g, q0 + rot * qstep, q1, tid);
    pre_tc_storew(N, SC, LDW, pw, ws, tid);
    OMPK_SYNC();
    for (int st = 0; st < nst; st++) {
        /* past the last stage: chunks from q1 on, zeros */
        const int sn = st + 1 + rot < nst ? st + 1 + rot : st + 1 + rot - nst;
        const int qn = !ROTON ? q0 + (st + 1) * qstep : st + 1 < nst ? q0 + sn * qstep : q1;
        MHC_UNROLL
        for (int cc = 0; cc < 2; cc++)
            if (cc < SC) pre_tc_loadx(TM, L2F, xb[cc], xr, g, qn + cc, q1, t4);
        if (st + 1 < nst) pre_tc_fetchw(N, SC, pw, phi, gamma, g, qn, q1, tid);
        pre_tc_stage(N, SC, LDW, TM, acc, ss, xa, ws + (st & 1) * BUF, gq, t4);
        if (st + 1 < nst) pre_tc_storew(N, SC, LDW, pw, ws + ((st + 1) & 1) * BUF, tid);
        OMPK_SYNC();
        MHC_UNROLL
        for (int cc = 0; cc < 2; cc++) {
            if (cc >= SC) continue;
            MHC_UNROLL
            for (int mt = 0; mt < PRE_TC_TMMAX; mt++) MHC_UNROLL
            for (int h = 0; h < 2; h++) MHC_UNROLL
            for (int w = 0; w < 4; w++)
                if (mt < TM) xa[cc][mt][h][w] = xb[cc][mt][h][w];
        }
    }
    MHC_UNROLL
    for (int mt = 0; mt < PRE_TC_TMMAX; mt++) MHC_UNROLL
    for (int h = 0; h < 2; h++) {
        if (mt >= TM) continue;
        /* the 4 lanes of a row hold disjoint k: their sum is the row's */
        ss[mt][h] += ptx_shfl_xor(ss[mt][h], 1);
        ss[mt][h] += ptx_shfl_xor(ss[mt][h], 2);
        const int64_t t = tb + mt * 16 + h * 8;
        if (t >= T) continue;
        pre_tc_put_row(NT, M, acc[mt], h, t4, ss[mt][h], part + ((int64_t)c * T + t) * (M + 1));
    }
}

/* The x of chunk q for the team's PRE_TCA_TOK tokens into one ring tile [token][32], by cp.async
 * (zeros stored directly past the split or past D): 4 pieces of 16 bytes a thread. */
MHC_INLINE void pre_tca_issue(const char *const xrow[4], const pre_tc_geom *g, int q, int q1,
                              uint16_t *tile, int tid) {
    int64_t off;
    const int ok = pre_tc_chunk_off(g, q, q1, 8 * (tid & 3), &off);
    MHC_UNROLL
    for (int j = 0; j < 4; j++) {
        uint16_t *dst = tile + ((tid >> 2) + 32 * j) * 32 + (tid & 3) * 8;
        if (ok) {
            ptx_cp_async16(dst, xrow[j] + off);
        } else {
            const ompk_u128 z = {{0u, 0u, 0u, 0u}};
            *(ompk_u128 *)dst = z;
        }
    }
}

/* pre_tc_team with x staged through team-shared memory: stage st's tile is copied PRE_TCA_NS - 1
 * stages ahead by cp.async, so the bytes in flight do not occupy registers and a team needs few
 * (more teams an SM). One barrier a stage: after it, stage st's x (everyone's copies) and
 * weights are visible and every warp is done with stage st - 1, whose x slot the next copy and
 * whose weight buffer the next weights then reuse. Same partials as pre_tc_team. */
MHC_INLINE void pre_tca_team(const int N, const int ROTON, const pre_tc_geom *g, const char *x,
                             const float *phi, const float *gamma, float *part, uint16_t *ws,
                             uint16_t *xs) {
    const int M = 2 * N + N * N, NT = PRE_TC_NT(N), TM = PRE_TCA_TM, NS = PRE_TCA_NS;
    const int WBUF = PRE_TCA_WBUF(N), XBUF = PRE_TCA_XBUF;
    const int tid = OMPK_TID(), lane = tid & 31, warp = tid >> 5;
    const int gq = lane >> 2, t4 = lane & 3;
    const int blk = OMPK_BID();
    const int c = g->ILV ? blk % g->KS : blk / g->NG;
    const int grp = g->ILV ? blk / g->KS : blk - c * g->NG;
    const int64_t T = g->T;
    const int q0 = g->ILV ? c : c * g->CPS, qstep = g->ILV ? g->KS : 1;
    const int q1 = g->ILV || q0 + g->CPS > g->NCH ? g->NCH : q0 + g->CPS;
    const int nst = g->ILV ? (g->NCH - c + g->KS - 1) / g->KS : q1 - q0;
    const int64_t t0 = (int64_t)grp * PRE_TCA_TOK;
    /* stage s reads chunk q0 + ((s + rot) % nst) * qstep (see pre_tc_team) */
    const int rot = ROTON && g->ROT && nst > 0 ? blk % nst : 0;
#define PRE_TCA_Q(s) (q0 + ((s) + rot < nst ? (s) + rot : (s) + rot - nst) * qstep)
    /* rows this thread copies: tokens tid / 4 + 32 j of the group */
    const char *xrow[4];
    MHC_UNROLL
    for (int j = 0; j < 4; j++) {
        int64_t t = t0 + (tid >> 2) + 32 * j;
        t = t < T ? t : T - 1;
        xrow[j] = x + ((t / g->S) * g->sx0 + (t % g->S) * g->sx1) * 2;
    }
    float acc[PRE_TC_TMMAX][10][4], ss[PRE_TC_TMMAX][2];
    MHC_UNROLL
    for (int mt = 0; mt < PRE_TC_TMMAX; mt++) {
        ss[mt][0] = ss[mt][1] = 0.f;
        MHC_UNROLL
        for (int nt = 0; nt < 10; nt++) MHC_UNROLL
        for (int e = 0; e < 4; e++) acc[mt][nt][e] = 0.f;
    }
    float pw[16][2];
    MHC_UNROLL
    for (int s = 0; s < NS - 1; s++) {
        if (s < nst) pre_tca_issue(xrow, g, PRE_TCA_Q(s), q1, xs + s * XBUF, tid);
        ptx_cp_async_commit();
    }
    pre_tc_fetchw(N, 1, pw, phi, gamma, g, PRE_TCA_Q(0), q1, tid);
    pre_tc_storew(N, 1, 32, pw, ws, tid);
    int slot = 0; /* st % NS */
    for (int st = 0; st < nst; st++) {
        /* groups committed: st + NS - 1; all but the newest NS - 2 = 1 have landed */
        ptx_cp_async_wait1();
        OMPK_SYNC();
        const int sn = st + NS - 1, slot_n = slot == 0 ? NS - 1 : slot - 1;
        if (sn < nst) pre_tca_issue(xrow, g, PRE_TCA_Q(sn), q1, xs + slot_n * XBUF, tid);
        ptx_cp_async_commit();
        if (st + 1 < nst) pre_tc_fetchw(N, 1, pw, phi, gamma, g, PRE_TCA_Q(st + 1), q1, tid);
        uint32_t xa[2][PRE_TC_TMMAX][2][4];
        const uint16_t *xt = xs + slot * XBUF + (warp * TM * 16 + gq) * 32 + t4 * 8;
        MHC_UNROLL
        for (int mt = 0; mt < PRE_TC_TMMAX; mt++) MHC_UNROLL
        for (int h = 0; h < 2; h++) {
            if (mt >= TM) continue;
            const ompk_u128 v = *(const ompk_u128 *)(xt + (mt * 16 + h * 8) * 32);
            MHC_UNROLL
            for (int w = 0; w < 4; w++) xa[0][mt][h][w] = v.w[w];
        }
        pre_tc_stage(N, 1, 32, TM, acc, ss, xa, ws + (st & 1) * WBUF, gq, t4);
        if (st + 1 < nst) pre_tc_storew(N, 1, 32, pw, ws + ((st + 1) & 1) * WBUF, tid);
        slot = slot == NS - 1 ? 0 : slot + 1;
    }
    const int64_t tb = t0 + warp * (TM * 16) + gq;
    MHC_UNROLL
    for (int mt = 0; mt < PRE_TC_TMMAX; mt++) MHC_UNROLL
    for (int h = 0; h < 2; h++) {
        if (mt >= TM) continue;
        ss[mt][h] += ptx_shfl_xor(ss[mt][h], 1);
        ss[mt][h] += ptx_shfl_xor(ss[mt][h], 2);
        const int64_t t = tb + mt * 16 + h * 8;
        if (t >= T) continue;
        pre_tc_put_row(NT, M, acc[mt], h, t4, ss[mt][h], part + ((int64_t)c * T + t) * (M + 1));
    }
}

#undef PRE_TCA_Q

/* Launch 2 on the tensor-core path, lane-parallel: a token is LPT lanes (16 for n <= 4, so two
 * tokens a warp; 32 above). Its M + 1 partial sums are added over the splits in split order (the
 * order of the one-thread-a-token kernel: bit-identical sums), staged in team-shared memory, and
 * the Sinkhorn matrix lives one entry per lane on an NP x NP grid (NP = 4 or 8, two entries a
 * lane for n > 4: rows lane / 8 and lane / 8 + 4): row sums and maxima are xor shuffles over the
 * column bits of the lane, column sums over the row bits, in a fixed tree order
 * (deterministic). Entries outside n x n stay 0. */
#define PRE_EPI_LPT(N) ((N) <= 4 ? 16 : 32)
#define PRE_EPI_NP(N) ((N) <= 4 ? 4 : 8)
#define PRE_EPI_TOK(N) (PRE_TC_THREADS / PRE_EPI_LPT(N)) /* tokens per team */
#define PRE_EPI_MP 84                                    /* floats a token: >= M + 1 = 81 */
#define PRE_EPI_SMEM (PRE_TC_THREADS / 16 * PRE_EPI_MP)

MHC_INLINE float pre_epi_sigmoid(float z) {
    return 1.f / (1.f + expf(-z));
}

/* sum (or maximum) over the lanes whose bits in [lo, hi) differ, a fixed butterfly */
MHC_INLINE float pre_epi_sum(float v, int lo, int hi) {
    for (int o = lo; o < hi; o <<= 1) v += ptx_shfl_xor(v, o);
    return v;
}
MHC_INLINE float pre_epi_max(float v, int lo, int hi) {
    for (int o = lo; o < hi; o <<= 1) {
        const float u = ptx_shfl_xor(v, o);
        v = u > v ? u : v;
    }
    return v;
}

/* One team: tokens PRE_EPI_TOK(N) * block .. of the KS-split partials in part; es is the
 * team-shared staging buffer (PRE_EPI_SMEM floats). Writes what pre_token writes. */
MHC_INLINE void pre_epi_team(const int N, const pre_tc_geom *g, int KS, const float *part,
                             const mhc_pre_fwd_args *a, const float *alpha, const float *bias,
                             float *hp_ws, float *h_post, float *logits, float *comb, float *h_mix,
                             float *inv_rms, float *h_pre, float *es) {
    const int M = 2 * N + N * N, MP = M + 1, LPT = PRE_EPI_LPT(N), NP = PRE_EPI_NP(N);
    const int ER = NP * NP / LPT; /* Sinkhorn entries a lane: 1 or 2 */
    const int tid = OMPK_TID(), slot = tid / LPT, l = tid % LPT;
    const int64_t T = g->T, t = (int64_t)OMPK_BID() * PRE_EPI_TOK(N) + slot;
    /* past T: lane work on the last token (the shuffles need every lane), nothing written */
    const int live_t = t < T;
    const int64_t tl = live_t ? t : T - 1;
    float *e = es + slot * PRE_EPI_MP;
    for (int m = l; m < MP; m += LPT) {
        float sum = 0.f;
        for (int c = 0; c < KS; c++) sum += part[((int64_t)c * T + tl) * MP + m];
        e[m] = sum;
    }
    OMPK_SYNC();
    const float r = 1.f / sqrtf(e[M] / (float)((int64_t)N * g->D) + a->norm_eps);
    const float a0 = alpha[0], a1 = alpha[a->salpha], a2 = alpha[2 * a->salpha];
    const int64_t b = tl / g->S, s = tl % g->S;
    if (live_t) {
        if (inv_rms && l == 0) inv_rms[t * a->sinv] = r;
        if (h_mix)
            for (int m = l; m < M; m += LPT) h_mix[t * a->shmix[0] + m * a->shmix[1]] = e[m];
        if (l < N) {
            const float hp = pre_epi_sigmoid(a0 * (e[l] * r) + bias[l * a->sbias]) + a->hc_eps;
            hp_ws[t * N + l] = hp;
            if (h_pre) h_pre[t * a->shpre[0] + l * a->shpre[1]] = hp;
            h_post[b * a->shpost[0] + s * a->shpost[1] + l * a->shpost[2]] =
                a->post_mult * pre_epi_sigmoid(a1 * (e[N + l] * r) + bias[(N + l) * a->sbias]);
        }
    }
    float cv[2];
    int live[2];
    MHC_UNROLL
    for (int u = 0; u < 2; u++) {
        cv[u] = 0.f, live[u] = 0;
        if (u >= ER) continue;
        const int q = l + u * LPT, i = q / NP, j = q % NP;
        live[u] = i < N && j < N;
        const int m = 2 * N + i * N + j;
        cv[u] = live[u] ? a2 * (e[m] * r) + bias[m * a->sbias] : -INFINITY;
        if (live[u] && live_t && logits)
            logits[b * a->slog[0] + s * a->slog[1] + i * a->slog[2] + j * a->slog[3]] = cv[u];
    }
    if (!comb) return;
    const float eps = a->sk_eps;
    /* softmax over j (max-subtracted), then + eps */
    MHC_UNROLL
    for (int u = 0; u < 2; u++) {
        if (u >= ER) continue;
        const float mx = pre_epi_max(cv[u], 1, NP);
        const float ex = live[u] ? expf(cv[u] - mx) : 0.f;
        const float sum = pre_epi_sum(ex, 1, NP);
        cv[u] = live[u] ? ex / sum + eps : 0.f;
    }
    for (int rr = 0; rr < a->repeat; rr++) {
        if (rr > 0) {
            MHC_UNROLL
            for (int u = 0; u < 2; u++) {
                if (u >= ER) continue;
                const float sum = pre_epi_sum(cv[u], 1, NP) + eps;
                cv[u] = live[u] ? cv[u] / sum : 0.f;
            }
        }
        const float sum = pre_epi_sum(ER == 2 ? cv[0] + cv[1] : cv[0], NP, LPT) + eps;
        MHC_UNROLL
        for (int u = 0; u < 2; u++)
            if (u < ER) cv[u] = live[u] ? cv[u] / sum : 0.f;
    }
    MHC_UNROLL
    for (int u = 0; u < 2; u++) {
        if (u >= ER || !live[u] || !live_t) continue;
        const int q = l + u * LPT, i = q / NP, j = q % NP;
        comb[b * a->scomb[0] + s * a->scomb[1] + i * a->scomb[2] + j * a->scomb[3]] = cv[u];
    }
}

MHC_INLINE void pre_tc_hin_load(const int N, const pre_tc_geom *g, const char *x, int64_t t,
                                int64_t d, ompk_u128 v[8]);
MHC_INLINE void pre_tc_hin_store(const int N, const pre_tc_geom *g, const float *hp, char *h_in,
                                 int64_t t, int64_t d, const ompk_u128 v[8]);

/* Launches 2 and 3 as one kernel: pre_epi_team for the team's tokens, then their h_in rows
 * (pieces of 8, adjacent threads on adjacent pieces of a row: the stream rows are read as
 * contiguous runs) from the h_pre the team just wrote (the barrier orders global memory within
 * the team). One launch less, and the x of a team's tokens is read right after its h_pre. */
MHC_INLINE void pre_epi_hin_team(const int N, const pre_tc_geom *g, int KS, const float *part,
                                 const mhc_pre_fwd_args *a, const float *alpha, const float *bias,
                                 float *hp_ws, float *h_post, float *logits, float *comb,
                                 float *h_mix, float *inv_rms, float *h_pre, float *es,
                                 const char *x, char *h_in) {
    pre_epi_team(N, g, KS, part, a, alpha, bias, hp_ws, h_post, logits, comb, h_mix, inv_rms, h_pre,
                 es);
    OMPK_SYNC();
    const int64_t t0 = (int64_t)OMPK_BID() * PRE_EPI_TOK(N), np = g->D / 8;
    const int64_t nt = g->T - t0 < PRE_EPI_TOK(N) ? g->T - t0 : PRE_EPI_TOK(N);
    /* two pieces an iteration, both loads first: twice the bytes in flight a thread */
    for (int64_t w = OMPK_TID(); w < nt * np; w += 2 * PRE_TC_THREADS) {
        const int64_t w2 = w + PRE_TC_THREADS, u = w / np, u2 = w2 / np;
        ompk_u128 v[8], v2[8];
        pre_tc_hin_load(N, g, x, t0 + u, (w - u * np) * 8, v);
        if (w2 < nt * np) pre_tc_hin_load(N, g, x, t0 + u2, (w2 - u2 * np) * 8, v2);
        pre_tc_hin_store(N, g, hp_ws, h_in, t0 + u, (w - u * np) * 8, v);
        if (w2 < nt * np) pre_tc_hin_store(N, g, hp_ws, h_in, t0 + u2, (w2 - u2 * np) * 8, v2);
    }
}

/* h_in for the 8 elements at d of token t (16-byte loads and store; D % 8 == 0), from the
 * token's h_pre in hp [T][N]: the loads, then the sums and the store. */
MHC_INLINE void pre_tc_hin_load(const int N, const pre_tc_geom *g, const char *x, int64_t t,
                                int64_t d, ompk_u128 v[8]) {
    const int64_t b = t / g->S, s = t % g->S;
    const char *xp = x + (b * g->sx0 + s * g->sx1 + d) * 2;
    MHC_UNROLL
    for (int i = 0; i < 8; i++)
        if (i < N) v[i] = *(const ompk_u128 *)(xp + i * g->sx2 * 2);
}

MHC_INLINE void pre_tc_hin_store(const int N, const pre_tc_geom *g, const float *hp, char *h_in,
                                 int64_t t, int64_t d, const ompk_u128 v[8]) {
    const int64_t b = t / g->S, s = t % g->S;
    float acc[8];
    MHC_UNROLL
    for (int e = 0; e < 8; e++) acc[e] = 0.f;
    MHC_UNROLL
    for (int i = 0; i < 8; i++) {
        if (i >= N) continue;
        const float h = hp[t * N + i];
        MHC_UNROLL
        for (int w = 0; w < 4; w++) {
            acc[2 * w] += h * ptx_bf16_half(v[i].w[w], 0);
            acc[2 * w + 1] += h * ptx_bf16_half(v[i].w[w], 1);
        }
    }
    ompk_u128 o;
    MHC_UNROLL
    for (int w = 0; w < 4; w++) o.w[w] = ptx_pack_bf16x2(acc[2 * w], acc[2 * w + 1]);
    *(ompk_u128 *)(h_in + (b * g->shin0 + s * g->shin1 + d) * 2) = o;
}

MHC_INLINE void pre_tc_hin(const int N, const pre_tc_geom *g, const char *x, const float *hp,
                           char *h_in, int64_t t, int64_t d) {
    ompk_u128 v[8];
    pre_tc_hin_load(N, g, x, t, d, v);
    pre_tc_hin_store(N, g, hp, h_in, t, d, v);
}
#endif /* OMPK_NV_KERNELS */

#endif
