/* The backward's data-gradient GEMMs on the forward's tile kernels (bf16, int8 base), against the
 * transposed copies of moe_wt.c. Work item: (expert, chunk of MOE_NSTEPS 32-column n-steps);
 * the chunk's weights (at most 128 columns x K bf16) stay in L2 while the expert's routes pass
 * in blocks of 32 rows, each gathered and rounded to bf16 (the operand the tile instructions
 * take) into the thread's A block, zero-padded along K. The kernel is chosen per expert from
 * the routed row count of this backward. Every output element is written by one kernel call:
 * the results do not depend on the thread count. */
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

/* row r of the A blocks from route `route` (dh: dy of its token, dx: [dg | du]), split into
 * bf16 hi = bf16(v) and lo = bf16(v - hi) */
typedef void (*gather_fn)(const ompk_moe *m, const void *ctx, int64_t e, int64_t route,
                          uint16_t *hi, uint16_t *lo);

static void split(float v, uint16_t *hi, uint16_t *lo) {
    *hi = ompk_f32_to_bf16(v);
    *lo = ompk_f32_to_bf16(v - ompk_bf16_to_f32(*hi));
}

typedef struct dh_ctx {
    const float *dy;
} dh_ctx;

typedef struct dx_ctx {
    const float *dg, *du;
} dx_ctx;

/* int8: the weight row scales (per k here) multiply the activations */
static void gather_dh(const ompk_moe *m, const void *ctx, int64_t e, int64_t route, uint16_t *hi,
                      uint16_t *lo) {
    const float *y = ((const dh_ctx *)ctx)->dy + (route / m->k) * m->H;
    const float *sc = m->wt_scale ? m->wt_scale + e * (m->H + 2 * m->I) : NULL;
    for (int64_t h = 0; h < m->H; h++) split(sc ? y[h] * sc[h] : y[h], hi + h, lo + h);
}

static void gather_dx(const ompk_moe *m, const void *ctx, int64_t e, int64_t route, uint16_t *hi,
                      uint16_t *lo) {
    const dx_ctx *c = ctx;
    const float *g = c->dg + route * m->I, *u = c->du + route * m->I;
    const float *sg = m->wt_scale ? m->wt_scale + e * (m->H + 2 * m->I) + m->H : NULL;
    for (int64_t i = 0; i < m->I; i++) {
        split(sg ? g[i] * sg[i] : g[i], hi + i, lo + i);
        split(sg ? u[i] * sg[m->I + i] : u[i], hi + m->wt_ip + i, lo + m->wt_ip + i);
    }
}

static void run(const ompk_moe *m, const gemm *G, const int64_t *offs, const int32_t *rroute,
                gather_fn gat, const void *ctx, float *out, int64_t ldo, float *tb) {
    const int64_t E = m->E, K = (int64_t)G->kt * 32;
    const int nch = (G->nb / 2 + MOE_NSTEPS - 1) / MOE_NSTEPS;
    uint16_t *A = (uint16_t *)tb, *A2 = A + 32 * K;
    float *ko = tb + (size_t)K * 32, *ko2 = ko + MOE_NSTEPS * 1024;
    uint8_t *scr = (uint8_t *)(ko2 + MOE_NSTEPS * 1024);
    int used_amx = 0;
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < E * nch; task++) {
        const int64_t e = task / nch, c = task % nch, n = offs[e + 1] - offs[e];
        if (n == 0) continue;
        const int kind = moe_pick_kernel(m, n);
        used_amx |= kind == K_AMX;
        const int p0 = (int)c * MOE_NSTEPS, np = G->nb / 2;
        const int ns = np - p0 < MOE_NSTEPS ? np - p0 : MOE_NSTEPS;
        const uint8_t *w = G->w + G->wbytes * (size_t)e;
        const int64_t ps = (int64_t)G->kt * 1024; /* bytes of one 16-row block */
        /* the K-blocked AMX kernel takes all n-steps at once; the others one at a time */
        const int blk = kind == K_AMX || kind == K_AMX_EMU;
        for (int64_t r0 = 0; r0 < n; r0 += 32) {
            const int mr = (int)(n - r0 < 32 ? n - r0 : 32), rows = mr > 16 ? 32 : 16;
            memset(A, 0, (size_t)rows * (size_t)K * 2);
            memset(A2, 0, (size_t)rows * (size_t)K * 2);
            for (int r = 0; r < mr; r++)
                gat(m, ctx, e, rroute[offs[e] + r0 + r], A + r * K, A2 + r * K);
            for (int pass = 0; pass < 2; pass++)
                for (int j = 0; j < ns; j += blk ? ns : 1) {
                    moe_kargs ka;
                    memset(&ka, 0, sizeof ka);
                    ka.fmt = OMPK_MOE_BF16;
                    ka.m = mr;
                    ka.kt = G->kt;
                    ka.a = (const uint8_t *)(pass ? A2 : A);
                    ka.lda = K * 2;
                    ka.b[0] = w + (size_t)(2 * (p0 + j)) * (size_t)ps;
                    ka.b[1] = ka.b[0] + ps;
                    ka.bstride = 1024;
                    ka.out = (pass ? ko2 : ko) + j * 1024;
                    ka.scratch = scr;
                    ka.nsteps = blk ? ns : 1;
                    ka.nstride = 2 * ps;
                    moe_run_kernel(kind, &ka);
                }
            for (int j = 0; j < ns; j++)
                for (int s = 0; s < 2; s++) {
                    const int64_t n0 = (int64_t)(2 * (p0 + j) + s) * 16;
                    const int nw = (int)(G->N - n0 < 16 ? G->N - n0 : 16);
                    for (int r = 0; r < mr && nw > 0; r++) {
                        float *o = out + rroute[offs[e] + r0 + r] * ldo + n0;
                        const float *h = ko + j * 1024 + (s * 32 + r) * 16, *l = h + (ko2 - ko);
                        for (int q = 0; q < nw; q++) o[q] = h[q] + l[q];
                    }
                }
        }
    }
    if (used_amx) moe_amx_release();
}

void moe_bwd_gemm_dh(const ompk_moe *m, const float *dy, const int64_t *offs, const int32_t *rroute,
                     float *q, float *tb) {
    const gemm G = {m->wt, m->wt_dn_bytes + m->wt_gu_bytes, m->wt_dn_kt, m->wt_dn_nb, m->I};
    const dh_ctx c = {dy};
    run(m, &G, offs, rroute, gather_dh, &c, q, m->I, tb);
}

void moe_bwd_gemm_dx(const ompk_moe *m, const int64_t *offs, const int32_t *rroute, const float *dg,
                     const float *du, float *o, float *tb) {
    const gemm G = {m->wt + m->wt_dn_bytes, m->wt_dn_bytes + m->wt_gu_bytes, m->wt_gu_kt,
                    m->wt_gu_nb, m->H};
    const dx_ctx c = {dg, du};
    run(m, &G, offs, rroute, gather_dx, &c, o, m->H, tb);
}
