/* mHC post, forward (docs/KERNELS.md 1.2), one OpenMP source for GPU and host:
 *     out[t,o,d] = post[t,o]*f[t,d] + sum_i comb[t,i,o]*x[t,i,d]
 * Memory-bound (n+1 reads, n writes per d), so each iteration moves 8 consecutive d of every
 * stream as 16-byte words and reuses the token's n^2+n mixing weights for all 8. The stream
 * count is a compile-time constant in every kernel (mhc_each_n.h), so the per-stream register
 * arrays are never indexed at run time (a run-time index would put them in GPU local memory). */
#include <string.h>

#include "mhc_post_kern.h"

int ompk_mhc_post_vec_ok(const ompk_mhc_post_args *a) {
    if (a->D % 8 || a->sx[3] != 1 || a->sf[2] != 1 || a->so[3] != 1) return 0;
    for (int k = 0; k < 3; k++)
        if (a->sx[k] % 8 || a->so[k] % 8) return 0;
    if (a->sf[0] % 8 || a->sf[1] % 8) return 0;
    if (((uintptr_t)a->x | (uintptr_t)a->f | (uintptr_t)a->out) & 15) return 0;
    return 1;
}

/* Loads one chunk of 8 d of every stream (x points at stream 0's chunk) and of f. */
static inline __attribute__((always_inline)) void post_load8(const int n, const char *x,
                                                             int64_t xsi, const char *f, int bf16,
                                                             int esz, float xv[NMAX][8],
                                                             float fv[8]) {
#pragma GCC unroll 8
    for (int i = 0; i < NMAX; i++)
        if (i < n) ompk_load8(x + i * xsi * esz, bf16, xv[i]);
    ompk_load8(f, bf16, fv);
}

/* Every post kernel forms out as one product and then an fmaf a stream, so that no compiler's
 * contraction choices change the bits between kernels (ompk_mhc_post_pre_fwd relies on it). */
static inline __attribute__((always_inline)) void
post_compute8(const int n, const float xv[NMAX][8], const float fv[8], const float cw[NMAX][NMAX],
              const float pw[NMAX], char *out, int64_t osi, int bf16, int esz) {
#pragma GCC unroll 8
    for (int o = 0; o < NMAX; o++) {
        if (o >= n) continue;
        float acc[8];
#pragma GCC unroll 8
        for (int e = 0; e < 8; e++) acc[e] = pw[o] * fv[e];
#pragma GCC unroll 8
        for (int i = 0; i < NMAX; i++) {
            if (i >= n) continue;
#pragma GCC unroll 8
            for (int e = 0; e < 8; e++) acc[e] = fmaf(cw[o][i], xv[i][e], acc[e]);
        }
        ompk_store8(out + o * osi * esz, bf16, acc);
    }
}

/* One chunk of 8 d for one token: x, f, out point at the chunk of stream 0; comb/post at the
 * token's weights. */
static inline __attribute__((always_inline)) void
post_chunk8(const int n, const char *x, int64_t xsi, const float *comb, int64_t csi, int64_t cso,
            const float *post, int64_t pso, const char *f, char *out, int64_t osi, int bf16,
            int esz) {
    float cw[NMAX][NMAX], pw[NMAX], xv[NMAX][8], fv[8];
    post_weights(n, comb, csi, cso, post, pso, cw, pw);
    post_load8(n, x, xsi, f, bf16, esz, xv, fv);
    post_compute8(n, xv, fv, cw, pw, out, osi, bf16, esz);
}

#ifdef OMPK_BARE_DEVICE
/* GPU variant body for one token: the token's weights stay in registers across its chunks, and
 * each chunk is loaded as raw words (all streams before any arithmetic) and unpacked on use. */
static inline __attribute__((always_inline)) void
post_token_raw(const int n, const int bf16, const char *restrict xt, int64_t xsi, const float *comb,
               int64_t csi, int64_t cso, const float *post, int64_t pso, const char *restrict ft,
               char *restrict ot, int64_t osi, int64_t C, int64_t tid, int64_t nthr) {
    const int esz = bf16 ? 2 : 4, words = bf16 ? 1 : 2;
    float cw[NMAX][NMAX], pw[NMAX];
    post_weights(n, comb, csi, cso, post, pso, cw, pw);
    for (int64_t c = tid; c < C; c += nthr) {
        ompk_u128 xr[NMAX][2], fr[2];
#pragma GCC unroll 8
        for (int i = 0; i < NMAX; i++)
            if (i < n)
                for (int w = 0; w < words; w++)
                    xr[i][w] = ((const ompk_u128 *)(xt + (i * xsi + c * 8) * esz))[w];
        for (int w = 0; w < words; w++) fr[w] = ((const ompk_u128 *)(ft + c * 8 * esz))[w];
#pragma GCC unroll 8
        for (int o = 0; o < NMAX; o++) {
            if (o >= n) continue;
            float acc[8];
#pragma GCC unroll 8
            for (int e = 0; e < 8; e++) acc[e] = pw[o] * raw_elem(fr, e, bf16);
#pragma GCC unroll 8
            for (int i = 0; i < NMAX; i++) {
                if (i >= n) continue;
#pragma GCC unroll 8
                for (int e = 0; e < 8; e++)
                    acc[e] = fmaf(cw[o][i], raw_elem(xr[i], e, bf16), acc[e]);
            }
            ompk_store8(ot + (o * osi + c * 8) * esz, bf16, acc);
        }
    }
}
#endif

/* One d for one token, any strides. */
static inline __attribute__((always_inline)) void
post_elem(const int n, const void *x, int64_t xo, int64_t xsi, const float *comb, int64_t csi,
          int64_t cso, const float *post, int64_t pso, const void *f, int64_t fo, void *out,
          int64_t oo, int64_t osi, int bf16) {
    float xv[NMAX];
#pragma GCC unroll 8
    for (int i = 0; i < NMAX; i++)
        if (i < n) xv[i] = ompk_load_f(x, xo + i * xsi, bf16);
    float fv = ompk_load_f(f, fo, bf16);
#pragma GCC unroll 8
    for (int o = 0; o < NMAX; o++) {
        if (o >= n) continue;
        float acc = post[o * pso] * fv;
#pragma GCC unroll 8
        for (int i = 0; i < NMAX; i++)
            if (i < n) acc = fmaf(comb[i * csi + o * cso], xv[i], acc);
        ompk_store_f(out, oo + o * osi, acc, bf16);
    }
}

/* The first GPU variant ("bare1"; the default for n >= 5, where mhc_post_fwd_stream.c has no
 * streaming instance), one per dtype BF of the stream count MHC_N (mhc_post_fwd_n.inc): a bare
 * kernel, one team per token (grid-stride over tokens), its threads striding over the token's
 * 8-element chunks. It avoids the portable loop's 64-bit index division per chunk, keeps the
 * token's weights in registers, and holds chunks as raw words (see post_token_raw). */
#ifdef OMPK_BARE_DEVICE
// clang-format off
#define POST_BARE_KERNEL(BF, NAME)                                                                 \
    static void NAME(ompk_exec ex, const ompk_mhc_post_args *a) {                                  \
        POST_UNPACK(a);                                                                            \
        const int64_t T = B * S;                                                                   \
        const int teams = (int)(T < 8192 ? T : 8192);                                              \
        OMPK_PRAGMA(omp target teams ompx_bare num_teams(teams) thread_limit(256)                  \
                    device(ex.device) is_device_ptr(x, f, out, comb, post))                        \
        {                                                                                          \
            const int64_t nteams = ompx_grid_dim_x(), nthr = ompx_block_dim_x();                   \
            for (int64_t t = ompx_block_id_x(); t < T; t += nteams) {                              \
                const int64_t b = t / S, s = t - b * S;                                            \
                post_token_raw(MHC_N, BF, x + (b * sx0 + s * sx1) * esz, sx2,                      \
                               comb + b * sc0 + s * sc1, sc2, sc3, post + b * sp0 + s * sp1, sp2,  \
                               f + (b * sf0 + s * sf1) * esz, out + (b * so0 + s * so1) * esz,     \
                               so2, C, ompx_thread_id_x(), nthr);                                  \
            }                                                                                      \
        }                                                                                          \
    }
// clang-format on
#endif

#define MHC_N_INC "mhc_post_fwd_n.inc"
#include "mhc_each_n.inc"

const ompk_mhc_post_stream_cfg *ompk_mhc_post_stream_find(const char *name, int n, int bf16) {
    int count;
    const ompk_mhc_post_stream_cfg *list = ompk_mhc_post_stream_list(&count);
    for (int i = 0; i < count; i++) {
        const ompk_mhc_post_stream_cfg *c = &list[i];
        if (c->n == n && c->is_bf16 == bf16 &&
            (name ? c->name && strcmp(c->name, name) == 0 : c->name == NULL))
            return c;
    }
    return NULL;
}

/* Target tensors on the vector path with D >= 512 (shorter rows leave most of a team idle). */
int ompk_mhc_post_bare_fits(ompk_exec ex, const ompk_mhc_post_args *a) {
#ifdef OMPK_BARE_DEVICE
    return ex.on_target && a->D >= 512 && ompk_mhc_post_vec_ok(a);
#else
    (void)ex, (void)a;
    return 0;
#endif
}

void ompk_mhc_post_fwd_bare1(ompk_exec ex, const ompk_mhc_post_args *a) {
#ifdef OMPK_BARE_DEVICE
#define POST_BARE(N) (a->is_bf16 ? post_bare_bf16_##N : post_bare_f32_##N)(ex, a)
    MHC_SWITCH_N(a->n, POST_BARE)
#undef POST_BARE
#else
    (void)ex, (void)a;
#endif
}

/* Team size: threads when > 0 (clamped to 32..1024), else enough for one step to cover a token's
 * chunks, 64..256, a multiple of 32. */
void ompk_mhc_post_fwd_stream(ompk_exec ex, const ompk_mhc_post_args *a,
                              const ompk_mhc_post_stream_cfg *cfg, int64_t threads) {
    if (threads <= 0) {
        const int64_t C = a->D / 8, per_step = (C + cfg->U - 1) / cfg->U;
        threads = (per_step + 31) / 32 * 32;
        threads = threads < 64 ? 64 : threads > 256 ? 256 : threads;
    }
    threads = threads < 32 ? 32 : threads > 1024 ? 1024 : threads;
    cfg->fn(ex, a, (int)threads);
}

void ompk_mhc_post_fwd_kernel(ompk_exec ex, const ompk_mhc_post_args *a) {
    const int vec = ompk_mhc_post_vec_ok(a);
#define POST_FWD(N) (vec ? post_vec_##N : post_elem_##N)(ex, a)
    MHC_SWITCH_N(a->n, POST_FWD) /* validated: 1 <= n <= 8 */
#undef POST_FWD
}

void ompk_mhc_post_fwd_plain_host(const ompk_mhc_post_args *a) {
#define POST_PLAIN(N) post_plain_##N(a)
    MHC_SWITCH_N(a->n, POST_PLAIN)
#undef POST_PLAIN
}
