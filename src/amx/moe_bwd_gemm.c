/* The backward's data-gradient GEMMs on the forward's tile kernels (bf16, int8 base), against the
 * transposed copies of moe_wt.c. The activations (dy rows for dh, [dg | du] rows for dx) are
 * split into bf16 hi = bf16(v) and lo = bf16(v - hi) once per backward, into expert-sorted
 * groups of 16 routes: rows 0-15 of a group are the hi rows, rows 16-31 the lo rows, so one
 * 32-row AMX call does both halves against the same weight tiles (a route's result is row r
 * plus row r + 16, each row's sum in the kernel's order: the bits do not depend on the layout).
 * Padding (K beyond the data, rows of a partial group) holds 0.
 * Hi only (OMPK_MOE_GRAD_BF16, or dh with bf16 dy on a bf16 base, where lo is exactly 0): the
 * expert's rows are hi rows in order from its first group's start, one AMX call covers 32
 * routes, and each result is h + 0.0f (the bits of h + lo when lo is 0).
 * Work item: (expert, chunk of MOE_BWD_STEPS 32-column n-steps); the chunk's weights stay in L2
 * while the expert's groups stream past them. The kernel is chosen per expert from the routed
 * row count of this backward. Every output element is written by one kernel call: the results
 * do not depend on the thread count. */
#include <omp.h>
#include <string.h>

#include "bf16.h"
#include "moe_internal.h"

typedef struct gemm {
    const uint8_t *w; /* expert 0's packed matrix */
    size_t wbytes;    /* per expert */
    int kt, nb;       /* k-tiles, 16-row blocks */
    int64_t N;        /* real output columns */
} gemm;

/* bytes between the rows of the split operand: K bf16 and one line, so the 16 rows of a tile
 * load do not all map to one L1 set when K*2 is a multiple of 4 KB */
static int64_t ldab(int kt) {
    return (int64_t)kt * 64 + 64;
}

size_t moe_wt_split_bytes(const ompk_moe *m, int64_t R) {
    const int kt = m->wt_dn_kt > m->wt_gu_kt ? m->wt_dn_kt : m->wt_gu_kt;
    return (size_t)(2 * R + 32 * m->E) * (size_t)ldab(kt);
}

void moe_wt_group_offsets(const ompk_moe *m, const int64_t *offs, int64_t *goff) {
    goff[0] = 0;
    for (int64_t e = 0; e < m->E; e++) goff[e + 1] = goff[e] + (offs[e + 1] - offs[e] + 15) / 16;
}

/* lo NULL: hi only */
static void split_row(const float *v, const float *sc, int64_t n, uint16_t *hi, uint16_t *lo) {
    for (int64_t i = 0; i < n; i++) {
        const float x = sc ? v[i] * sc[i] : v[i];
        const uint16_t h = ompk_f32_to_bf16(x);
        hi[i] = h;
        if (lo) lo[i] = ompk_f32_to_bf16(x - ompk_bf16_to_f32(h));
    }
}

/* route row rr (expert-sorted) of expert e: its hi row and lo row in the split buffer */
static uint16_t *row_at(uint8_t *A, int64_t lda, const int64_t *offs, const int64_t *goff,
                        int64_t e, int64_t rr) {
    const int64_t j = rr - offs[e];
    return (uint16_t *)(A + ((goff[e] + j / 16) * 32 + j % 16) * lda);
}

/* Orphaned worksharing (inside the backward's parallel region): fills the split operand. dh: dy
 * rows (int8: times the weight row scales, per k here); dx: [dg | du] rows at 0 and wt_ip. */
static void split_all(const ompk_moe *m, int dx, int hionly, const float *src0, const float *src1,
                      const int64_t *offs, const int64_t *goff, const int32_t *rroute,
                      const int32_t *ids, int kt, uint8_t *A) {
    const int64_t E = m->E, R = offs[E], lda = ldab(kt), K = (int64_t)kt * 32;
    const int64_t H = m->H, I = m->I, ip = m->wt_ip;
#pragma omp for schedule(static) nowait
    for (int64_t rr = 0; rr < R; rr++) {
        const int64_t route = rroute[rr], e = ids[route];
        uint16_t *hi = hionly ? (uint16_t *)(A + (goff[e] * 32 + rr - offs[e]) * lda)
                              : row_at(A, lda, offs, goff, e, rr);
        uint16_t *lo = hionly ? NULL : (uint16_t *)((uint8_t *)hi + 16 * lda);
        const float *sc = m->wt_scale ? m->wt_scale + e * (H + 2 * I) : NULL;
        int64_t n = 0;
        if (!dx) {
            split_row(src0 + (route / m->k) * H, sc, H, hi, lo);
            n = H;
        } else {
            split_row(src0 + route * I, sc ? sc + H : NULL, I, hi, lo);
            split_row(src1 + route * I, sc ? sc + H + I : NULL, I, hi + ip, lo ? lo + ip : NULL);
            memset(hi + I, 0, (size_t)(ip - I) * 2);
            if (lo) memset(lo + I, 0, (size_t)(ip - I) * 2);
            n = ip + I;
        }
        memset(hi + n, 0, (size_t)(K - n) * 2);
        if (lo) memset(lo + n, 0, (size_t)(K - n) * 2);
    }
    /* rows of the experts' partial last groups */
#pragma omp for schedule(static)
    for (int64_t e = 0; e < E; e++) {
        const int64_t n = offs[e + 1] - offs[e];
        if (hionly) {
            const int64_t pad = (n + 31) / 32 * 32 - n;
            memset(A + (goff[e] * 32 + n) * lda, 0, (size_t)(pad * lda));
            continue;
        }
        for (int64_t j = n; j < (goff[e + 1] - goff[e]) * 16; j++) {
            uint8_t *hi = A + ((goff[e] + j / 16) * 32 + j % 16) * lda;
            memset(hi, 0, (size_t)lda);
            memset(hi + 16 * lda, 0, (size_t)lda);
        }
    }
}

static void run(const ompk_moe *m, const gemm *G, int hionly, const int64_t *offs,
                const int64_t *goff, const int32_t *rroute, const uint8_t *A, float *out,
                int64_t ldo, float *tb) {
    const int64_t E = m->E, lda = ldab(G->kt);
    const int np = G->nb / 2, nch = (np + MOE_BWD_STEPS - 1) / MOE_BWD_STEPS;
    float *ko = tb, *ko2 = ko + MOE_BWD_STEPS * 1024;
    uint8_t *scr = (uint8_t *)(ko2 + MOE_BWD_STEPS * 1024);
    const int64_t ps = (int64_t)G->kt * 1024; /* bytes of one 16-row block */
    int used_amx = 0;
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < E * nch; task++) {
        const int64_t e = task / nch, c = task % nch, n = offs[e + 1] - offs[e];
        if (n == 0) continue;
        const int kind = moe_pick_kernel(m, n);
        const int amx = kind == K_AMX || kind == K_AMX_EMU;
        used_amx |= kind == K_AMX;
        const int p0 = (int)c * MOE_BWD_STEPS;
        const int ns = np - p0 < MOE_BWD_STEPS ? np - p0 : MOE_BWD_STEPS;
        const uint8_t *w = G->w + G->wbytes * (size_t)e + (size_t)(2 * p0) * (size_t)ps;
        /* blocks of cm routes: a group of 16 (hi and lo rows), or 32 hi-only rows on AMX */
        const int cm = hionly && amx ? 32 : 16;
        for (int64_t r0 = 0; r0 < n; r0 += cm) {
            const int mr = (int)(n - r0 < cm ? n - r0 : cm);
            const uint8_t *ag = A + (hionly ? goff[e] * 32 + r0 : (goff[e] + r0 / 16) * 32) * lda;
            /* AMX: hi and lo rows in one 32-row call of at most MOE_NSTEPS n-steps; the others
             * one n-step at a time, hi and lo rows as separate calls of mr rows */
            const int sub = amx ? MOE_NSTEPS : 1;
            for (int j = 0; j < ns; j += sub)
                for (int half = 0; half < (amx || hionly ? 1 : 2); half++) {
                    moe_kargs ka;
                    memset(&ka, 0, sizeof ka);
                    ka.fmt = OMPK_MOE_BF16;
                    ka.m = amx ? 32 : mr;
                    ka.kt = G->kt;
                    ka.a = ag + half * 16 * lda;
                    ka.lda = lda;
                    ka.b[0] = w + (size_t)(2 * j) * (size_t)ps;
                    ka.b[1] = ka.b[0] + ps;
                    ka.bstride = 1024;
                    ka.out = (half ? ko2 : ko) + j * 1024;
                    ka.scratch = scr;
                    ka.nsteps = ns - j < sub ? ns - j : sub;
                    ka.nstride = 2 * ps;
                    moe_run_kernel(kind, &ka);
                }
            for (int j = 0; j < ns; j++)
                for (int s = 0; s < 2; s++) {
                    const int64_t n0 = (int64_t)(2 * (p0 + j) + s) * 16;
                    const int nw = (int)(G->N - n0 < 16 ? G->N - n0 : 16);
                    for (int r = 0; r < mr && nw > 0; r++) {
                        float *o = out + rroute[offs[e] + r0 + r] * ldo + n0;
                        const float *h = ko + j * 1024 + (s * 32 + r) * 16;
                        if (hionly) {
                            for (int q = 0; q < nw; q++) o[q] = h[q] + 0.0f;
                            continue;
                        }
                        const float *l = amx ? h + 256 : ko2 + j * 1024 + (s * 32 + r) * 16;
                        for (int q = 0; q < nw; q++) o[q] = h[q] + l[q];
                    }
                }
        }
    }
    if (used_amx) moe_amx_release();
}

void moe_bwd_gemm_dh(const ompk_moe *m, const float *dy, int dy_bf16, const int64_t *offs,
                     const int64_t *goff, const int32_t *rroute, const int32_t *ids, uint8_t *A,
                     float *q, float *tb) {
    const gemm G = {m->wt, m->wt_dn_bytes + m->wt_gu_bytes, m->wt_dn_kt, m->wt_dn_nb, m->I};
    const int hionly = m->grad_bf16 || (dy_bf16 && !m->wt_scale);
    split_all(m, 0, hionly, dy, NULL, offs, goff, rroute, ids, G.kt, A);
    run(m, &G, hionly, offs, goff, rroute, A, q, m->I, tb);
}

void moe_bwd_gemm_dx(const ompk_moe *m, const int64_t *offs, const int64_t *goff,
                     const int32_t *rroute, const int32_t *ids, const float *dg, const float *du,
                     uint8_t *A, float *o, float *tb) {
    const gemm G = {m->wt + m->wt_dn_bytes, m->wt_dn_bytes + m->wt_gu_bytes, m->wt_gu_kt,
                    m->wt_gu_nb, m->H};
    split_all(m, 1, m->grad_bf16, dg, du, offs, goff, rroute, ids, G.kt, A);
    run(m, &G, m->grad_bf16, offs, goff, rroute, A, o, m->H, tb);
}
