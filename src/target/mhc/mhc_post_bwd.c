/* mHC post, backward (docs/KERNELS.md 1.6); one OpenMP source for GPU and host.
 *  1. Work item = (token, d chunk): dx and df for the chunk (elementwise over streams, 8 d at a
 *     time), and the chunk's partial dpost[o] = sum dout[o]*f, dcomb[i,o] = sum x[i]*dout[o]
 *     in registers (n a compile-time constant). Adjacent lanes take adjacent chunks of one
 *     token, so its comb and post loads are broadcasts.
 *  2. Per token: the chunk partials summed in fixed order (deterministic). */
#include "mhc_kern.h"

#define NMAX 8

typedef struct post_geom {
    int64_t T, CD, NC;
    int P; /* partial row: n + n*n */
} post_geom;

/* Item c of a token takes the 8-wide d chunks c, c + NC, c + 2 NC, ...: adjacent lanes read
 * adjacent 16-byte pieces (coalesced), and every item's partial sums keep a fixed order. */
static post_geom post_geometry(const mhc_post_bwd_args *a) {
    post_geom g;
    g.T = a->B * a->S;
    g.P = a->n + a->n * a->n;
    int64_t T1 = g.T > 0 ? g.T : 1;
    int64_t nch = (a->D + 7) / 8;
    int64_t nc = (((int64_t)1 << 18) + T1 - 1) / T1;
    if (nc < 32) nc = 32;
    if (nc > nch) nc = nch;
    if (nc < 1) nc = 1;
    g.NC = nc;
    g.CD = 8 * nc; /* distance between one item's chunks */
    return g;
}

int64_t mhc_post_bwd_workspace(const mhc_post_bwd_args *a) {
    post_geom g = post_geometry(a);
    return (int64_t)sizeof(float) * g.T * g.NC * g.P + 64;
}

static int post_bwd_vec_ok(const mhc_post_bwd_args *a) {
    if (a->sx[3] != 1 || a->sg[3] != 1 || a->sdx[3] != 1 || a->sf[2] != 1 || a->sdf[2] != 1)
        return 0;
    MHC_UNROLL
    for (int k = 0; k < 3; k++)
        if (a->sx[k] % 8 || a->sg[k] % 8 || a->sdx[k] % 8) return 0;
    MHC_UNROLL
    for (int k = 0; k < 2; k++)
        if (a->sf[k] % 8 || a->sdf[k] % 8) return 0;
    if (((uintptr_t)a->x | (uintptr_t)a->f | (uintptr_t)a->dout | (uintptr_t)a->dx |
         (uintptr_t)a->df) &
        15)
        return 0;
    return 1;
}

/* 8 elements (or nd < 8 at the tail, or any alignment when !vec) */
MHC_INLINE void ld8(const char *p, int bf16, int vec, int nd, float v[8]) {
    if (vec && nd == 8) {
        ompk_load8(p, bf16, v);
        return;
    }
    MHC_UNROLL
    for (int e = 0; e < 8; e++) v[e] = e < nd ? ompk_load_f(p, e, bf16) : 0.f;
}

MHC_INLINE void st8(char *p, int bf16, int vec, int nd, const float v[8]) {
    if (vec && nd == 8) {
        ompk_store8(p, bf16, v);
        return;
    }
    MHC_UNROLL
    for (int e = 0; e < 8; e++)
        if (e < nd) ompk_store_f(p, e, v[e], bf16);
}

MHC_INLINE void post_bwd_chunk(const int N, const char *x, const int64_t *sx, const char *f,
                               const char *g, const int64_t *sg, const float *comb,
                               const int64_t *sc, const float *post, int64_t sp2, char *dx,
                               const int64_t *sdx, char *df, int64_t d0, int64_t d1, int64_t dstep,
                               int bf16, int vec, float *part) {
    const int esz = bf16 ? 2 : 4;
    float cm[NMAX][NMAX], pw[NMAX], dp[NMAX], dc[NMAX][NMAX];
    MHC_UNROLL
    for (int i = 0; i < NMAX; i++) {
        pw[i] = i < N ? post[i * sp2] : 0.f;
        dp[i] = 0.f;
        MHC_UNROLL
        for (int o = 0; o < NMAX; o++) {
            cm[i][o] = (i < N && o < N) ? comb[i * sc[2] + o * sc[3]] : 0.f;
            dc[i][o] = 0.f;
        }
    }
    for (int64_t d = d0; d < d1; d += dstep) {
        const int nd = d1 - d < 8 ? (int)(d1 - d) : 8;
        float xv[NMAX][8], dxa[NMAX][8], fv[8], dfa[8], gv[8];
        MHC_UNROLL
        for (int i = 0; i < NMAX; i++) {
            MHC_UNROLL
            for (int e = 0; e < 8; e++) dxa[i][e] = xv[i][e] = 0.f;
            if (i < N) ld8(x + (i * sx[2] + d) * esz, bf16, vec, nd, xv[i]);
        }
        ld8(f + d * esz, bf16, vec, nd, fv);
        MHC_UNROLL
        for (int e = 0; e < 8; e++) dfa[e] = 0.f;
        MHC_UNROLL
        for (int o = 0; o < NMAX; o++) {
            if (o >= N) continue;
            ld8(g + (o * sg[2] + d) * esz, bf16, vec, nd, gv);
            MHC_UNROLL
            for (int e = 0; e < 8; e++) {
                dfa[e] += pw[o] * gv[e];
                dp[o] += gv[e] * fv[e];
            }
            MHC_UNROLL
            for (int i = 0; i < NMAX; i++) {
                if (i >= N) continue;
                MHC_UNROLL
                for (int e = 0; e < 8; e++) {
                    dxa[i][e] += cm[i][o] * gv[e];
                    dc[i][o] += xv[i][e] * gv[e];
                }
            }
        }
        MHC_UNROLL
        for (int i = 0; i < NMAX; i++)
            if (i < N) st8(dx + (i * sdx[2] + d) * esz, bf16, vec, nd, dxa[i]);
        st8(df + d * esz, bf16, vec, nd, dfa);
    }
    MHC_UNROLL
    for (int o = 0; o < NMAX; o++)
        if (o < N) part[o] = dp[o];
    MHC_UNROLL
    for (int i = 0; i < NMAX; i++) MHC_UNROLL
    for (int o = 0; o < NMAX; o++)
        if (i < N && o < N) part[N + i * N + o] = dc[i][o];
}

#define MHC_N_INC "mhc_post_bwd_n.inc"
#include "mhc_each_n.inc"

void mhc_post_bwd_kernel(ompk_exec ex, const mhc_post_bwd_args *a, void *ws) {
#define POST_BWD(N) post_bwd_launch_##N(ex, a, ws)
    MHC_SWITCH_N(a->n, POST_BWD)
#undef POST_BWD
}
