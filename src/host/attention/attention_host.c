/* Host attention for bf16 on AVX-512 BF16 CPUs (the portable kernel stays the fallback and the
 * GPU kernel): the same flash schedule as src/target/attention/attention_portable.c, written for
 * the vdpbf16ps dot product, which does two bf16 products per f32 lane at twice the FMA rate.
 *
 * Layout: 16 query rows (forward, dq) or 16 keys (dk/dv) sit in the 16 lanes of a vector, with
 * their bf16 values transposed once per block as pairs along the head dim (xT[p][lane] =
 * x[lane][2p] | x[lane][2p+1] << 16). A score column over the 16 lanes is then dh/2 vdpbf16ps
 * with a 32-bit broadcast of the other operand's raw bf16 row: no conversion in the inner loop.
 * The second product of each step (P V, dS K, P^T dO, dS^T Q) sums over keys or rows, so its
 * pairs run along that axis: the probabilities are rounded to bf16 pairwise (as on tensor
 * cores) and the tile of the other operand is interleaved row pair by row pair once per tile.
 * Softmax statistics are lane-wise in f32, exp2 is a polynomial with vscalefps.
 * The backward is deterministic: each work item owns its output rows and sums in a fixed order. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"
#include "cpu.h"
#include "target/attention/attention_kernels.h"

#if defined(__x86_64__)
#include "attention_x86.h"

enum { ATH_L = 16, ATH_BK = 64, ATH_DMAX = 256 };

ATH_INLINE __m512 ath_dp(__m512 acc, __m512i a, __m512i b) {
    return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}

ATH_INLINE __m512i ath_bcast_pair(const ath_bf *p) {
    uint32_t u;
    memcpy(&u, p, 4);
    return _mm512_set1_epi32((int)u);
}

/* Lane l of the result = bf16(a[l]) | bf16(b[l]) << 16 (round to nearest even). */
ATH_INLINE __m512i ath_pack_pair(__m512 a, __m512 b) {
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24,
                                         8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    __m512i ab = (__m512i)_mm512_cvtne2ps_pbh(b, a); /* a in elements 0..15, b in 16..31 */
    return _mm512_permutexvar_epi16(idx, ab);
}

/* xT[p][l] = pair p of row (r0 + l), lanes from n on zero. */
ATH_INLINE void ath_stage_T(uint32_t (*restrict xT)[ATH_L], const ath_bf *src, int64_t rs,
                            int64_t r0, int n, const int DH) {
    for (int l = 0; l < ATH_L; l++) {
        const ath_bf *row = src + (r0 + (l < n ? l : 0)) * rs;
        for (int p = 0; p < DH / 2; p++) {
            uint32_t u = 0;
            if (l < n) memcpy(&u, row + 2 * p, 4);
            xT[p][l] = u;
        }
    }
}

/* dst[tp][d] = row(r0 + 2tp)[d] | row(r0 + 2tp + 1)[d] << 16 for tp < (n + 1) / 2, rows from n
 * on zero (so a zero weight never meets a stray Inf/NaN). */
ATH_INLINE void ath_stage_pairs(uint32_t (*restrict dst)[ATH_DMAX], const ath_bf *src, int64_t rs,
                                int64_t r0, int n, const int DH) {
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24,
                                         8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (int tp = 0; tp < (n + 1) / 2; tp++) {
        const ath_bf *a = src + (r0 + 2 * tp) * rs, *b = a + rs;
        const int hasb = 2 * tp + 1 < n;
        for (int d = 0; d < DH; d += 16) {
            __m256i va = _mm256_loadu_si256((const __m256i *)(a + d));
            __m256i vb =
                hasb ? _mm256_loadu_si256((const __m256i *)(b + d)) : _mm256_setzero_si256();
            __m512i ab = _mm512_inserti64x4(_mm512_castsi256_si512(va), vb, 1);
            _mm512_storeu_si512(&dst[tp][d], _mm512_permutexvar_epi16(idx, ab));
        }
    }
}

/* acc[d][l] += sum_tp w[tp][l] . rows[tp][d] (pairs), 16 d at a time in registers. */
ATH_INLINE void ath_accum(float (*restrict acc)[ATH_L], const __m512i *restrict w,
                          const uint32_t (*restrict rows)[ATH_DMAX], int np, const int DH) {
    for (int d = 0; d < DH; d += 16) {
        __m512 c[16];
        for (int u = 0; u < 16; u++) c[u] = _mm512_loadu_ps(acc[d + u]);
        for (int tp = 0; tp < np; tp++) {
            const __m512i wv = _mm512_loadu_si512(&w[tp]);
            for (int u = 0; u < 16; u++)
                c[u] = ath_dp(c[u], wv, _mm512_set1_epi32((int)rows[tp][d + u]));
        }
        for (int u = 0; u < 16; u++) _mm512_storeu_ps(acc[d + u], c[u]);
    }
}

/* The same for a tile that a mask cuts through: for pair tp, lanes in both[tp] take both
 * products, lanes in lo[tp] (hi[tp]) only the first (second) one, the other half of the row pair
 * zeroed, and other lanes nothing, so a masked pair adds exactly 0 even against inf or NaN. */
ATH_INLINE void ath_accum_vis(float (*restrict acc)[ATH_L], const __m512i *restrict w,
                              const uint32_t (*restrict rows)[ATH_DMAX], int np, const int DH,
                              const __mmask16 *both, const __mmask16 *lo, const __mmask16 *hi) {
    for (int d = 0; d < DH; d += 16) {
        __m512 c[16];
        for (int u = 0; u < 16; u++) c[u] = _mm512_loadu_ps(acc[d + u]);
        for (int tp = 0; tp < np; tp++) {
            const __m512bh wv = (__m512bh)_mm512_loadu_si512(&w[tp]);
            for (int u = 0; u < 16; u++)
                c[u] = _mm512_mask_dpbf16_ps(c[u], both[tp], wv,
                                             (__m512bh)_mm512_set1_epi32((int)rows[tp][d + u]));
            if (lo[tp])
                for (int u = 0; u < 16; u++)
                    c[u] = _mm512_mask_dpbf16_ps(
                        c[u], lo[tp], wv,
                        (__m512bh)_mm512_set1_epi32((int)(rows[tp][d + u] & 0xFFFFu)));
            if (hi[tp])
                for (int u = 0; u < 16; u++)
                    c[u] = _mm512_mask_dpbf16_ps(
                        c[u], hi[tp], wv,
                        (__m512bh)_mm512_set1_epi32((int)(rows[tp][d + u] & 0xFFFF0000u)));
        }
        for (int u = 0; u < 16; u++) _mm512_storeu_ps(acc[d + u], c[u]);
    }
}

/* Pair masks of ath_accum_vis from vm[t], the lanes that see row (or key) t of a tile of n;
 * returns whether some lane among the first `lanes` misses some t (the tile is cut). The
 * padding row of an odd tail is zero and goes with its partner. */
ATH_INLINE int ath_pair_masks(const __mmask16 *vm, int n, int lanes, __mmask16 *both, __mmask16 *lo,
                              __mmask16 *hi) {
    const __mmask16 all = (__mmask16)(lanes >= 16 ? 0xFFFF : (1u << lanes) - 1u);
    int cut = 0;
    for (int tp = 0; tp < (n + 1) / 2; tp++) {
        const __mmask16 a = vm[2 * tp], b = 2 * tp + 1 < n ? vm[2 * tp + 1] : a;
        both[tp] = a & b;
        lo[tp] = a & (__mmask16)~b;
        hi[tp] = b & (__mmask16)~a;
        cut |= ((a & b & all) != all);
    }
    return cut;
}

/* s[t] = sum_p xT[p] . row(t) pair p for t < n (8 rows at a time; tails repeat the last row). */
ATH_INLINE void ath_scores(__m512 *restrict s, const uint32_t (*restrict xT)[ATH_L],
                           const ath_bf *base, int64_t rs, int n, const int DH) {
    for (int t = 0; t < n; t += 8) {
        const ath_bf *r[8];
        for (int u = 0; u < 8; u++) r[u] = base + (t + u < n ? t + u : n - 1) * rs;
        __m512 a[8];
        for (int u = 0; u < 8; u++) a[u] = _mm512_setzero_ps();
        for (int p = 0; p < DH / 2; p++) {
            const __m512i x = _mm512_loadu_si512(xT[p]);
            for (int u = 0; u < 8; u++) a[u] = ath_dp(a[u], x, ath_bcast_pair(r[u] + 2 * p));
        }
        for (int u = 0; u < 8; u++)
            if (t + u < ATH_BK) s[t + u] = a[u];
    }
}

/* ---- forward: 16 query rows of head (b, h) -------------------------------------------------- */
ATH_INLINE void ath_fwd_block(const ompk_attn_geom *g, const ath_bf *q, const ath_bf *k,
                              const ath_bf *v, ath_bf *out, float *lse, int64_t b, int64_t h,
                              int64_t i0, const int DH) {
    enum { L = ATH_L, BK = ATH_BK };
    const int64_t N = g->N, M = g->M, hk = h / (g->Hq / g->Hkv);
    const int rb = (int)(N - i0 < L ? N - i0 : L);
    uint32_t qT[ATH_DMAX / 2][L];
    float acc[ATH_DMAX][L];
    uint32_t vp[BK / 2][ATH_DMAX];
    __m512 s[BK];
    __m512i pp[BK / 2];
    __mmask16 vm[BK], both[BK / 2], lo[BK / 2], hi[BK / 2];
    float limf_a[L];
    int64_t jmax = 0;
    for (int r = 0; r < L; r++) {
        int64_t lim = r < rb ? ompk_attn_key_limit(g->mask, i0 + r, N, M) : 0;
        limf_a[r] = (float)lim;
        jmax = lim > jmax ? lim : jmax;
    }
    const __m512 limf = _mm512_loadu_ps(limf_a);
    ath_stage_T(qT, q + ath_row(g->qs, b, h, 0), g->qs[2], i0, rb, DH);
    memset(acc, 0, sizeof(float) * DH * L);
    const __m512 sc = _mm512_set1_ps(g->scale), ninf = _mm512_set1_ps(-INFINITY);
    const __m512 l2e = _mm512_set1_ps(ATH_LOG2E);
    __m512 m = ninf, l = _mm512_setzero_ps();
    const ath_bf *kb = k + ath_row(g->ks, b, hk, 0), *vb = v + ath_row(g->vs, b, hk, 0);
    for (int64_t j0 = 0; j0 < jmax; j0 += BK) {
        const int jn = (int)(jmax - j0 < BK ? jmax - j0 : BK);
        ath_scores(s, qT, kb + j0 * g->ks[2], g->ks[2], jn, DH);
        __m512 mx = m;
        for (int jj = 0; jj < jn; jj++) {
            vm[jj] = _mm512_cmp_ps_mask(_mm512_set1_ps((float)(j0 + jj)), limf, _CMP_LT_OQ);
            s[jj] = _mm512_mask_mul_ps(ninf, vm[jj], s[jj], sc);
            mx = _mm512_max_ps(s[jj], mx); /* a NaN score stays out of the max */
        }
        /* rows with nothing visible yet keep m = -inf; their p and alpha come out 0 (NaN for a
         * NaN score) */
        __mmask16 live = _mm512_cmp_ps_mask(mx, ninf, _CMP_NEQ_OQ);
        __m512 msafe = _mm512_maskz_mov_ps(live, mx);
        __m512 alpha = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(m, ninf, _CMP_NEQ_OQ),
                                           ath_exp2(_mm512_mul_ps(_mm512_sub_ps(m, msafe), l2e)));
        __m512 sum = _mm512_setzero_ps();
        for (int jj = 0; jj < jn; jj += 2) {
            __m512 p0 = ath_exp2(_mm512_mul_ps(_mm512_sub_ps(s[jj], msafe), l2e));
            p0 = _mm512_maskz_mov_ps(vm[jj], p0);
            __m512 p1 = _mm512_setzero_ps();
            if (jj + 1 < jn) {
                p1 = ath_exp2(_mm512_mul_ps(_mm512_sub_ps(s[jj + 1], msafe), l2e));
                p1 = _mm512_maskz_mov_ps(vm[jj + 1], p1);
            }
            sum = _mm512_add_ps(sum, _mm512_add_ps(p0, p1));
            pp[jj / 2] = ath_pack_pair(p0, p1);
        }
        l = _mm512_fmadd_ps(l, alpha, sum);
        m = _mm512_mask_mov_ps(ninf, live, mx);
        for (int d = 0; d < DH; d++)
            _mm512_storeu_ps(acc[d], _mm512_mul_ps(_mm512_loadu_ps(acc[d]), alpha));
        ath_stage_pairs(vp, vb + j0 * g->vs[2], g->vs[2], 0, jn, DH);
        if (ath_pair_masks(vm, jn, rb, both, lo, hi))
            ath_accum_vis(acc, pp, (const uint32_t(*)[ATH_DMAX])vp, (jn + 1) / 2, DH, both, lo, hi);
        else
            ath_accum(acc, pp, (const uint32_t(*)[ATH_DMAX])vp, (jn + 1) / 2, DH);
    }
    float la[L], ma[L];
    _mm512_storeu_ps(la, l);
    _mm512_storeu_ps(ma, m);
    for (int r = 0; r < rb; r++) {
        float inv = ath_inv_l(limf_a[r] > 0.f, la[r]);
        ath_bf *o = out + ath_row(g->os, b, h, i0 + r);
        for (int d = 0; d < DH; d++) o[d] = ompk_f32_to_bf16(acc[d][r] * inv);
        if (lse) lse[ath_row(g->ls, b, h, i0 + r)] = ath_lse(limf_a[r] > 0.f, ma[r], la[r]);
    }
}

/* ---- dq: 16 query rows of head (b, h) ------------------------------------------------------- */
ATH_INLINE void ath_dq_block(const ompk_attn_geom *g, const ath_bf *dout, const ath_bf *q,
                             const ath_bf *k, const ath_bf *v, const float *lse, const float *dsum,
                             ath_bf *dq, int64_t b, int64_t h, int64_t i0, const int DH) {
    enum { L = ATH_L, BK = ATH_BK };
    const int64_t N = g->N, M = g->M, hk = h / (g->Hq / g->Hkv);
    const int rb = (int)(N - i0 < L ? N - i0 : L);
    uint32_t qT[ATH_DMAX / 2][L], doT[ATH_DMAX / 2][L];
    float acc[ATH_DMAX][L];
    uint32_t kp[BK / 2][ATH_DMAX];
    __m512 s[BK], dp[BK];
    __m512i w[BK / 2];
    __mmask16 vm[BK], both[BK / 2], lo[BK / 2], hi[BK / 2];
    float limf_a[L], l2_a[L], di_a[L];
    int64_t jmax = 0;
    for (int r = 0; r < L; r++) {
        int64_t i = i0 + (r < rb ? r : 0);
        float lv = r < rb ? lse[ath_row(g->ls, b, h, i)] : -INFINITY;
        int64_t lim = lv == -INFINITY ? 0 : ompk_attn_key_limit(g->mask, i, N, M);
        limf_a[r] = (float)lim;
        jmax = lim > jmax ? lim : jmax;
        l2_a[r] = lv == -INFINITY ? 0.f : lv;
        di_a[r] = r < rb ? dsum[(b * g->Hq + h) * N + i] : 0.f;
    }
    const __m512 limf = _mm512_loadu_ps(limf_a), l2 = _mm512_loadu_ps(l2_a);
    const __m512 di = _mm512_loadu_ps(di_a), sc = _mm512_set1_ps(g->scale);
    ath_stage_T(qT, q + ath_row(g->qs, b, h, 0), g->qs[2], i0, rb, DH);
    ath_stage_T(doT, dout + ath_row(g->dos, b, h, 0), g->dos[2], i0, rb, DH);
    memset(acc, 0, sizeof(float) * DH * L);
    const ath_bf *kb = k + ath_row(g->ks, b, hk, 0), *vb = v + ath_row(g->vs, b, hk, 0);
    for (int64_t j0 = 0; j0 < jmax; j0 += BK) {
        const int jn = (int)(jmax - j0 < BK ? jmax - j0 : BK);
        ath_scores(s, qT, kb + j0 * g->ks[2], g->ks[2], jn, DH);
        ath_scores(dp, doT, vb + j0 * g->vs[2], g->vs[2], jn, DH);
        for (int jj = 0; jj < jn; jj += 2) {
            __m512 d2[2];
            for (int u = 0; u < 2; u++) {
                d2[u] = _mm512_setzero_ps();
                if (jj + u < jn) {
                    const __mmask16 vis =
                        _mm512_cmp_ps_mask(_mm512_set1_ps((float)(j0 + jj + u)), limf, _CMP_LT_OQ);
                    vm[jj + u] = vis;
                    __m512 p = ath_p_of(s[jj + u], sc, l2);
                    d2[u] = _mm512_maskz_mul_ps(vis, p, _mm512_sub_ps(dp[jj + u], di));
                }
            }
            w[jj / 2] = ath_pack_pair(d2[0], d2[1]);
        }
        ath_stage_pairs(kp, kb + j0 * g->ks[2], g->ks[2], 0, jn, DH);
        if (ath_pair_masks(vm, jn, rb, both, lo, hi))
            ath_accum_vis(acc, w, (const uint32_t(*)[ATH_DMAX])kp, (jn + 1) / 2, DH, both, lo, hi);
        else
            ath_accum(acc, w, (const uint32_t(*)[ATH_DMAX])kp, (jn + 1) / 2, DH);
    }
    for (int r = 0; r < rb; r++) {
        ath_bf *o = dq + ath_row(g->dqs, b, h, i0 + r);
        for (int d = 0; d < DH; d++) o[d] = ompk_f32_to_bf16(acc[d][r] * g->scale);
    }
}

/* ---- dk, dv: 16 keys of kv head (b, hk); the group's query heads in increasing order, their
 * rows in increasing order, each lane summing its own key (deterministic) ---------------------- */
ATH_INLINE void ath_dkdv_block(const ompk_attn_geom *g, const ath_bf *dout, const ath_bf *q,
                               const ath_bf *k, const ath_bf *v, const float *lse,
                               const float *dsum, ath_bf *dk, ath_bf *dv, int64_t b, int64_t hk,
                               int64_t j0, const int DH) {
    enum { L = ATH_L, BQ = ATH_BK };
    const int64_t N = g->N, M = g->M, G = g->Hq / g->Hkv;
    const int cb = (int)(M - j0 < L ? M - j0 : L);
    uint32_t kT[ATH_DMAX / 2][L], vT[ATH_DMAX / 2][L];
    float dka[ATH_DMAX][L], dva[ATH_DMAX][L];
    uint32_t qp[BQ / 2][ATH_DMAX], dop[BQ / 2][ATH_DMAX];
    __m512 s[BQ], dp[BQ];
    __m512i pw[BQ / 2], dw[BQ / 2];
    __mmask16 vm[BQ], both[BQ / 2], lo[BQ / 2], hi[BQ / 2];
    float jf_a[L];
    ath_stage_T(kT, k + ath_row(g->ks, b, hk, 0), g->ks[2], j0, cb, DH);
    ath_stage_T(vT, v + ath_row(g->vs, b, hk, 0), g->vs[2], j0, cb, DH);
    memset(dka, 0, sizeof(float) * DH * L);
    memset(dva, 0, sizeof(float) * DH * L);
    /* lanes past the last key get an index no row sees */
    for (int c = 0; c < L; c++) jf_a[c] = c < cb ? (float)(j0 + c) : (float)M + 1.f;
    const __m512 jf = _mm512_loadu_ps(jf_a), sc = _mm512_set1_ps(g->scale);
    const int64_t ifirst = ompk_attn_first_row(g->mask, j0, N, M);
    for (int64_t h = hk * G; h < (hk + 1) * G; h++) {
        const ath_bf *qb = q + ath_row(g->qs, b, h, 0), *ob = dout + ath_row(g->dos, b, h, 0);
        for (int64_t ii0 = ifirst; ii0 < N; ii0 += BQ) {
            const int in = (int)(N - ii0 < BQ ? N - ii0 : BQ);
            ath_scores(s, kT, qb + ii0 * g->qs[2], g->qs[2], in, DH);
            ath_scores(dp, vT, ob + ii0 * g->dos[2], g->dos[2], in, DH);
            for (int t = 0; t < in; t += 2) {
                __m512 p2[2], d2[2];
                for (int u = 0; u < 2; u++) {
                    p2[u] = d2[u] = _mm512_setzero_ps();
                    if (t + u < in) {
                        int64_t i = ii0 + t + u;
                        float lv = lse[ath_row(g->ls, b, h, i)];
                        float lim =
                            lv == -INFINITY ? 0.f : (float)ompk_attn_key_limit(g->mask, i, N, M);
                        float l2 = lv == -INFINITY ? 0.f : lv;
                        __mmask16 vis = _mm512_cmp_ps_mask(jf, _mm512_set1_ps(lim), _CMP_LT_OQ);
                        vm[t + u] = vis;
                        __m512 p = ath_p_of(s[t + u], sc, _mm512_set1_ps(l2));
                        p2[u] = _mm512_maskz_mov_ps(vis, p);
                        d2[u] = _mm512_maskz_mul_ps(
                            vis, p,
                            _mm512_sub_ps(dp[t + u],
                                          _mm512_set1_ps(dsum[(b * g->Hq + h) * N + i])));
                    }
                }
                pw[t / 2] = ath_pack_pair(p2[0], p2[1]);
                dw[t / 2] = ath_pack_pair(d2[0], d2[1]);
            }
            ath_stage_pairs(dop, ob + ii0 * g->dos[2], g->dos[2], 0, in, DH);
            ath_stage_pairs(qp, qb + ii0 * g->qs[2], g->qs[2], 0, in, DH);
            const uint32_t(*dopc)[ATH_DMAX] = (const uint32_t(*)[ATH_DMAX])dop;
            const uint32_t(*qpc)[ATH_DMAX] = (const uint32_t(*)[ATH_DMAX])qp;
            if (ath_pair_masks(vm, in, cb, both, lo, hi)) {
                ath_accum_vis(dva, pw, dopc, (in + 1) / 2, DH, both, lo, hi);
                ath_accum_vis(dka, dw, qpc, (in + 1) / 2, DH, both, lo, hi);
            } else {
                ath_accum(dva, pw, dopc, (in + 1) / 2, DH);
                ath_accum(dka, dw, qpc, (in + 1) / 2, DH);
            }
        }
    }
    for (int c = 0; c < cb; c++) {
        ath_bf *ko = dk + ath_row(g->dks, b, hk, j0 + c), *vo = dv + ath_row(g->dvs, b, hk, j0 + c);
        for (int d = 0; d < DH; d++) {
            ko[d] = ompk_f32_to_bf16(dka[d][c] * g->scale);
            vo[d] = ompk_f32_to_bf16(dva[d][c]);
        }
    }
}

/* Keys kept of pair 2cp, 2cp+1 for a row that sees nv keys of the block: both, the first, none. */
static inline int ath_pair_keep(int cp, int nv) {
    return 2 * cp + 1 < nv ? -1 : 2 * cp < nv ? 0xFFFF : 0;
}

/* dq rows += dS row . K block for the n rows of dqr: head dim in lanes, key pairs, two rows at
 * a time. With nv (a tile a mask cuts through), row t takes only its nv[t] visible keys: the
 * others' k (maybe inf or NaN) is zeroed, not multiplied by their zero dS. */
ATH_INLINE void ath_dq_pairs(float *restrict dqr, const uint32_t (*restrict dsb)[ATH_L / 2],
                             const uint32_t (*restrict kp)[ATH_DMAX], int in, int np, const int *nv,
                             const int DH) {
    for (int t = 0; t < in; t += 2) {
        const int two = t + 1 < in;
        for (int d0 = 0; d0 < DH; d0 += 64) {
            __m512 a0[4], a1[4];
            for (int z = 0; z < 4; z++) a0[z] = a1[z] = _mm512_setzero_ps();
            for (int z = 0; z < 4; z++)
                if (d0 + 16 * z < DH) {
                    a0[z] = _mm512_loadu_ps(dqr + t * DH + d0 + 16 * z);
                    a1[z] = two ? _mm512_loadu_ps(dqr + (t + 1) * DH + d0 + 16 * z)
                                : _mm512_setzero_ps();
                }
            for (int cp = 0; cp < np; cp++) {
                const __m512i w0 = _mm512_set1_epi32((int)dsb[t][cp]);
                const __m512i w1 = _mm512_set1_epi32((int)dsb[t + 1][cp]);
                if (nv) {
                    const __m512i m0 = _mm512_set1_epi32(ath_pair_keep(cp, nv[t]));
                    const __m512i m1 = _mm512_set1_epi32(two ? ath_pair_keep(cp, nv[t + 1]) : 0);
                    for (int z = 0; z < 4; z++)
                        if (d0 + 16 * z < DH) {
                            const __m512i kv = _mm512_loadu_si512(&kp[cp][d0 + 16 * z]);
                            a0[z] = ath_dp(a0[z], _mm512_and_si512(kv, m0), w0);
                            a1[z] = ath_dp(a1[z], _mm512_and_si512(kv, m1), w1);
                        }
                } else {
                    for (int z = 0; z < 4; z++)
                        if (d0 + 16 * z < DH) {
                            const __m512i kv = _mm512_loadu_si512(&kp[cp][d0 + 16 * z]);
                            a0[z] = ath_dp(a0[z], kv, w0);
                            a1[z] = ath_dp(a1[z], kv, w1);
                        }
                }
            }
            for (int z = 0; z < 4; z++)
                if (d0 + 16 * z < DH) {
                    _mm512_storeu_ps(dqr + t * DH + d0 + 16 * z, a0[z]);
                    if (two) _mm512_storeu_ps(dqr + (t + 1) * DH + d0 + 16 * z, a1[z]);
                }
        }
    }
}

/* bf16 backward of kv head (b, hk) in one pass (five products), as ath_bwd_head_f below: dq
 * rows accumulate in the item's own f32 dqa ([G][N][DH]) key pair by key pair, from dS rounded
 * to bf16 and the block's keys interleaved in pairs. */
ATH_INLINE void ath_bwd_head(const ompk_attn_geom *g, const ath_bf *dout, const ath_bf *q,
                             const ath_bf *k, const ath_bf *v, const float *lse, const float *dsum,
                             ath_bf *dq, ath_bf *dk, ath_bf *dv, int64_t b, int64_t hk,
                             float *restrict dqa, const int DH) {
    enum { L = ATH_L, BQ = ATH_BK };
    const int64_t N = g->N, M = g->M, G = g->Hq / g->Hkv;
    uint32_t kT[ATH_DMAX / 2][L], vT[ATH_DMAX / 2][L];
    float dka[ATH_DMAX][L], dva[ATH_DMAX][L];
    uint32_t qp[BQ / 2][ATH_DMAX], dop[BQ / 2][ATH_DMAX], kp[L / 2][ATH_DMAX];
    __m512 s[BQ], dp[BQ];
    __m512i pw[BQ / 2], dw[BQ / 2];
    uint32_t dsb[BQ][L / 2];
    __mmask16 vm[BQ], both[BQ / 2], lo[BQ / 2], hi[BQ / 2];
    int nv[BQ];
    float jf_a[L];
    const __m512 sc = _mm512_set1_ps(g->scale);
    memset(dqa, 0, sizeof(float) * (size_t)(G * N * DH));
    const ath_bf *kb = k + ath_row(g->ks, b, hk, 0), *vb = v + ath_row(g->vs, b, hk, 0);
    for (int64_t j0 = 0; j0 < M; j0 += L) {
        const int cb = (int)(M - j0 < L ? M - j0 : L);
        ath_stage_T(kT, kb, g->ks[2], j0, cb, DH);
        ath_stage_T(vT, vb, g->vs[2], j0, cb, DH);
        ath_stage_pairs(kp, kb, g->ks[2], j0, cb, DH);
        for (int cp = (cb + 1) / 2; cp < L / 2; cp++) memset(kp[cp], 0, sizeof(uint32_t) * DH);
        memset(dka, 0, sizeof(float) * DH * L);
        memset(dva, 0, sizeof(float) * DH * L);
        for (int c = 0; c < L; c++) jf_a[c] = c < cb ? (float)(j0 + c) : (float)M + 1.f;
        const __m512 jf = _mm512_loadu_ps(jf_a);
        const int64_t ifirst = ompk_attn_first_row(g->mask, j0, N, M);
        for (int64_t hh = 0; hh < G; hh++) {
            const int64_t h = hk * G + hh;
            const ath_bf *qb = q + ath_row(g->qs, b, h, 0), *ob = dout + ath_row(g->dos, b, h, 0);
            for (int64_t ii0 = ifirst; ii0 < N; ii0 += BQ) {
                const int in = (int)(N - ii0 < BQ ? N - ii0 : BQ);
                ath_scores(s, kT, qb + ii0 * g->qs[2], g->qs[2], in, DH);
                ath_scores(dp, vT, ob + ii0 * g->dos[2], g->dos[2], in, DH);
                for (int t = 0; t < in; t += 2) {
                    __m512 p2[2], d2[2];
                    for (int u = 0; u < 2; u++) {
                        p2[u] = d2[u] = _mm512_setzero_ps();
                        if (t + u < in) {
                            int64_t i = ii0 + t + u;
                            float lv = lse[ath_row(g->ls, b, h, i)];
                            int64_t lim =
                                lv == -INFINITY ? 0 : ompk_attn_key_limit(g->mask, i, N, M);
                            float l2 = lv == -INFINITY ? 0.f : lv;
                            __mmask16 vis =
                                _mm512_cmp_ps_mask(jf, _mm512_set1_ps((float)lim), _CMP_LT_OQ);
                            vm[t + u] = vis;
                            nv[t + u] = (int)(lim <= j0 ? 0 : lim - j0 < cb ? lim - j0 : cb);
                            __m512 p = ath_p_of(s[t + u], sc, _mm512_set1_ps(l2));
                            p2[u] = _mm512_maskz_mov_ps(vis, p);
                            __m512 di = _mm512_set1_ps(dsum[(b * g->Hq + h) * N + i]);
                            d2[u] = _mm512_maskz_mul_ps(vis, p, _mm512_sub_ps(dp[t + u], di));
                        }
                        _mm256_storeu_si256((__m256i *)dsb[t + u],
                                            (__m256i)_mm512_cvtneps_pbh(d2[u]));
                    }
                    pw[t / 2] = ath_pack_pair(p2[0], p2[1]);
                    dw[t / 2] = ath_pack_pair(d2[0], d2[1]);
                }
                ath_stage_pairs(dop, ob, g->dos[2], ii0, in, DH);
                ath_stage_pairs(qp, qb, g->qs[2], ii0, in, DH);
                const uint32_t(*dopc)[ATH_DMAX] = (const uint32_t(*)[ATH_DMAX])dop;
                const uint32_t(*qpc)[ATH_DMAX] = (const uint32_t(*)[ATH_DMAX])qp;
                const uint32_t(*kpc)[ATH_DMAX] = (const uint32_t(*)[ATH_DMAX])kp;
                float *dqr = dqa + (hh * N + ii0) * DH;
                if (ath_pair_masks(vm, in, cb, both, lo, hi)) {
                    ath_accum_vis(dva, pw, dopc, (in + 1) / 2, DH, both, lo, hi);
                    ath_accum_vis(dka, dw, qpc, (in + 1) / 2, DH, both, lo, hi);
                    ath_dq_pairs(dqr, dsb, kpc, in, (cb + 1) / 2, nv, DH);
                } else {
                    ath_accum(dva, pw, dopc, (in + 1) / 2, DH);
                    ath_accum(dka, dw, qpc, (in + 1) / 2, DH);
                    ath_dq_pairs(dqr, dsb, kpc, in, (cb + 1) / 2, NULL, DH);
                }
            }
        }
        for (int c = 0; c < cb; c++) {
            ath_bf *ko = dk + ath_row(g->dks, b, hk, j0 + c),
                   *vo = dv + ath_row(g->dvs, b, hk, j0 + c);
            for (int d = 0; d < DH; d++) {
                ko[d] = ompk_f32_to_bf16(dka[d][c] * g->scale);
                vo[d] = ompk_f32_to_bf16(dva[d][c]);
            }
        }
    }
    for (int64_t hh = 0; hh < G; hh++)
        for (int64_t i = 0; i < N; i++) {
            ath_bf *o = dq + ath_row(g->dqs, b, hk * G + hh, i);
            const float *a = dqa + (hh * N + i) * DH;
            for (int d = 0; d < DH; d++) o[d] = ompk_f32_to_bf16(a[d] * g->scale);
        }
}

/* ---- f32: the same blocks with vfmadd231ps, values in lanes as they are ------------------- */

/* xT[d][l] = row (r0 + l)[d] * mul, lanes from n on zero. The scores' scale goes into one
 * operand before the dot product, as in the portable kernel (logits of several hundred then
 * round alike). */
ATH_INLINE void ath_stage_Tf(float (*restrict xT)[ATH_L], const float *src, int64_t rs, int64_t r0,
                             int n, const int DH, float mul) {
    for (int l = 0; l < ATH_L; l++) {
        const float *row = src + (r0 + (l < n ? l : 0)) * rs;
        for (int d = 0; d < DH; d++) xT[d][l] = l < n ? row[d] * mul : 0.f;
    }
}

/* s[t] = sum_d xT[d] * row(t)[d] for t < n, 8 rows at a time (tails repeat the last row). */
ATH_INLINE void ath_scores_f(__m512 *restrict s, const float (*restrict xT)[ATH_L],
                             const float *base, int64_t rs, int n, const int DH) {
    for (int t = 0; t < n; t += 8) {
        const float *r[8];
        for (int u = 0; u < 8; u++) r[u] = base + (t + u < n ? t + u : n - 1) * rs;
        __m512 a[8];
        for (int u = 0; u < 8; u++) a[u] = _mm512_setzero_ps();
        for (int d = 0; d < DH; d++) {
            const __m512 x = _mm512_loadu_ps(xT[d]);
            for (int u = 0; u < 8; u++) a[u] = _mm512_fmadd_ps(x, _mm512_set1_ps(r[u][d]), a[u]);
        }
        for (int u = 0; u < 8; u++)
            if (t + u < ATH_BK) s[t + u] = a[u];
    }
}

/* acc[d][l] += sum_{t < n} w[t][l] * row(t)[d] for the lanes in vm[t], 16 d at a time in
 * registers: a masked pair adds exactly 0 even against an inf or NaN row element (the masked
 * FMA costs what the plain one does). */
ATH_INLINE void ath_accum_f(float (*restrict acc)[ATH_L], const __m512 *restrict w,
                            const __mmask16 *vm, const float *base, int64_t rs, int n,
                            const int DH) {
    for (int d = 0; d < DH; d += 16) {
        __m512 c[16];
        for (int u = 0; u < 16; u++) c[u] = _mm512_loadu_ps(acc[d + u]);
        for (int t = 0; t < n; t++) {
            const __m512 wv = w[t];
            const float *r = base + t * rs + d;
            const __mmask16 k = vm[t];
            for (int u = 0; u < 16; u++)
                c[u] = _mm512_mask3_fmadd_ps(wv, _mm512_set1_ps(r[u]), c[u], k);
        }
        for (int u = 0; u < 16; u++) _mm512_storeu_ps(acc[d + u], c[u]);
    }
}

ATH_INLINE void ath_fwd_block_f(const ompk_attn_geom *g, const float *q, const float *k,
                                const float *v, float *out, float *lse, int64_t b, int64_t h,
                                int64_t i0, const int DH) {
    enum { L = ATH_L, BK = ATH_BK };
    const int64_t N = g->N, M = g->M, hk = h / (g->Hq / g->Hkv);
    const int rb = (int)(N - i0 < L ? N - i0 : L);
    float qT[ATH_DMAX][L], acc[ATH_DMAX][L];
    __m512 s[BK];
    float limf_a[L];
    int64_t jmax = 0;
    for (int r = 0; r < L; r++) {
        int64_t lim = r < rb ? ompk_attn_key_limit(g->mask, i0 + r, N, M) : 0;
        limf_a[r] = (float)lim;
        jmax = lim > jmax ? lim : jmax;
    }
    const __m512 limf = _mm512_loadu_ps(limf_a);
    __mmask16 vm[BK];
    ath_stage_Tf(qT, q + ath_row(g->qs, b, h, 0), g->qs[2], i0, rb, DH, 1.f);
    memset(acc, 0, sizeof(float) * DH * L);
    const __m512 ninf = _mm512_set1_ps(-INFINITY), sc = _mm512_set1_ps(g->scale);
    const __m512 l2e = _mm512_set1_ps(ATH_LOG2E);
    __m512 m = ninf, l = _mm512_setzero_ps();
    const float *kb = k + ath_row(g->ks, b, hk, 0), *vb = v + ath_row(g->vs, b, hk, 0);
    for (int64_t j0 = 0; j0 < jmax; j0 += BK) {
        const int jn = (int)(jmax - j0 < BK ? jmax - j0 : BK);
        ath_scores_f(s, qT, kb + j0 * g->ks[2], g->ks[2], jn, DH);
        __m512 mx = m;
        for (int jj = 0; jj < jn; jj++) {
            vm[jj] = _mm512_cmp_ps_mask(_mm512_set1_ps((float)(j0 + jj)), limf, _CMP_LT_OQ);
            s[jj] = _mm512_mask_mul_ps(ninf, vm[jj], s[jj], sc);
            mx = _mm512_max_ps(s[jj], mx); /* a NaN score stays out of the max */
        }
        __mmask16 live = _mm512_cmp_ps_mask(mx, ninf, _CMP_NEQ_OQ);
        __m512 msafe = _mm512_maskz_mov_ps(live, mx);
        __m512 alpha = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(m, ninf, _CMP_NEQ_OQ),
                                           ath_exp2(_mm512_mul_ps(_mm512_sub_ps(m, msafe), l2e)));
        __m512 sum = _mm512_setzero_ps();
        for (int jj = 0; jj < jn; jj++) {
            __m512 p = ath_exp2(_mm512_mul_ps(_mm512_sub_ps(s[jj], msafe), l2e));
            s[jj] = _mm512_maskz_mov_ps(vm[jj], p);
            sum = _mm512_add_ps(sum, s[jj]);
        }
        l = _mm512_fmadd_ps(l, alpha, sum);
        m = _mm512_mask_mov_ps(ninf, live, mx);
        for (int d = 0; d < DH; d++)
            _mm512_storeu_ps(acc[d], _mm512_mul_ps(_mm512_loadu_ps(acc[d]), alpha));
        ath_accum_f(acc, s, vm, vb + j0 * g->vs[2], g->vs[2], jn, DH);
    }
    float la[L], ma[L];
    _mm512_storeu_ps(la, l);
    _mm512_storeu_ps(ma, m);
    for (int r = 0; r < rb; r++) {
        float inv = ath_inv_l(limf_a[r] > 0.f, la[r]);
        float *o = out + ath_row(g->os, b, h, i0 + r);
        for (int d = 0; d < DH; d++) o[d] = acc[d][r] * inv;
        if (lse) lse[ath_row(g->ls, b, h, i0 + r)] = ath_lse(limf_a[r] > 0.f, ma[r], la[r]);
    }
}

/* f32 backward of kv head (b, hk) in one pass (five products, as FlashAttention-2): key blocks
 * of 16 in lanes, ascending; for each, the group's query heads and rows ascending. dk, dv of the
 * block are complete when it ends; dq rows accumulate in dqa ([G][N][DH] f32, the work item's
 * own) in the same fixed order, key by key, so the result does not depend on scheduling. */
ATH_INLINE void ath_bwd_head_f(const ompk_attn_geom *g, const float *dout, const float *q,
                               const float *k, const float *v, const float *lse, const float *dsum,
                               float *dq, float *dk, float *dv, int64_t b, int64_t hk,
                               float *restrict dqa, const int DH) {
    enum { L = ATH_L, BQ = ATH_BK };
    const int64_t N = g->N, M = g->M, G = g->Hq / g->Hkv;
    float kT[ATH_DMAX][L], vT[ATH_DMAX][L], dka[ATH_DMAX][L], dva[ATH_DMAX][L];
    __m512 s[BQ], dp[BQ];
    float dsm[BQ][L], jf_a[L];
    __mmask16 vm[BQ];
    int nv[BQ];
    const __m512 sc = _mm512_set1_ps(g->scale);
    memset(dqa, 0, sizeof(float) * (size_t)(G * N * DH));
    const float *kb = k + ath_row(g->ks, b, hk, 0), *vb = v + ath_row(g->vs, b, hk, 0);
    for (int64_t j0 = 0; j0 < M; j0 += L) {
        const int cb = (int)(M - j0 < L ? M - j0 : L);
        ath_stage_Tf(kT, kb, g->ks[2], j0, cb, DH, 1.f);
        ath_stage_Tf(vT, vb, g->vs[2], j0, cb, DH, 1.f);
        memset(dka, 0, sizeof(float) * DH * L);
        memset(dva, 0, sizeof(float) * DH * L);
        for (int c = 0; c < L; c++) jf_a[c] = c < cb ? (float)(j0 + c) : (float)M + 1.f;
        const __m512 jf = _mm512_loadu_ps(jf_a);
        const int64_t ifirst = ompk_attn_first_row(g->mask, j0, N, M);
        for (int64_t hh = 0; hh < G; hh++) {
            const int64_t h = hk * G + hh;
            const float *qb = q + ath_row(g->qs, b, h, 0), *ob = dout + ath_row(g->dos, b, h, 0);
            for (int64_t ii0 = ifirst; ii0 < N; ii0 += BQ) {
                const int in = (int)(N - ii0 < BQ ? N - ii0 : BQ);
                ath_scores_f(s, kT, qb + ii0 * g->qs[2], g->qs[2], in, DH);
                ath_scores_f(dp, vT, ob + ii0 * g->dos[2], g->dos[2], in, DH);
                for (int t = 0; t < in; t++) {
                    int64_t i = ii0 + t;
                    float lv = lse[ath_row(g->ls, b, h, i)];
                    int64_t lim = lv == -INFINITY ? 0 : ompk_attn_key_limit(g->mask, i, N, M);
                    float l2 = lv == -INFINITY ? 0.f : lv;
                    __mmask16 vis = _mm512_cmp_ps_mask(jf, _mm512_set1_ps((float)lim), _CMP_LT_OQ);
                    vm[t] = vis;
                    nv[t] = (int)(lim <= j0 ? 0 : lim - j0 < cb ? lim - j0 : cb);
                    __m512 p = ath_p_of(s[t], sc, _mm512_set1_ps(l2));
                    s[t] = _mm512_maskz_mov_ps(vis, p);
                    __m512 di = _mm512_set1_ps(dsum[(b * g->Hq + h) * N + i]);
                    dp[t] = _mm512_maskz_mul_ps(vis, p, _mm512_sub_ps(dp[t], di));
                    _mm512_storeu_ps(dsm[t], dp[t]);
                }
                ath_accum_f(dva, s, vm, ob + ii0 * g->dos[2], g->dos[2], in, DH);
                ath_accum_f(dka, dp, vm, qb + ii0 * g->qs[2], g->qs[2], in, DH);
                /* dq rows += dS row . K block: head dim in lanes, two rows at a time; row t
                 * takes its nv[t] visible keys only (masked FMAs) */
                float *dqr = dqa + (hh * N + ii0) * DH;
                for (int t = 0; t < in; t += 2) {
                    const int two = t + 1 < in;
                    for (int d0 = 0; d0 < DH; d0 += 64) {
                        __m512 a0[4], a1[4];
                        for (int z = 0; z < 4; z++) a0[z] = a1[z] = _mm512_setzero_ps();
                        for (int z = 0; z < 4; z++)
                            if (d0 + 16 * z < DH) {
                                a0[z] = _mm512_loadu_ps(dqr + t * DH + d0 + 16 * z);
                                a1[z] = two ? _mm512_loadu_ps(dqr + (t + 1) * DH + d0 + 16 * z)
                                            : _mm512_setzero_ps();
                            }
                        for (int c = 0; c < cb; c++) {
                            const float *kr = kb + (j0 + c) * g->ks[2] + d0;
                            const __m512 w0 = _mm512_set1_ps(dsm[t][c]);
                            const __m512 w1 = _mm512_set1_ps(two ? dsm[t + 1][c] : 0.f);
                            const __mmask16 k0 = c < nv[t] ? 0xFFFF : 0;
                            const __mmask16 k1 = two && c < nv[t + 1] ? 0xFFFF : 0;
                            for (int z = 0; z < 4; z++)
                                if (d0 + 16 * z < DH) {
                                    const __m512 kv = _mm512_loadu_ps(kr + 16 * z);
                                    a0[z] = _mm512_mask3_fmadd_ps(w0, kv, a0[z], k0);
                                    a1[z] = _mm512_mask3_fmadd_ps(w1, kv, a1[z], k1);
                                }
                        }
                        for (int z = 0; z < 4; z++)
                            if (d0 + 16 * z < DH) {
                                _mm512_storeu_ps(dqr + t * DH + d0 + 16 * z, a0[z]);
                                if (two) _mm512_storeu_ps(dqr + (t + 1) * DH + d0 + 16 * z, a1[z]);
                            }
                    }
                }
            }
        }
        for (int c = 0; c < cb; c++) {
            float *ko = dk + ath_row(g->dks, b, hk, j0 + c),
                  *vo = dv + ath_row(g->dvs, b, hk, j0 + c);
            for (int d = 0; d < DH; d++) {
                ko[d] = dka[d][c] * g->scale;
                vo[d] = dva[d][c];
            }
        }
    }
    for (int64_t hh = 0; hh < G; hh++)
        for (int64_t i = 0; i < N; i++) {
            float *o = dq + ath_row(g->dqs, b, hk * G + hh, i);
            const float *a = dqa + (hh * N + i) * DH;
            for (int d = 0; d < DH; d++) o[d] = a[d] * g->scale;
        }
}

ATH_TARGET static void ath_fwd_item(const ompk_attn_geom *g, const void *q, const void *k,
                                    const void *v, void *out, float *lse, int64_t w, int64_t nblk) {
    int64_t i0 = (w % nblk) * ATH_L, bh = w / nblk;
#define ATH_FWD(D) ath_fwd_block(g, q, k, v, out, lse, bh / g->Hq, bh % g->Hq, i0, D)
#define ATH_FWDF(D) ath_fwd_block_f(g, q, k, v, out, lse, bh / g->Hq, bh % g->Hq, i0, D)
    if (g->bf16) {
        ATT_SWITCH_DH(g->dh, ATH_FWD)
    } else {
        ATT_SWITCH_DH(g->dh, ATH_FWDF)
    }
#undef ATH_FWD
#undef ATH_FWDF
}

ATH_TARGET static void ath_dq_item(const ompk_attn_geom *g, const void *dout, const void *q,
                                   const void *k, const void *v, const float *lse,
                                   const float *dsum, void *dq, int64_t w, int64_t nblk) {
    int64_t i0 = (w % nblk) * ATH_L, bh = w / nblk;
#define ATH_DQ(D) ath_dq_block(g, dout, q, k, v, lse, dsum, dq, bh / g->Hq, bh % g->Hq, i0, D)
    ATT_SWITCH_DH(g->dh, ATH_DQ)
#undef ATH_DQ
}

ATH_TARGET static void ath_dkdv_item(const ompk_attn_geom *g, const void *dout, const void *q,
                                     const void *k, const void *v, const float *lse,
                                     const float *dsum, void *dk, void *dv, int64_t w,
                                     int64_t nblk) {
    int64_t j0 = (w % nblk) * ATH_L, bh = w / nblk;
#define ATH_DKDV(D)                                                                                \
    ath_dkdv_block(g, dout, q, k, v, lse, dsum, dk, dv, bh / g->Hkv, bh % g->Hkv, j0, D)
    ATT_SWITCH_DH(g->dh, ATH_DKDV)
#undef ATH_DKDV
}

ATH_TARGET static void ath_bwd_head_item(const ompk_attn_geom *g, const void *dout, const void *q,
                                         const void *k, const void *v, const float *lse,
                                         const float *dsum, void *dq, void *dk, void *dv, int64_t w,
                                         float *dqa) {
#define ATH_HEADF(D)                                                                               \
    ath_bwd_head_f(g, dout, q, k, v, lse, dsum, dq, dk, dv, w / g->Hkv, w % g->Hkv, dqa, D)
#define ATH_HEAD(D)                                                                                \
    ath_bwd_head(g, dout, q, k, v, lse, dsum, dq, dk, dv, w / g->Hkv, w % g->Hkv, dqa, D)
    if (g->bf16) {
        ATT_SWITCH_DH(g->dh, ATH_HEAD)
    } else {
        ATT_SWITCH_DH(g->dh, ATH_HEADF)
    }
#undef ATH_HEADF
#undef ATH_HEAD
}

/* Backward: one pass per kv head (five products) when the heads spread evenly over the
 * threads; otherwise bf16 runs dk/dv and dq as two passes (seven products) and f32 is left to
 * the portable kernel. */
static int ath_heads_even(const ompk_attn_geom *g) {
    const int64_t nt = omp_get_max_threads(), heads = g->B * g->Hkv;
    const int64_t acc_bytes = 4 * (g->Hq / g->Hkv) * g->N * g->dh; /* per thread */
    return (heads % nt == 0 || heads >= 4 * nt) && acc_bytes <= ((int64_t)64 << 20);
}

int ompk_attn_host_ok(ompk_exec ex, const ompk_attn_geom *g, int bwd) {
    /* empty q or k/v go to the portable kernel: these kernels form row pointers from the
     * tensors' data, which may be NULL when empty */
    if (ex.on_target || g->dh % 16 != 0 || g->dh > ATH_DMAX || g->N == 0 || g->M == 0) return 0;
    if (bwd && !g->bf16 && !ath_heads_even(g)) return 0;
    const ompk_cpu_features *f = ompk_cpu_get();
    return f->avx512f && f->avx512bw && f->avx512vl && (f->avx512_bf16 || !g->bf16);
}

/* Work items in order of decreasing cost under a causal mask (later query blocks see more
 * keys; earlier key blocks are seen by more rows), so dynamic scheduling ends balanced. */
void ompk_attn_fwd_host(const ompk_attn_geom *gp, const void *q, const void *k, const void *v,
                        void *out, float *lse) {
    const ompk_attn_geom g = *gp;
    const int64_t nblk = (g.N + ATH_L - 1) / ATH_L, items = g.B * g.Hq * nblk;
    const int rev = g.mask != 0;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t w = 0; w < items; w++) {
        int64_t x = rev ? (w / nblk) * nblk + (nblk - 1 - w % nblk) : w;
        ath_fwd_item(&g, q, k, v, out, lse, x, nblk);
    }
}

int ompk_attn_bwd_host(const ompk_attn_geom *gp, const void *dout, const void *q, const void *k,
                       const void *v, const float *lse, void *dq, void *dk, void *dv,
                       const float *dsum) {
    const ompk_attn_geom g = *gp;
    const int64_t kblk = (g.M + ATH_L - 1) / ATH_L, kitems = g.B * g.Hkv * kblk;
    const int64_t qblk = (g.N + ATH_L - 1) / ATH_L, qitems = g.B * g.Hq * qblk;
    const int rev = g.mask != 0;
    if (ath_heads_even(&g)) {
        /* each item owns a [G][N][dh] f32 dq accumulator */
        const size_t per = sizeof(float) * (size_t)(g.Hq / g.Hkv * g.N * g.dh);
        const int64_t heads = g.B * g.Hkv;
        int failed = 0;
#pragma omp parallel reduction(| : failed)
        {
            float *dqa = malloc(per);
            failed = dqa == NULL;
#pragma omp for schedule(dynamic, 1)
            for (int64_t w = 0; w < heads; w++)
                if (dqa) ath_bwd_head_item(&g, dout, q, k, v, lse, dsum, dq, dk, dv, w, dqa);
            free(dqa);
        }
        if (!failed) return 0;
        if (!g.bf16) return -1; /* bf16 goes on with the two passes, which need no workspace */
    }
#pragma omp parallel
    {
#pragma omp for schedule(dynamic, 1) nowait
        for (int64_t w = 0; w < kitems; w++)
            ath_dkdv_item(&g, dout, q, k, v, lse, dsum, dk, dv, w, kblk);
#pragma omp for schedule(dynamic, 1)
        for (int64_t w = 0; w < qitems; w++) {
            int64_t x = rev ? (w / qblk) * qblk + (qblk - 1 - w % qblk) : w;
            ath_dq_item(&g, dout, q, k, v, lse, dsum, dq, x, qblk);
        }
    }
    return 0;
}

#else /* not x86-64: the portable kernel serves every host call */

int ompk_attn_host_ok(ompk_exec ex, const ompk_attn_geom *g, int bwd) {
    (void)ex, (void)g, (void)bwd;
    return 0;
}
void ompk_attn_fwd_host(const ompk_attn_geom *g, const void *q, const void *k, const void *v,
                        void *out, float *lse) {
    (void)g, (void)q, (void)k, (void)v, (void)out, (void)lse;
}
int ompk_attn_bwd_host(const ompk_attn_geom *g, const void *dout, const void *q, const void *k,
                       const void *v, const float *lse, void *dq, void *dk, void *dv,
                       const float *dsum) {
    (void)g, (void)dout, (void)q, (void)k, (void)v, (void)lse, (void)dq, (void)dk, (void)dv;
    (void)dsum;
    return -1;
}
#endif
