/* mHC post, forward (KERNELS.md 1.2), one OpenMP source for GPU and host:
 *     out[t,o,d] = post[t,o]*f[t,d] + sum_i comb[t,i,o]*x[t,i,d]
 * Memory-bound (n+1 reads, n writes per d), so each iteration moves 8 consecutive d of every
 * stream as 16-byte words and reuses the token's n^2+n mixing weights for all 8. The stream
 * count is made a compile-time constant by a switch, so the per-stream register arrays are
 * never indexed at run time (a run-time index would put them in GPU local memory). */
#include <stdlib.h>
#include <string.h>
#if defined(__clang__) && defined(OMPK_OFFLOAD_BUILD)
#include <ompx.h>
#define OMPK_HAVE_BARE 1
#endif

#include "mhc_post.h"
#include "vec8.h"

#define NMAX 8

int ompk_mhc_post_vec_ok(const ompk_mhc_post_args *a) {
    if (a->D % 8 || a->sx[3] != 1 || a->sf[2] != 1 || a->so[3] != 1) return 0;
    for (int k = 0; k < 3; k++)
        if (a->sx[k] % 8 || a->so[k] % 8) return 0;
    if (a->sf[0] % 8 || a->sf[1] % 8) return 0;
    if (((uintptr_t)a->x | (uintptr_t)a->f | (uintptr_t)a->out) & 15) return 0;
    return 1;
}

/* One chunk of 8 d for one token: x, f, out point at the chunk of stream 0; comb/post at the
 * token's weights. */
static inline __attribute__((always_inline)) void
post_chunk8(const int n, const char *x, int64_t xsi, const float *comb, int64_t csi, int64_t cso,
            const float *post, int64_t pso, const char *f, char *out, int64_t osi, int bf16,
            int esz) {
    float xv[NMAX][8], fv[8];
    for (int i = 0; i < NMAX; i++)
        if (i < n) ompk_load8(x + i * xsi * esz, bf16, xv[i]);
    ompk_load8(f, bf16, fv);
    for (int o = 0; o < NMAX; o++) {
        if (o >= n) continue;
        float p = post[o * pso], acc[8];
        for (int e = 0; e < 8; e++) acc[e] = p * fv[e];
        for (int i = 0; i < NMAX; i++) {
            if (i >= n) continue;
            float c = comb[i * csi + o * cso];
            for (int e = 0; e < 8; e++) acc[e] += c * xv[i][e];
        }
        ompk_store8(out + o * osi * esz, bf16, acc);
    }
}

/* One d for one token, any strides. */
static inline __attribute__((always_inline)) void
post_elem(const int n, const void *x, int64_t xo, int64_t xsi, const float *comb, int64_t csi,
          int64_t cso, const float *post, int64_t pso, const void *f, int64_t fo, void *out,
          int64_t oo, int64_t osi, int bf16) {
    float xv[NMAX];
    for (int i = 0; i < NMAX; i++)
        if (i < n) xv[i] = ompk_load_f(x, xo + i * xsi, bf16);
    float fv = ompk_load_f(f, fo, bf16);
    for (int o = 0; o < NMAX; o++) {
        if (o >= n) continue;
        float acc = post[o * pso] * fv;
        for (int i = 0; i < NMAX; i++)
            if (i < n) acc += comb[i * csi + o * cso] * xv[i];
        ompk_store_f(out, oo + o * osi, acc, bf16);
    }
}

#define OMPK_SWITCH_N(n, CALL)                                                                     \
    switch (n) {                                                                                   \
    case 1:                                                                                        \
        CALL(1);                                                                                   \
        break;                                                                                     \
    case 2:                                                                                        \
        CALL(2);                                                                                   \
        break;                                                                                     \
    case 3:                                                                                        \
        CALL(3);                                                                                   \
        break;                                                                                     \
    case 4:                                                                                        \
        CALL(4);                                                                                   \
        break;                                                                                     \
    case 5:                                                                                        \
        CALL(5);                                                                                   \
        break;                                                                                     \
    case 6:                                                                                        \
        CALL(6);                                                                                   \
        break;                                                                                     \
    case 7:                                                                                        \
        CALL(7);                                                                                   \
        break;                                                                                     \
    default:                                                                                       \
        CALL(8);                                                                                   \
        break;                                                                                     \
    }

/* GPU variant: a bare kernel, one team per token (grid-stride over tokens), its threads striding
 * over the token's 8-element chunks. No per-chunk index division (the portable collapse(3) loop
 * divides 64-bit indices for every chunk) and restrict-qualified streams let the compiler keep
 * several 16-byte loads in flight. Used for target tensors on the vector path with D >= 512;
 * OMPK_MHC_POST_VARIANT=portable forces the portable kernel. */
#ifdef OMPK_HAVE_BARE
static void post_fwd_bare(ompk_exec ex, const ompk_mhc_post_args *a) {
    const char *restrict x = (const char *)a->x;
    const char *restrict f = (const char *)a->f;
    char *restrict out = (char *)a->out;
    const float *comb = a->comb, *post = a->post;
    const int64_t S = a->S, C = a->D / 8, T = a->B * a->S;
    const int n = a->n, bf16 = a->is_bf16, esz = a->is_bf16 ? 2 : 4;
    const int64_t sx0 = a->sx[0], sx1 = a->sx[1], sx2 = a->sx[2];
    const int64_t sc0 = a->sc[0], sc1 = a->sc[1], sc2 = a->sc[2], sc3 = a->sc[3];
    const int64_t sp0 = a->sp[0], sp1 = a->sp[1], sp2 = a->sp[2];
    const int64_t sf0 = a->sf[0], sf1 = a->sf[1];
    const int64_t so0 = a->so[0], so1 = a->so[1], so2 = a->so[2];
    const int teams = (int)(T < 8192 ? T : 8192);
#pragma omp target teams ompx_bare num_teams(teams) thread_limit(256) device(ex.device)            \
    is_device_ptr(x, f, out, comb, post)                                                           \
    firstprivate(S, C, T, n, bf16, esz, sx0, sx1, sx2, sc0, sc1, sc2, sc3, sp0, sp1, sp2, sf0,     \
                     sf1, so0, so1, so2)
    {
        const int64_t nteams = ompx_grid_dim_x(), nthr = ompx_block_dim_x();
        for (int64_t t = ompx_block_id_x(); t < T; t += nteams) {
            const int64_t b = t / S, s = t - b * S;
            const char *xt = x + (b * sx0 + s * sx1) * esz;
            const char *ft = f + (b * sf0 + s * sf1) * esz;
            char *ot = out + (b * so0 + s * so1) * esz;
            const float *cp = comb + b * sc0 + s * sc1;
            const float *pp = post + b * sp0 + s * sp1;
            for (int64_t c = ompx_thread_id_x(); c < C; c += nthr) {
                const char *xp = xt + c * 8 * esz, *fp = ft + c * 8 * esz;
                char *op = ot + c * 8 * esz;
#define OMPK_POST_CHUNK(N) post_chunk8(N, xp, sx2, cp, sc2, sc3, pp, sp2, fp, op, so2, bf16, esz)
                OMPK_SWITCH_N(n, OMPK_POST_CHUNK)
#undef OMPK_POST_CHUNK
            }
        }
    }
}

static int use_bare(ompk_exec ex, const ompk_mhc_post_args *a) {
    if (!ex.on_target || a->D < 512) return 0;
    const char *v = getenv("OMPK_MHC_POST_VARIANT");
    return !(v && strcmp(v, "portable") == 0);
}
#else
static int use_bare(ompk_exec ex, const ompk_mhc_post_args *a) {
    (void)ex, (void)a;
    return 0;
}
static void post_fwd_bare(ompk_exec ex, const ompk_mhc_post_args *a) {
    (void)ex, (void)a;
}
#endif

void ompk_mhc_post_fwd_kernel(ompk_exec ex, const ompk_mhc_post_args *a) {
    const char *x = (const char *)a->x, *f = (const char *)a->f;
    char *out = (char *)a->out;
    const float *comb = a->comb, *post = a->post;
    const int64_t B = a->B, S = a->S, D = a->D;
    const int n = a->n, bf16 = a->is_bf16, esz = a->is_bf16 ? 2 : 4;
    const int64_t sx0 = a->sx[0], sx1 = a->sx[1], sx2 = a->sx[2], sx3 = a->sx[3];
    const int64_t sc0 = a->sc[0], sc1 = a->sc[1], sc2 = a->sc[2], sc3 = a->sc[3];
    const int64_t sp0 = a->sp[0], sp1 = a->sp[1], sp2 = a->sp[2];
    const int64_t sf0 = a->sf[0], sf1 = a->sf[1], sf2 = a->sf[2];
    const int64_t so0 = a->so[0], so1 = a->so[1], so2 = a->so[2], so3 = a->so[3];

    if (ompk_mhc_post_vec_ok(a)) {
        if (use_bare(ex, a)) {
            post_fwd_bare(ex, a);
            return;
        }
        const int64_t C = D / 8;
#pragma omp target teams distribute parallel for collapse(3) if (target : ex.on_target)            \
    device(ex.device) is_device_ptr(x, f, out, comb, post) thread_limit(256)
        for (int64_t b = 0; b < B; b++)
            for (int64_t s = 0; s < S; s++)
                for (int64_t c = 0; c < C; c++) {
                    const char *xp = x + (b * sx0 + s * sx1 + c * 8) * esz;
                    const char *fp = f + (b * sf0 + s * sf1 + c * 8) * esz;
                    char *op = out + (b * so0 + s * so1 + c * 8) * esz;
                    const float *cp = comb + b * sc0 + s * sc1;
                    const float *pp = post + b * sp0 + s * sp1;
#define OMPK_POST_CHUNK(N) post_chunk8(N, xp, sx2, cp, sc2, sc3, pp, sp2, fp, op, so2, bf16, esz)
                    OMPK_SWITCH_N(n, OMPK_POST_CHUNK)
#undef OMPK_POST_CHUNK
                }
        return;
    }

#pragma omp target teams distribute parallel for collapse(3) if (target : ex.on_target)            \
    device(ex.device) is_device_ptr(x, f, out, comb, post) thread_limit(256)
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t d = 0; d < D; d++) {
                const int64_t xo = b * sx0 + s * sx1 + d * sx3;
                const int64_t fo = b * sf0 + s * sf1 + d * sf2;
                const int64_t oo = b * so0 + s * so1 + d * so3;
                const float *cp = comb + b * sc0 + s * sc1;
                const float *pp = post + b * sp0 + s * sp1;
#define OMPK_POST_ELEM(N) post_elem(N, x, xo, sx2, cp, sc2, sc3, pp, sp2, f, fo, out, oo, so2, bf16)
                OMPK_SWITCH_N(n, OMPK_POST_ELEM)
#undef OMPK_POST_ELEM
            }
}

/* The same loop nest under a plain `omp parallel for`: only for ompk-bench's routing probe,
 * which measures what running the target region's host fallback costs against it. */
void ompk_mhc_post_fwd_plain_host(const ompk_mhc_post_args *a) {
    const char *x = (const char *)a->x, *f = (const char *)a->f;
    char *out = (char *)a->out;
    const float *comb = a->comb, *post = a->post;
    const int64_t B = a->B, S = a->S, C = a->D / 8;
    const int n = a->n, bf16 = a->is_bf16, esz = a->is_bf16 ? 2 : 4;
    const int64_t sx0 = a->sx[0], sx1 = a->sx[1], sx2 = a->sx[2];
    const int64_t sc0 = a->sc[0], sc1 = a->sc[1], sc2 = a->sc[2], sc3 = a->sc[3];
    const int64_t sp0 = a->sp[0], sp1 = a->sp[1], sp2 = a->sp[2];
    const int64_t sf0 = a->sf[0], sf1 = a->sf[1];
    const int64_t so0 = a->so[0], so1 = a->so[1], so2 = a->so[2];
#pragma omp parallel for collapse(3)
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t c = 0; c < C; c++) {
                const char *xp = x + (b * sx0 + s * sx1 + c * 8) * esz;
                const char *fp = f + (b * sf0 + s * sf1 + c * 8) * esz;
                char *op = out + (b * so0 + s * so1 + c * 8) * esz;
                const float *cp = comb + b * sc0 + s * sc1;
                const float *pp = post + b * sp0 + s * sp1;
#define OMPK_POST_CHUNK(N) post_chunk8(N, xp, sx2, cp, sc2, sc3, pp, sp2, fp, op, so2, bf16, esz)
                OMPK_SWITCH_N(n, OMPK_POST_CHUNK)
#undef OMPK_POST_CHUNK
            }
}
