/* mHC pre, backward (KERNELS.md 1.4), dW route; one OpenMP source for GPU and host.
 *  1. dh_pre partials: work item = (d chunk, token), all n streams of the chunk.
 *  2. Per token: partials summed in fixed order; dz, dh_mix (padded rows), the dinv
 *     coefficient, and the token's dbias / dalpha terms.
 *  3. dbias, dalpha: fixed blocks of tokens, then a fixed-order sum of the blocks.
 *  4. One pass over x for dx and dW: work item = (token block, k); adjacent lanes take adjacent
 *     k (coalesced x, dh_in, dx, phi), the token's dh_mix row is a broadcast. The item keeps the
 *     M dW sums of its k in registers over its tokens and writes them as the block's partial.
 *  5. dW = fixed-order sum of the block partials; dphi = dW*gamma, dgamma = colsum(dW*phi).
 * No float atomics anywhere: the same inputs give the same bits. */
#include "mhc_kern.h"

#define NMAX 8
#define MMAX (2 * NMAX + NMAX * NMAX)
#define TOKBLK 256 /* tokens per dbias/dalpha block */

typedef struct bwd_geom {
    int64_t T, K, CD, NC, TBK, NB, NBLK;
    int MW, R; /* R = M + 3: per-token dz (M) and dz*hm summed per group (3) */
} bwd_geom;

/* float counts rounded to 16 bytes, so every workspace part starts aligned */
static inline int64_t al4(int64_t v) {
    return (v + 3) & ~(int64_t)3;
}

static bwd_geom bwd_geometry(const mhc_pre_bwd_args *a) {
    bwd_geom g;
    const int n = a->n, M = 2 * n + n * n;
    g.T = a->B * a->S;
    g.K = (int64_t)n * a->D;
    g.MW = mhc_mw(n);
    g.R = M + 3;
    int64_t T1 = g.T > 0 ? g.T : 1;
    int64_t nc = (((int64_t)1 << 17) + T1 - 1) / T1, maxc = (a->D + 15) / 16;
    if (nc > maxc) nc = maxc;
    if (nc < 1) nc = 1;
    int64_t cd = (a->D + nc - 1) / nc;
    cd = (cd + 15) & ~(int64_t)15;
    if (cd < 16) cd = 16;
    g.CD = cd;
    g.NC = (a->D + cd - 1) / cd;
    if (g.NC < 1) g.NC = 1;
    /* token blocks of the dW pass: enough items for a GPU, partials bounded by ~16 blocks */
    g.TBK = 1024;
    if (g.T < 16 * 1024) g.TBK = (g.T + 15) / 16 > 64 ? (g.T + 15) / 16 : 64;
    g.NB = (g.T + g.TBK - 1) / g.TBK;
    if (g.NB < 1) g.NB = 1;
    g.NBLK = (g.T + TOKBLK - 1) / TOKBLK;
    if (g.NBLK < 1) g.NBLK = 1;
    return g;
}

/* workspace: dh_pre partials [NC][T][n], dh_mix [T][MW], coef [T], token rows [T][R],
 * block rows [NBLK][R], dW partials [NB][M][K] */
int64_t mhc_pre_bwd_workspace(const mhc_pre_bwd_args *a) {
    bwd_geom g = bwd_geometry(a);
    const int M = 2 * a->n + a->n * a->n;
    return (int64_t)sizeof(float) * (al4(g.NC * g.T * a->n) + al4(g.T * g.MW) + al4(g.T) +
                                     al4(g.T * g.R) + al4(g.NBLK * g.R) + al4(g.NB * M * g.K)) +
           64;
}

static int bwd_vec_ok(const mhc_pre_bwd_args *a) {
    if (a->sx[3] != 1 || a->sdh[2] != 1) return 0;
    MHC_UNROLL
    for (int k = 0; k < 3; k++)
        if (a->sx[k] % 8) return 0;
    if (a->sdh[0] % 8 || a->sdh[1] % 8) return 0;
    if (((uintptr_t)a->x | (uintptr_t)a->dh_in) & 15) return 0;
    return 1;
}

/* Stage 1 body: sum over d in [d0,d1) of dh_in[d]*x[i,d] for every stream i. */
MHC_INLINE void bwd_dhpre(const int N, const char *xrow, int64_t sx2, const char *grow, int64_t d0,
                          int64_t d1, int bf16, int gbf16, int vec, float *out) {
    const int esz = bf16 ? 2 : 4, gsz = gbf16 ? 2 : 4;
    float acc[NMAX];
    MHC_UNROLL
    for (int i = 0; i < NMAX; i++) acc[i] = 0.f;
    int64_t d = d0;
    for (; d + 16 <= d1; d += 16) {
        float gv[16], xv[16];
        mhc_load16(grow + d * gsz, gbf16, vec, gv);
        MHC_UNROLL
        for (int i = 0; i < NMAX; i++) {
            if (i >= N) continue;
            mhc_load16(xrow + (i * sx2 + d) * esz, bf16, vec, xv);
            MHC_UNROLL
            for (int e = 0; e < 16; e++) acc[i] += gv[e] * xv[e];
        }
    }
    for (; d < d1; d++) {
        const float gv = ompk_load_f(grow, d, gbf16);
        MHC_UNROLL
        for (int i = 0; i < NMAX; i++)
            if (i < N) acc[i] += gv * ompk_load_f(xrow, i * sx2 + d, bf16);
    }
    MHC_UNROLL
    for (int i = 0; i < NMAX; i++)
        if (i < N) out[i] = acc[i];
}

/* Stage 2 body for token t. */
MHC_INLINE void bwd_token(const int N, int64_t t, int64_t S, int64_t T, int64_t NC, int64_t K,
                          const float *pdh, const mhc_pre_bwd_args *a, const float *alpha,
                          const float *dh_post, const float *dh_res, const float *h_mix,
                          const float *inv_rms, const float *h_pre, const float *h_post,
                          float *dhm_ws, int MW, float *coef, float *tok) {
    const int M = 2 * N + N * N;
    const int64_t b = t / S, s = t % S;
    float dhp[NMAX];
    MHC_UNROLL
    for (int i = 0; i < NMAX; i++) dhp[i] = 0.f;
    for (int64_t c = 0; c < NC; c++) MHC_UNROLL
    for (int i = 0; i < NMAX; i++)
        if (i < N) dhp[i] += pdh[(c * T + t) * N + i];
    const float r = inv_rms[t * a->sinv];
    const float al[3] = {alpha[0], alpha[a->salpha], alpha[2 * a->salpha]};
    float ga[3] = {0.f, 0.f, 0.f}, dinv = 0.f;
    float *dst = dhm_ws + t * MW, *trow = tok + t * (M + 3);
    MHC_UNROLL
    for (int m = 0; m < MMAX; m++) {
        if (m >= M) continue;
        const int grp = m < N ? 0 : (m < 2 * N ? 1 : 2);
        float dz;
        if (m < N) {
            const float sv = h_pre[t * a->shpre[0] + m * a->shpre[1]] - a->hc_eps;
            dz = dhp[m] * sv * (1.f - sv);
        } else if (m < 2 * N) {
            const int i = m - N;
            const float hp = h_post[b * a->shpost[0] + s * a->shpost[1] + i * a->shpost[2]];
            dz = dh_post[b * a->sdpost[0] + s * a->sdpost[1] + i * a->sdpost[2]] * hp *
                 (1.f - hp / a->post_mult);
        } else {
            const int e = m - 2 * N;
            dz = dh_res[b * a->sdres[0] + s * a->sdres[1] + (e / N) * a->sdres[2] +
                        (e % N) * a->sdres[3]];
        }
        const float hmx = h_mix[t * a->shmix[0] + m * a->shmix[1]];
        const float dhm = dz * al[grp];
        ga[grp] += dz * (hmx * r);
        dinv += dhm * hmx;
        dst[m] = dhm * r;
        trow[m] = dz;
    }
    for (int m = M; m < MW; m++) dst[m] = 0.f;
    MHC_UNROLL
    for (int g = 0; g < 3; g++) trow[M + g] = ga[g];
    coef[t] = dinv * r * r * r / (float)K;
}

/* Stage 4 body: tokens [t0,t1) at flattened k = i*D + d. */
MHC_INLINE void bwd_dxdw(const int N, int64_t k, int64_t D, int64_t S, int64_t t0, int64_t t1,
                         const char *x, const int64_t *sx, int bf16, const char *dh,
                         const int64_t *sdh, int dbf16, const char *gxp, const int64_t *sg,
                         int gbf16, char *dx, const int64_t *sdx, const float *phi, int64_t sphi,
                         const float *gamma, const float *h_pre, const int64_t *shpre,
                         const float *dhm_ws, int MW, const float *coef, float *pw, int64_t K) {
    const int M = 2 * N + N * N;
    const int i = (int)(k / D);
    const int64_t d = k % D;
    const float gk = gamma ? gamma[k] : 1.f;
    float w[MMAX], acc[MMAX];
    MHC_UNROLL
    for (int m = 0; m < MMAX; m++) {
        w[m] = m < M ? phi[m * sphi + k] * gk : 0.f;
        acc[m] = 0.f;
    }
    /* (b, s) advance with t (no 64-bit division per token), and the next token's scalars are
     * loaded before this token's arithmetic and store, so their latency overlaps it */
    int64_t b = t1 > t0 ? t0 / S : 0, s = t1 > t0 ? t0 % S : 0;
    float v_n = 0.f, g_n = 0.f, c_n = 0.f, h_n = 0.f;
    if (t0 < t1) {
        v_n = ompk_load_f(x, b * sx[0] + s * sx[1] + i * sx[2] + d, bf16);
        g_n = ompk_load_f(dh, b * sdh[0] + s * sdh[1] + d, dbf16);
        c_n = coef[t0];
        h_n = h_pre[t0 * shpre[0] + i * shpre[1]];
    }
    for (int64_t t = t0; t < t1; t++) {
        const float v = v_n, gin = g_n, cf = c_n, hp = h_n;
        const int64_t bc = b, sc = s;
        if (++s == S) s = 0, b++;
        if (t + 1 < t1) {
            v_n = ompk_load_f(x, b * sx[0] + s * sx[1] + i * sx[2] + d, bf16);
            g_n = ompk_load_f(dh, b * sdh[0] + s * sdh[1] + d, dbf16);
            c_n = coef[t + 1];
            h_n = h_pre[(t + 1) * shpre[0] + i * shpre[1]];
        }
        const mhc_f4 *row = (const mhc_f4 *)(dhm_ws + t * MW);
        float sum[4] = {0.f, 0.f, 0.f, 0.f};
        MHC_UNROLL
        for (int q = 0; q < MMAX / 4 + 1; q++) {
            if (4 * q >= M) continue;
            const mhc_f4 r4 = row[q];
            MHC_UNROLL
            for (int e = 0; e < 4; e++) {
                if (4 * q + e >= M) continue;
                sum[e] += r4.v[e] * w[4 * q + e];
                acc[4 * q + e] += r4.v[e] * v;
            }
        }
        float val = ((sum[0] + sum[1]) + (sum[2] + sum[3])) - cf * v + hp * gin;
        if (gxp) val += ompk_load_f(gxp, bc * sg[0] + sc * sg[1] + i * sg[2] + d, gbf16);
        ompk_store_f(dx, bc * sdx[0] + sc * sdx[1] + i * sdx[2] + d, val, bf16);
    }
    MHC_UNROLL
    for (int m = 0; m < MMAX; m++)
        if (m < M) pw[m * K + k] = acc[m];
}

#define MHC_N_INC "mhc_pre_bwd_n.inc"
#include "mhc_each_n.inc"
#undef MHC_N_INC

void mhc_pre_bwd_kernel(ompk_exec ex, const mhc_pre_bwd_args *a, void *ws) {
#define PRE_BWD(N) pre_bwd_launch_##N(ex, a, ws)
    MHC_SWITCH_N(a->n, PRE_BWD)
#undef PRE_BWD
}
