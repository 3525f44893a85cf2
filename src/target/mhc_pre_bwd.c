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
/* stage 4 elements per item on the GPU (2*M*KC registers: 2 while M <= 24) and on the host, and
 * the GPU's tokens loaded ahead */
#define BWD_KCD (MHC_N <= 4 ? 2 : 1)
#define BWD_KCH 16
#define BWD_TGD 4

typedef struct bwd_geom {
    int64_t T, K, CD, NC, TBK, NB, NBLK;
    int MW, R; /* R = M + 3: per-token dz (M) and dz*hm summed per group (3) */
} bwd_geom;

/* 2 floats moved as one 8-byte word */
typedef struct mhc_f2 {
    float v[2];
} __attribute__((aligned(8))) mhc_f2;

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
    /* token blocks of the dx/dW pass: at most 64 blocks (bounded dW partials), enough items to
     * fill a GPU in several waves */
    g.TBK = (g.T + 63) / 64 > 64 ? (g.T + 63) / 64 : 64;
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

/* KC consecutive elements at p (element e at p + e*st) as floats; vec: st == 1 and the run is
 * aligned to its size, so it moves as one word (GPU, KC = 2) or as a loop the host vectorizes.
 * Elements past ne read as zero. */
MHC_INLINE void kc_load(const int KC, const char *p, int64_t st, int bf16, int vec, int ne,
                        float *v) {
    if (vec && bf16 && KC == 2) {
        const uint32_t u = *(const uint32_t *)p;
        ompk_f32_bits lo, hi;
        lo.u = u << 16;
        hi.u = u & 0xffff0000u;
        v[0] = lo.f;
        v[1] = hi.f;
    } else if (vec && KC == 2) {
        const mhc_f2 f = *(const mhc_f2 *)p;
        v[0] = f.v[0];
        v[1] = f.v[1];
    } else if (vec) {
        for (int e = 0; e < KC; e++) v[e] = ompk_load_f(p, e, bf16);
    } else {
        for (int e = 0; e < KC; e++) v[e] = e < ne ? ompk_load_f(p, e * st, bf16) : 0.f;
    }
}

MHC_INLINE void kc_store(const int KC, char *p, int64_t st, int bf16, int vec, int ne,
                         const float *v) {
    if (vec && bf16 && KC == 2) {
        *(uint32_t *)p =
            (uint32_t)ompk_f32_to_bf16(v[0]) | ((uint32_t)ompk_f32_to_bf16(v[1]) << 16);
    } else if (vec && KC == 2) {
        mhc_f2 f;
        f.v[0] = v[0];
        f.v[1] = v[1];
        *(mhc_f2 *)p = f;
    } else if (vec) {
        for (int e = 0; e < KC; e++) ompk_store_f(p, e, v[e], bf16);
    } else {
        for (int e = 0; e < KC; e++)
            if (e < ne) ompk_store_f(p, e * st, v[e], bf16);
    }
}

/* Where the stage-4 body reads and writes; strides in elements. */
typedef struct bwd_io {
    int64_t sx[4], sdh[3], sg[4], sdx[4], shpre[2];
    int64_t S, D, K, sphi;
    int bf16, dbf16, gbf16, MW;
} bwd_io;

/* Stage 4 body: tokens [t0,t1) at the KC elements d0.. of stream i (k = i*D + d0 + e). The KC x M
 * weights phi*gamma and dW sums stay in registers over the tokens; x and dh_in of the next TG
 * tokens are loaded before this group's arithmetic and dx stores, so the loads are in flight
 * while it runs (the stores could alias the loads, so the compiler cannot hoist them itself). */
MHC_INLINE void bwd_dxdw(const int N, const int KC, const int TG, const bwd_io *io, int64_t i,
                         int64_t d0, int64_t t0, int64_t t1, int vec, const char *x, const char *dh,
                         const char *gxp, char *dx, const float *phi, const float *gamma,
                         const float *h_pre, const float *dhm_ws, const float *coef, float *pw) {
    const int M = 2 * N + N * N, MW = io->MW;
    const int64_t S = io->S, D = io->D, K = io->K;
    const int esz = io->bf16 ? 2 : 4, dsz = io->dbf16 ? 2 : 4, gsz = io->gbf16 ? 2 : 4;
    const int ne = D - d0 < KC ? (int)(D - d0) : KC;
    const int64_t k0 = i * D + d0;
    float w[MMAX][KC], acc[MMAX][KC];
    MHC_UNROLL
    for (int m = 0; m < MMAX; m++) {
        if (m >= M) continue;
        for (int e = 0; e < KC; e++) {
            w[m][e] = e < ne ? phi[m * io->sphi + k0 + e] * (gamma ? gamma[k0 + e] : 1.f) : 0.f;
            acc[m][e] = 0.f;
        }
    }
    const int64_t xo = i * io->sx[2] + d0 * io->sx[3], dxo = i * io->sdx[2] + d0 * io->sdx[3];
    const int64_t go = i * io->sg[2] + d0 * io->sg[3], ho = i * io->shpre[1];
    int64_t bl = t1 > t0 ? t0 / S : 0, sl = t1 > t0 ? t0 - bl * S : 0, bc = bl, sc = sl;
    float vn[TG][KC], gn[TG][KC], cn[TG], hn[TG];
    MHC_UNROLL
    for (int j = 0; j < TG; j++) {
        if (t0 + j < t1) {
            kc_load(KC, x + (bl * io->sx[0] + sl * io->sx[1] + xo) * esz, io->sx[3], io->bf16, vec,
                    ne, vn[j]);
            kc_load(KC, dh + (bl * io->sdh[0] + sl * io->sdh[1] + d0 * io->sdh[2]) * dsz,
                    io->sdh[2], io->dbf16, vec, ne, gn[j]);
            cn[j] = coef[t0 + j];
            hn[j] = h_pre[(t0 + j) * io->shpre[0] + ho];
            if (++sl == S) sl = 0, bl++;
        }
    }
    for (int64_t tg = t0; tg < t1; tg += TG) {
        float vc[TG][KC], gc[TG][KC], cc[TG], hc[TG];
        MHC_UNROLL
        for (int j = 0; j < TG; j++) {
            for (int e = 0; e < KC; e++) vc[j][e] = vn[j][e], gc[j][e] = gn[j][e];
            cc[j] = cn[j], hc[j] = hn[j];
        }
        MHC_UNROLL
        for (int j = 0; j < TG; j++) {
            const int64_t t = tg + TG + j;
            if (t < t1) {
                kc_load(KC, x + (bl * io->sx[0] + sl * io->sx[1] + xo) * esz, io->sx[3], io->bf16,
                        vec, ne, vn[j]);
                kc_load(KC, dh + (bl * io->sdh[0] + sl * io->sdh[1] + d0 * io->sdh[2]) * dsz,
                        io->sdh[2], io->dbf16, vec, ne, gn[j]);
                cn[j] = coef[t];
                hn[j] = h_pre[t * io->shpre[0] + ho];
                if (++sl == S) sl = 0, bl++;
            }
        }
        MHC_UNROLL
        for (int j = 0; j < TG; j++) {
            const int64_t t = tg + j;
            if (t >= t1) break;
            const mhc_f4 *row = (const mhc_f4 *)(dhm_ws + t * MW);
            float s0[KC], s1[KC];
            for (int e = 0; e < KC; e++) s0[e] = s1[e] = 0.f;
            MHC_UNROLL
            for (int q = 0; q < MMAX / 4 + 1; q++) {
                if (4 * q >= M) continue;
                const mhc_f4 r4 = row[q];
                MHC_UNROLL
                for (int u = 0; u < 4; u++) {
                    const int m = 4 * q + u;
                    if (m >= M) continue;
                    for (int e = 0; e < KC; e++) {
                        if (u & 1)
                            s1[e] += r4.v[u] * w[m][e];
                        else
                            s0[e] += r4.v[u] * w[m][e];
                        acc[m][e] += r4.v[u] * vc[j][e];
                    }
                }
            }
            float val[KC], gx[KC];
            if (gxp)
                kc_load(KC, gxp + (bc * io->sg[0] + sc * io->sg[1] + go) * gsz, io->sg[3],
                        io->gbf16, vec, ne, gx);
            for (int e = 0; e < KC; e++) {
                val[e] = (s0[e] + s1[e]) - cc[j] * vc[j][e] + hc[j] * gc[j][e];
                if (gxp) val[e] += gx[e];
            }
            kc_store(KC, dx + (bc * io->sdx[0] + sc * io->sdx[1] + dxo) * esz, io->sdx[3], io->bf16,
                     vec, ne, val);
            if (++sc == S) sc = 0, bc++;
        }
    }
    MHC_UNROLL
    for (int m = 0; m < MMAX; m++) {
        if (m >= M) continue;
        for (int e = 0; e < KC; e++)
            if (e < ne) pw[m * K + k0 + e] = acc[m][e];
    }
}

/* Whether every run of KC elements that stage 4 moves is contiguous and aligned to its size. */
static int bwd_kc_vec_ok(const mhc_pre_bwd_args *a, int KC) {
    const int64_t esz = a->bf16 ? 2 : 4, dsz = a->dh_bf16 ? 2 : 4, gsz = a->gxp_bf16 ? 2 : 4;
    if (a->D % KC || a->sx[3] != 1 || a->sdh[2] != 1 || a->sdx[3] != 1) return 0;
    for (int k = 0; k < 3; k++)
        if (a->sx[k] % KC || a->sdx[k] % KC) return 0;
    if (a->sdh[0] % KC || a->sdh[1] % KC) return 0;
    if ((uintptr_t)a->x % (uintptr_t)(KC * esz) || (uintptr_t)a->dx % (uintptr_t)(KC * esz) ||
        (uintptr_t)a->dh_in % (uintptr_t)(KC * dsz))
        return 0;
    if (a->gxp) {
        if (a->sgxp[3] != 1) return 0;
        for (int k = 0; k < 3; k++)
            if (a->sgxp[k] % KC) return 0;
        if ((uintptr_t)a->gxp % (uintptr_t)(KC * gsz)) return 0;
    }
    return 1;
}

#define MHC_N_INC "mhc_pre_bwd_n.inc"
#include "mhc_each_n.inc"
#undef MHC_N_INC

void mhc_pre_bwd_kernel(ompk_exec ex, const mhc_pre_bwd_args *a, void *ws) {
#define PRE_BWD(N) pre_bwd_launch_##N(ex, a, ws)
    MHC_SWITCH_N(a->n, PRE_BWD)
#undef PRE_BWD
}
