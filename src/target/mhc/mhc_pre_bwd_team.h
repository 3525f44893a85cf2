/* Internal: the GPU stage 4 of the portable mHC pre backward on a team (bwd_team_item, and
 * bwd_team_rows for a team that got fewer threads), and the pieces mhc_pre_bwd.c's per-thread
 * stage 4 shares with it. One OpenMP source: the team's threads and barrier are
 * omp_get_thread_num() and omp barrier, or with OMPK_EMULATE the hooks of tests/emu_team.h
 * (tests/test_mhc_pre_bwd_team_emu.c runs both on the host). */
#ifndef OMPK_MHC_PRE_BWD_TEAM_H
#define OMPK_MHC_PRE_BWD_TEAM_H

#include <stdint.h>

#include "mhc_kern.h"

#if defined(OMPK_EMULATE)
#define BWD_TID() OMPK_EMU_TID()
#define BWD_SYNC() OMPK_EMU_SYNC()
#else
#include <omp.h>
#define BWD_TID() omp_get_thread_num()
#define BWD_SYNC() MHC_SYNC()
#endif

#define NMAX 8
#define MMAX (2 * NMAX + NMAX * NMAX)
/* stage 4 on the GPU: tokens loaded ahead (TG), and bounds of the elements a thread (KC) and of TG
 * (register arrays need constant extents) */
#define BWD_TGD 4
#define BWD_KCMAX 2
#define BWD_TGMAX 4
/* the GPU stage 4 on teams (bwd_team_item): threads a team, which also caps the registers a
 * thread (384: 168, enough for the 2*M*KC weights and sums while n <= 6), tokens a shared chunk
 * (CT * n <= TT: one coef and one h_pre a thread to stage), and the most 16-byte row words a
 * thread stages (n = 8: 16 tokens of 20 words on 128 threads) */
#define BWD_TT(n) ((n) <= 6 ? 384 : 128)
#define BWD_CT(n) ((n) <= 4 ? 64 : (n) <= 6 ? 32 : 16)
#define BWD_NSMAX 3
#define BWD_MW4(n) ((2 * (n) + (n) * (n) + 3) / 4) /* 16-byte words of a padded dh_mix row */

/* 2 floats moved as one 8-byte word */
typedef struct mhc_f2 {
    float v[2];
} __attribute__((aligned(8))) mhc_f2;

/* Where the stage-4 body reads and writes; strides in elements. */
typedef struct bwd_io {
    int64_t sx[4], sdh[3], sg[4], sdx[4], shpre[2];
    int64_t S, D, K, sphi;
    int bf16, dbf16, gbf16, MW;
} bwd_io;

/* bwd_io as BWD_IO_NW 8-byte words, for a target region's firstprivate scalars: a struct
 * there is a host-to-device copy of its own, and each thread copied it byte by byte. */
#define BWD_IO_NW 24
_Static_assert(sizeof(bwd_io) <= BWD_IO_NW * 8, "bwd_io fits BWD_IO_NW words");
// clang-format off
#define BWD_IO_WORDS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15) X(16) X(17) X(18) X(19) X(20) X(21) X(22) X(23)
#define BWD_IO_NAMES io0, io1, io2, io3, io4, io5, io6, io7, io8, io9, io10, io11, io12, io13, io14, io15, io16, io17, io18, io19, io20, io21, io22, io23
// clang-format on

/* bwd_team_item's form of kc_load: the KC bf16 elements at p as one raw word, converted by
 * kc_unraw where they are used. A conversion next to its load would wait for the load there,
 * and undo the loading ahead of the token slots. */
MHC_INLINE uint32_t kc_raw(const int KC, const char *p) {
    return KC == 2 ? *(const uint32_t *)p : *(const uint16_t *)p;
}

MHC_INLINE void kc_unraw(const int KC, uint32_t u, float *v) {
    ompk_f32_bits lo, hi;
    lo.u = u << 16;
    hi.u = u & 0xffff0000u;
    v[0] = lo.f;
    if (KC == 2) v[1] = hi.f;
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
        MHC_UNROLL
        for (int e = 0; e < KC; e++) ompk_store_f(p, e, v[e], bf16);
    } else {
        MHC_UNROLL
        for (int e = 0; e < KC; e++)
            if (e < ne) ompk_store_f(p, e * st, v[e], bf16);
    }
}

/* One token of stage 4 at a thread's KC elements: the dW sums acc[m] += dh_mix[m] * x, and
 * sum = the dx term sum_m dh_mix[m] * w[m], in two chains (even and odd m) added at the end. */
MHC_INLINE void bwd_tok(const int N, const int KC, const mhc_f4 *row, float w[][BWD_KCMAX],
                        float acc[][BWD_KCMAX], const float *xv, float *sum) {
    const int M = 2 * N + N * N;
    float s0v[BWD_KCMAX], s1v[BWD_KCMAX];
    MHC_UNROLL
    for (int e = 0; e < KC; e++) s0v[e] = s1v[e] = 0.f;
    MHC_UNROLL
    for (int q = 0; q < MMAX / 4 + 1; q++) {
        if (4 * q >= M) continue;
        const mhc_f4 r4 = row[q];
        MHC_UNROLL
        for (int u = 0; u < 4; u++) {
            const int m = 4 * q + u;
            if (m >= M) continue;
            MHC_UNROLL
            for (int e = 0; e < KC; e++) {
                if (u & 1)
                    s1v[e] += r4.v[u] * w[m][e];
                else
                    s0v[e] += r4.v[u] * w[m][e];
                acc[m][e] += r4.v[u] * xv[e];
            }
        }
    }
    MHC_UNROLL
    for (int e = 0; e < KC; e++) sum[e] = s0v[e] + s1v[e];
}

/* The KC x M weights phi*gamma at k0 (elements past ne: 0) and zeroed dW sums. */
MHC_INLINE void bwd_w_init(const int N, const int KC, const float *phi, int64_t sphi,
                           const float *gamma, int64_t k0, int ne, float w[][BWD_KCMAX],
                           float acc[][BWD_KCMAX]) {
    const int M = 2 * N + N * N;
    MHC_UNROLL
    for (int m = 0; m < MMAX; m++) {
        if (m >= M) continue;
        MHC_UNROLL
        for (int e = 0; e < KC; e++) {
            w[m][e] = e < ne ? phi[m * sphi + k0 + e] * (gamma ? gamma[k0 + e] : 1.f) : 0.f;
            acc[m][e] = 0.f;
        }
    }
}

MHC_INLINE void bwd_w_store(const int N, const int KC, int ne, const float acc[][BWD_KCMAX],
                            float *pw, int64_t K, int64_t k0) {
    const int M = 2 * N + N * N;
    MHC_UNROLL
    for (int m = 0; m < MMAX; m++) {
        if (m >= M) continue;
        MHC_UNROLL
        for (int e = 0; e < KC; e++)
            if (e < ne) pw[m * K + k0 + e] = acc[m][e];
    }
}

/* Team-shared staging of one chunk of CT tokens for bwd_team_item: the chunk's dh_mix rows (MW4
 * 16-byte words a token), coef, and h_pre of every stream, held in registers between the loads
 * and the stores so that the loads are in flight while the previous chunk computes. */
typedef struct bwd_stage {
    mhc_f4 r[BWD_NSMAX];
    float c, h;
} bwd_stage;

MHC_INLINE void bwd_stage_load(const int N, const int CT, const int TT, int tid, int64_t tc, int nt,
                               const float *dhm_ws, const float *coef, const float *h_pre,
                               int64_t shp0, int64_t shp1, bwd_stage *st) {
    const int MW4 = BWD_MW4(N);
    const mhc_f4 *src = (const mhc_f4 *)(dhm_ws + tc * 4 * MW4);
    MHC_UNROLL
    for (int s = 0; s < BWD_NSMAX; s++) {
        const int v = tid + s * TT;
        st->r[s] = (mhc_f4){{0.f, 0.f, 0.f, 0.f}};
        if (s * TT < CT * MW4 && v < nt * MW4) st->r[s] = src[v];
    }
    st->c = tid < nt ? coef[tc + tid] : 0.f;
    st->h = tid < nt * N ? h_pre[(tc + tid / N) * shp0 + (tid % N) * shp1] : 0.f;
}

MHC_INLINE void bwd_stage_store(const int N, const int CT, const int TT, int tid, int nt,
                                const bwd_stage *st, mhc_f4 *srow, float *sco, float *shp) {
    const int MW4 = BWD_MW4(N);
    MHC_UNROLL
    for (int s = 0; s < BWD_NSMAX; s++) {
        const int v = tid + s * TT;
        if (s * TT < CT * MW4 && v < nt * MW4) srow[v] = st->r[s];
    }
    if (tid < nt) sco[tid] = st->c;
    if (tid < nt * N) shp[tid] = st->h;
}

/* Stage 4 on a team of TT threads, for bf16 x, dh_in, dx and grad_x_post in aligned runs of KC
 * and tokens a flat index (bwd_team_ok). Item: tokens [t0,t1) and the TT runs from c0, run
 * c0 + tid a thread (runs past NCH only stage). The team stages the dh_mix rows, coef and h_pre
 * CT tokens at a time in shared memory, two buffers (chunk h + 1 loads while chunk h computes,
 * one barrier a chunk), so a token's row is a shared broadcast rather than a load that misses L1
 * on a team's first warp. x, dh_in and grad_x_post move as raw words (kc_raw) a group of TG tokens
 * ahead: a group issues the next group's loads before its own arithmetic, because the GPU code
 * waits for every outstanding load where the next loop iteration starts.
 * The sums are bwd_dxdw's, in its order. srow, sco, shp: team-shared, 2 x CT tokens. */
MHC_INLINE void bwd_team_item(const int N, const int KC, const int CT, const int TT,
                              const bwd_io *io, int64_t t0, int64_t t1, int64_t c0, int64_t NCH,
                              int64_t CPS, const char *x, const char *dh, const char *gxp, char *dx,
                              const float *phi, const float *gamma, const float *h_pre,
                              const float *dhm_ws, const float *coef, float *pw, mhc_f4 *srow,
                              float *sco, float *shp) {
    const int MW4 = BWD_MW4(N), TG = BWD_TGD;
    const int tid = BWD_TID();
    const int64_t c = c0 + tid, D = io->D, K = io->K, shp0 = io->shpre[0], shp1 = io->shpre[1];
    const int own = c < NCH, hg = gxp != NULL;
    const int64_t i = own ? c / CPS : 0, d0 = own ? (c - i * CPS) * KC : 0, k0 = i * D + d0;
    float w[MMAX][BWD_KCMAX], acc[MMAX][BWD_KCMAX];
    bwd_w_init(N, KC, phi, io->sphi, gamma, k0, own ? KC : 0, w, acc);
    /* byte pointers: the loads run a group ahead of the dx store; without grad_x_post its
     * pointer stays on x and is not read */
    const int64_t xs = io->sx[1] * 2, ds = io->sdh[1] * 2, gs = hg ? io->sg[1] * 2 : 0;
    const int64_t os = io->sdx[1] * 2;
    const char *xl = x + (t0 * io->sx[1] + i * io->sx[2] + d0) * 2;
    const char *dl = dh + (t0 * io->sdh[1] + d0) * 2;
    const char *gl = hg ? gxp + (t0 * io->sg[1] + i * io->sg[2] + d0) * 2 : xl;
    char *op = dx + (t0 * io->sdx[1] + i * io->sdx[2] + d0) * 2;
    uint32_t vr[BWD_TGMAX], gr[BWD_TGMAX], pr[BWD_TGMAX];
#define BWD_TFILL(j)                                                                               \
    do {                                                                                           \
        vr[j] = kc_raw(KC, xl);                                                                    \
        gr[j] = kc_raw(KC, dl);                                                                    \
        if (hg) pr[j] = kc_raw(KC, gl);                                                            \
        xl += xs, dl += ds, gl += gs;                                                              \
    } while (0)
    MHC_UNROLL
    for (int j = 0; j < TG; j++) {
        vr[j] = gr[j] = pr[j] = 0;
        if (own && t0 + j < t1) BWD_TFILL(j);
    }
    const int64_t nch = (t1 - t0 + CT - 1) / CT;
    bwd_stage st;
    const int n0 = t1 - t0 < CT ? (int)(t1 - t0) : CT;
    bwd_stage_load(N, CT, TT, tid, t0, n0, dhm_ws, coef, h_pre, shp0, shp1, &st);
    bwd_stage_store(N, CT, TT, tid, n0, &st, srow, sco, shp);
    BWD_SYNC();
    for (int64_t h = 0; h < nch; h++) {
        const int64_t tc = t0 + h * CT;
        const int b = (int)(h & 1);
        /* tokens from tc: nk in this chunk, nr up to the last one a slot may load ahead */
        const int nr = t1 - tc < CT + TG ? (int)(t1 - tc) : CT + TG, nk = nr < CT ? nr : CT;
        const int nxt = h + 1 < nch;
        const int nnext = t1 - tc - CT < CT ? (int)(t1 - tc - CT) : CT;
        if (nxt)
            bwd_stage_load(N, CT, TT, tid, tc + CT, nnext, dhm_ws, coef, h_pre, shp0, shp1, &st);
        if (own) {
            const mhc_f4 *rb = srow + b * CT * MW4;
            const float *cb = sco + b * CT, *hb = shp + b * CT * N + i;
            for (int jb = 0; jb < nk; jb += TG) {
                /* this group's words out of the slots, the next group's loads into them */
                uint32_t cv[BWD_TGMAX], cg[BWD_TGMAX], cp[BWD_TGMAX];
                MHC_UNROLL
                for (int j = 0; j < TG; j++) cv[j] = vr[j], cg[j] = gr[j], cp[j] = pr[j];
                MHC_UNROLL
                for (int j = 0; j < TG; j++)
                    if (jb + j + TG < nr) BWD_TFILL(j);
                MHC_UNROLL
                for (int j = 0; j < TG; j++) {
                    const int jj = jb + j;
                    if (jj >= nk) break;
                    float xv[BWD_KCMAX], gv[BWD_KCMAX], gx[BWD_KCMAX], sum[BWD_KCMAX];
                    float val[BWD_KCMAX];
                    kc_unraw(KC, cv[j], xv);
                    kc_unraw(KC, cg[j], gv);
                    kc_unraw(KC, cp[j], gx);
                    bwd_tok(N, KC, rb + jj * MW4, w, acc, xv, sum);
                    MHC_UNROLL
                    for (int e = 0; e < KC; e++) {
                        val[e] = sum[e] - cb[jj] * xv[e] + hb[jj * N] * gv[e];
                        if (hg) val[e] += gx[e];
                    }
                    kc_store(KC, op, 1, 1, 1, KC, val);
                    op += os;
                }
            }
        }
        if (nxt)
            bwd_stage_store(N, CT, TT, tid, nnext, &st, srow + (b ^ 1) * CT * MW4,
                            sco + (b ^ 1) * CT, shp + (b ^ 1) * CT * N);
        BWD_SYNC();
    }
#undef BWD_TFILL
    if (own) bwd_w_store(N, KC, KC, acc, pw, K, k0);
}

/* bwd_team_item's runs c0 + first, c0 + first + step, .. (below c0 + TT and NCH), for a team
 * that got fewer than TT threads: the same sums in the same order, element by element from
 * memory. Out of line and without register arrays, so that the team kernel's register count is
 * the tiled path's. */
static __attribute__((noinline)) void
bwd_team_rows(const int N, const int KC, const int TT, const bwd_io *io, int64_t t0, int64_t t1,
              int64_t c0, int64_t NCH, int64_t CPS, int first, int step, const char *x,
              const char *dh, const char *gxp, char *dx, const float *phi, const float *gamma,
              const float *h_pre, const float *dhm_ws, const float *coef, float *pw) {
    const int M = 2 * N + N * N, MW = io->MW;
    const int64_t D = io->D, K = io->K;
    for (int64_t c = c0 + first; c < c0 + TT && c < NCH; c += step) {
        const int64_t i = c / CPS;
        for (int e = 0; e < KC; e++) {
            const int64_t d = (c - i * CPS) * KC + e, k = i * D + d;
            const int64_t xo = i * io->sx[2] + d, go = i * io->sg[2] + d, oo = i * io->sdx[2] + d;
            const float gk = gamma ? gamma[k] : 1.f;
            for (int64_t t = t0; t < t1; t++) {
                const float *row = dhm_ws + t * MW;
                const float xv = ompk_load_f(x, t * io->sx[1] + xo, 1);
                const float gv = ompk_load_f(dh, t * io->sdh[1] + d, 1);
                float s0 = 0.f, s1 = 0.f;
                for (int m = 0; m < M; m++) {
                    const float wm = phi[m * io->sphi + k] * gk;
                    if (m & 1)
                        s1 += row[m] * wm;
                    else
                        s0 += row[m] * wm;
                }
                const float sum = s0 + s1;
                float val = sum - coef[t] * xv + h_pre[t * io->shpre[0] + i * io->shpre[1]] * gv;
                if (gxp) val += ompk_load_f(gxp, t * io->sg[1] + go, 1);
                ompk_store_f(dx, t * io->sdx[1] + oo, val, 1);
            }
            for (int m = 0; m < M; m++) {
                float acc = 0.f;
                for (int64_t t = t0; t < t1; t++)
                    acc += dhm_ws[t * MW + m] * ompk_load_f(x, t * io->sx[1] + xo, 1);
                pw[m * K + k] = acc;
            }
        }
    }
}

#endif
