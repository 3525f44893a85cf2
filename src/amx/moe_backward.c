/* The MoE backward engine (docs/KERNELS.md section 3) on one saved entry. bf16 and int8 bases: the
 * data-gradient GEMMs (down^T dy, gate^T dg + up^T du) run on the tile kernels against transposed
 * packed copies (moe_wt.c, moe_bwd_gemm.c). int4: each work item dequantizes its weight block from
 * the packed tiles (moe_get_deq_tile) into a thread-local fp32 block serving W and W^T products
 * alike (group scales vary along both dimensions, so no scale folding reproduces them).
 *
 * Phases (one parallel region, barriers between):
 *  1. per route: a~ recomputed from the saved g, u (the forward's function; bf16: in phase 2,
 *     elementwise), B_d^T dy_t; tiles: then down^T dy for every route into dG.
 *  2. per (expert, 64-column chunk c of I): down^T dy, da (LoRA included), dg, du; the chunk's
 *     partial of dw; the I-dimension gradients of the chunk (dB_gate, dB_up rows, dA_down and
 *     dW_down columns, dW_gate, dW_up rows), written by their chunk only. Chunks never straddle
 *     a NUMA partition (partitions are 64-aligned), so chunk order is partition order.
 *  3. per route: B_g^T dg, B_u^T du over all of I (lane dots); tiles: then the base dx
 *     rows into dxr.
 *  4. per (expert, 64-column chunk of H): per-route dx (int4: base over all of I
 *     ascending; then the LoRA terms), dA_gate, dA_up columns, dB_down rows.
 *  5. per token: dx = sum over its slots in slot order, rounded once; dw = chunk partials in
 *     chunk order + s <B_d^T dy, A_d a~>.
 * Phases 2 and 4 take an expert's routes in groups of four, the group's LoRA gradient updates in
 * one pass over their rows (each element still adds its routes one by one, in order); the
 * per-route rank products of phases 1 and 3 take adjacent routes of one expert in pairs.
 * Every output element is produced by one thread in a fixed order: results are bit-identical
 * across runs, thread counts and NUMA splits. Routes of an expert are walked in token order.
 * Threads are not pinned per partition here (the forward pins them). */
#include <math.h>
#include <omp.h>
#include <string.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

/* moe_backward_v4.c compiles this file again for x86-64-v4 under other names */
#ifdef MOE_PASS_V4
#define moe_run_backward moe_run_backward_v4
#define moe_train_act moe_train_act_v4
#endif

#include "bf16.h"
#include "error.h"
#include "moe_internal.h"
#include "ref/moe_ref.h"

#define DW_BLK 512 /* floats of a full-weight gradient row kept in L1 over the routes */

static float x_at(const ompk_moe *m, const moe_entry *en, int64_t t, int64_t h) {
    if (m->fmt == OMPK_MOE_BF16) return ompk_bf16_to_f32(((const uint16_t *)en->xq)[t * m->H + h]);
    return (float)((const int8_t *)en->xq)[t * m->H + h] * en->xs[t];
}

#ifndef MOE_PASS_V4
/* <b, c> over r in order, compiled once (x86-64-v3) for both builds: GCC vectorises this in-order
 * sum with unfused products in whole vectors and fused ones in the remainder, a split that
 * depends on the vector width (so an x86-64-v4 copy would change the bits) */
__attribute__((noinline)) float moe_bwd_rank_dot(const float *b, const float *c, int r) {
    float l = 0.0f;
    for (int q = 0; q < r; q++) l += b[q] * c[q];
    return l;
}
#endif

/* out = M[e] va for route ra (r rows of n, expert e's block at M + e*es) and likewise for route rb
 * (-1: none); one pass over the rows where both routes have the same expert */
static void lora_dots_pair(const float *M, int64_t es, int64_t n, int r, const int32_t *ids,
                           int64_t ra, int64_t rb, const float *va, const float *vb, float *oa,
                           float *ob) {
    const int64_t ea = ids[ra];
    if (rb >= 0 && ids[rb] == ea) {
        moe_lane_dots2(M + ea * es, n, r, va, vb, n, oa, ob);
        return;
    }
    moe_lane_dots(M + ea * es, n, r, va, n, oa);
    if (rb >= 0) moe_lane_dots(M + ids[rb] * es, n, r, vb, n, ob);
}

/* x as consumed, f32, features h0..h0+n-1 of token t */
static void x_chunk(const ompk_moe *m, const moe_entry *en, int64_t t, int64_t h0, int64_t n,
                    float *out) {
    if (m->fmt == OMPK_MOE_BF16) {
        const uint16_t *q = (const uint16_t *)en->xq + t * m->H + h0;
        for (int64_t h = 0; h < n; h++) out[h] = ompk_bf16_to_f32(q[h]);
    } else {
        const int8_t *q = (const int8_t *)en->xq + t * m->H + h0;
        for (int64_t h = 0; h < n; h++) out[h] = (float)q[h] * en->xs[t];
    }
}

/* Dequantized down block of one work item, tile by tile: wd[h][ii] = down[e][h][i0+ii] for the
 * 64-column chunk i0 of I */
static void deq_chunk_i(const ompk_moe *m, int64_t e, int64_t i0, int cw, float *wd) {
    const int64_t H = m->H, kte = m->kte;
    for (int64_t n0 = 0; n0 < H; n0 += 16)
        for (int64_t k0 = i0; k0 < i0 + cw; k0 += kte)
            moe_get_deq_tile(m, 2, e, n0, k0, (int)(H - n0 < 16 ? H - n0 : 16),
                             (int)(i0 + cw - k0 < kte ? i0 + cw - k0 : kte),
                             wd + n0 * 64 + (k0 - i0), 64);
}

/* wg/wu[i][hh] = gate/up[e][i][h0+hh] for the 64-column chunk h0 of H, all of I */
static void deq_chunk_h(const ompk_moe *m, int64_t e, int64_t h0, int hw, float *wg, float *wu) {
    const int64_t I = m->I, kte = m->kte;
    float tmp[16 * 64];
    for (int64_t n0 = 0; n0 < I; n0 += 16)
        for (int64_t k0 = h0 - h0 % kte; k0 < h0 + hw; k0 += kte) {
            const int nr = (int)(I - n0 < 16 ? I - n0 : 16);
            const int64_t lo = k0 > h0 ? k0 : h0, hi = k0 + kte < h0 + hw ? k0 + kte : h0 + hw;
            for (int w = 0; w < 2; w++) {
                moe_get_deq_tile(m, w, e, n0, k0, nr, (int)(hi - k0), tmp, 64);
                for (int nn = 0; nn < nr; nn++)
                    memcpy((w ? wu : wg) + (n0 + nn) * 64 + (lo - h0), tmp + nn * 64 + (lo - k0),
                           (size_t)(hi - lo) * 4);
            }
        }
}

/* o[i*r + q] += (sc * v[b][i]) * c[b][q] for i < n, q < r, routes b = 0..nb-1 in order: the LoRA
 * B gradient of a route group, the product rounded as the expression s * v * c rounds it, each
 * element loaded and stored once, vectorised over q in fixed widths (any rank) */
static void rank1_rows_g(float *restrict o, int64_t n, int r, const float *const *v, float sc,
                         const float *const *c, int nb) {
    for (int64_t i = 0; i < n; i++) {
        float t[4];
        for (int b = 0; b < nb; b++) t[b] = sc * v[b][i];
        float *restrict oi = o + i * r;
        int q = 0;
        if (nb == 4) /* straight-line bodies of a fixed width: vectorised at any rank */
            for (; q + 8 <= r; q += 8)
                for (int j = 0; j < 8; j++) {
                    float a = oi[q + j];
                    a += t[0] * c[0][q + j];
                    a += t[1] * c[1][q + j];
                    a += t[2] * c[2][q + j];
                    a += t[3] * c[3][q + j];
                    oi[q + j] = a;
                }
        for (; q + 8 <= r; q += 8)
            for (int b = 0; b < nb; b++)
                for (int j = 0; j < 8; j++) oi[q + j] += t[b] * c[b][q + j];
        for (; q < r; q++) {
            float a = oi[q];
            for (int b = 0; b < nb; b++) a += t[b] * c[b][q];
            oi[q] = a;
        }
    }
}

#if defined(__AVX512F__)
/* rank1_routes for r a multiple of 8 (x86-64-v4 pass): a block of 32 rows x 8 ranks stays in 16
 * registers over all the routes, each element's FMAs in route order as rank1_rows_g does them */
static void rank1_routes_zmm(float *restrict o, int64_t n, int r, const int32_t *rt, int64_t nr,
                             const float *vb, int64_t vs, int vdiv, const float *pre, float sc,
                             const float *cb, int64_t cs) {
    const __m512 vsc = _mm512_set1_ps(sc);
    float buf[16][16] __attribute__((aligned(64)));
    for (int64_t i0 = 0; i0 < n; i0 += 32) {
        const int nrow = (int)(n - i0 < 32 ? n - i0 : 32);
        const __mmask16 m0 = nrow >= 16 ? 0xffff : (__mmask16)((1u << nrow) - 1);
        const __mmask16 m1 = nrow >= 32  ? 0xffff
                             : nrow > 16 ? (__mmask16)((1u << (nrow - 16)) - 1)
                                         : 0;
        for (int q0 = 0; q0 < r; q0 += 8) {
            /* buf[h * 8 + q][i]: rank q0 + q of row i0 + 16 h + i */
            memset(buf, 0, sizeof buf);
            for (int i = 0; i < nrow; i++)
                for (int q = 0; q < 8; q++)
                    buf[(i >> 4) * 8 + q][i & 15] = o[(i0 + i) * r + q0 + q];
            __m512 a[16];
            for (int q = 0; q < 16; q++) a[q] = _mm512_load_ps(buf[q]);
            for (int64_t j = 0; j < nr; j++) {
                const int64_t route = rt[j];
                const float *v = vb + (route / vdiv) * vs + i0, *c = cb + route * cs + q0;
                __m512 t0 = _mm512_maskz_loadu_ps(m0, v), t1 = _mm512_maskz_loadu_ps(m1, v + 16);
                if (pre) {
                    const __m512 w = _mm512_set1_ps(pre[route]);
                    t0 = _mm512_mul_ps(w, t0);
                    t1 = _mm512_mul_ps(w, t1);
                }
                t0 = _mm512_mul_ps(vsc, t0);
                t1 = _mm512_mul_ps(vsc, t1);
                for (int q = 0; q < 8; q++) {
                    const __m512 cq = _mm512_set1_ps(c[q]);
                    a[q] = _mm512_fmadd_ps(t0, cq, a[q]);
                    a[8 + q] = _mm512_fmadd_ps(t1, cq, a[8 + q]);
                }
            }
            for (int q = 0; q < 16; q++) _mm512_store_ps(buf[q], a[q]);
            for (int i = 0; i < nrow; i++)
                for (int q = 0; q < 8; q++)
                    o[(i0 + i) * r + q0 + q] = buf[(i >> 4) * 8 + q][i & 15];
        }
    }
}
#endif

/* o[i*r + q] += (sc * v_j[i]) * c_j[q] for i < n (at most 64), q < r over the nr routes rt[j] in
 * order: v_j = vb + (rt[j] / vdiv) * vs, times pre[rt[j]] first when pre is set; c_j = cb +
 * rt[j] * cs. The LoRA B gradient of one chunk from all routes of its expert. */
static void rank1_routes(float *restrict o, int64_t n, int r, const int32_t *rt, int64_t nr,
                         const float *vb, int64_t vs, int vdiv, const float *pre, float sc,
                         const float *cb, int64_t cs) {
#if defined(__AVX512F__)
    if (r % 8 == 0) {
        rank1_routes_zmm(o, n, r, rt, nr, vb, vs, vdiv, pre, sc, cb, cs);
        return;
    }
#endif
    float pv[4][64];
    for (int64_t j0 = 0; j0 < nr; j0 += 4) {
        const int nb = (int)(nr - j0 < 4 ? nr - j0 : 4);
        const float *v[4], *c[4];
        for (int b = 0; b < nb; b++) {
            const int64_t route = rt[j0 + b];
            v[b] = vb + (route / vdiv) * vs;
            c[b] = cb + route * cs;
            if (pre) {
                for (int64_t i = 0; i < n; i++) pv[b][i] = pre[route] * v[b][i];
                v[b] = pv[b];
            }
        }
        rank1_rows_g(o, n, r, v, sc, c, nb);
    }
}

/* o[i] += coef[b] * x[b][i] for b = 0..nb-1 in order (the LoRA A gradient rows of nb routes) */
static void axpy_g(float *restrict o, int64_t n, const float *coef, const float *const *x, int nb) {
    if (nb == 4) { /* a straight-line body: the loop over i vectorises */
        const float c0 = coef[0], c1 = coef[1], c2 = coef[2], c3 = coef[3];
        const float *restrict x0 = x[0], *restrict x1 = x[1], *restrict x2 = x[2],
                              *restrict x3 = x[3];
        for (int64_t i = 0; i < n; i++) {
            float a = o[i];
            a += c0 * x0[i];
            a += c1 * x1[i];
            a += c2 * x2[i];
            a += c3 * x3[i];
            o[i] = a;
        }
        return;
    }
    for (int b = 0; b < nb; b++) {
        const float cb = coef[b], *restrict xb = x[b];
        for (int64_t i = 0; i < n; i++) o[i] += cb * xb[i];
    }
}

/* the dropout keep factors of features f0..f0+n-1 (1 without dropout, filled without hashing) */
static void keep_fill(float *k, uint64_t seed, int proj, int64_t t, int64_t f0, int64_t n,
                      float drop) {
    if (!(drop > 0.0f)) {
        for (int64_t i = 0; i < n; i++) k[i] = 1.0f;
        return;
    }
    for (int64_t i = 0; i < n; i++) k[i] = ompk_moe_lora_keep(seed, proj, t, f0 + i, drop);
}

/* ex = moe_expf(-g) of a chunk; ar (may be NULL) = bf16 a~ as moe_train_act rounds it */
static void exp_act_chunk(int64_t n, const float *restrict g, const float *restrict u,
                          float *restrict ex, float *restrict ar) {
    for (int64_t i = 0; i < n; i++) ex[i] = moe_expf(-g[i]);
    if (ar)
        for (int64_t i = 0; i < n; i++) ar[i] = ompk_round_bf16(moe_silu_mul(g[i], ex[i], u[i]));
}

/* dg, du of a chunk from q = down^T dy, the LoRA term tq with its keep factors (0 without LoRA)
 * and ex = e^-g (KERNELS.md section 3) */
static void dgdu_chunk(int64_t n, float wt, float s, const float *restrict q,
                       const float *restrict keep, const float *restrict tq,
                       const float *restrict ex, const float *restrict g, const float *restrict u,
                       float *restrict dg, float *restrict du) {
    for (int64_t i = 0; i < n; i++) {
        const float da = wt * (q[i] + s * keep[i] * tq[i]);
        const float sg = 1.0f / (1.0f + ex[i]);
        dg[i] = da * u[i] * sg * (1.0f + g[i] * (1.0f - sg));
        du[i] = da * g[i] * sg;
    }
}

/* the 64-float chunk at p (two lines beyond 128 bytes) towards L1 */
static inline void pf_chunk(const void *p, int bytes) {
    for (int o = 0; o < bytes; o += 64) __builtin_prefetch((const char *)p + o);
}

static float *gdata(const ompk_tensor *t) {
    return t ? (float *)t->data : NULL;
}

ompk_status moe_run_backward(ompk_moe *m, const moe_entry *en, const float *dy, int dy_bf16,
                             void *dxd, int64_t dxs, float *dw, const ompk_moe_grads *gr) {
    const int64_t E = m->E, H = m->H, I = m->I, T = en->T, rm = m->rmax;
    const int k = m->k, r = en->r, acc = gr->accumulate;
    const float s = m->lora.s, drop = m->lora.dropout;
    const uint64_t seed = m->lora.seed;
    const int64_t nch = (I + 63) / 64, nhc = (H + 63) / 64;
#if !defined(MOE_PASS_V4) && defined(__x86_64__) && !defined(OMPK_MOE_NO_V4)
    if (moe_cpu_has_avx512()) return moe_run_backward_v4(m, en, dy, dy_bf16, dxd, dxs, dw, gr);
#endif
    int64_t *offs = TBUF(m, TB_EOFFS, int64_t), *goff = TBUF(m, TB_GOFFS, int64_t);
    uint8_t *split = TBUF(m, TB_ZP, uint8_t);
    int32_t *rroute = TBUF(m, TB_RROUTE, int32_t);
    int64_t *cur = (int64_t *)(m->arena + m->off[MB_CURSOR]);
    float *at = TBUF(m, TB_AT, float), *dG = TBUF(m, TB_DG, float), *dU = TBUF(m, TB_DU, float);
    float *dxr = TBUF(m, TB_DXR, float), *dwp = TBUF(m, TB_DWP, float);
    float *bv = TBUF(m, TB_BV, float), *tdeq = TBUF(m, TB_TDEQ, float);
    float *dA[3] = {gdata(gr->gate_da), gdata(gr->up_da), gdata(gr->down_da)};
    float *dB[3] = {gdata(gr->gate_db), gdata(gr->up_db), gdata(gr->down_db)};
    float *dW[3] = {gdata(gr->gate_dw), gdata(gr->up_dw), gdata(gr->down_dw)};
    const int64_t in[3] = {H, H, I}, out[3] = {I, I, H};

    for (int64_t e = 0; e <= E; e++) offs[e] = 0;
    for (int64_t i = 0; i < T * k; i++)
        if (en->ids[i] >= 0) offs[en->ids[i] + 1]++;
    for (int64_t e = 0; e < E; e++) {
        offs[e + 1] += offs[e];
        cur[e] = offs[e];
    }
    const int64_t R = offs[E];
    for (int64_t t = 0; t < T; t++)
        for (int j = 0; j < k; j++)
            if (en->ids[t * k + j] >= 0) rroute[cur[en->ids[t * k + j]]++] = (int32_t)(t * k + j);
    /* bf16, int8 base: the data-gradient GEMMs run on the tile kernels against transposed
     * copies */
    const int tiles = m->fmt == OMPK_MOE_BF16 || m->fmt == OMPK_MOE_INT8;
    if (tiles) {
        const ompk_status st = moe_wt_build(m);
        if (st != OMPK_OK) return st;
        moe_wt_group_offsets(m, offs, goff);
    }
    if (r) moe_lora_stage(m, offs);
    const float *la[3] = {NULL, NULL, NULL}, *lb[3] = {NULL, NULL, NULL};
    for (int p = 0; p < 3 && r; p++) {
        la[p] = moe_lw(m, 0, p);
        lb[p] = moe_lw(m, 1, p);
    }

    double tm[6];
    tm[0] = omp_get_wtime();
#pragma omp parallel num_threads(m->threads)
    {
        float *tb = tdeq + (size_t)omp_get_thread_num() * m->tdeq_floats;
        /* "=": experts no token reached get 0 */
        if (!acc) {
#pragma omp for schedule(static)
            for (int64_t e = 0; e < E; e++) {
                if (offs[e + 1] > offs[e]) continue;
                for (int p = 0; p < 3; p++) {
                    if (dA[p]) memset(dA[p] + e * r * in[p], 0, (size_t)(r * in[p]) * 4);
                    if (dB[p]) memset(dB[p] + e * out[p] * r, 0, (size_t)(out[p] * r) * 4);
                    if (dW[p]) memset(dW[p] + e * out[p] * in[p], 0, (size_t)(out[p] * in[p]) * 4);
                }
            }
        }
        /* 1: a~ and B_d^T dy per route */
#pragma omp for schedule(static)
        for (int64_t rp = 0; rp < (R + 1) / 2; rp++) { /* pairs of adjacent routes */
            const int64_t rr0 = 2 * rp, nr = rr0 + 1 < R ? 2 : 1;
            for (int64_t rr = rr0; rr < rr0 + nr; rr++) {
                const int64_t route = rroute[rr], t = route / k;
                float sc;
                /* bf16: a~ is elementwise and is made in phase 2, where the sigmoid reuses
                 * moe_expf(-g) */
                if (m->fmt != OMPK_MOE_BF16)
                    moe_train_act(m, en->g + route * I, en->u + route * I, at + route * I,
                                  (uint8_t *)tb, &sc);
                /* x as consumed, f32, for the full-weight gradients (the per-route dx rows of
                 * phase 4 reuse the buffer) */
                if (dW[0] || dW[1])
                    for (int64_t h = 0; h < H; h++) dxr[route * H + h] = x_at(m, en, t, h);
            }
            if (r) {
                const int64_t ra = rroute[rr0], rb = nr > 1 ? rroute[rr0 + 1] : -1;
                lora_dots_pair(lb[2], r * H, H, r, en->ids, ra, rb, dy + (ra / k) * H,
                               rb >= 0 ? dy + (rb / k) * H : NULL, bv + (ra * 3 + 2) * rm,
                               rb >= 0 ? bv + (rb * 3 + 2) * rm : NULL);
            }
        }
        /* down^T dy per route into dG (phase 2 reads it before writing dg there) */
        if (tiles) moe_bwd_gemm_dh(m, dy, dy_bf16, offs, goff, rroute, en->ids, split, dG, tb);
        /* 2: per (expert, chunk of I) */
#pragma omp master
        tm[1] = omp_get_wtime();
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < E * nch; task++) {
            const int64_t e = task / nch, c = task % nch, i0 = c * 64;
            const int64_t cw = I - i0 < 64 ? I - i0 : 64;
            if (offs[e + 1] == offs[e]) continue;
            float *wd = tb, *q4 = tb + 64 * H, *ex4 = q4 + 256, *ar4 = ex4 + 256;
            float *tq = ar4 + 256, *km4 = tq + 64, *zero64 = km4 + 256, *cfa = zero64 + 64;
            for (int ii = 0; ii < 64; ii++) zero64[ii] = 0.0f;
            if (!tiles) deq_chunk_i(m, e, i0, (int)cw, wd);
            if (!acc) {
                for (int p = 0; p < 3; p++) {
                    if (p < 2 && dB[p]) memset(dB[p] + (e * I + i0) * r, 0, (size_t)(cw * r) * 4);
                    if (p < 2 && dW[p]) memset(dW[p] + (e * I + i0) * H, 0, (size_t)(cw * H) * 4);
                }
                for (int qq = 0; qq < r && dA[2]; qq++)
                    memset(dA[2] + (e * r + qq) * I + i0, 0, (size_t)cw * 4);
                for (int64_t h = 0; h < H && dW[2]; h++)
                    memset(dW[2] + (e * H + h) * I + i0, 0, (size_t)cw * 4);
            }
            /* routes in groups of four: the four dw chunk dots run as independent chains */
            const int keep_at = m->fmt != OMPK_MOE_BF16 || dW[2]; /* a~ needed past the route */
            for (int64_t rg = offs[e]; rg < offs[e + 1]; rg += 4) {
                const int nr = (int)(offs[e + 1] - rg < 4 ? offs[e + 1] - rg : 4);
                const float *qv[4], *av[4];
                for (int64_t rn = rg + 4; rn < rg + 8 && rn < offs[e + 1]; rn++) {
                    const int64_t rt = rroute[rn] * I + i0; /* the next group's rows */
                    pf_chunk(en->g + rt, (int)cw * 4);
                    pf_chunk(en->u + rt, (int)cw * 4);
                    pf_chunk(dG + rt, (int)cw * 4);
                }
                for (int b = 0; b < 4; b++) {
                    qv[b] = av[b] = zero64;
                    if (b >= nr) continue;
                    const int64_t route = rroute[rg + b];
                    const float *g = en->g + route * I + i0, *u = en->u + route * I + i0;
                    float *ex = ex4 + b * 64, *q = q4 + b * 64;
                    /* moe_expf(-g) of the chunk, once for the sigmoid and (bf16) a~, rounded as
                     * moe_train_act rounds it */
                    float *ar = keep_at ? at + route * I + i0 : ar4 + b * 64;
                    exp_act_chunk(cw, g, u, ex, m->fmt == OMPK_MOE_BF16 ? ar : NULL);
                    if (tiles) {
                        memcpy(q, dG + route * I + i0, (size_t)cw * 4);
                    } else {
                        const float *dyt = dy + (route / k) * H;
                        for (int64_t ii = 0; ii < 64; ii++) q[ii] = 0.0f;
                        for (int64_t h = 0; h < H; h++)
                            for (int64_t ii = 0; ii < cw; ii++) q[ii] += wd[h * 64 + ii] * dyt[h];
                    }
                    qv[b] = q;
                    av[b] = ar;
                }
                float d0 = 0.0f, d1 = 0.0f, d2 = 0.0f, d3 = 0.0f;
                for (int64_t ii = 0; ii < cw; ii++) {
                    d0 += qv[0][ii] * av[0][ii];
                    d1 += qv[1][ii] * av[1][ii];
                    d2 += qv[2][ii] * av[2][ii];
                    d3 += qv[3][ii] * av[3][ii];
                }
                const float dd[4] = {d0, d1, d2, d3};
                const float *akm[4];
                for (int b = 0; b < nr; b++) {
                    const int64_t route = rroute[rg + b], t = route / k;
                    const float wt = en->w[route], *q = qv[b], *ar = av[b], *ex = ex4 + b * 64;
                    const float *g = en->g + route * I + i0, *u = en->u + route * I + i0;
                    const float *bq = bv + (route * 3 + 2) * rm;
                    float *km = km4 + b * 64;
                    dwp[route * nch + c] = dd[b];
                    for (int64_t ii = 0; ii < cw; ii++) tq[ii] = 0.0f;
                    if (r) {
                        const float *A = la[2] + e * r * I;
                        moe_axpy_rows(tq, A + i0, I, r, bq, cw);
                        keep_fill(km, seed, 2, t, i0, cw, drop);
                    }
                    float *dgr = dG + route * I + i0, *dur = dU + route * I + i0;
                    dgdu_chunk(cw, wt, s, q, r ? km : zero64, tq, ex, g, u, dgr, dur);
                    /* the masked a~ of dA_down (the mask is 1 without dropout) */
                    if (r && drop > 0.0f)
                        for (int64_t ii = 0; ii < cw; ii++) km[ii] = ar[ii] * km[ii];
                    akm[b] = drop > 0.0f ? km : ar;
                    for (int qq = 0; qq < r; qq++) cfa[qq * 4 + b] = s * wt * bq[qq];
                }
                /* the group's dA_down, each element's sum over the routes in order */
                for (int qq = 0; qq < r && dA[2]; qq++)
                    axpy_g(dA[2] + (e * r + qq) * I + i0, cw, cfa + qq * 4, akm, nr);
            }
            /* dB_gate, dB_up rows of the chunk from the dg, du rows just written (in L2) */
            const int32_t *re = rroute + offs[e];
            const int64_t ne = offs[e + 1] - offs[e];
            if (r && dB[0])
                rank1_routes(dB[0] + (e * I + i0) * r, cw, r, re, ne, dG + i0, I, 1, NULL, s,
                             en->lx, 3 * rm);
            if (r && dB[1])
                rank1_routes(dB[1] + (e * I + i0) * r, cw, r, re, ne, dU + i0, I, 1, NULL, s,
                             en->lx + rm, 3 * rm);
            /* full-weight gradients as GEMMs with the routes as K: an output block stays in
             * cache over all routes (each element still sums its routes in token order) */
            for (int p = 0; p < 2; p++) {
                if (!dW[p]) continue;
                const float *dsrc = p ? dU : dG;
                for (int64_t ii = 0; ii < cw; ii++)
                    for (int64_t h0 = 0; h0 < H; h0 += DW_BLK) {
                        const int64_t hw = H - h0 < DW_BLK ? H - h0 : DW_BLK;
                        float *o = dW[p] + (e * I + i0 + ii) * H + h0;
                        for (int64_t rr = offs[e]; rr < offs[e + 1]; rr++) {
                            const int64_t route = rroute[rr];
                            const float d = dsrc[route * I + i0 + ii], *xr = dxr + route * H + h0;
                            for (int64_t hh = 0; hh < hw; hh++) o[hh] += d * xr[hh];
                        }
                    }
            }
            if (dW[2])
                for (int64_t h = 0; h < H; h++) {
                    float *o = dW[2] + (e * H + h) * I + i0;
                    for (int64_t rr = offs[e]; rr < offs[e + 1]; rr++) {
                        const int64_t route = rroute[rr];
                        const float gy = en->w[route] * dy[(route / k) * H + h];
                        const float *ar = at + route * I + i0;
                        for (int64_t ii = 0; ii < cw; ii++) o[ii] += gy * ar[ii];
                    }
                }
        }
        /* 3: B_g^T dg, B_u^T du per route over all of I */
#pragma omp master
        tm[2] = omp_get_wtime();
#pragma omp for schedule(static)
        for (int64_t rp = 0; rp < (R + 1) / 2; rp++) { /* pairs of adjacent routes */
            if (!r) continue;
            const int64_t ra = rroute[2 * rp], rb = 2 * rp + 1 < R ? rroute[2 * rp + 1] : -1;
            for (int p = 0; p < 2; p++) {
                const float *dv = p ? dU : dG;
                lora_dots_pair(lb[p], r * I, I, r, en->ids, ra, rb, dv + ra * I,
                               rb >= 0 ? dv + rb * I : NULL, bv + (ra * 3 + p) * rm,
                               rb >= 0 ? bv + (rb * 3 + p) * rm : NULL);
            }
        }
        /* base part of the per-route dx rows (phase 2 is done with x in dxr) */
        if (tiles) moe_bwd_gemm_dx(m, offs, goff, rroute, en->ids, dG, dU, split, dxr, tb);
        /* 4: per (expert, chunk of H) */
#pragma omp master
        tm[3] = omp_get_wtime();
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < E * nhc; task++) {
            const int64_t e = task / nhc, h0 = (task % nhc) * 64;
            const int64_t hw = H - h0 < 64 ? H - h0 : 64;
            if (offs[e + 1] == offs[e] || (tiles && !r)) continue;
            float *wg = tb, *wu = tb + 64 * I, *xv = wu + 64 * I;
            /* per route of a group: x~ masked per projection; the dA coefficients [2][r][4] */
            float *xk4 = xv + 512, *cf[2] = {xk4 + 512, xk4 + 512 + 4 * r};
            if (!tiles) deq_chunk_h(m, e, h0, (int)hw, wg, wu);
            if (!acc) {
                for (int p = 0; p < 2 && r; p++)
                    for (int qq = 0; qq < r && dA[p]; qq++)
                        memset(dA[p] + (e * r + qq) * H + h0, 0, (size_t)hw * 4);
                if (r && dB[2]) memset(dB[2] + (e * H + h0) * r, 0, (size_t)(hw * r) * 4);
            }
            /* routes in groups of four: the LoRA gradients of a group in one pass over their
             * rows */
            for (int64_t rg = offs[e]; rg < offs[e + 1]; rg += 4) {
                const int nr = (int)(offs[e + 1] - rg < 4 ? offs[e + 1] - rg : 4);
                const float *xkv[2][4];
                for (int b = 0; b < nr; b++) {
                    const int64_t rr = rg + b, route = rroute[rr], t = route / k;
                    const float *dgr = dG + route * I, *dur = dU + route * I;
                    float *o = dxr + route * H + h0;
                    if (rr + 2 < offs[e + 1]) { /* the route after next: dx, dy and x chunks */
                        const int64_t rn = rroute[rr + 2], tn = rn / k;
                        pf_chunk(dxr + rn * H + h0, (int)hw * 4);
                        pf_chunk(dy + tn * H + h0, (int)hw * 4);
                        pf_chunk(en->xq + (size_t)(tn * H + h0) * (m->fmt == OMPK_MOE_BF16 ? 2 : 1),
                                 (int)hw * 2);
                    }
                    if (tiles) {
                        memcpy(xv, o, (size_t)hw * 4);
                    } else {
                        for (int64_t hh = 0; hh < hw; hh++) xv[hh] = 0.0f;
                        for (int64_t i = 0; i < I; i++)
                            for (int64_t hh = 0; hh < hw; hh++)
                                xv[hh] += wg[i * 64 + hh] * dgr[i] + wu[i * 64 + hh] * dur[i];
                    }
                    /* rank-outer loops over contiguous h: each element's sums keep their order */
                    float *av = xv + 64, *kp = av + 64, *xf = kp + 64 + b * 64;
                    if (r) x_chunk(m, en, t, h0, hw, xf);
                    for (int p = 0; p < 2 && r; p++) {
                        const float *A = la[p] + e * r * H, *bb = bv + (route * 3 + p) * rm;
                        float *xk = xk4 + (p * 4 + b) * 64;
                        for (int64_t hh = 0; hh < hw; hh++) av[hh] = 0.0f;
                        keep_fill(kp, seed, p, t, h0, hw, drop);
                        for (int64_t hh = 0; hh < hw; hh++) xk[hh] = xf[hh] * kp[hh];
                        moe_axpy_rows(av, A + h0, H, r, bb, hw);
                        for (int64_t hh = 0; hh < hw; hh++) xv[hh] += s * kp[hh] * av[hh];
                        xkv[p][b] = xk;
                        for (int qq = 0; qq < r; qq++) cf[p][qq * 4 + b] = s * bb[qq];
                    }
                    for (int64_t hh = 0; hh < hw; hh++) o[hh] = xv[hh];
                }
                /* the group's dA_gate, dA_up, each element's sum over the routes in order */
                for (int p = 0; p < 2 && r; p++)
                    for (int qq = 0; qq < r && dA[p]; qq++)
                        axpy_g(dA[p] + (e * r + qq) * H + h0, hw, cf[p] + qq * 4, xkv[p], nr);
            }
            /* dB_down rows of the chunk: gy = w dy per route */
            if (r && dB[2])
                rank1_routes(dB[2] + (e * H + h0) * r, hw, r, rroute + offs[e],
                             offs[e + 1] - offs[e], dy + h0, H, k, en->w, s, en->lx + 2 * rm,
                             3 * rm);
        }
        /* 5: per token */
#pragma omp master
        tm[4] = omp_get_wtime();
#pragma omp for schedule(static)
        for (int64_t t = 0; t < T; t++) {
            uint8_t *row = (uint8_t *)dxd + (size_t)(t * dxs) * (en->xdt == OMPK_BF16 ? 2 : 4);
            /* one vectorisable pass per slot, each element's sum in slot order */
            float *dxa = tb;
            for (int64_t h = 0; h < H; h++) dxa[h] = 0.0f;
            for (int j = 0; j < k; j++) {
                if (en->ids[t * k + j] < 0) continue;
                const float *src = dxr + (t * k + j) * H;
                for (int64_t h = 0; h < H; h++) dxa[h] += src[h];
            }
            for (int64_t h = 0; h < H; h++) ompk_store_f(row, h, dxa[h], en->xdt == OMPK_BF16);
            for (int j = 0; j < k && dw; j++) {
                const int64_t route = t * k + j;
                if (en->ids[route] < 0) {
                    dw[route] = 0.0f;
                    continue;
                }
                float a = 0.0f;
                for (int64_t c = 0; c < nch; c++) a += dwp[route * nch + c];
                if (r) {
                    const float *bq = bv + (route * 3 + 2) * rm, *lx = en->lx + route * 3 * rm;
                    a += s * moe_bwd_rank_dot(bq, lx + 2 * rm, r);
                }
                dw[route] = a;
            }
        }
    }
    tm[5] = omp_get_wtime();
    for (int i = 0; i < 5; i++) m->stats.phase_ms[i] = (tm[i + 1] - tm[i]) * 1e3;
    m->stats.fork_ms = 0.0;
    return OMPK_OK;
}
