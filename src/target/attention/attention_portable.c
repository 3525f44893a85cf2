/* Portable flash attention: OpenMP target teams loops, one source for the GPU and the host.
 *
 * Forward: each work item is a block of query rows of one (b, h); it streams the visible keys in
 * tiles of ATT_BK, keeps per-row running max m, running sum l and an fp32 accumulator, and
 * rescales them when the max grows (online softmax). Scores live only in a ATT_RB x ATT_BK tile.
 * Backward (FlashAttention-2 recompute): D_i = rowsum(dout_i * out_i), then one pass parallel over
 * key blocks (each owns its dk/dv rows and visits the group's query heads and rows in a fixed
 * order: deterministic, no atomics) and one pass parallel over query rows for dq.
 * Scores are s = <q, k> * scale in natural units, computed the same way in the forward and both
 * backward passes, so the backward's p = exp(s - lse) is exactly 1 where the forward's softmax
 * was one-hot, at any logit size. Differences s - m or s - lse are taken before the scaling to
 * log2 e for the polynomial exp2 (vectorizes on the host): scaling first loses the low bits of
 * large logits. A masked pair adds exactly 0 (never 0 * NaN); a NaN score propagates. The host
 * regions work on ATT_RB rows at a time so one key row, converted once, feeds several rows from L1;
 * GPU regions give each thread one row, but for the forward up to dh 128, which runs on team-shared
 * tiles (attention_portable_tiled.c). The pieces both files use are in attention_portable.h. */
#include <math.h>
#include <stdint.h>

#include "attention_portable.h"

#pragma omp declare target

/* lse of row i of head (b, h) from this kernel's own fp32 scores (att_dot * scale, as the
 * backward recomputes them); -inf for a row that sees no key, NaN for a NaN score. */
ATT_INLINE float att_row_lse(const ompk_attn_geom *g, const void *q, const void *k, int64_t b,
                             int64_t h, int64_t i, const int bf) {
    const int64_t dh = g->dh, hk = h / (g->Hq / g->Hkv);
    const int64_t lim = ompk_attn_key_limit(g->mask, i, g->N, g->M);
    float qf[ATT_DMAX], kf[ATT_DMAX];
    att_load_row(qf, q, att_row(g->qs, b, h, i), dh, 1.f, bf);
    float m = -INFINITY, l = 0.f;
    for (int64_t j = 0; j < lim; j++) {
        int64_t koff = att_row(g->ks, b, hk, j);
        const float *kr = (const float *)k + koff;
        if (bf) {
            att_load_row(kf, k, koff, dh, 1.f, bf);
            kr = kf;
        }
        const float x = att_score(att_dot(qf, kr, dh), g->scale);
        if (x > m) { /* a NaN score leaves m alone and turns l into NaN below */
            l *= att_exp2((m - x) * ATT_LOG2E);
            m = x;
        }
        l += att_exp2((x - (m == -INFINITY ? 0.f : m)) * ATT_LOG2E);
    }
    return att_lse(lim > 0, m, l);
}

/* dq for rows i0 .. i0+rb-1 of head (b, h). */
ATT_INLINE void att_dq_block(const ompk_attn_geom *g, const void *dout, const void *q,
                             const void *k, const void *v, const float *lse, const float *dsum,
                             void *dq, int64_t b, int64_t h, int64_t i0, const int RB,
                             const int bf) {
    const int64_t dh = g->dh, N = g->N, M = g->M;
    const int64_t hk = h / (g->Hq / g->Hkv);
    int rb = (int)(N - i0 < RB ? N - i0 : RB);
    float qf[RB][ATT_DMAX], dof[RB][ATT_DMAX], acc[RB][ATT_DMAX];
    float kf[ATT_DMAX], vf[ATT_DMAX], l2[RB], Di[RB];
    int64_t lim[RB];
    int64_t jmax = 0;
    for (int r = 0; r < rb; r++) {
        int64_t i = i0 + r;
        att_load_row(qf[r], q, att_row(g->qs, b, h, i), dh, 1.f, bf);
        att_load_row(dof[r], dout, att_row(g->dos, b, h, i), dh, 1.f, bf);
        for (int64_t d = 0; d < dh; d++) acc[r][d] = 0.f;
        float l = lse[att_row(g->ls, b, h, i)];
        l2[r] = l;
        Di[r] = dsum[(b * g->Hq + h) * N + i];
        lim[r] = l == -INFINITY ? 0 : ompk_attn_key_limit(g->mask, i, N, M);
        jmax = lim[r] > jmax ? lim[r] : jmax;
    }
    for (int64_t j = 0; j < jmax; j++) {
        int64_t koff = att_row(g->ks, b, hk, j), voff = att_row(g->vs, b, hk, j);
        const float *kr = (const float *)k + koff, *vr = (const float *)v + voff;
        if (bf) {
            att_load_row(kf, k, koff, dh, 1.f, bf);
            att_load_row(vf, v, voff, dh, 1.f, bf);
            kr = kf;
            vr = vf;
        }
        for (int r = 0; r < rb; r++) {
            if (j >= lim[r]) continue;
            float s = att_score(att_dot(qf[r], kr, dh), g->scale);
            float p = att_exp2((s - l2[r]) * ATT_LOG2E);
            float ds = p * (att_dot(dof[r], vr, dh) - Di[r]);
            float *restrict a = acc[r];
            for (int64_t d = 0; d < dh; d++) a[d] += ds * kr[d];
        }
    }
    for (int r = 0; r < rb; r++) {
        int64_t off = att_row(g->dqs, b, h, i0 + r);
        for (int64_t d = 0; d < dh; d++) att_st(dq, off + d, acc[r][d] * g->scale, bf);
    }
}

/* dk, dv for keys j0 .. j0+cb-1 of kv head (b, hk), summed over the group's query heads in
 * increasing head order, then increasing row order. */
ATT_INLINE void att_dkdv_block(const ompk_attn_geom *g, const void *dout, const void *q,
                               const void *k, const void *v, const float *lse, const float *dsum,
                               void *dk, void *dv, int64_t b, int64_t hk, int64_t j0, const int CB,
                               const int bf) {
    const int64_t dh = g->dh, N = g->N, M = g->M, G = g->Hq / g->Hkv;
    int cb = (int)(M - j0 < CB ? M - j0 : CB);
    float kf[CB][ATT_DMAX], vf[CB][ATT_DMAX], dka[CB][ATT_DMAX], dva[CB][ATT_DMAX];
    float qf[ATT_DMAX], dof[ATT_DMAX];
    for (int c = 0; c < cb; c++) {
        att_load_row(kf[c], k, att_row(g->ks, b, hk, j0 + c), dh, 1.f, bf);
        att_load_row(vf[c], v, att_row(g->vs, b, hk, j0 + c), dh, 1.f, bf);
        for (int64_t d = 0; d < dh; d++) dka[c][d] = dva[c][d] = 0.f;
    }
    int64_t ifirst = ompk_attn_first_row(g->mask, j0, N, M);
    for (int64_t h = hk * G; h < (hk + 1) * G; h++)
        for (int64_t i = ifirst; i < N; i++) {
            float l = lse[att_row(g->ls, b, h, i)];
            if (l == -INFINITY) continue;
            int64_t lim = ompk_attn_key_limit(g->mask, i, N, M);
            if (lim <= j0) continue;
            att_load_row(qf, q, att_row(g->qs, b, h, i), dh, 1.f, bf);
            att_load_row(dof, dout, att_row(g->dos, b, h, i), dh, 1.f, bf);
            float Di = dsum[(b * g->Hq + h) * N + i];
            for (int c = 0; c < cb; c++) {
                if (j0 + c >= lim) break;
                float s = att_score(att_dot(qf, kf[c], dh), g->scale);
                float p = att_exp2((s - l) * ATT_LOG2E);
                float ds = p * (att_dot(dof, vf[c], dh) - Di);
                float *restrict a = dka[c], *restrict e = dva[c];
                for (int64_t d = 0; d < dh; d++) {
                    a[d] += ds * qf[d];
                    e[d] += p * dof[d];
                }
            }
        }
    for (int c = 0; c < cb; c++) {
        int64_t ko = att_row(g->dks, b, hk, j0 + c), vo = att_row(g->dvs, b, hk, j0 + c);
        for (int64_t d = 0; d < dh; d++) {
            att_st(dk, ko + d, dka[c][d] * g->scale, bf);
            att_st(dv, vo + d, dva[c][d], bf);
        }
    }
}

/* Host blocks: ATT_LANES rows (or keys) sit in vector lanes with a compile-time head dim. The
 * lane-side operand is transposed once per block (xT[d][lane]); the other side is staged per
 * tile as fp32 rows. Every product is then one of two shapes, both plain loops over the lanes
 * that the compiler turns into vector FMAs with a broadcast operand:
 *   att_tile_dot:   out[t][lane] = sum_d xT[d][lane] * rows[t][d]       (4 rows at a time)
 *   att_tile_accum: accT[d][lane] += sum_t w[t][lane] * rows[t][d]       (4 d at a time)
 * There is no transposition inside the key loop and softmax statistics are lane-wise. */
#define ATT_LANES 16

ATT_INLINE void att_tile_dot(float (*restrict out)[ATT_LANES],
                             const float (*restrict xT)[ATT_LANES],
                             const float (*restrict rows)[ATT_DMAX], const int n, const int DH) {
    enum { L = ATT_LANES };
    for (int t = 0; t < n; t += 4) {
        const float *r0 = rows[t], *r1 = rows[t + 1 < n ? t + 1 : t];
        const float *r2 = rows[t + 2 < n ? t + 2 : t], *r3 = rows[t + 3 < n ? t + 3 : t];
        float s0[L], s1[L], s2[L], s3[L];
        for (int l = 0; l < L; l++) s0[l] = s1[l] = s2[l] = s3[l] = 0.f;
        for (int d = 0; d < DH; d++) {
            const float a0 = r0[d], a1 = r1[d], a2 = r2[d], a3 = r3[d];
            for (int l = 0; l < L; l++) {
                s0[l] += xT[d][l] * a0;
                s1[l] += xT[d][l] * a1;
                s2[l] += xT[d][l] * a2;
                s3[l] += xT[d][l] * a3;
            }
        }
        for (int l = 0; l < L; l++) {
            out[t][l] = s0[l];
            out[t + 1][l] = s1[l];
            out[t + 2][l] = s2[l];
            out[t + 3][l] = s3[l];
        }
    }
}

ATT_INLINE void att_tile_accum(float (*restrict accT)[ATT_LANES],
                               const float (*restrict w)[ATT_LANES],
                               const float (*restrict rows)[ATT_DMAX], const int n, const int DH) {
    enum { L = ATT_LANES };
    for (int d = 0; d < DH; d += 4) {
        float c0[L], c1[L], c2[L], c3[L];
        for (int l = 0; l < L; l++) {
            c0[l] = accT[d][l];
            c1[l] = accT[d + 1][l];
            c2[l] = accT[d + 2][l];
            c3[l] = accT[d + 3][l];
        }
        for (int t = 0; t < n; t++) {
            const float *rt = rows[t] + d;
            const float v0 = rt[0], v1 = rt[1], v2 = rt[2], v3 = rt[3];
            for (int l = 0; l < L; l++) {
                c0[l] += w[t][l] * v0;
                c1[l] += w[t][l] * v1;
                c2[l] += w[t][l] * v2;
                c3[l] += w[t][l] * v3;
            }
        }
        for (int l = 0; l < L; l++) {
            accT[d][l] = c0[l];
            accT[d + 1][l] = c1[l];
            accT[d + 2][l] = c2[l];
            accT[d + 3][l] = c3[l];
        }
    }
}

/* att_tile_accum for a tile that a mask cuts through: only pairs with vis[t][lane] != 0 add,
 * so a masked pair adds exactly 0 even against an inf or NaN row element. */
ATT_INLINE void att_tile_accum_vis(float (*restrict accT)[ATT_LANES],
                                   const float (*restrict w)[ATT_LANES],
                                   const float (*restrict vis)[ATT_LANES],
                                   const float (*restrict rows)[ATT_DMAX], const int n,
                                   const int DH) {
    enum { L = ATT_LANES };
    for (int d = 0; d < DH; d += 4) {
        float c0[L], c1[L], c2[L], c3[L];
        for (int l = 0; l < L; l++) {
            c0[l] = accT[d][l];
            c1[l] = accT[d + 1][l];
            c2[l] = accT[d + 2][l];
            c3[l] = accT[d + 3][l];
        }
        for (int t = 0; t < n; t++) {
            const float *rt = rows[t] + d;
            const float v0 = rt[0], v1 = rt[1], v2 = rt[2], v3 = rt[3];
            for (int l = 0; l < L; l++) {
                const int on = vis[t][l] != 0.f;
                c0[l] += on ? w[t][l] * v0 : 0.f;
                c1[l] += on ? w[t][l] * v1 : 0.f;
                c2[l] += on ? w[t][l] * v2 : 0.f;
                c3[l] += on ? w[t][l] * v3 : 0.f;
            }
        }
        for (int l = 0; l < L; l++) {
            accT[d][l] = c0[l];
            accT[d + 1][l] = c1[l];
            accT[d + 2][l] = c2[l];
            accT[d + 3][l] = c3[l];
        }
    }
}

/* n rows of a [.., L, dh] tensor from row r0 (row stride rs, offset base) as fp32 rows in dst,
 * f32 rows copied too: the tile loops below read a row's four elements at a time, which GCC may
 * widen into a load that reaches into the next row (dead, but past the tensor's end after its
 * last row); from dst it stays in the caller's stack frame. */
ATT_INLINE const float (*att_stage_rows(float (*restrict dst)[ATT_DMAX], const void *src,
                                        int64_t base, int64_t rs, int64_t r0, const int n,
                                        const int DH, const int bf))[ATT_DMAX] {
    for (int t = 0; t < n; t++)
        for (int d = 0; d < DH; d++) dst[t][d] = att_ld(src, base + (r0 + t) * rs + d, bf);
    return (const float(*)[ATT_DMAX])dst;
}

/* xT[d][lane] = row (r0 + lane) * mul, zero lanes past n. */
ATT_INLINE void att_stage_T(float (*restrict xT)[ATT_LANES], const void *src, int64_t base,
                            int64_t rs, int64_t r0, const int n, const int DH, float mul,
                            const int bf) {
    for (int l = 0; l < ATT_LANES; l++) {
        int64_t o = base + (r0 + (l < n ? l : 0)) * rs;
        for (int d = 0; d < DH; d++) xT[d][l] = l < n ? att_ld(src, o + d, bf) * mul : 0.f;
    }
}

/* Host forward for ATT_LANES rows with a compile-time head dim. The rows sit in vector lanes:
 * q is transposed once per block (qT[d][row]), so a score column s[key][row] is DH vector FMAs
 * with the key element broadcast, softmax statistics are lane-wise, and P*V accumulates into
 * accT[d][row] four d at a time. No transposition inside the key loop. */
ATT_INLINE void att_fwd_block_h(const ompk_attn_geom *g, const void *q, const void *k,
                                const void *v, void *out, float *lse, int64_t b, int64_t h,
                                int64_t i0, const int DH, const int bf) {
    enum { L = ATT_LANES, BK = ATT_BK };
    const int64_t N = g->N, M = g->M;
    const int64_t hk = h / (g->Hq / g->Hkv);
    const int rb = (int)(N - i0 < L ? N - i0 : L);
    const float sc = g->scale;
    float qT[ATT_DMAX][L], accT[ATT_DMAX][L], st[BK][L], kr[BK][ATT_DMAX], vis[BK][L];
    float mrow[L], lrow[L], limf[L], alpha[L];
    int64_t jmax = 0, jmin = M;
    for (int r = 0; r < L; r++) {
        int64_t lim = r < rb ? ompk_attn_key_limit(g->mask, i0 + r, N, M) : 0;
        limf[r] = (float)lim;
        jmax = lim > jmax ? lim : jmax;
        jmin = r < rb && lim < jmin ? lim : jmin;
        mrow[r] = -INFINITY;
        lrow[r] = 0.f;
    }
    for (int r = 0; r < L; r++) {
        int64_t qo = att_row(g->qs, b, h, i0 + (r < rb ? r : 0));
        for (int d = 0; d < DH; d++) qT[d][r] = r < rb ? att_ld(q, qo + d, bf) : 0.f;
    }
    for (int d = 0; d < DH; d++)
        for (int r = 0; r < L; r++) accT[d][r] = 0.f;
    for (int64_t j0 = 0; j0 < jmax; j0 += BK) {
        const int jn = (int)(jmax - j0 < BK ? jmax - j0 : BK);
        const float(*kp)[ATT_DMAX] =
            att_stage_rows(kr, k, att_row(g->ks, b, hk, 0), g->ks[2], j0, jn, DH, bf);
        /* the scores as both backward passes form them (same FMA chain on every compiler), so
         * their p = exp(s - lse) is exactly 1 where this softmax is one-hot */
        att_tile_dot(st, (const float(*)[L])qT, kp, jn, DH);
        /* online softmax, lane-wise */
        float mx[L];
        for (int r = 0; r < L; r++) mx[r] = mrow[r];
        const int cut = j0 + jn > jmin; /* some row of the block cannot see some key of the tile */
        for (int jj = 0; jj < jn; jj++) {
            const float jf = (float)(j0 + jj);
            for (int r = 0; r < L; r++) {
                float x = jf < limf[r] ? att_score(st[jj][r], sc) : -INFINITY;
                st[jj][r] = x;
                mx[r] = x > mx[r] ? x : mx[r];
            }
            if (cut)
                for (int r = 0; r < L; r++) vis[jj][r] = jf < limf[r] ? 1.f : 0.f;
        }
        for (int r = 0; r < L; r++) {
            /* a row with nothing visible yet keeps m = -inf: its p and alpha are forced to 0 */
            float m = mx[r] == -INFINITY ? 0.f : mx[r];
            alpha[r] = att_exp2((mrow[r] - m) * ATT_LOG2E);
            mx[r] = m;
        }
        float sum[L];
        for (int r = 0; r < L; r++) sum[r] = 0.f;
        for (int jj = 0; jj < jn; jj++)
            for (int r = 0; r < L; r++) {
                float p = att_exp2((st[jj][r] - mx[r]) * ATT_LOG2E);
                st[jj][r] = p;
                sum[r] += p;
            }
        for (int r = 0; r < L; r++) {
            lrow[r] = lrow[r] * alpha[r] + sum[r];
            mrow[r] = lrow[r] > 0.f ? mx[r] : -INFINITY;
        }
        /* P * V, four d at a time; the staged keys are spent: their buffer takes the values */
        for (int d = 0; d < DH; d++)
            for (int r = 0; r < L; r++) accT[d][r] *= alpha[r];
        const float(*vp)[ATT_DMAX] =
            att_stage_rows(kr, v, att_row(g->vs, b, hk, 0), g->vs[2], j0, jn, DH, bf);
        if (cut)
            att_tile_accum_vis(accT, (const float(*)[L])st, (const float(*)[L])vis, vp, jn, DH);
        else
            att_tile_accum(accT, (const float(*)[L])st, vp, jn, DH);
    }
    for (int r = 0; r < rb; r++) {
        float inv = att_inv_l(limf[r] > 0.f, lrow[r]);
        int64_t ooff = att_row(g->os, b, h, i0 + r);
        for (int d = 0; d < DH; d++) att_st(out, ooff + d, accT[d][r] * inv, bf);
        if (lse) lse[att_row(g->ls, b, h, i0 + r)] = att_lse(limf[r] > 0.f, mrow[r], lrow[r]);
    }
}

/* dq for ATT_LANES query rows of head (b, h). */
ATT_INLINE void att_dq_block_h(const ompk_attn_geom *g, const void *dout, const void *q,
                               const void *k, const void *v, const float *lse, const float *dsum,
                               void *dq, int64_t b, int64_t h, int64_t i0, const int DH,
                               const int bf) {
    enum { L = ATT_LANES, BK = ATT_BK };
    const int64_t N = g->N, M = g->M;
    const int64_t hk = h / (g->Hq / g->Hkv);
    const int rb = (int)(N - i0 < L ? N - i0 : L);
    float qT[ATT_DMAX][L], doT[ATT_DMAX][L], dqT[ATT_DMAX][L], st[BK][L], pt[BK][L];
    float kr[BK][ATT_DMAX], vr[BK][ATT_DMAX], l2[L], Di[L], limf[L];
    const float sc = g->scale;
    int64_t jmax = 0, jmin = M;
    for (int r = 0; r < L; r++) {
        int64_t i = i0 + (r < rb ? r : 0);
        float l = r < rb ? lse[att_row(g->ls, b, h, i)] : -INFINITY;
        int64_t lim = l == -INFINITY ? 0 : ompk_attn_key_limit(g->mask, i, N, M);
        limf[r] = (float)lim;
        jmax = lim > jmax ? lim : jmax;
        jmin = r < rb && lim < jmin ? lim : jmin;
        l2[r] = l == -INFINITY ? 0.f : l;
        Di[r] = r < rb ? dsum[(b * g->Hq + h) * N + i] : 0.f;
    }
    att_stage_T(qT, q, att_row(g->qs, b, h, 0), g->qs[2], i0, rb, DH, 1.f, bf);
    att_stage_T(doT, dout, att_row(g->dos, b, h, 0), g->dos[2], i0, rb, DH, 1.f, bf);
    for (int d = 0; d < DH; d++)
        for (int r = 0; r < L; r++) dqT[d][r] = 0.f;
    const int64_t kb = att_row(g->ks, b, hk, 0), vb = att_row(g->vs, b, hk, 0);
    for (int64_t j0 = 0; j0 < jmax; j0 += BK) {
        const int jn = (int)(jmax - j0 < BK ? jmax - j0 : BK);
        const float(*kp)[ATT_DMAX] = att_stage_rows(kr, k, kb, g->ks[2], j0, jn, DH, bf);
        const float(*vp)[ATT_DMAX] = att_stage_rows(vr, v, vb, g->vs[2], j0, jn, DH, bf);
        att_tile_dot(st, qT, kp, jn, DH);
        att_tile_dot(pt, doT, vp, jn, DH);
        for (int jj = 0; jj < jn; jj++) {
            const float jf = (float)(j0 + jj);
            for (int r = 0; r < L; r++) {
                float p = att_exp2((att_score(st[jj][r], sc) - l2[r]) * ATT_LOG2E);
                st[jj][r] = jf < limf[r] ? p * (pt[jj][r] - Di[r]) : 0.f;
                pt[jj][r] = jf < limf[r] ? 1.f : 0.f;
            }
        }
        if (j0 + jn > jmin) /* a mask cuts the tile: pt holds which pairs are visible */
            att_tile_accum_vis(dqT, (const float(*)[L])st, (const float(*)[L])pt, kp, jn, DH);
        else
            att_tile_accum(dqT, (const float(*)[L])st, kp, jn, DH);
    }
    for (int r = 0; r < rb; r++) {
        int64_t off = att_row(g->dqs, b, h, i0 + r);
        for (int d = 0; d < DH; d++) att_st(dq, off + d, dqT[d][r] * g->scale, bf);
    }
}

/* dk, dv for ATT_LANES keys of kv head (b, hk): the group's query heads in increasing order,
 * their rows in increasing order, each lane summing its own key (deterministic). */
ATT_INLINE void att_dkdv_block_h(const ompk_attn_geom *g, const void *dout, const void *q,
                                 const void *k, const void *v, const float *lse, const float *dsum,
                                 void *dk, void *dv, int64_t b, int64_t hk, int64_t j0,
                                 const int DH, const int bf) {
    enum { L = ATT_LANES, BQ = ATT_BK };
    const int64_t N = g->N, M = g->M, G = g->Hq / g->Hkv;
    const int cb = (int)(M - j0 < L ? M - j0 : L);
    float kT[ATT_DMAX][L], vT[ATT_DMAX][L], dkT[ATT_DMAX][L], dvT[ATT_DMAX][L];
    float st[BQ][L], pt[BQ][L], qr[BQ][ATT_DMAX], dr[BQ][ATT_DMAX];
    float l2[BQ], Di[BQ], limf[BQ], jf[L], vis[BQ][L];
    const float sc = g->scale;
    att_stage_T(kT, k, att_row(g->ks, b, hk, 0), g->ks[2], j0, cb, DH, 1.f, bf);
    att_stage_T(vT, v, att_row(g->vs, b, hk, 0), g->vs[2], j0, cb, DH, 1.f, bf);
    for (int d = 0; d < DH; d++)
        for (int c = 0; c < L; c++) dkT[d][c] = dvT[d][c] = 0.f;
    /* lanes past the last key get an index no row sees */
    for (int c = 0; c < L; c++) jf[c] = c < cb ? (float)(j0 + c) : (float)M + 1.f;
    const int64_t ifirst = ompk_attn_first_row(g->mask, j0, N, M);
    for (int64_t h = hk * G; h < (hk + 1) * G; h++) {
        const int64_t qb = att_row(g->qs, b, h, 0), ob = att_row(g->dos, b, h, 0);
        for (int64_t ii0 = ifirst; ii0 < N; ii0 += BQ) {
            const int in = (int)(N - ii0 < BQ ? N - ii0 : BQ);
            float lmin = (float)M + 1.f;
            for (int t = 0; t < in; t++) {
                int64_t i = ii0 + t;
                float l = lse[att_row(g->ls, b, h, i)];
                limf[t] = l == -INFINITY ? 0.f : (float)ompk_attn_key_limit(g->mask, i, N, M);
                lmin = limf[t] < lmin ? limf[t] : lmin;
                l2[t] = l == -INFINITY ? 0.f : l;
                Di[t] = dsum[(b * g->Hq + h) * N + i];
            }
            /* some row of the tile cannot see some key of the block */
            const int cut = lmin < (float)(j0 + cb);
            const float(*qp)[ATT_DMAX] = att_stage_rows(qr, q, qb, g->qs[2], ii0, in, DH, bf);
            const float(*dp)[ATT_DMAX] = att_stage_rows(dr, dout, ob, g->dos[2], ii0, in, DH, bf);
            att_tile_dot(st, kT, qp, in, DH);
            att_tile_dot(pt, vT, dp, in, DH);
            for (int t = 0; t < in; t++)
                for (int c = 0; c < L; c++) {
                    float p = att_exp2((att_score(st[t][c], sc) - l2[t]) * ATT_LOG2E);
                    st[t][c] = jf[c] < limf[t] ? p : 0.f;
                    pt[t][c] = jf[c] < limf[t] ? p * (pt[t][c] - Di[t]) : 0.f;
                    vis[t][c] = jf[c] < limf[t] ? 1.f : 0.f;
                }
            if (cut) {
                att_tile_accum_vis(dvT, (const float(*)[L])st, (const float(*)[L])vis, dp, in, DH);
                att_tile_accum_vis(dkT, (const float(*)[L])pt, (const float(*)[L])vis, qp, in, DH);
            } else {
                att_tile_accum(dvT, (const float(*)[L])st, dp, in, DH);
                att_tile_accum(dkT, (const float(*)[L])pt, qp, in, DH);
            }
        }
    }
    for (int c = 0; c < cb; c++) {
        int64_t ko = att_row(g->dks, b, hk, j0 + c), vo = att_row(g->dvs, b, hk, j0 + c);
        for (int d = 0; d < DH; d++) {
            att_st(dk, ko + d, dkT[d][c] * g->scale, bf);
            att_st(dv, vo + d, dvT[d][c], bf);
        }
    }
}

/* Host work items: cloned for AVX-512 and baseline x86-64 (picked at load time), since the
 * library is built for baseline x86-64. The GPU image compiles them too but never calls them.
 * GCC offload builds do not clone: GCC hands the host's declare-target functions to its offload
 * compiler, which cannot take a clone's resolver. */
#if defined(__x86_64__) && !defined(__NVPTX__) && !defined(__AMDGCN__) &&                          \
    !(defined(OMPK_OFFLOAD_BUILD) && !defined(__clang__))
#define ATT_HOST_CLONES __attribute__((target_clones("arch=x86-64-v4", "default")))
#else
#define ATT_HOST_CLONES
#endif

ATT_HOST_CLONES static void att_fwd_host(const ompk_attn_geom *g, const void *q, const void *k,
                                         const void *v, void *out, float *lse, int64_t w,
                                         int64_t nblk) {
    int64_t i0 = (w % nblk) * ATT_LANES, bh = w / nblk, b = bh / g->Hq, h = bh % g->Hq;
#define ATT_FWD_H1(D) att_fwd_block_h(g, q, k, v, out, lse, b, h, i0, D, 1)
#define ATT_FWD_H0(D) att_fwd_block_h(g, q, k, v, out, lse, b, h, i0, D, 0)
    if (g->bf16) {
        ATT_SWITCH_DH(g->dh, ATT_FWD_H1)
    } else {
        ATT_SWITCH_DH(g->dh, ATT_FWD_H0)
    }
#undef ATT_FWD_H1
#undef ATT_FWD_H0
}

ATT_HOST_CLONES static void att_dq_host(const ompk_attn_geom *g, const void *dout, const void *q,
                                        const void *k, const void *v, const float *lse,
                                        const float *dsum, void *dq, int64_t w, int64_t nblk) {
    int64_t i0 = (w % nblk) * ATT_LANES, bh = w / nblk, b = bh / g->Hq, h = bh % g->Hq;
#define ATT_DQ_H1(D) att_dq_block_h(g, dout, q, k, v, lse, dsum, dq, b, h, i0, D, 1)
#define ATT_DQ_H0(D) att_dq_block_h(g, dout, q, k, v, lse, dsum, dq, b, h, i0, D, 0)
    if (g->bf16) {
        ATT_SWITCH_DH(g->dh, ATT_DQ_H1)
    } else {
        ATT_SWITCH_DH(g->dh, ATT_DQ_H0)
    }
#undef ATT_DQ_H1
#undef ATT_DQ_H0
}

ATT_HOST_CLONES static void att_dkdv_host(const ompk_attn_geom *g, const void *dout, const void *q,
                                          const void *k, const void *v, const float *lse,
                                          const float *dsum, void *dk, void *dv, int64_t w,
                                          int64_t nblk) {
    int64_t j0 = (w % nblk) * ATT_LANES, bh = w / nblk, b = bh / g->Hkv, hk = bh % g->Hkv;
#define ATT_DKDV_H1(D) att_dkdv_block_h(g, dout, q, k, v, lse, dsum, dk, dv, b, hk, j0, D, 1)
#define ATT_DKDV_H0(D) att_dkdv_block_h(g, dout, q, k, v, lse, dsum, dk, dv, b, hk, j0, D, 0)
    if (g->bf16) {
        ATT_SWITCH_DH(g->dh, ATT_DKDV_H1)
    } else {
        ATT_SWITCH_DH(g->dh, ATT_DKDV_H0)
    }
#undef ATT_DKDV_H1
#undef ATT_DKDV_H0
}

#pragma omp end declare target

void ompk_attn_fwd_portable(ompk_exec ex, const ompk_attn_geom *gp, const void *q, const void *k,
                            const void *v, void *out, float *lse) {
    const ompk_attn_geom g = *gp;
    const int bf = g.bf16;
    if (ex.on_target && ompk_attn_fwd_tiled_ok(&g)) {
        ompk_attn_fwd_tiled(ex, &g, q, k, v, out, lse);
    } else if (ex.on_target) {
        int64_t items = g.B * g.Hq * g.N;
#pragma omp target teams distribute parallel for thread_limit(128) device(ex.device)               \
    is_device_ptr(q, k, v, out, lse) firstprivate(g)
        for (int64_t w = 0; w < items; w++) {
            int64_t i = w % g.N, bh = w / g.N;
            if (bf)
                att_fwd_block(&g, q, k, v, out, lse, bh / g.Hq, bh % g.Hq, i, 1, 1);
            else
                att_fwd_block(&g, q, k, v, out, lse, bh / g.Hq, bh % g.Hq, i, 1, 0);
        }
    } else {
        int64_t nblk = (g.N + ATT_LANES - 1) / ATT_LANES, items = g.B * g.Hq * nblk;
        int nt = ompk_host_teams();
#pragma omp target teams distribute parallel for num_teams(nt)                                     \
    dist_schedule(static, 1) if (target : 0) device(ex.device) is_device_ptr(q, k, v, out, lse)    \
    firstprivate(g)
        for (int64_t w = 0; w < items; w++) att_fwd_host(&g, q, k, v, out, lse, w, nblk);
    }
}

void ompk_attn_rowsum(ompk_exec ex, const ompk_attn_geom *gp, const void *dout, const void *out,
                      float *dsum) {
    const ompk_attn_geom g = *gp;
    const int bf = g.bf16;
    const int on = ex.on_target;
    const int nt = on ? 0 : ompk_host_teams();
    int64_t rows = g.B * g.Hq * g.N;
    /* D_i = rowsum(dout_i * out_i). On the host, one team per thread and no inner parallel
     * (the host fallback otherwise runs a single team). */
#define ATT_DSUM_BODY                                                                              \
    {                                                                                              \
        int64_t i = w % g.N, bh = w / g.N, b = bh / g.Hq, h = bh % g.Hq;                           \
        int64_t oo = att_row(g.os, b, h, i), od = att_row(g.dos, b, h, i);                         \
        float acc = 0.f;                                                                           \
        for (int64_t d = 0; d < g.dh; d++)                                                         \
            acc += att_ld(dout, od + d, bf) * att_ld(out, oo + d, bf);                             \
        dsum[w] = acc;                                                                             \
    }
    if (on) {
#pragma omp target teams distribute parallel for thread_limit(256) device(ex.device)               \
    is_device_ptr(dout, out, dsum) firstprivate(g)
        for (int64_t w = 0; w < rows; w++) ATT_DSUM_BODY
    } else {
#pragma omp target teams distribute num_teams(nt) if (target : 0) device(ex.device)                \
    is_device_ptr(dout, out, dsum) firstprivate(g)
        for (int64_t w = 0; w < rows; w++) ATT_DSUM_BODY
    }
#undef ATT_DSUM_BODY
}

void ompk_attn_bwd_portable(ompk_exec ex, const ompk_attn_geom *gp, const void *dout, const void *q,
                            const void *k, const void *v, const void *out, const float *lse,
                            void *dq, void *dk, void *dv, float *dsum) {
    ompk_attn_geom g = *gp;
    const int bf = g.bf16;
    const int on = ex.on_target;
    const int nt = on ? 0 : ompk_host_teams();
    int64_t rows = g.B * g.Hq * g.N;
    /* the tiled kernels form D themselves, in the order of their dP */
    if (ompk_attn_bwd_tiled_ok(ex, &g)) {
        ompk_attn_bwd_tiled(ex, &g, dout, q, k, v, out, dsum, dsum + rows, dq, dk, dv);
        return;
    }
    ompk_attn_rowsum(ex, gp, dout, out, dsum);
    if (on) {
        /* On the GPU the forward may have been another kernel (3xTF32 for f32, the tensor-core
         * kernel for bf16) whose scores round differently: at large logits p = exp(s - lse)
         * then misses its one-hot 1 by an ulp of the logit. The rows' lse is recomputed from
         * this kernel's scores into the workspace's second half; the lse passed in is unused. */
        float *lw = dsum + rows;
#pragma omp target teams distribute parallel for thread_limit(128) device(ex.device)               \
    is_device_ptr(q, k, lw) firstprivate(g)
        for (int64_t w = 0; w < rows; w++) {
            int64_t i = w % g.N, bh = w / g.N;
            lw[w] = bf ? att_row_lse(&g, q, k, bh / g.Hq, bh % g.Hq, i, 1)
                       : att_row_lse(&g, q, k, bh / g.Hq, bh % g.Hq, i, 0);
        }
        lse = lw;
        g.ls[0] = g.Hq * g.N, g.ls[1] = g.N, g.ls[2] = 1;

        int64_t kitems = g.B * g.Hkv * g.M;
#pragma omp target teams distribute parallel for thread_limit(128) device(ex.device)               \
    is_device_ptr(dout, q, k, v, lse, dsum, dk, dv) firstprivate(g)
        for (int64_t w = 0; w < kitems; w++) {
            int64_t j = w % g.M, bh = w / g.M;
            if (bf)
                att_dkdv_block(&g, dout, q, k, v, lse, dsum, dk, dv, bh / g.Hkv, bh % g.Hkv, j, 1,
                               1);
            else
                att_dkdv_block(&g, dout, q, k, v, lse, dsum, dk, dv, bh / g.Hkv, bh % g.Hkv, j, 1,
                               0);
        }
#pragma omp target teams distribute parallel for thread_limit(128) device(ex.device)               \
    is_device_ptr(dout, q, k, v, lse, dsum, dq) firstprivate(g)
        for (int64_t w = 0; w < rows; w++) {
            int64_t i = w % g.N, bh = w / g.N;
            if (bf)
                att_dq_block(&g, dout, q, k, v, lse, dsum, dq, bh / g.Hq, bh % g.Hq, i, 1, 1);
            else
                att_dq_block(&g, dout, q, k, v, lse, dsum, dq, bh / g.Hq, bh % g.Hq, i, 1, 0);
        }
    } else {
        const int RB = ATT_LANES;
        int64_t kblk = (g.M + RB - 1) / RB, kitems = g.B * g.Hkv * kblk;
#pragma omp target teams distribute parallel for num_teams(nt)                                     \
    dist_schedule(static, 1) if (target : 0) device(ex.device)                                     \
    is_device_ptr(dout, q, k, v, lse, dsum, dk, dv) firstprivate(g)
        for (int64_t w = 0; w < kitems; w++)
            att_dkdv_host(&g, dout, q, k, v, lse, dsum, dk, dv, w, kblk);
        int64_t qblk = (g.N + RB - 1) / RB, qitems = g.B * g.Hq * qblk;
#pragma omp target teams distribute parallel for num_teams(nt)                                     \
    dist_schedule(static, 1) if (target : 0) device(ex.device)                                     \
    is_device_ptr(dout, q, k, v, lse, dsum, dq) firstprivate(g)
        for (int64_t w = 0; w < qitems; w++) att_dq_host(&g, dout, q, k, v, lse, dsum, dq, w, qblk);
    }
}
