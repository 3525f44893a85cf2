/* mHC pre, backward (docs/KERNELS.md 1.4), dW route; one OpenMP source for GPU and host.
 *  1. dh_pre partials: work item = (token, lane c of NC), all n streams of the 16-element pieces
 *     c, c + NC, c + 2 NC, .. of the row, so adjacent lanes read adjacent pieces (the host: whole
 *     token rows, one partial a token, bwd_dhpre_host).
 *  2. Per token: partials summed in fixed order; dz, dh_mix (padded rows), the dinv
 *     coefficient, and the token's dbias / dalpha terms.
 *  3. dbias, dalpha: fixed blocks of tokens, then a fixed-order sum of the blocks.
 *  4. One pass over x for dx and dW: work item = (token block, run of KC elements of one
 *     stream); on the GPU adjacent lanes take adjacent runs (coalesced x, dh_in, dx), the
 *     token's dh_mix row is a broadcast (from shared memory where a team of BWD_TT runs stages
 *     it, mhc_pre_bwd_team.h), and the item keeps the KC*M weights and dW sums in registers
 *     over its tokens; the host form works on 8-float vectors, as register tiles over
 *     runs of 16 where rows are contiguous (bwd_dxdw_host16). Each item writes its dW sums as
 *     its token block's partial.
 *  5. dW = fixed-order sum of the block partials; dphi = dW*gamma, dgamma = colsum(dW*phi) (the
 *     host: the same order with k innermost, bwd_dw_host).
 * On a GPU with bf16 tensors of 16-byte rows and n <= BWD_TC_NMAX the tensor-core path of
 * mhc_pre_bwd_tc.h runs instead: stages 1 + 2 fused (writing the operands in mma fragment
 * order), stage 4 on tensor cores with stage 3's block sums, stage 5 with the blocks' sum.
 * No float atomics anywhere: the same inputs give the same bits. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "mhc_host_vec.h"
#include "mhc_kern.h"
#include "mhc_pre_bwd_tc.h"
#include "mhc_pre_bwd_team.h"

#define TOKBLK 256 /* tokens per dbias/dalpha block */
/* stage 4 elements per item on the GPU (2*M*KC registers: 2 while M <= 24) and on the host */
#define BWD_KCD (MHC_N <= 4 ? 2 : 1)
#define BWD_KCH 8

typedef struct bwd_geom {
    int64_t T, K, NC, TBK, NB, NBLK;
    int64_t BR; /* rows of the block-sum region: NBLK (stage 3) or up to NB (tensor-core stage 4) */
    int MW, R;  /* R = M + 3: per-token dz (M) and dz*hm summed per group (3) */
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
    /* stage 1: at least 32 lanes a token, so a warp's loads are runs of one row; more where T is
     * small, for items enough to fill a GPU */
    int64_t T1 = g.T > 0 ? g.T : 1;
    int64_t nc = (((int64_t)1 << 17) + T1 - 1) / T1, maxc = (a->D + 15) / 16;
    if (nc < 32) nc = 32;
    if (nc > maxc) nc = maxc;
    if (nc < 1) nc = 1;
    g.NC = nc;
    /* token blocks of the dx/dW pass: at most 64 blocks (bounded dW partials), enough items to
     * fill a GPU in several waves */
    g.TBK = (g.T + 63) / 64 > 64 ? (g.T + 63) / 64 : 64;
    g.NB = (g.T + g.TBK - 1) / g.TBK;
    if (g.NB < 1) g.NB = 1;
    g.NBLK = (g.T + TOKBLK - 1) / TOKBLK;
    if (g.NBLK < 1) g.NBLK = 1;
    g.BR = g.NBLK > g.NB ? g.NBLK : g.NB;
    return g;
}

/* workspace: dh_pre partials [NC][T][n], dh_mix [T][MW], coef [T], token rows [T][R],
 * block rows [BR][R], dW partials [NB][M][K], fragment tiles (tensor-core stage 4; sized
 * whichever path runs, a few MB) */
int64_t mhc_pre_bwd_workspace(const mhc_pre_bwd_args *a) {
    bwd_geom g = bwd_geometry(a);
    const int M = 2 * a->n + a->n * a->n;
    return (int64_t)sizeof(float) *
               (al4(g.NC * g.T * a->n) + al4(g.T * g.MW) + al4(g.T) + al4(g.T * g.R) +
                al4(g.BR * g.R) + al4(g.NB * M * g.K) + al4(bwd_tc_frag_words(a->n, g.T))) +
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

/* Stage 1 body: sum of dh_in[d]*x[i,d] for every stream i over the 16-element pieces at d0,
 * d0 + step, .. below D. */
MHC_INLINE void bwd_dhpre(const int N, const char *xrow, int64_t sx2, const char *grow, int64_t d0,
                          int64_t step, int64_t D, int bf16, int gbf16, int vec, float *out) {
    const int esz = bf16 ? 2 : 4, gsz = gbf16 ? 2 : 4;
    float acc[NMAX];
    MHC_UNROLL
    for (int i = 0; i < NMAX; i++) acc[i] = 0.f;
    int64_t d = d0;
    for (; d + 16 <= D; d += step) {
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
    for (; d < D; d++) {
        const float gv = ompk_load_f(grow, d, gbf16);
        MHC_UNROLL
        for (int i = 0; i < NMAX; i++)
            if (i < N) acc[i] += gv * ompk_load_f(xrow, i * sx2 + d, bf16);
    }
    MHC_UNROLL
    for (int i = 0; i < NMAX; i++)
        if (i < N) out[i] = acc[i];
}

/* Stage 2 body for token t: dh_pre from the NC partials at pdh, or given (dhp_in). */
MHC_INLINE void bwd_token(const int N, int64_t t, int64_t S, int64_t T, int64_t NC, int64_t K,
                          const float *pdh, const float *dhp_in, const mhc_pre_bwd_args *a,
                          const float *alpha, const float *dh_post, const float *dh_res,
                          const float *h_mix, const float *inv_rms, const float *h_pre,
                          const float *h_post, float *dhm_ws, int MW, float *coef, float *tok) {
    const int M = 2 * N + N * N;
    const int64_t b = t / S, s = t % S;
    float dhp[NMAX];
    MHC_UNROLL
    for (int i = 0; i < NMAX; i++) dhp[i] = 0.f;
    if (dhp_in) {
        MHC_UNROLL
        for (int i = 0; i < NMAX; i++) dhp[i] = dhp_in[i];
    } else {
        for (int64_t c = 0; c < NC; c++) MHC_UNROLL
        for (int i = 0; i < NMAX; i++)
            if (i < N) dhp[i] += pdh[(c * T + t) * N + i];
    }
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
        MHC_UNROLL
        for (int e = 0; e < KC; e++) v[e] = ompk_load_f(p, e, bf16);
    } else {
        MHC_UNROLL
        for (int e = 0; e < KC; e++) v[e] = e < ne ? ompk_load_f(p, e * st, bf16) : 0.f;
    }
}

/* A token cursor over one tensor: the element offset of token (b, s), advanced without
 * multiplies (s1 = the s stride, wrap = the b stride less S s-strides). */
typedef struct bwd_cur {
    int64_t off, s1, wrap;
} bwd_cur;

MHC_INLINE bwd_cur cur_make(int64_t b, int64_t s, int64_t S, int64_t s0, int64_t s1) {
    bwd_cur c;
    c.off = b * s0 + s * s1;
    c.s1 = s1;
    c.wrap = s0 - S * s1;
    return c;
}

MHC_INLINE void cur_next(bwd_cur *c, int wrapped) {
    c->off += c->s1 + (wrapped ? c->wrap : 0);
}

/* Stage 4's four token cursors (x, dh_in, dx, grad_x_post) at token t0; returns t0's s (all at
 * token 0 when the run is empty). */
MHC_INLINE int64_t cur_make4(const bwd_io *io, int64_t t0, int64_t t1, bwd_cur *cx, bwd_cur *cd,
                             bwd_cur *co, bwd_cur *cg) {
    const int64_t S = io->S, b0 = t1 > t0 ? t0 / S : 0, s0 = t1 > t0 ? t0 - b0 * S : 0;
    *cx = cur_make(b0, s0, S, io->sx[0], io->sx[1]);
    *cd = cur_make(b0, s0, S, io->sdh[0], io->sdh[1]);
    *co = cur_make(b0, s0, S, io->sdx[0], io->sdx[1]);
    *cg = cur_make(b0, s0, S, io->sg[0], io->sg[1]);
    return s0;
}

/* Stage 4 body, any layout and dtype (bwd_team_item takes the common one): tokens [t0,t1) at the
 * KC elements d0.. of stream i (k = i*D + d0 + e). The KC x M weights phi*gamma and dW sums stay
 * in registers over the tokens; x and dh_in are loaded TG tokens ahead of their use, so TG
 * tokens' loads are in flight while one token's arithmetic runs (the dx stores could alias the
 * loads, so the compiler cannot hoist them itself). */
MHC_INLINE void bwd_dxdw(const int N, const int KC, const int TG, const int FAST, const bwd_io *io,
                         int64_t i, int64_t d0, int64_t t0, int64_t t1, int vec_rt, const char *x,
                         const char *dh, const char *gxp, char *dx, const float *phi,
                         const float *gamma, const float *h_pre, const float *dhm_ws,
                         const float *coef, float *pw) {
    const int MW = io->MW;
    const int64_t S = io->S, D = io->D, K = io->K;
    /* FAST: the common layout (bf16 everywhere, unit element strides, aligned runs) as constants */
    const int vec = FAST ? 1 : vec_rt;
    const int bf16 = FAST ? 1 : io->bf16, dbf16 = FAST ? 1 : io->dbf16;
    const int gbf16 = FAST ? 1 : io->gbf16;
    const int esz = bf16 ? 2 : 4, dsz = dbf16 ? 2 : 4, gsz = gbf16 ? 2 : 4;
    const int64_t sx3 = FAST ? 1 : io->sx[3], sd2 = FAST ? 1 : io->sdh[2];
    const int64_t sg3 = FAST ? 1 : io->sg[3], so3 = FAST ? 1 : io->sdx[3];
    const int ne = D - d0 < KC ? (int)(D - d0) : KC;
    const int64_t k0 = i * D + d0;
    float w[MMAX][BWD_KCMAX], acc[MMAX][BWD_KCMAX];
    bwd_w_init(N, KC, phi, io->sphi, gamma, k0, ne, w, acc);
    const char *xb = x + (i * io->sx[2] + d0 * sx3) * esz, *db = dh + d0 * sd2 * dsz;
    const char *gb = gxp ? gxp + (i * io->sg[2] + d0 * sg3) * gsz : gxp;
    char *ob = dx + (i * io->sdx[2] + d0 * so3) * esz;
    const float *hb = h_pre + i * io->shpre[1];
    const int64_t sh0 = io->shpre[0];
    /* load cursors (x, dh_in, grad_x_post) run TG tokens ahead of the store cursor (dx) */
    bwd_cur cx, cd, co, cg;
    const int64_t s0 = cur_make4(io, t0, t1, &cx, &cd, &co, &cg);
    int64_t sl = s0, sc = s0;
    /* slot j holds token tg+j; once that token is done the slot is refilled with token tg+j+TG */
    float vs[BWD_TGMAX][BWD_KCMAX], gs[BWD_TGMAX][BWD_KCMAX], ps[BWD_TGMAX][BWD_KCMAX];
    float cs[BWD_TGMAX], hs[BWD_TGMAX];
#define BWD_FILL(j, t)                                                                             \
    do {                                                                                           \
        kc_load(KC, xb + cx.off * esz, sx3, bf16, vec, ne, vs[j]);                                 \
        kc_load(KC, db + cd.off * dsz, sd2, dbf16, vec, ne, gs[j]);                                \
        if (gb) kc_load(KC, gb + cg.off * gsz, sg3, gbf16, vec, ne, ps[j]);                        \
        cs[j] = coef[t];                                                                           \
        hs[j] = hb[(t) * sh0];                                                                     \
        const int wr_ = ++sl == S;                                                                 \
        if (wr_) sl = 0;                                                                           \
        cur_next(&cx, wr_);                                                                        \
        cur_next(&cd, wr_);                                                                        \
        cur_next(&cg, wr_);                                                                        \
    } while (0)
    MHC_UNROLL
    for (int j = 0; j < TG; j++) {
        cs[j] = hs[j] = 0.f;
        MHC_UNROLL
        for (int e = 0; e < KC; e++) vs[j][e] = gs[j][e] = ps[j][e] = 0.f;
        if (t0 + j < t1) BWD_FILL(j, t0 + j);
    }
    for (int64_t tg = t0; tg < t1; tg += TG) {
        MHC_UNROLL
        for (int j = 0; j < TG; j++) {
            const int64_t t = tg + j;
            if (t >= t1) break;
            float sum[BWD_KCMAX], val[BWD_KCMAX];
            bwd_tok(N, KC, (const mhc_f4 *)(dhm_ws + t * MW), w, acc, vs[j], sum);
            MHC_UNROLL
            for (int e = 0; e < KC; e++) {
                val[e] = sum[e] - cs[j] * vs[j][e] + hs[j] * gs[j][e];
                if (gb) val[e] += ps[j][e];
            }
            kc_store(KC, ob + co.off * esz, so3, bf16, vec, ne, val);
            const int wr = ++sc == S;
            if (wr) sc = 0;
            cur_next(&co, wr);
            if (t + TG < t1) BWD_FILL(j, t + TG);
        }
    }
#undef BWD_FILL
    bwd_w_store(N, KC, ne, acc, pw, K, k0);
}

/* ---- host forms of stages 1, 4 and 5, on the 8-float vectors of mhc_host_vec.h ------------ */

/* Host form of stage 1 for one token: dh_pre over the whole row (x has unit element stride) on
 * 8-float vectors, two accumulators a stream for independent FMA chains, then a fixed-order sum
 * of the 16 lanes. The GPU items of 16-element pieces cost the host a dependent chain of 16
 * scalar FMAs a stream and the item bookkeeping: a third of the host backward (perf) for 8M
 * multiply-adds. */
static inline void bwd_dhpre_host(const int N, const char *xrow, int64_t sx2, const char *grow,
                                  int64_t D, int bf16, int gbf16, int vec, float *out) {
    const int esz = bf16 ? 2 : 4, gsz = gbf16 ? 2 : 4;
    mhc_f8 a0[NMAX], a1[NMAX];
    for (int i = 0; i < N; i++) a0[i] = a1[i] = (mhc_f8){0};
    int64_t d = 0;
    for (; d + 16 <= D; d += 16) {
        const mhc_f8 g0 = mhc_f8_load(grow + d * gsz, 1, gbf16, vec, 8);
        const mhc_f8 g1 = mhc_f8_load(grow + (d + 8) * gsz, 1, gbf16, vec, 8);
        for (int i = 0; i < N; i++) {
            const char *xp = xrow + (i * sx2 + d) * esz;
            a0[i] += g0 * mhc_f8_load(xp, 1, bf16, vec, 8);
            a1[i] += g1 * mhc_f8_load(xp + 8 * esz, 1, bf16, vec, 8);
        }
    }
    /* the last D % 16 elements element by element (a vector load would pass the row end) */
    for (; d < D; d += 8) {
        const int ne = D - d < 8 ? (int)(D - d) : 8;
        const mhc_f8 g0 = mhc_f8_load(grow + d * gsz, 1, gbf16, 0, ne);
        for (int i = 0; i < N; i++)
            a0[i] += g0 * mhc_f8_load(xrow + (i * sx2 + d) * esz, 1, bf16, 0, ne);
    }
    for (int i = 0; i < N; i++) {
        const mhc_f8 v = a0[i] + a1[i];
        float acc = 0.f;
        for (int e = 0; e < 8; e++) acc += v[e];
        out[i] = acc;
    }
}

/* Host form of stage 5 for elements [k0, k1): the same sums in the same order as the GPU loop
 * (blocks q in order, then m in order for dgamma), but with k innermost so that they run on
 * vectors instead of one element's 24 x NB strided reads at a time. */
static inline void bwd_dw_host(int M, int64_t K, int64_t nbw, int64_t k0, int64_t k1,
                               const float *pw, const float *phi, int64_t sphi, const float *gamma,
                               float *dphi, int64_t sdphi, float *dgamma) {
    enum { KB = 256 };
    float w[KB], dg[KB];
    for (int64_t kb = k0; kb < k1; kb += KB) {
        const int nk = k1 - kb < KB ? (int)(k1 - kb) : KB;
        for (int e = 0; e < nk; e++) dg[e] = 0.f;
        for (int m = 0; m < M; m++) {
            for (int e = 0; e < nk; e++) w[e] = 0.f;
            for (int64_t q = 0; q < nbw; q++) {
                const float *pq = pw + (q * M + m) * K + kb;
                for (int e = 0; e < nk; e++) w[e] += pq[e];
            }
            float *dp = dphi + m * sdphi + kb;
            const float *ph = phi + m * sphi + kb;
            for (int e = 0; e < nk; e++) {
                dp[e] = w[e] * (gamma ? gamma[kb + e] : 1.f);
                dg[e] += w[e] * ph[e];
            }
        }
        if (dgamma)
            for (int e = 0; e < nk; e++) dgamma[kb + e] = dg[e];
    }
}

/* Host stage 4 on runs of 8 elements, one vector; tokens in pairs, so each weight and dW-sum
 * vector is loaded and stored once per two tokens. */
MHC_INLINE void bwd_dxdw_host(const int N, const bwd_io *io, int64_t i, int64_t d0, int64_t t0,
                              int64_t t1, int vec, const char *x, const char *dh, const char *gxp,
                              char *dx, const float *phi, const float *gamma, const float *h_pre,
                              const float *dhm_ws, const float *coef, float *pw) {
    const int M = 2 * N + N * N, MW = io->MW;
    const int64_t S = io->S, D = io->D, K = io->K;
    const int bf16 = io->bf16, dbf16 = io->dbf16, gbf16 = io->gbf16;
    const int esz = bf16 ? 2 : 4, dsz = dbf16 ? 2 : 4, gsz = gbf16 ? 2 : 4;
    const int64_t sx3 = io->sx[3], sd2 = io->sdh[2], sg3 = io->sg[3], so3 = io->sdx[3];
    const int ne = D - d0 < 8 ? (int)(D - d0) : 8;
    const int64_t k0 = i * D + d0;
    mhc_f8 w[MMAX], acc[MMAX];
    for (int m = 0; m < M; m++) {
        for (int e = 0; e < 8; e++)
            w[m][e] = e < ne ? phi[m * io->sphi + k0 + e] * (gamma ? gamma[k0 + e] : 1.f) : 0.f;
        acc[m] = (mhc_f8){0};
    }
    const char *xb = x + (i * io->sx[2] + d0 * sx3) * esz, *db = dh + d0 * sd2 * dsz;
    const char *gb = gxp ? gxp + (i * io->sg[2] + d0 * sg3) * gsz : gxp;
    char *ob = dx + (i * io->sdx[2] + d0 * so3) * esz;
    bwd_cur cx, cd, co, cg;
    const int64_t s0 = cur_make4(io, t0, t1, &cx, &cd, &co, &cg);
    int64_t sc = s0;
    for (int64_t t = t0; t < t1; t += 2) {
        const int two = t + 1 < t1;
        mhc_f8 v[2], g[2], sum[2];
        bwd_cur px = cx, pd = cd;
        int64_t ps = sc;
        for (int j = 0; j < 2; j++) {
            if (j == 0 || two) {
                v[j] = mhc_f8_load(xb + px.off * esz, sx3, bf16, vec, ne);
                g[j] = mhc_f8_load(db + pd.off * dsz, sd2, dbf16, vec, ne);
            } else {
                v[j] = g[j] = (mhc_f8){0};
            }
            const int wr = ++ps == S;
            if (wr) ps = 0;
            cur_next(&px, wr);
            cur_next(&pd, wr);
            sum[j] = (mhc_f8){0};
        }
        const float *r0 = dhm_ws + t * MW, *r1 = two ? r0 + MW : r0;
        for (int m = 0; m < M; m++) {
            const float a0 = r0[m], a1 = two ? r1[m] : 0.f;
            sum[0] += a0 * w[m];
            sum[1] += a1 * w[m];
            acc[m] += a0 * v[0];
            acc[m] += a1 * v[1];
        }
        for (int j = 0; j < 2; j++) {
            if (j == 1 && !two) break;
            const int64_t tj = t + j;
            mhc_f8 out =
                sum[j] - coef[tj] * v[j] + h_pre[tj * io->shpre[0] + i * io->shpre[1]] * g[j];
            if (gb) out += mhc_f8_load(gb + cg.off * gsz, sg3, gbf16, vec, ne);
            mhc_f8_store(ob + co.off * esz, so3, bf16, vec, ne, out);
            const int wr = ++sc == S;
            if (wr) sc = 0;
            cur_next(&cx, wr);
            cur_next(&cd, wr);
            cur_next(&co, wr);
            cur_next(&cg, wr);
        }
    }
    for (int m = 0; m < M; m++)
        for (int e = 0; e < ne; e++) pw[m * K + k0 + e] = acc[m][e];
}

/* Host stage 4 on runs of 16 elements (two 8-float vectors), for calls whose every run is
 * contiguous (bwd_host16_ok; no alignment needed, the vectors move by memcpy). bwd_dxdw_host
 * keeps 2 x M weight and sum vectors across the token loop: 48 for n = 4 on AVX2's 16
 * registers, so they live in memory and every 4 FMAs cost 4 loads and a store. Here the sums are
 * register tiles: dW 6 rows x 16 elements (per token 2 loads and 6 broadcasts for 12 FMAs), dx 4
 * tokens x 16 elements (per m 2 weight loads and 4 broadcasts for 8 FMAs), over tokens converted
 * to f32 BWD_HTB at a time. The same sums in the same order as bwd_dxdw_host: tokens in order for
 * dW, m in order for dx. */
#define BWD_HTB 64
#define BWD_HMB 6
static inline void bwd_dxdw_host16(const int N, const bwd_io *io, int64_t i, int64_t d0, int64_t t0,
                                   int64_t t1, const char *x, const char *dh, const char *gxp,
                                   char *dx, const float *phi, const float *gamma,
                                   const float *h_pre, const float *dhm_ws, const float *coef,
                                   float *pw) {
    const int M = 2 * N + N * N, MW = io->MW;
    const int64_t S = io->S, K = io->K, k0 = i * io->D + d0;
    const int bf16 = io->bf16, dbf16 = io->dbf16, gbf16 = io->gbf16;
    const int esz = bf16 ? 2 : 4, dsz = dbf16 ? 2 : 4, gsz = gbf16 ? 2 : 4;
    mhc_f8 w[MMAX][2], acc[MMAX][2];
    for (int m = 0; m < M; m++)
        for (int h = 0; h < 2; h++) {
            for (int e = 0; e < 8; e++) {
                const int64_t k = k0 + 8 * h + e;
                w[m][h][e] = phi[m * io->sphi + k] * (gamma ? gamma[k] : 1.f);
            }
            acc[m][h] = (mhc_f8){0};
        }
    const char *xb = x + (i * io->sx[2] + d0) * esz, *db = dh + d0 * dsz;
    const char *gb = gxp ? gxp + (i * io->sg[2] + d0) * gsz : gxp;
    char *ob = dx + (i * io->sdx[2] + d0) * esz;
    bwd_cur cx, cd, co, cg;
    const int64_t s0 = cur_make4(io, t0, t1, &cx, &cd, &co, &cg);
    int64_t sl = s0, so = s0;
    mhc_f8 vb[BWD_HTB][2], gv[BWD_HTB][2];
    for (int64_t tb = t0; tb < t1; tb += BWD_HTB) {
        const int nt = t1 - tb < BWD_HTB ? (int)(t1 - tb) : BWD_HTB;
        for (int j = 0; j < nt; j++) {
            for (int h = 0; h < 2; h++) {
                vb[j][h] = mhc_f8_load(xb + (cx.off + 8 * h) * esz, 1, bf16, 1, 8);
                gv[j][h] = mhc_f8_load(db + (cd.off + 8 * h) * dsz, 1, dbf16, 1, 8);
            }
            const int wr = ++sl == S;
            if (wr) sl = 0;
            cur_next(&cx, wr);
            cur_next(&cd, wr);
        }
        const float *rb = dhm_ws + tb * MW;
        for (int mb = 0; mb < M; mb += BWD_HMB) {
            mhc_f8 a[BWD_HMB][2];
            for (int u = 0; u < BWD_HMB; u++)
                for (int h = 0; h < 2; h++) a[u][h] = mb + u < M ? acc[mb + u][h] : (mhc_f8){0};
            for (int j = 0; j < nt; j++)
                for (int u = 0; u < BWD_HMB; u++) {
                    if (mb + u >= M) continue;
                    const float r = rb[j * MW + mb + u];
                    a[u][0] += r * vb[j][0];
                    a[u][1] += r * vb[j][1];
                }
            for (int u = 0; u < BWD_HMB; u++)
                if (mb + u < M) acc[mb + u][0] = a[u][0], acc[mb + u][1] = a[u][1];
        }
        for (int j = 0; j < nt; j += 4) {
            const int nu = nt - j < 4 ? nt - j : 4;
            mhc_f8 sum[4][2];
            for (int u = 0; u < 4; u++) sum[u][0] = sum[u][1] = (mhc_f8){0};
            if (nu == 4) {
                for (int m = 0; m < M; m++)
                    for (int u = 0; u < 4; u++) {
                        const float r = rb[(j + u) * MW + m];
                        sum[u][0] += r * w[m][0];
                        sum[u][1] += r * w[m][1];
                    }
            } else {
                for (int u = 0; u < nu; u++)
                    for (int m = 0; m < M; m++) {
                        const float r = rb[(j + u) * MW + m];
                        sum[u][0] += r * w[m][0];
                        sum[u][1] += r * w[m][1];
                    }
            }
            for (int u = 0; u < nu; u++) {
                const int64_t t = tb + j + u;
                const float c = coef[t], hp = h_pre[t * io->shpre[0] + i * io->shpre[1]];
                for (int h = 0; h < 2; h++) {
                    mhc_f8 out = sum[u][h] - c * vb[j + u][h] + hp * gv[j + u][h];
                    if (gb) out += mhc_f8_load(gb + (cg.off + 8 * h) * gsz, 1, gbf16, 1, 8);
                    mhc_f8_store(ob + (co.off + 8 * h) * esz, 1, bf16, 1, 8, out);
                }
                const int wr = ++so == S;
                if (wr) so = 0;
                cur_next(&co, wr);
                cur_next(&cg, wr);
            }
        }
    }
    for (int m = 0; m < M; m++)
        for (int h = 0; h < 2; h++)
            for (int e = 0; e < 8; e++) pw[m * K + k0 + 8 * h + e] = acc[m][h][e];
}

/* Whether bwd_dxdw_host16 can take the call: unit element strides and D a multiple of 16. */
static int bwd_host16_ok(const mhc_pre_bwd_args *a) {
    if (a->D % 16 || a->sx[3] != 1 || a->sdh[2] != 1 || a->sdx[3] != 1) return 0;
    return !a->gxp || a->sgxp[3] == 1;
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

/* Whether the GPU stage 4 runs on teams (bwd_team_item): bf16 x, dh_in, dx and grad_x_post in
 * aligned runs of KC, and each tensor's tokens one flat index (t * its s stride). */
static int bwd_team_ok(const mhc_pre_bwd_args *a, int KC) {
#ifdef OMPK_OFFLOAD_GCC_NVPTX
    /* GCC 12 has no team-shared memory (a team's arrays live in global memory) */
    (void)a, (void)KC;
    return 0;
#else
    const int64_t S = a->S;
    if (!a->bf16 || !a->dh_bf16 || (a->gxp && !a->gxp_bf16) || !bwd_kc_vec_ok(a, KC)) return 0;
    if (a->B == 1) return 1;
    if (a->sx[0] != S * a->sx[1] || a->sdh[0] != S * a->sdh[1] || a->sdx[0] != S * a->sdx[1])
        return 0;
    return !a->gxp || a->sgxp[0] == S * a->sgxp[1];
#endif
}

/* Whether stage 4 runs on tensor cores (bwd_tc_team), with its geometry in *tg: bf16 x, dh_in
 * and grad_x_post on a device, n <= BWD_TC_NMAX, 16-byte aligned contiguous runs of 8, every
 * warp's KW k inside one stream and whole team tiles (D % KW == 0, K % KT == 0: 32 and 128 for
 * n <= 4, 16 and 64 above). Token blocks of at least the portable kernel's size (so its partial
 * buffer suffices), about 16 of them: fewer partials for stage 5, and enough teams (K/KT per
 * block) to fill the GPU.
 * Returns 0 (portable stage 4) or want (1: tensor cores, 168-register build; 2: the 128-register
 * build); want 0 asks for the portable stage 4. */
static int bwd_tc_plan(ompk_exec ex, const mhc_pre_bwd_args *a, const bwd_geom *bg, bwd_tc_geom *tg,
                       int want) {
    memset(tg, 0, sizeof *tg);
#ifdef OMPK_NV_KERNELS
    if (!ex.on_target || a->n > BWD_TC_NMAX || !a->bf16 || !a->dh_bf16) return 0;
    if ((a->gxp && !a->gxp_bf16) || bg->T < 1 || bg->T > 0x7fffffff) return 0;
    if (a->D % BWD_TC_KW(a->n) || bg->K % BWD_TC_KT(a->n)) return 0;
    if (!bwd_kc_vec_ok(a, 8)) return 0;
    if (!want) return 0;
    int64_t tbk = (bg->T + 15) / 16;
    if (tbk < bg->TBK) tbk = bg->TBK;
    tbk = (tbk + 15) & ~(int64_t)15;
    const int64_t nb = (bg->T + tbk - 1) / tbk, nkt = bg->K / BWD_TC_KT(a->n);
    if (nb > bg->NB || nb * nkt > 0x7fffffff) return 0;
    tg->T = bg->T, tg->S = a->S, tg->D = a->D, tg->K = bg->K, tg->TBK = tbk;
    tg->sx0 = a->sx[0], tg->sx1 = a->sx[1], tg->sx2 = a->sx[2];
    tg->sdh0 = a->sdh[0], tg->sdh1 = a->sdh[1];
    tg->sg0 = a->sgxp[0], tg->sg1 = a->sgxp[1], tg->sg2 = a->sgxp[2];
    tg->sdx0 = a->sdx[0], tg->sdx1 = a->sdx[1], tg->sdx2 = a->sdx[2];
    tg->sphi = a->sphi, tg->shp0 = a->shpre[0], tg->shp1 = a->shpre[1];
    tg->NKT = (int)nkt, tg->NB = (int)nb;
    tg->has_gamma = a->gamma != NULL, tg->has_gxp = a->gxp != NULL;
    return want;
#else
    (void)ex, (void)a, (void)bg, (void)want;
    return 0;
#endif
}

#define MHC_N_INC "mhc_pre_bwd_n.inc"
#include "mhc_each_n.inc"

int mhc_pre_bwd_tc_fits(ompk_exec ex, const mhc_pre_bwd_args *a) {
    if (a->n > BWD_TC_NMAX) return 0;
    const bwd_geom g = bwd_geometry(a);
    bwd_tc_geom tg;
    return bwd_tc_plan(ex, a, &g, &tg, 1) != 0;
}

void mhc_pre_bwd_kernel(ompk_exec ex, const mhc_pre_bwd_args *a, void *ws, int tc) {
#define PRE_BWD(N) pre_bwd_launch_##N(ex, a, ws, tc)
    MHC_SWITCH_N(a->n, PRE_BWD)
#undef PRE_BWD
}
