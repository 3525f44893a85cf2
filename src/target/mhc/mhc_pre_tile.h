/* Launch 1 of the portable pre forward (mhc_pre_fwd.c) on team-shared tiles: standard OpenMP only
 * (target teams, one parallel region a team, barriers, team-shared arrays), for any GPU a compiler
 * offloads to, and the host.
 *
 * A work item is (chunk c = d range [d0, d1) of stream i, tile of PTL_TB tokens); its PTL_T threads
 * walk the chunk in steps of PTL_KB. Each step the team stores the tile's x (as f32, a token's
 * row at a time) and the step's weight rows in shared memory, then lane l of warp v (mg = l % 4,
 * tg = 8 v + l / 4) adds x[t][d] * w[d][m] for its tokens t = tg + 32 u (u < 4) and its columns
 * m = mg * MPT + j (j < MPT), every operand a 16-byte shared load: a warp reads 8 x rows and 4
 * weight groups, each load one conflict-free wavefront. The weights come grouped, [K][4][MPP]
 * (gamma folded in, zero padded), so a thread's columns are one aligned run. A thread's sum of a
 * (t, m) runs over d in order, one fma a step, whatever the tiling; padding (d >= d1, t >= T) adds
 * exact zeros and is never written. The sum of squares of token t is kept by the threads that load
 * its row, one partial per 8-element group of a step (oct), and the groups added in order at the
 * end. GCC builds (no team-shared memory) and a team that got fewer than PTL_T threads run
 * pre_tile_token, the host pre_tile_pair: the same sums in the same order, one thread a token or
 * a pair.
 * tests/test_mhc_pre_tile_emu.c runs the team function with emulated teams and checks it bit for
 * bit against pre_tile_rows. */
#ifndef OMPK_MHC_PRE_TILE_H
#define OMPK_MHC_PRE_TILE_H

#include <omp.h>

#include "mhc_host_vec.h"
#include "mhc_kern.h"

#if defined(OMPK_EMULATE)
#define PTL_TID() OMPK_EMU_TID()
#define PTL_SYNC() OMPK_EMU_SYNC()
#else
#define PTL_TID() omp_get_thread_num()
#define PTL_SYNC() MHC_SYNC()
#endif

#define PTL_TB 128           /* tokens a tile */
#define PTL_KB 32            /* d a step */
#define PTL_T 128            /* threads a team: 4 column groups of 32 */
#define PTL_XP (PTL_KB + 4)  /* pitch of a token row in xs: 16-byte rows, conflict-free reads */
#define PTL_OCT (PTL_KB / 8) /* 8-element groups of a step's row */
#define PTL_LJ (PTL_TB * PTL_OCT / PTL_T)          /* groups a thread loads a step */
#define PTL_MPT(N) ((2 * (N) + (N) * (N) + 3) / 4) /* columns a thread */
#define PTL_MPP(N) ((PTL_MPT(N) + 3) & ~3)         /* the same, padded to 16 bytes */
#define PTL_WG(N) (4 * PTL_MPP(N))                 /* floats of a grouped weight row */
#define PTL_MPTMAX PTL_MPT(8)
#define PTL_MMAX (2 * 8 + 8 * 8)
#define PTL_XS (PTL_TB * PTL_XP) /* floats of the team's x tile (also the oct partials) */

/* What every item of a call shares. */
typedef struct pre_tile_geom {
    int64_t sx0, sx1, sx2, S, T, D, CD, NCD, NTL; /* NTL: token tiles */
    int bf16, vec;
} pre_tile_geom;

static inline int pre_tile_wg(int n) {
    return PTL_WG(n);
}

/* Grouped weight column q of a row: the model column it holds, or -1 for padding. */
static inline int pre_tile_col(int n, int q) {
    const int M = 2 * n + n * n, mpt = (M + 3) / 4, mpp = (mpt + 3) & ~3;
    const int g = q / mpp, j = q - g * mpp, m = g * mpt + j;
    return j < mpt && m < M ? m : -1;
}

/* Item w's chunk and first token. */
MHC_INLINE void pre_tile_item(const pre_tile_geom *g, int64_t w, int *i, int64_t *d0, int64_t *d1,
                              int64_t *t0, int64_t *c) {
    *c = w / g->NTL;
    *t0 = (w - *c * g->NTL) * PTL_TB;
    *i = (int)(*c / g->NCD);
    *d0 = (*c - (int64_t)*i * g->NCD) * g->CD;
    *d1 = *d0 + g->CD < g->D ? *d0 + g->CD : g->D;
}

/* Token t's row of stream i (t clamped to T - 1: padding tokens read a real row). */
MHC_INLINE const char *pre_tile_row(const pre_tile_geom *g, const char *x, int64_t t, int i) {
    const int64_t tt = t < g->T ? t : g->T - 1;
    return x +
           ((tt / g->S) * g->sx0 + (tt % g->S) * g->sx1 + (int64_t)i * g->sx2) * (g->bf16 ? 2 : 4);
}

/* Elements d .. d + 7 of a row (d < d1; those at or past d1 read as 0). */
MHC_INLINE void pre_tile_load8(const pre_tile_geom *g, const char *row, int64_t d, int64_t d1,
                               float v[8]) {
    if (g->vec && d + 8 <= d1) {
        ompk_load8(row + d * (g->bf16 ? 2 : 4), g->bf16, v);
        return;
    }
    MHC_UNROLL
    for (int e = 0; e < 8; e++) v[e] = d + e < d1 ? ompk_load_f(row, d + e, g->bf16) : 0.f;
}

/* A loader's 8 x values into the shared tile at dst (16-byte aligned), their squares into ss. */
MHC_INLINE void pre_tile_put8(const float v[8], float *dst, float *ss) {
    MHC_UNROLL
    for (int e = 0; e < 8; e++) *ss = fmaf(v[e], v[e], *ss);
    mhc_f4 *d4 = (mhc_f4 *)dst;
    MHC_UNROLL
    for (int h = 0; h < 2; h++) MHC_UNROLL
    for (int e = 0; e < 4; e++) d4[h].v[e] = v[4 * h + e];
}

/* A thread's 16-byte words of a step's grouped weight rows (PTL_KB * WG floats: a multiple of
 * 4 * PTL_T, since WG is a multiple of 16). */
#define PTL_WJ(N) (PTL_KB * PTL_WG(N) / 4 / PTL_T)
#define PTL_WJMAX PTL_WJ(8)

/* pre_tile_team for x of one dtype (BF: bf16; a constant on the GPU). */
MHC_INLINE void pre_tile_team_bf(const int N, const int BF, const pre_tile_geom *g, const char *x,
                                 const float *wg, float *part, int64_t w, float *xs, float *ws) {
    const int M = 2 * N + N * N, MP = M + 1, MPT = PTL_MPT(N), WG = PTL_WG(N), ESZ = BF ? 2 : 4;
    const int tid = PTL_TID();
    /* the fast path's test read once: through g, every barrier would reload it */
    const int vec = g->vec;
    int i;
    int64_t d0, d1, t0, c;
    pre_tile_item(g, w, &i, &d0, &d1, &t0, &c);
    const int64_t T = g->T;
    /* loader role: the 8-element group oct of tokens lt + LS j */
    const int LS = PTL_T / PTL_OCT, lt = tid / PTL_OCT, oct = tid % PTL_OCT;
    const char *lrow[PTL_LJ];
    float ssa[PTL_LJ];
    MHC_UNROLL
    for (int j = 0; j < PTL_LJ; j++)
        lrow[j] = pre_tile_row(g, x, t0 + lt + LS * j, i), ssa[j] = 0.f;
    /* compute role */
    const int mg = tid & 3, tg = ((tid >> 5) << 3) | ((tid & 31) >> 2);
    float acc[4][PTL_MPTMAX];
    MHC_UNROLL
    for (int u = 0; u < 4; u++) MHC_UNROLL
    for (int j = 0; j < PTL_MPTMAX; j++) acc[u][j] = 0.f;
    const float *wrow = wg + ((int64_t)i * g->D + d0) * WG;
    for (int64_t s0 = d0; s0 < d1; s0 += PTL_KB) {
        /* the step's x (as f32) and weight rows into shared memory; rows at or past d1 zero */
        const int64_t kn = d1 - s0 < PTL_KB ? d1 - s0 : PTL_KB;
        const float *wstep = wrow + (s0 - d0) * WG;
        if (vec && kn == PTL_KB) {
            /* a whole step of aligned rows: every load issued before the first is used */
            ompk_u128 xr[PTL_LJ][2];
            ompk_u128 wr[PTL_WJMAX];
            MHC_UNROLL
            for (int j = 0; j < PTL_LJ; j++) MHC_UNROLL
            for (int h = 0; h < 2; h++)
                xr[j][h] = h * 2 < ESZ ? ((const ompk_u128 *)(lrow[j] + (s0 + 8 * oct) * ESZ))[h]
                                       : (ompk_u128){{0u, 0u, 0u, 0u}};
            MHC_UNROLL
            for (int q = 0; q < PTL_WJMAX; q++)
                if (q < PTL_WJ(N)) wr[q] = ((const ompk_u128 *)wstep)[tid + q * PTL_T];
            MHC_UNROLL
            for (int j = 0; j < PTL_LJ; j++) {
                float v[8];
                ompk_load8(xr[j], BF, v);
                pre_tile_put8(v, xs + (lt + LS * j) * PTL_XP + 8 * oct, &ssa[j]);
            }
            /* element by element: a whole-struct copy went through the stack */
            MHC_UNROLL
            for (int q = 0; q < PTL_WJMAX; q++) MHC_UNROLL
            for (int e = 0; e < 4; e++)
                if (q < PTL_WJ(N)) ((ompk_u128 *)ws)[tid + q * PTL_T].w[e] = wr[q].w[e];
        } else {
            MHC_UNROLL
            for (int j = 0; j < PTL_LJ; j++) {
                float v[8];
                pre_tile_load8(g, lrow[j], s0 + 8 * oct, d1, v);
                pre_tile_put8(v, xs + (lt + LS * j) * PTL_XP + 8 * oct, &ssa[j]);
            }
            MHC_UNROLL
            for (int q = 0; q < PTL_WJMAX; q++) {
                const int f = tid + q * PTL_T;
                if (q >= PTL_WJ(N)) continue;
                MHC_UNROLL
                for (int e = 0; e < 4; e++)
                    ws[4 * f + e] = f / (WG / 4) < kn ? wstep[4 * f + e] : 0.f;
            }
        }
        PTL_SYNC();
        for (int kk = 0; kk < PTL_KB; kk += 4) {
            mhc_f4 xv[4];
            MHC_UNROLL
            for (int u = 0; u < 4; u++) xv[u] = *(const mhc_f4 *)(xs + (tg + 32 * u) * PTL_XP + kk);
            MHC_UNROLL
            for (int e = 0; e < 4; e++) {
                const mhc_f4 *wq = (const mhc_f4 *)(ws + (kk + e) * WG + mg * PTL_MPP(N));
                MHC_UNROLL
                for (int q = 0; q < PTL_MPP(PTL_MPTMAX) / 4; q++) {
                    if (4 * q >= MPT) continue;
                    const mhc_f4 wv = wq[q];
                    MHC_UNROLL
                    for (int r = 0; r < 4; r++) {
                        if (4 * q + r >= MPT) continue;
                        MHC_UNROLL
                        for (int u = 0; u < 4; u++)
                            acc[u][4 * q + r] = fmaf(xv[u].v[e], wv.v[r], acc[u][4 * q + r]);
                    }
                }
            }
        }
        PTL_SYNC();
    }
    MHC_UNROLL
    for (int u = 0; u < 4; u++) {
        const int64_t t = t0 + tg + 32 * u;
        if (t >= T) continue;
        float *p = part + (c * T + t) * MP;
        MHC_UNROLL
        for (int j = 0; j < PTL_MPTMAX; j++)
            if (j < MPT && mg * MPT + j < M) p[mg * MPT + j] = acc[u][j];
    }
    /* the sums of squares: the groups' partials of a token, in order */
    MHC_UNROLL
    for (int j = 0; j < PTL_LJ; j++) xs[(lt + LS * j) * PTL_OCT + oct] = ssa[j];
    PTL_SYNC();
    for (int r = tid; r < PTL_TB; r += PTL_T) {
        const float *q = xs + r * PTL_OCT;
        float ss = q[0];
        for (int o = 1; o < PTL_OCT; o++) ss += q[o];
        if (t0 + r < T) part[(c * T + t0 + r) * MP + M] = ss;
    }
    PTL_SYNC();
}

/* Launch 1's team function: one item, the team's PTL_T threads in their two roles. A GPU, which
 * runs it, gets a copy per dtype; host compilations (the emulation tests, the target region's
 * host fallback) one copy with the dtype read at run time, which halves their compile time. */
MHC_INLINE void pre_tile_team(const int N, const pre_tile_geom *g, const char *x, const float *wg,
                              float *part, int64_t w, float *xs, float *ws) {
#if defined(__NVPTX__) || defined(__AMDGCN__)
    if (g->bf16)
        pre_tile_team_bf(N, 1, g, x, wg, part, w, xs, ws);
    else
        pre_tile_team_bf(N, 0, g, x, wg, part, w, xs, ws);
#else
    pre_tile_team_bf(N, g->bf16, g, x, wg, part, w, xs, ws);
#endif
}

/* pre_tile_team's sums of token r of item w without the team layout: every column's sum in
 * registers, d in order (the same fma a step); the sum of squares in the same groups. */
MHC_INLINE void pre_tile_token(const int N, const pre_tile_geom *g, const char *x, const float *wg,
                               float *part, int64_t w, int r) {
    const int M = 2 * N + N * N, MP = M + 1, MPT = PTL_MPT(N), WG = PTL_WG(N);
    int i;
    int64_t d0, d1, t0, c;
    pre_tile_item(g, w, &i, &d0, &d1, &t0, &c);
    const int64_t t = t0 + r;
    if (t >= g->T) return;
    const char *row = pre_tile_row(g, x, t, i);
    float acc[PTL_MMAX], ss[PTL_OCT];
    MHC_UNROLL
    for (int m = 0; m < PTL_MMAX; m++) acc[m] = 0.f;
    MHC_UNROLL
    for (int o = 0; o < PTL_OCT; o++) ss[o] = 0.f;
    for (int64_t s0 = d0; s0 < d1; s0 += PTL_KB) {
        MHC_UNROLL
        for (int o = 0; o < PTL_OCT; o++) {
            float v[8];
            pre_tile_load8(g, row, s0 + 8 * o, d1, v);
            MHC_UNROLL
            for (int e = 0; e < 8; e++) {
                const int64_t d = s0 + 8 * o + e;
                if (d >= d1) break;
                const float *wr = wg + ((int64_t)i * g->D + d) * WG;
                /* group by group: each group's columns are one contiguous run of wr */
                MHC_UNROLL
                for (int q = 0; q < 4; q++) MHC_UNROLL
                for (int j = 0; j < PTL_MPTMAX; j++)
                    if (j < MPT && q * MPT + j < M)
                        acc[q * MPT + j] = fmaf(v[e], wr[q * PTL_MPP(N) + j], acc[q * MPT + j]);
                ss[o] = fmaf(v[e], v[e], ss[o]);
            }
        }
    }
    float *p = part + (c * g->T + t) * MP;
    MHC_UNROLL
    for (int m = 0; m < PTL_MMAX; m++)
        if (m < M) p[m] = acc[m];
    float sum = ss[0];
    MHC_UNROLL
    for (int o = 1; o < PTL_OCT; o++) sum += ss[o];
    p[M] = sum;
}

/* One element of pre_tile_pair's two tokens (values v0, v1): every column of weight row wr, and
 * the sums of squares. */
MHC_INLINE void pre_tile_pair_el(const int NV, const float *wr, float v0, float v1, mhc_f8 *a0,
                                 mhc_f8 *a1, float *s0, float *s1) {
    MHC_UNROLL
    for (int q = 0; q < NV; q++) {
        mhc_f8 wv;
        __builtin_memcpy(&wv, wr + 8 * q, sizeof wv);
        a0[q] += v0 * wv;
        a1[q] += v1 * wv;
    }
    *s0 = fmaf(v0, v0, *s0);
    *s1 = fmaf(v1, v1, *s1);
}

/* pre_tile_token for tokens r and r + 1 on the host: each weight row read once for both, the
 * products over the padded grouped row (padding weights are zero, their sums never written) as
 * whole 8-float vectors (WG is a multiple of 16). The same fma a step in the same order (the
 * build contracts a += v * w): the same bits. */
MHC_INLINE void pre_tile_pair(const int N, const pre_tile_geom *g, const char *x, const float *wg,
                              float *part, int64_t w, int r) {
    const int M = 2 * N + N * N, MP = M + 1, MPT = PTL_MPT(N), MPP = PTL_MPP(N), WG = PTL_WG(N);
    const int NV = WG / 8;
    int i;
    int64_t d0, d1, t0, c;
    pre_tile_item(g, w, &i, &d0, &d1, &t0, &c);
    const int64_t t = t0 + r;
    if (t >= g->T) return;
    const char *row[2] = {pre_tile_row(g, x, t, i), pre_tile_row(g, x, t + 1, i)};
    mhc_f8 acc[2][PTL_WG(8) / 8];
    float ss[2][PTL_OCT];
    MHC_UNROLL
    for (int u = 0; u < 2; u++) {
        MHC_UNROLL
        for (int q = 0; q < NV; q++) acc[u][q] = (mhc_f8){0};
        MHC_UNROLL
        for (int o = 0; o < PTL_OCT; o++) ss[u][o] = 0.f;
    }
    /* 8-element groups in order; group d's partial of the sum of squares is oct (d - d0) / 8 % 4,
     * as in the team and token paths */
    for (int64_t d = d0; d < d1; d += 8) {
        const int o = (int)((d - d0) >> 3) & (PTL_OCT - 1);
        const float *wd = wg + ((int64_t)i * g->D + d) * WG;
        float v[2][8];
        pre_tile_load8(g, row[0], d, d1, v[0]);
        pre_tile_load8(g, row[1], d, d1, v[1]);
        /* a whole group as a fixed count (kept in registers), a tail element by element */
        if (d + 8 <= d1) {
            MHC_UNROLL
            for (int e = 0; e < 8; e++)
                pre_tile_pair_el(NV, wd + e * WG, v[0][e], v[1][e], acc[0], acc[1], &ss[0][o],
                                 &ss[1][o]);
            continue;
        }
        for (int e = 0; e < d1 - d; e++)
            pre_tile_pair_el(NV, wd + e * WG, v[0][e], v[1][e], acc[0], acc[1], &ss[0][o],
                             &ss[1][o]);
    }
    for (int u = 0; u < 2; u++) {
        if (t + u >= g->T) break;
        float *p = part + (c * g->T + t + u) * MP;
        for (int q = 0; q < 4; q++)
            for (int j2 = 0; j2 < MPT && q * MPT + j2 < M; j2++)
                p[q * MPT + j2] = acc[u][(q * MPP + j2) / 8][(q * MPP + j2) % 8];
        float sum = ss[u][0];
        for (int o = 1; o < PTL_OCT; o++) sum += ss[u][o];
        p[M] = sum;
    }
}

/* The item's tokens over the team's threads, whatever their number. */
MHC_INLINE void pre_tile_rows(const int N, const pre_tile_geom *g, const char *x, const float *wg,
                              float *part, int64_t w) {
    for (int r = omp_get_thread_num(); r < PTL_TB; r += omp_get_num_threads())
        pre_tile_token(N, g, x, wg, part, w, r);
}

#endif
