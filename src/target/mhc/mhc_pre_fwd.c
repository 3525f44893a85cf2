/* mHC pre, forward (docs/KERNELS.md 1.1), Sinkhorn (1.3) optionally fused; one OpenMP source for
 * GPU and host. Three launches:
 *  1. GEMM + sum of squares in one pass over x (mhc_pre_tile.h): work item = (K chunk, tile of
 *     tokens), the team's threads sharing the tile's x and weight rows through team-shared memory;
 *     each item writes the partial sums of its tokens.
 *  2. Per token: the partials summed in fixed chunk order (deterministic), then rms, sigmoids,
 *     logits and the Sinkhorn iterations in registers. A team sums a tile of tokens with
 *     coalesced loads into team-shared rows, then one thread a token (pre_simt_epi).
 *  3. h_in = sum_i h_pre[i] * x[i], a second streaming pass over x, 16-byte loads a piece of 8
 *     elements where the rows allow them (pre_hin8).
 * Splitting K over items keeps every SM busy for any T; the partials cost (M+1) floats per
 * token and chunk, which is small next to x. On the host the three launches become one pass over
 * token tiles (mhc_pre_fwd_host.h, pre_host_<n>): one partial row a token, and x still in cache
 * for h_in. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "mhc_kern.h"
#include "mhc_pre_dec.h"
#include "mhc_pre_tc.h"
#include "mhc_pre_tcw.h"
#include "mhc_pre_tile.h"

#define NMAX 8
#define MMAX (2 * NMAX + NMAX * NMAX)

#include "mhc_pre_fwd_host.h"
#include "mhc_pre_token.h"

typedef struct pre_geom {
    int64_t T, K, CD, NCD, NC, MP, NTL; /* chunk width, chunks per stream, chunks, partial row,
                                           token tiles */
} pre_geom;

/* gpu: the chunk split for a GPU's teams; the host takes a stream's row as one chunk (its threads
 * have tokens enough, and fewer partials to write and sum). */
static pre_geom pre_geometry(const mhc_pre_fwd_args *a, int gpu) {
    pre_geom g;
    const int n = a->n, M = 2 * n + n * n;
    g.T = a->B * a->S;
    g.K = (int64_t)n * a->D;
    g.MP = M + 1;
    g.NTL = (g.T + PTL_TB - 1) / PTL_TB;
    if (g.NTL < 1) g.NTL = 1;
    /* about 1536 items in all: enough teams to fill a GPU, few enough partials, and close below a
     * whole number of rounds of resident teams on an H100/H200 (132 SMs, 3 GEMM teams each) */
    int64_t want = 1536 / g.NTL;
    int64_t ncd = gpu ? (want + n - 1) / n : 1;
    const int64_t max_ncd = (a->D + PTL_KB - 1) / PTL_KB;
    if (ncd > max_ncd) ncd = max_ncd;
    if (ncd < 1) ncd = 1;
    int64_t cd = (a->D + ncd - 1) / ncd;
    cd = (cd + PTL_KB - 1) / PTL_KB * PTL_KB;
    if (cd < PTL_KB) cd = PTL_KB;
    g.CD = cd;
    g.NCD = a->D > 0 ? (a->D + cd - 1) / cd : 1;
    g.NC = g.NCD * n;
    return g;
}

/* Enough for either path: which one runs is decided with the call's device at launch. */
int64_t mhc_pre_fwd_workspace(const mhc_pre_fwd_args *a) {
    pre_geom g = pre_geometry(a, 1);
    const int64_t simt =
        (int64_t)sizeof(float) * (g.K * pre_tile_wg(a->n) + g.NC * g.T * g.MP + g.T * a->n) + 64;
    const int64_t tc = pre_tc_workspace(a);
    const int M = 2 * a->n + a->n * a->n;
    const int64_t host =
        (int64_t)sizeof(float) * (M * a->n * pre_host_dp(a->D) + g.T * g.MP + g.T * a->n) + 64;
    const int64_t dec = mhc_pre_dec_workspace(a);
    int64_t most = simt > tc ? simt : tc;
    most = most > dec ? most : dec;
    return most > host ? most : host;
}

#ifdef OMPK_NV_KERNELS
/* teams the wide-load GEMM aims at: c->teams when in 64 .. PRE_TCW_TEAMS_MAX, else PRE_TCW_TEAMS */
static int pre_tcw_teams(const mhc_pre_fwd_cfg *c) {
    return c->teams >= 64 && c->teams <= PRE_TCW_TEAMS_MAX ? c->teams : PRE_TCW_TEAMS;
}
#endif

/* Launch 2 of the SIMT path: a team takes tiles of up to PRE_SE_TL tokens. A tile's partial rows
 * are one contiguous run a chunk, so its lanes read them as coalesced runs (lane ln: elements ln,
 * ln + PRE_SE_TL, ...), each element summed over the chunks in order as pre_token sums it, into
 * team-shared rows; then one thread a token runs pre_token_out on its row. */
#define PRE_SE_TL 64
#define PRE_SE_TEAMS 256 /* tiles halved until there are this many (or one token a tile) */
#define PRE_SE_MP(N) (2 * (N) + (N) * (N) + 1)
/* team-shared row stride, odd: the threads of a warp read their rows from distinct banks */
#define PRE_SE_SP(N) (PRE_SE_MP(N) | 1)
/* A lane's sums keep KW elements (the tile in as few passes of at most 32 as cover it) and U
 * chunks of loads in flight, KW (U + 1) <= 128 floats; the deep form, for tiles of few
 * elements, one element and PRE_SE_DEEP_U chunks. */
#define PRE_SE_PASSES(N) ((PRE_SE_MP(N) + 31) / 32)
#define PRE_SE_KW(N) ((PRE_SE_MP(N) + PRE_SE_PASSES(N) - 1) / PRE_SE_PASSES(N))
#define PRE_SE_U(N) (128 / PRE_SE_KW(N) - 1 > 8 ? 8 : 128 / PRE_SE_KW(N) - 1)
#define PRE_SE_KMAX 32
#define PRE_SE_DEEP_U 16

/* Tokens a tile, and whether its sums take the deep form (fewer round trips to memory: passes
 * over the tile times chunks per load round). */
/* gpu: tiles halved for a GPU's teams; the host's one team takes full tiles (two barriers a
 * tile among all its threads) */
static void pre_se_geometry(int n, int64_t T, int gpu, int64_t *ptok, int *deep) {
    int64_t pt = PRE_SE_TL;
    while (gpu && pt > 1 && (T + pt - 1) / pt < PRE_SE_TEAMS) pt /= 2;
    const int64_t E = pt * PRE_SE_MP(n), TL = PRE_SE_TL;
    const int64_t pd = (E + TL - 1) / TL, pw = (E + TL * PRE_SE_KW(n) - 1) / (TL * PRE_SE_KW(n));
    *ptok = pt;
    *deep = pd * PRE_SE_U(n) < pw * PRE_SE_DEEP_U;
}

/* The sums of tokens t0 .. t0+nt-1 into sums (row stride PRE_SE_SP), h_mix written from them. */
MHC_INLINE void pre_se_sum(const int N, const int KW, const int U, const float *part, int64_t T,
                           int64_t NC, int64_t t0, int nt, float *sums, float *h_mix, int64_t shm0,
                           int64_t shm1, int tid, int nth) {
    const int M = 2 * N + N * N, MP = M + 1, SP = PRE_SE_SP(N), E = nt * MP;
    const int64_t cs = T * MP; /* one chunk */
    for (int ln = tid; ln < PRE_SE_TL; ln += nth)
        for (int e0 = ln; e0 < E; e0 += PRE_SE_TL * KW) {
            const float *p = part + t0 * MP + e0;
            float acc[PRE_SE_KMAX];
            MHC_UNROLL
            for (int k = 0; k < PRE_SE_KMAX; k++) acc[k] = 0.f;
            int64_t c = 0;
            for (; c + U <= NC; c += U) {
                /* U chunks' loads first, then the sums in chunk order */
                float v[PRE_SE_DEEP_U][PRE_SE_KMAX];
                MHC_UNROLL
                for (int u = 0; u < PRE_SE_DEEP_U; u++) MHC_UNROLL
                for (int k = 0; k < PRE_SE_KMAX; k++)
                    if (u < U && k < KW)
                        v[u][k] = e0 + k * PRE_SE_TL < E ? p[(c + u) * cs + k * PRE_SE_TL] : 0.f;
                MHC_UNROLL
                for (int u = 0; u < PRE_SE_DEEP_U; u++) MHC_UNROLL
                for (int k = 0; k < PRE_SE_KMAX; k++)
                    if (u < U && k < KW) acc[k] += v[u][k];
            }
            for (; c < NC; c++) MHC_UNROLL
            for (int k = 0; k < PRE_SE_KMAX; k++)
                if (k < KW && e0 + k * PRE_SE_TL < E) acc[k] += p[c * cs + k * PRE_SE_TL];
            MHC_UNROLL
            for (int k = 0; k < PRE_SE_KMAX; k++) {
                const int e = e0 + k * PRE_SE_TL, u = e / MP, m = e - u * MP;
                if (k >= KW || e >= E) continue;
                sums[u * SP + m] = acc[k];
                if (h_mix && m < M) h_mix[(t0 + u) * shm0 + m * shm1] = acc[k];
            }
        }
}

/* Launch 2 for this team's tiles (ptok tokens each); sums: PRE_SE_TL * PRE_SE_SP(N) team-shared
 * floats. */
MHC_INLINE void pre_simt_epi(const int N, int64_t T, int64_t NC, int64_t K, int64_t ptok, int deep,
                             const float *part, float *sums, const mhc_pre_fwd_args *a,
                             const float *alpha, const float *bias, float *hp_ws, float *h_post,
                             float *logits, float *comb, float *h_mix, float *inv_rms,
                             float *h_pre) {
    const int M = 2 * N + N * N, SP = PRE_SE_SP(N);
    const int tid = omp_get_thread_num(), nth = omp_get_num_threads();
    const int64_t tiles = (T + ptok - 1) / ptok;
    for (int64_t q = omp_get_team_num(); q < tiles; q += omp_get_num_teams()) {
        const int64_t t0 = q * ptok;
        const int nt = (int)(T - t0 < ptok ? T - t0 : ptok);
        if (deep)
            pre_se_sum(N, 1, PRE_SE_DEEP_U, part, T, NC, t0, nt, sums, h_mix, a->shmix[0],
                       a->shmix[1], tid, nth);
        else
            pre_se_sum(N, PRE_SE_KW(N), PRE_SE_U(N), part, T, NC, t0, nt, sums, h_mix, a->shmix[0],
                       a->shmix[1], tid, nth);
        MHC_SYNC();
        for (int u = tid; u < nt; u += nth) {
            float acc[MMAX + 1];
            MHC_UNROLL
            for (int m = 0; m <= MMAX; m++) acc[m] = m <= M ? sums[u * SP + m] : 0.f;
            pre_token_out(N, t0 + u, a->S, acc, K, a, alpha, bias, hp_ws, h_post, logits, comb,
                          (float *)0, inv_rms, h_pre);
        }
        MHC_SYNC();
    }
}

/* Launch 3 on 16-byte aligned rows (mhc_pre_vec_ok): an iteration takes U pieces of 8 elements of a
 * token, q, q + NPU, ... (adjacent iterations take adjacent pieces, so each load is a contiguous
 * run); all its x loads first, then the sums in pre_hin's order. A piece past D's last multiple
 * of 8 goes element by element. BF: bf16 x and h_in. */
#define PRE_HIN_U(N) ((N) == 1 ? 8 : (N) == 2 ? 4 : (N) <= 4 ? 2 : 1)
#define PRE_HIN_UMAX 8
MHC_INLINE void pre_hin8(const int N, const int U, const int BF, const char *xrow, int64_t sx2,
                         const float *hp, char *out, int64_t D, int64_t q, int64_t NPU) {
    const int esz = BF ? 2 : 4, W = BF ? 1 : 2; /* 16-byte words a piece */
    const ompk_u128 z = {{0u, 0u, 0u, 0u}};
    ompk_u128 v[PRE_HIN_UMAX][NMAX][2];
    float h[NMAX];
    MHC_UNROLL
    for (int i = 0; i < NMAX; i++)
        if (i < N) h[i] = hp[i];
    MHC_UNROLL
    for (int u = 0; u < PRE_HIN_UMAX; u++) {
        const int64_t d = (q + u * NPU) * 8;
        if (u >= U) continue;
        MHC_UNROLL
        for (int i = 0; i < NMAX; i++) MHC_UNROLL
        for (int w = 0; w < 2; w++)
            if (i < N && w < W)
                v[u][i][w] =
                    d + 8 <= D ? *(const ompk_u128 *)(xrow + (i * sx2 + d) * esz + 16 * w) : z;
    }
    MHC_UNROLL
    for (int u = 0; u < PRE_HIN_UMAX; u++) {
        const int64_t d = (q + u * NPU) * 8;
        if (u >= U || d >= D) continue;
        if (d + 8 <= D) {
            float acc[8];
            MHC_UNROLL
            for (int e = 0; e < 8; e++) acc[e] = 0.f;
            MHC_UNROLL
            for (int i = 0; i < NMAX; i++) {
                if (i >= N) continue;
                float xv[8];
                ompk_load8(v[u][i], BF, xv);
                MHC_UNROLL
                for (int e = 0; e < 8; e++) acc[e] += h[i] * xv[e];
            }
            ompk_store8(out + d * esz, BF, acc);
        } else {
            for (int64_t e = d; e < D; e++) {
                float acc = 0.f;
                MHC_UNROLL
                for (int i = 0; i < NMAX; i++)
                    if (i < N) acc += h[i] * ompk_load_f(xrow + i * sx2 * esz, e, BF);
                ompk_store_f(out, e, acc, BF);
            }
        }
    }
}

#ifdef OMPK_NV_KERNELS
/* The tensor-core path serves bf16 x on a device with 16-byte rows (D a multiple of 8, so a
 * lane's 8-element piece is either inside D or past it); the cp.async GEMM (tc = 3) n <= 6 and
 * the wide-load GEMM (tc = 4, mhc_pre_tcw.h) n <= 4, its ring of 2 n = 4 only. */
int mhc_pre_fwd_tc_fits(ompk_exec ex, const mhc_pre_fwd_args *a, const mhc_pre_fwd_cfg *c) {
    if (!ex.on_target || !a->bf16 || !mhc_pre_vec_ok(a) || a->D % 8 || c->tc < 1) return 0;
    for (int async = 0; async < 2; async++) {
        const pre_tc_geom g = pre_tc_geometry(a, 0, async);
        if (g.KS < 1 || (int64_t)g.NG * g.KS > 0x7fffffff) return 0;
    }
    if ((a->B * a->S + PRE_EPI_TOK(a->n) - 1) / PRE_EPI_TOK(a->n) > 0x7fffffff) return 0;
#ifndef OMPK_LAB
    /* the product builds the defaults' kernels only: the wide-load GEMM with its ring of 3, the
     * register GEMM rotated with L2 fills, lane-parallel launch 2 */
    if (c->epi != 1 || !(c->tc == 4 ? c->ring == 3 : c->tc == 1 && c->rot && c->l2f)) return 0;
#endif
    if (c->tc == 3) return PRE_TCA_FITS(a->n);
    if (c->tc == 4) {
        const pre_tc_geom gw = pre_tcw_geometry(a, pre_tcw_teams(c));
        return PRE_TCW_FITS(a->n) && gw.KS >= 1 && (int64_t)gw.NG * gw.KS <= 0x7fffffff &&
               (c->ring != 2 || a->n == 4);
    }
    return 1;
}
#else
int mhc_pre_fwd_tc_fits(ompk_exec ex, const mhc_pre_fwd_args *a, const mhc_pre_fwd_cfg *c) {
    (void)ex, (void)a, (void)c;
    return 0;
}
#endif

/* Everything the per-n launches need (mhc_pre_fwd_n.inc defines pre_stages_<n>). */
typedef struct pre_launch {
    ompk_exec ex;
    int gpu; /* ex is a GPU (not the host, nor the host as a target device) */
    const char *x;
    int64_t sx0, sx1, sx2, S, T, D, K, NC, shin0, shin1;
    int bf16, vec;
    pre_tile_geom tl;
    float *wt, *part, *hp_ws;
    const float *alpha, *bias;
    char *h_in;
    float *h_post, *logits, *comb, *h_mix, *inv_rms, *h_pre;
    mhc_pre_fwd_args args;
    int tc;   /* mhc_pre_fwd_cfg.tc: tensor-core GEMM and bare h_in kernels */
    int epi;  /* mhc_pre_fwd_cfg.epi (tensor-core path only) */
    int l2f;  /* mhc_pre_fwd_cfg.l2f */
    int ring; /* mhc_pre_fwd_cfg.ring */
    pre_tc_geom tg;
    const float *phi, *gamma;
    uint16_t *wp; /* the wide-load GEMM's precomputed weights (tc = 4) */
} pre_launch;

#define MHC_N_INC "mhc_pre_fwd_n.inc"
#include "mhc_each_n.inc"

void mhc_pre_fwd_kernel(ompk_exec ex, const mhc_pre_fwd_args *a, void *ws,
                        const mhc_pre_fwd_cfg *var) {
    const int gpu = ex.on_target && ex.device != omp_get_initial_device();
    const pre_geom g = pre_geometry(a, gpu);
    const int n = a->n, M = 2 * n + n * n, WG = pre_tile_wg(n), bf16 = a->bf16;
    const int vec = mhc_pre_vec_ok(a);
    const int64_t T = g.T, K = g.K, D = a->D, S = a->S, NC = g.NC;
    const char *x = (const char *)a->x;
    const int64_t sx0 = a->sx[0], sx1 = a->sx[1], sx2 = a->sx[2];
    const float *phi = a->phi, *gamma = a->gamma, *alpha = a->alpha, *bias = a->bias;
    const int64_t sphi = a->sphi;
#ifdef OMPK_NV_KERNELS
    const int tc = var->tc;
    pre_tc_geom tg =
        tc == 4 ? pre_tcw_geometry(a, pre_tcw_teams(var)) : pre_tc_geometry(a, tc == 2, tc == 3);
#else
    const int tc = 0;
    pre_tc_geom tg = pre_tc_geometry(a, 0, 0);
#endif
    tg.ROT = var->rot;
    float *wt = (float *)ws;
    /* the tensor-core path needs no transposed weights: its partials start the workspace */
    float *part = tc ? wt : wt + K * WG;
    float *hp_ws = part + (tc ? (int64_t)tg.KS : NC) * T * g.MP;
    char *h_in = (char *)a->h_in;
    float *h_post = a->h_post, *logits = a->logits, *comb = a->comb, *h_mix = a->h_mix;
    float *inv_rms = a->inv_rms, *h_pre = a->h_pre;
    const mhc_pre_fwd_args args = *a;
    if (T == 0) return;

    if (var->host) {
        /* gamma folded into phi as [M][n * DP] (mhc_pre_fwd_host.h) */
        const int64_t DP = pre_host_dp(D);
        float *wh = (float *)ws;
#pragma omp parallel for collapse(2) schedule(static)
        for (int m = 0; m < M; m++)
            for (int64_t k = 0; k < n * DP; k++) {
                const int64_t i = k / DP, d = k - i * DP;
                wh[m * n * DP + k] =
                    d < D ? phi[m * sphi + i * D + d] * (gamma ? gamma[i * D + d] : 1.f) : 0.f;
            }
        pre_launch L;
        L.x = x, L.sx0 = sx0, L.sx1 = sx1, L.sx2 = sx2, L.S = S, L.T = T, L.D = D, L.K = K;
        L.bf16 = bf16, L.wt = wh, L.part = wh + M * n * DP, L.hp_ws = L.part + T * g.MP;
        L.alpha = alpha, L.bias = bias, L.h_in = h_in, L.shin0 = a->shin[0], L.shin1 = a->shin[1];
        L.h_post = h_post, L.logits = logits, L.comb = comb, L.h_mix = h_mix;
        L.inv_rms = inv_rms, L.h_pre = h_pre, L.args = args;
#define PRE_HOST(N) pre_host_##N(&L)
        MHC_SWITCH_N(n, PRE_HOST)
#undef PRE_HOST
        return;
    }

    /* gamma folded into phi, transposed and grouped to [K][WG] (mhc_pre_tile.h, zero padded) */
    if (!tc) {
#pragma omp target teams distribute parallel for collapse(2) if (target : ex.on_target)            \
    device(ex.device) is_device_ptr(phi, gamma, wt) thread_limit(256)
        for (int64_t k = 0; k < K; k++)
            for (int q = 0; q < WG; q++) {
                const int m = pre_tile_col(n, q);
                wt[k * WG + q] = m >= 0 ? phi[m * sphi + k] * (gamma ? gamma[k] : 1.f) : 0.f;
            }
    }

    pre_launch L;
    L.ex = ex, L.gpu = gpu, L.x = x, L.sx0 = sx0, L.sx1 = sx1, L.sx2 = sx2, L.S = S, L.T = T,
    L.D = D;
    L.K = K, L.NC = tc ? tg.KS : NC, L.bf16 = bf16, L.vec = vec;
    L.tl = (pre_tile_geom){sx0, sx1, sx2, S, T, D, g.CD, g.NCD, g.NTL, bf16, vec};
    L.tc = tc, L.epi = var->epi, L.l2f = var->l2f, L.ring = var->ring, L.tg = tg, L.phi = phi,
    L.gamma = gamma;
    /* after hp_ws, 16-byte aligned */
    L.wp = (uint16_t *)(((uintptr_t)(hp_ws + T * n) + 15) & ~(uintptr_t)15);
    L.wt = wt, L.part = part, L.hp_ws = hp_ws, L.alpha = alpha, L.bias = bias;
    L.h_in = h_in, L.shin0 = a->shin[0], L.shin1 = a->shin[1];
    L.h_post = h_post, L.logits = logits, L.comb = comb, L.h_mix = h_mix;
    L.inv_rms = inv_rms, L.h_pre = h_pre, L.args = args;
#define PRE_STAGES(N) pre_stages_##N(&L)
    MHC_SWITCH_N(n, PRE_STAGES)
#undef PRE_STAGES
}
