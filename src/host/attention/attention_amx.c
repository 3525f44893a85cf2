/* Host attention for bf16 on AMX tiles: the flash schedule of attention_host.c with its products
 * on TDPBF16PS (attention_amx_tmpl.h) and the softmax in fp32 AVX-512, the same numerics as there
 * (fp32 accumulation; P and dS rounded to bf16 before their second product).
 *
 * Work items of 32 query rows (forward, dq) or 32 keys (dk, dv) take 64 keys (rows) a step:
 * S = Q K^T (or K Q^T) and dP by tiles into f32 memory, the row statistics in AVX-512, P (dS)
 * as bf16 rows, then O (dQ, dK, dV) += P V by tiles on f32 accumulators in memory. K, V, Q and
 * dO are packed once per call into the B operands' tile layouts (attention_amx.h), zero-padded to
 * whole tiles, so padded rows and head dims add exact zeros. The backward runs dk/dv and dq as
 * two passes (seven products) so that every item owns its outputs: no atomics, and results do
 * not depend on the thread count or the schedule.
 *
 * A mask that cuts a tile makes the tile multiply masked pairs' P = 0 (dS = 0) with the other
 * operand: where that operand (v; q, k, dout) holds a non-finite value the call goes to the next
 * kernel (attention_impl.c), as on the GPU tensor cores. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention_amx.h"
#include "bf16.h"
#include "cpu.h"
#include "target/attention/attention_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "attention_x86.h"

#define ATX_FN __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl")))
#define ATX_NAME(x) ompk_atx_amx_##x
#define T_CFG(c) OMPK_AMX_LOADCFG(c)
#define T_RELEASE() _tile_release()
#define T_LOAD(i, p, s) _tile_loadd(i, p, s)
#define T_STORE(i, p, s) _tile_stored(i, p, s)
#define T_ZERO(i) _tile_zero(i)
#define T_DPBF16(c, a, b) _tile_dpbf16ps(c, a, b)
#include "attention_amx_tmpl.h"

enum { ATX_R = 32, ATX_W = 64, ATX_DMAX = 256 };

ATH_INLINE void atx_store_bf(ath_bf *dst, __m512 x) {
    _mm256_storeu_si256((__m256i *)dst, (__m256i)_mm512_cvtneps_pbh(x));
}

/* The first n of 16 lanes. */
static inline __mmask16 atx_first(int64_t n) {
    return (__mmask16)(n >= 16 ? 0xFFFF : n <= 0 ? 0 : (1u << n) - 1u);
}

static inline int64_t atx_pad(int64_t n) {
    return (n + ATX_W - 1) / ATX_W * ATX_W;
}

/* One call's packed operands: per head, pad(L) x DP bf16 in a layout of attention_amx.h. */
typedef struct atx_pack {
    uint32_t *p;
    int64_t Lp, per; /* padded rows, uint32 per head */
} atx_pack;

static uint32_t *atx_head(const atx_pack *x, int64_t bh) {
    return x->p + bh * x->per;
}

/* Head bh's "T" tiles of the [L][dh] rows at src (row stride rs): tile row kp gathers pair kp
 * of the 16 rows (indices in bf16 units, so any stride works). */
ATH_TARGET static void atx_pack_T(uint32_t *dst, const ath_bf *src, int64_t rs, int64_t L,
                                  int64_t Lp, int dh, int DP) {
    const int dc = DP / 32;
    const __m512i rows =
        _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                           _mm512_set1_epi32((int)rs));
    for (int64_t nb = 0; nb < Lp / 16; nb++) {
        const __mmask16 valid = atx_first(L - nb * 16);
        const ath_bf *base = src + (valid ? nb * 16 * rs : 0);
        for (int c = 0; c < dc; c++) {
            uint32_t *t = dst + (nb * dc + c) * 256;
            for (int kp = 0; kp < 16; kp++) {
                const int d = 32 * c + 2 * kp;
                const __m512i x = d < dh
                                      ? _mm512_mask_i32gather_epi32(
                                            _mm512_setzero_si512(), valid,
                                            _mm512_add_epi32(rows, _mm512_set1_epi32(d)), base, 2)
                                      : _mm512_setzero_si512();
                _mm512_storeu_si512(t + kp * 16, x);
            }
        }
    }
}

/* Head bh's "P" tiles of the [L][dh] rows at src: tile row kp interleaves rows 2kp and 2kp + 1,
 * 16 head-dim elements at a time (dh is a multiple of 16). */
ATH_TARGET static void atx_pack_P(uint32_t *dst, const ath_bf *src, int64_t rs, int64_t L,
                                  int64_t Lp, int dh, int DP) {
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24,
                                         8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const int d16 = DP / 16;
    for (int64_t s = 0; s < Lp / 32; s++)
        for (int kp = 0; kp < 16; kp++) {
            const int64_t r0 = 32 * s + 2 * kp, r1 = r0 + 1;
            for (int dd = 0; dd < d16; dd++) {
                const int d = 16 * dd;
                const __m256i a = r0 < L && d < dh
                                      ? _mm256_loadu_si256((const __m256i *)(src + r0 * rs + d))
                                      : _mm256_setzero_si256();
                const __m256i b = r1 < L && d < dh
                                      ? _mm256_loadu_si256((const __m256i *)(src + r1 * rs + d))
                                      : _mm256_setzero_si256();
                const __m512i ab = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
                _mm512_storeu_si512(dst + (s * d16 + dd) * 256 + kp * 16,
                                    _mm512_permutexvar_epi16(idx, ab));
            }
        }
}

/* Packs every head of a [B,H,L,dh] operand (strides s) as T or P; 0 when out of memory. */
static int atx_pack_all(atx_pack *x, const ath_bf *src, const int64_t s[3], int64_t B, int64_t H,
                        int64_t L, int dh, int DP, int pairs) {
    x->Lp = atx_pad(L);
    x->per = x->Lp * DP / 2;
    x->p = malloc(sizeof(uint32_t) * (size_t)(B * H * x->per));
    if (!x->p) return 0;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < B * H; bh++) {
        const ath_bf *base = src + ath_row(s, bh / H, bh % H, 0);
        if (pairs)
            atx_pack_P(atx_head(x, bh), base, s[2], L, x->Lp, dh, DP);
        else
            atx_pack_T(atx_head(x, bh), base, s[2], L, x->Lp, dh, DP);
    }
    return 1;
}

/* a[32][DP] = rows r0.. of src (n of them valid), the rest zero. */
static void atx_rows(ath_bf *a, const ath_bf *src, int64_t rs, int64_t r0, int n, int dh, int DP) {
    for (int r = 0; r < ATX_R; r++) {
        if (r < n) memcpy(a + r * DP, src + (r0 + r) * rs, sizeof(ath_bf) * (size_t)dh);
        memset(a + r * DP + (r < n ? dh : 0), 0, sizeof(ath_bf) * (size_t)(r < n ? DP - dh : DP));
    }
}

/* ---- forward: 32 query rows of head (b, h) ------------------------------------------------ */
ATH_TARGET static void atx_fwd_item(const atx_ops *ops, const ompk_attn_geom *g, const ath_bf *q,
                                    const atx_pack *kt, const atx_pack *vp, ath_bf *out, float *lse,
                                    int64_t b, int64_t h, int64_t i0) {
    const int64_t N = g->N, M = g->M, hk = h / (g->Hq / g->Hkv);
    const int dh = (int)g->dh, DP = (dh + 31) / 32 * 32, dc = DP / 32;
    const int rb = (int)(N - i0 < ATX_R ? N - i0 : ATX_R);
    ath_bf qa[ATX_R * ATX_DMAX] __attribute__((aligned(64)));
    ath_bf pb[ATX_R][ATX_W] __attribute__((aligned(64)));
    float s[ATX_R][ATX_W] __attribute__((aligned(64)));
    float o[ATX_R * ATX_DMAX] __attribute__((aligned(64)));
    float m[ATX_R], l[ATX_R];
    int64_t lim[ATX_R], jmax = 0;
    for (int r = 0; r < ATX_R; r++) {
        lim[r] = r < rb ? ompk_attn_key_limit(g->mask, i0 + r, N, M) : 0;
        jmax = lim[r] > jmax ? lim[r] : jmax;
        m[r] = -INFINITY;
        l[r] = 0.f;
    }
    atx_rows(qa, q + ath_row(g->qs, b, h, 0), g->qs[2], i0, rb, dh, DP);
    memset(o, 0, sizeof(float) * ATX_R * (size_t)DP);
    const uint32_t *kh = atx_head(kt, b * g->Hkv + hk), *vh = atx_head(vp, b * g->Hkv + hk);
    const __m512 sc = _mm512_set1_ps(g->scale), ninf = _mm512_set1_ps(-INFINITY);
    const __m512 l2e = _mm512_set1_ps(ATH_LOG2E);
    for (int64_t j0 = 0; j0 < jmax; j0 += ATX_W) {
        ops->nt(&s[0][0], qa, 2 * DP, kh + (j0 / 16) * dc * 256, dc);
        for (int r = 0; r < ATX_R; r++) {
            __m512 x[4];
            __mmask16 vk[4];
            __m512 vmax = ninf;
            for (int u = 0; u < 4; u++) {
                vk[u] = atx_first(lim[r] - j0 - 16 * u);
                x[u] = _mm512_mask_mul_ps(ninf, vk[u], _mm512_loadu_ps(&s[r][16 * u]), sc);
                vmax = _mm512_max_ps(x[u], vmax); /* a NaN score stays out of the max */
            }
            const float mo = m[r], bm = _mm512_reduce_max_ps(vmax);
            const float mx = bm > mo ? bm : mo;
            /* rows with nothing visible yet keep m = -inf; their p and alpha come out 0 (NaN for
             * a NaN score) */
            const int live = mx != -INFINITY;
            const __m512 msafe = _mm512_set1_ps(live ? mx : 0.f);
            const float alpha =
                mo == -INFINITY
                    ? 0.f
                    : _mm512_cvtss_f32(
                          ath_exp2(_mm512_mul_ps(_mm512_sub_ps(_mm512_set1_ps(mo), msafe), l2e)));
            __m512 sum = _mm512_setzero_ps();
            for (int u = 0; u < 4; u++) {
                __m512 p = ath_exp2(_mm512_mul_ps(_mm512_sub_ps(x[u], msafe), l2e));
                p = _mm512_maskz_mov_ps(vk[u], p);
                sum = _mm512_add_ps(sum, p);
                atx_store_bf(&pb[r][16 * u], p);
            }
            l[r] = fmaf(l[r], alpha, _mm512_reduce_add_ps(sum));
            m[r] = live ? mx : -INFINITY;
            if (alpha != 1.f) { /* skipped at 1: x * 1 is x */
                const __m512 av = _mm512_set1_ps(alpha);
                float *orow = o + r * DP;
                for (int d = 0; d < DP; d += 16)
                    _mm512_storeu_ps(orow + d, _mm512_mul_ps(_mm512_loadu_ps(orow + d), av));
            }
        }
        ops->acc(o, 4 * DP, &pb[0][0], 2 * ATX_W, vh + (j0 / 32) * (DP / 16) * 256, 2, DP / 16);
    }
    for (int r = 0; r < rb; r++) {
        const float inv = ath_inv_l(lim[r] > 0, l[r]);
        ath_bf *orow = out + ath_row(g->os, b, h, i0 + r);
        for (int d = 0; d < dh; d++) orow[d] = ompk_f32_to_bf16(o[r * DP + d] * inv);
        if (lse) lse[ath_row(g->ls, b, h, i0 + r)] = ath_lse(lim[r] > 0, m[r], l[r]);
    }
}

/* ---- dq: 32 query rows of head (b, h) ----------------------------------------------------- */
ATH_TARGET static void atx_dq_item(const atx_ops *ops, const ompk_attn_geom *g, const ath_bf *dout,
                                   const ath_bf *q, const atx_pack *kt, const atx_pack *vt,
                                   const atx_pack *kp, const float *lse, const float *dsum,
                                   ath_bf *dq, int64_t b, int64_t h, int64_t i0) {
    const int64_t N = g->N, M = g->M, hk = h / (g->Hq / g->Hkv);
    const int dh = (int)g->dh, DP = (dh + 31) / 32 * 32, dc = DP / 32;
    const int rb = (int)(N - i0 < ATX_R ? N - i0 : ATX_R);
    ath_bf qa[ATX_R * ATX_DMAX] __attribute__((aligned(64)));
    ath_bf da[ATX_R * ATX_DMAX] __attribute__((aligned(64)));
    ath_bf wb[ATX_R][ATX_W] __attribute__((aligned(64)));
    float s[ATX_R][ATX_W] __attribute__((aligned(64)));
    float dp[ATX_R][ATX_W] __attribute__((aligned(64)));
    float acc[ATX_R * ATX_DMAX] __attribute__((aligned(64)));
    float l2[ATX_R], di[ATX_R];
    int64_t lim[ATX_R], jmax = 0;
    for (int r = 0; r < ATX_R; r++) {
        const float lv = r < rb ? lse[ath_row(g->ls, b, h, i0 + r)] : -INFINITY;
        lim[r] = lv == -INFINITY ? 0 : ompk_attn_key_limit(g->mask, i0 + r, N, M);
        jmax = lim[r] > jmax ? lim[r] : jmax;
        l2[r] = lv == -INFINITY ? 0.f : lv;
        di[r] = r < rb ? dsum[(b * g->Hq + h) * N + i0 + r] : 0.f;
    }
    atx_rows(qa, q + ath_row(g->qs, b, h, 0), g->qs[2], i0, rb, dh, DP);
    atx_rows(da, dout + ath_row(g->dos, b, h, 0), g->dos[2], i0, rb, dh, DP);
    memset(acc, 0, sizeof(float) * ATX_R * (size_t)DP);
    const int64_t kv = b * g->Hkv + hk;
    const uint32_t *kth = atx_head(kt, kv), *vth = atx_head(vt, kv), *kph = atx_head(kp, kv);
    const __m512 sc = _mm512_set1_ps(g->scale);
    for (int64_t j0 = 0; j0 < jmax; j0 += ATX_W) {
        ops->nt(&s[0][0], qa, 2 * DP, kth + (j0 / 16) * dc * 256, dc);
        ops->nt(&dp[0][0], da, 2 * DP, vth + (j0 / 16) * dc * 256, dc);
        for (int r = 0; r < ATX_R; r++) {
            const __m512 lv = _mm512_set1_ps(l2[r]), dv = _mm512_set1_ps(di[r]);
            for (int u = 0; u < 4; u++) {
                const __mmask16 vis = atx_first(lim[r] - j0 - 16 * u);
                const __m512 p = ath_p_of(_mm512_loadu_ps(&s[r][16 * u]), sc, lv);
                const __m512 ds =
                    _mm512_maskz_mul_ps(vis, p, _mm512_sub_ps(_mm512_loadu_ps(&dp[r][16 * u]), dv));
                atx_store_bf(&wb[r][16 * u], ds);
            }
        }
        ops->acc(acc, 4 * DP, &wb[0][0], 2 * ATX_W, kph + (j0 / 32) * (DP / 16) * 256, 2, DP / 16);
    }
    for (int r = 0; r < rb; r++) {
        ath_bf *row = dq + ath_row(g->dqs, b, h, i0 + r);
        for (int d = 0; d < dh; d++) row[d] = ompk_f32_to_bf16(acc[r * DP + d] * g->scale);
    }
}

/* ---- dk, dv: 32 keys of kv head (b, hk); the group's query heads in increasing order, their
 * rows in increasing order ----------------------------------------------------------------- */
ATH_TARGET static void atx_dkdv_item(const atx_ops *ops, const ompk_attn_geom *g, const ath_bf *k,
                                     const ath_bf *v, const atx_pack *qt, const atx_pack *dot,
                                     const atx_pack *qp, const atx_pack *dop, const float *lse,
                                     const float *dsum, ath_bf *dk, ath_bf *dv, int64_t b,
                                     int64_t hk, int64_t j0) {
    const int64_t N = g->N, M = g->M, G = g->Hq / g->Hkv;
    const int dh = (int)g->dh, DP = (dh + 31) / 32 * 32, dc = DP / 32;
    const int cb = (int)(M - j0 < ATX_R ? M - j0 : ATX_R);
    ath_bf ka[ATX_R * ATX_DMAX] __attribute__((aligned(64)));
    ath_bf va[ATX_R * ATX_DMAX] __attribute__((aligned(64)));
    ath_bf pw[ATX_R][ATX_W] __attribute__((aligned(64)));
    ath_bf dw[ATX_R][ATX_W] __attribute__((aligned(64)));
    float st[ATX_R][ATX_W] __attribute__((aligned(64)));
    float dpt[ATX_R][ATX_W] __attribute__((aligned(64)));
    float dka[ATX_R * ATX_DMAX] __attribute__((aligned(64)));
    float dva[ATX_R * ATX_DMAX] __attribute__((aligned(64)));
    float limf[ATX_W], l2[ATX_W], di[ATX_W];
    atx_rows(ka, k + ath_row(g->ks, b, hk, 0), g->ks[2], j0, cb, dh, DP);
    atx_rows(va, v + ath_row(g->vs, b, hk, 0), g->vs[2], j0, cb, dh, DP);
    memset(dka, 0, sizeof(float) * ATX_R * (size_t)DP);
    memset(dva, 0, sizeof(float) * ATX_R * (size_t)DP);
    const __m512 sc = _mm512_set1_ps(g->scale);
    const int64_t ifirst = ompk_attn_first_row(g->mask, j0, N, M) / ATX_W * ATX_W;
    for (int64_t hh = 0; hh < G; hh++) {
        const int64_t h = hk * G + hh, bh = b * g->Hq + h;
        const uint32_t *qth = atx_head(qt, bh), *doth = atx_head(dot, bh);
        const uint32_t *qph = atx_head(qp, bh), *doph = atx_head(dop, bh);
        for (int64_t i0 = ifirst; i0 < N; i0 += ATX_W) {
            ops->nt(&st[0][0], ka, 2 * DP, qth + (i0 / 16) * dc * 256, dc);
            ops->nt(&dpt[0][0], va, 2 * DP, doth + (i0 / 16) * dc * 256, dc);
            /* per query row: the keys it sees (none past the last row) and its lse and D */
            for (int t = 0; t < ATX_W; t++) {
                const int64_t i = i0 + t;
                const float lv = i < N ? lse[ath_row(g->ls, b, h, i)] : -INFINITY;
                limf[t] = lv == -INFINITY ? 0.f : (float)ompk_attn_key_limit(g->mask, i, N, M);
                l2[t] = lv == -INFINITY ? 0.f : lv;
                di[t] = i < N ? dsum[bh * N + i] : 0.f;
            }
            for (int c = 0; c < ATX_R; c++) {
                /* keys past the last get an index no row sees */
                const __m512 jf = _mm512_set1_ps(c < cb ? (float)(j0 + c) : (float)M + 1.f);
                for (int u = 0; u < 4; u++) {
                    const __mmask16 vis =
                        _mm512_cmp_ps_mask(jf, _mm512_loadu_ps(limf + 16 * u), _CMP_LT_OQ);
                    const __m512 p =
                        ath_p_of(_mm512_loadu_ps(&st[c][16 * u]), sc, _mm512_loadu_ps(l2 + 16 * u));
                    const __m512 ds =
                        _mm512_maskz_mul_ps(vis, p,
                                            _mm512_sub_ps(_mm512_loadu_ps(&dpt[c][16 * u]),
                                                          _mm512_loadu_ps(di + 16 * u)));
                    atx_store_bf(&pw[c][16 * u], _mm512_maskz_mov_ps(vis, p));
                    atx_store_bf(&dw[c][16 * u], ds);
                }
            }
            ops->acc(dva, 4 * DP, &pw[0][0], 2 * ATX_W, doph + (i0 / 32) * (DP / 16) * 256, 2,
                     DP / 16);
            ops->acc(dka, 4 * DP, &dw[0][0], 2 * ATX_W, qph + (i0 / 32) * (DP / 16) * 256, 2,
                     DP / 16);
        }
    }
    for (int c = 0; c < cb; c++) {
        ath_bf *ko = dk + ath_row(g->dks, b, hk, j0 + c), *vo = dv + ath_row(g->dvs, b, hk, j0 + c);
        for (int d = 0; d < dh; d++) {
            ko[d] = ompk_f32_to_bf16(dka[c * DP + d] * g->scale);
            vo[d] = ompk_f32_to_bf16(dva[c * DP + d]);
        }
    }
}

static const atx_ops *atx_pick(int emulated) {
    return emulated ? &ompk_atx_emu_ops : &ompk_atx_amx_ops;
}

int ompk_attn_amx_ok(ompk_exec ex, const ompk_attn_geom *g, int emulated) {
    /* empty q or k/v go to the portable kernel: these kernels form row pointers from the
     * tensors' data, which may be NULL when empty */
    if (ex.on_target || !g->bf16 || g->dh % 16 != 0 || g->dh > ATX_DMAX || g->N == 0 || g->M == 0)
        return 0;
    /* the packing gathers 16 rows with 32-bit indices in bf16 units */
    const int64_t big = INT32_MAX / 16;
    if (g->qs[2] > big || g->ks[2] > big || g->vs[2] > big || g->dos[2] > big) return 0;
    const ompk_cpu_features *f = ompk_cpu_get();
    const int avx = f->avx512f && f->avx512bw && f->avx512vl && f->avx512_bf16;
    return avx && (emulated || (ompk_cpu_amx_usable() && f->amx_bf16));
}

/* Work items in order of decreasing cost under a causal mask (later query blocks see more
 * keys; earlier key blocks are seen by more rows), so dynamic scheduling ends balanced. */
int ompk_attn_fwd_amx(const ompk_attn_geom *gp, const void *q, const void *k, const void *v,
                      void *out, float *lse, int emulated) {
    const ompk_attn_geom g = *gp;
    const atx_ops *ops = atx_pick(emulated);
    const int DP = (int)(g.dh + 31) / 32 * 32;
    atx_pack kt = {0}, vp = {0};
    if (!atx_pack_all(&kt, k, g.ks, g.B, g.Hkv, g.M, (int)g.dh, DP, 0) ||
        !atx_pack_all(&vp, v, g.vs, g.B, g.Hkv, g.M, (int)g.dh, DP, 1)) {
        free(kt.p);
        return -1;
    }
    const int64_t nblk = (g.N + ATX_R - 1) / ATX_R, items = g.B * g.Hq * nblk;
    const int rev = g.mask != 0;
#pragma omp parallel
    {
        ops->begin();
#pragma omp for schedule(dynamic, 1)
        for (int64_t w = 0; w < items; w++) {
            const int64_t bh = w / nblk, x = rev ? nblk - 1 - w % nblk : w % nblk;
            atx_fwd_item(ops, &g, q, &kt, &vp, out, lse, bh / g.Hq, bh % g.Hq, x * ATX_R);
        }
        ops->end();
    }
    free(kt.p);
    free(vp.p);
    return 0;
}

int ompk_attn_bwd_amx(const ompk_attn_geom *gp, const void *dout, const void *q, const void *k,
                      const void *v, const float *lse, void *dq, void *dk, void *dv,
                      const float *dsum, int emulated) {
    const ompk_attn_geom g = *gp;
    const atx_ops *ops = atx_pick(emulated);
    const int dh = (int)g.dh, DP = (dh + 31) / 32 * 32;
    atx_pack p[7] = {{0}};
    atx_pack *kt = &p[0], *vt = &p[1], *kp = &p[2], *qt = &p[3], *dot = &p[4], *qp = &p[5],
             *dop = &p[6];
    int ok = atx_pack_all(kt, k, g.ks, g.B, g.Hkv, g.M, dh, DP, 0) &&
             atx_pack_all(vt, v, g.vs, g.B, g.Hkv, g.M, dh, DP, 0) &&
             atx_pack_all(kp, k, g.ks, g.B, g.Hkv, g.M, dh, DP, 1) &&
             atx_pack_all(qt, q, g.qs, g.B, g.Hq, g.N, dh, DP, 0) &&
             atx_pack_all(dot, dout, g.dos, g.B, g.Hq, g.N, dh, DP, 0) &&
             atx_pack_all(qp, q, g.qs, g.B, g.Hq, g.N, dh, DP, 1) &&
             atx_pack_all(dop, dout, g.dos, g.B, g.Hq, g.N, dh, DP, 1);
    if (ok) {
        const int64_t kblk = (g.M + ATX_R - 1) / ATX_R, kitems = g.B * g.Hkv * kblk;
        const int64_t qblk = (g.N + ATX_R - 1) / ATX_R, qitems = g.B * g.Hq * qblk;
        const int rev = g.mask != 0;
#pragma omp parallel
        {
            ops->begin();
#pragma omp for schedule(dynamic, 1) nowait
            for (int64_t w = 0; w < kitems; w++) {
                const int64_t bh = w / kblk;
                atx_dkdv_item(ops, &g, k, v, qt, dot, qp, dop, lse, dsum, dk, dv, bh / g.Hkv,
                              bh % g.Hkv, (w % kblk) * ATX_R);
            }
#pragma omp for schedule(dynamic, 1)
            for (int64_t w = 0; w < qitems; w++) {
                const int64_t bh = w / qblk, x = rev ? qblk - 1 - w % qblk : w % qblk;
                atx_dq_item(ops, &g, dout, q, kt, vt, kp, lse, dsum, dq, bh / g.Hq, bh % g.Hq,
                            x * ATX_R);
            }
            ops->end();
        }
    }
    for (int i = 0; i < 7; i++) free(p[i].p);
    return ok ? 0 : -1;
}

#else /* not x86-64: no AMX; the other kernels serve every host call */

int ompk_attn_amx_ok(ompk_exec ex, const ompk_attn_geom *g, int emulated) {
    (void)ex, (void)g, (void)emulated;
    return 0;
}
int ompk_attn_fwd_amx(const ompk_attn_geom *g, const void *q, const void *k, const void *v,
                      void *out, float *lse, int emulated) {
    (void)g, (void)q, (void)k, (void)v, (void)out, (void)lse, (void)emulated;
    return -1;
}
int ompk_attn_bwd_amx(const ompk_attn_geom *g, const void *dout, const void *q, const void *k,
                      const void *v, const float *lse, void *dq, void *dk, void *dv,
                      const float *dsum, int emulated) {
    (void)g, (void)dout, (void)q, (void)k, (void)v, (void)lse, (void)dq, (void)dk, (void)dv;
    (void)dsum, (void)emulated;
    return -1;
}
#endif
