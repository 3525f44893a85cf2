/* Internal: attention kernels behind ompk_attention_fwd / _bwd. Arguments are validated by the
 * entry points; pointers are device pointers of ex.device (host pointers when !ex.on_target). */
#ifndef OMPK_ATTENTION_KERNELS_H
#define OMPK_ATTENTION_KERNELS_H

#include <math.h>
#include <stdint.h>

#include "route.h"

/* x rounded to fp32 before its next use: a score s = dot * scale must not fuse into the
 * subtraction s - lse (the forward rounds s; a fused backward then misses p = 1 on one-hot rows).
 * GCC (-ffp-contract=fast) fuses across statements, which the barrier stops; clang fuses only
 * within one expression, so the product there must stay a statement or function of its own. */
#if defined(__GNUC__) && !defined(__clang__)
#define ATT_ROUNDED(x) __builtin_assoc_barrier(x)
#else
#define ATT_ROUNDED(x) (x)
#endif

/* The scalar product a * b rounded as above, on every compiler and device. GCC's GPU images write
 * mul and sub without a rounding mode, and the driver's PTX compiler fuses such a pair through any
 * barrier; an fma with a -0 addend (the product rounded once) is not fused again. */
#if defined(OMPK_OFFLOAD_GCC_NVPTX)
#define ATT_ROUNDED_MUL(a, b) ATT_ROUNDED(fmaf((a), (b), -0.0f))
#else
#define ATT_ROUNDED_MUL(a, b) ATT_ROUNDED((a) * (b))
#endif

/* Shape, strides (elements, order b, h, n; dh has stride 1) and options of one call. */
typedef struct ompk_attn_geom {
    int64_t B, Hq, Hkv, N, M, dh;
    int64_t qs[3], ks[3], vs[3], os[3], ls[3]; /* q, k, v, out, lse */
    int64_t dos[3], dqs[3], dks[3], dvs[3];    /* dout, dq, dk, dv (backward only) */
    float scale;
    int mask; /* ompk_attention_mask */
    int bf16; /* q, k, v, out, dout, dq, dk, dv are bf16 (else f32) */
} ompk_attn_geom;

/* The causal masks (docs/KERNELS.md section 2), one definition for every kernel, host and
 * device: query row i of n sees keys [0, limit) of m; key j is seen from row first_row on. */
static inline int64_t ompk_attn_key_limit(int mask, int64_t i, int64_t n, int64_t m) {
    int64_t lim = m;
    if (mask == 1)
        lim = i + 1;
    else if (mask == 2)
        lim = i + 1 + m - n;
    lim = lim > m ? m : lim;
    return lim < 0 ? 0 : lim;
}

static inline int64_t ompk_attn_first_row(int mask, int64_t j, int64_t n, int64_t m) {
    int64_t i0 = 0;
    if (mask == 1)
        i0 = j;
    else if (mask == 2)
        i0 = j - (m - n);
    return i0 < 0 ? 0 : i0;
}

/* Portable kernels: OpenMP target teams loops, on the GPU or on the host's threads. */
void ompk_attn_fwd_portable(ompk_exec ex, const ompk_attn_geom *g, const void *q, const void *k,
                            const void *v, void *out, float *lse);
/* The portable GPU forward on team-shared tiles (attention_portable_tiled.c): whether it serves
 * this call (dh up to 128), and the kernel; with !ex.on_target it runs on the host (tests). */
int ompk_attn_fwd_tiled_ok(const ompk_attn_geom *g);
void ompk_attn_fwd_tiled(ompk_exec ex, const ompk_attn_geom *g, const void *q, const void *k,
                         const void *v, void *out, float *lse);
/* dsum[(b*Hq + h)*N + i] = <dout_i, out_i> (fp32), the backward's row term. */
void ompk_attn_rowsum(ompk_exec ex, const ompk_attn_geom *g, const void *dout, const void *out,
                      float *dsum);
/* dsum: 2*B*Hq*N f32 workspace on ex's device (the GPU form keeps the rows' lse in the second
 * half). */
void ompk_attn_bwd_portable(ompk_exec ex, const ompk_attn_geom *g, const void *dout, const void *q,
                            const void *k, const void *v, const void *out, const float *lse,
                            void *dq, void *dk, void *dv, float *dsum);
/* The portable GPU backward on team-shared tiles (attention_portable_bwd_tiled.c): whether it
 * serves this call (a GPU, the tensor-core head dims, clang builds), and its two kernels: each
 * row's D into dsum and lse from the kernels' own scores into lw (both [B, Hq, N] f32 on ex's
 * device) and dq, then dk and dv. */
int ompk_attn_bwd_tiled_ok(ompk_exec ex, const ompk_attn_geom *g);
void ompk_attn_bwd_tiled(ompk_exec ex, const ompk_attn_geom *g, const void *dout, const void *q,
                         const void *k, const void *v, const void *out, float *dsum, float *lw,
                         void *dq, void *dk, void *dv);

/* Whether the [B,H,L,dh] operand x (strides s, bf16 or f32, on ex's device) is all finite
 * (attention_finite.c). */
int ompk_attn_all_finite(ompk_exec ex, const void *x, int bf16, int64_t B, int64_t H, int64_t L,
                         int64_t dh, const int64_t s[3]);

/* GPU forward on tensor cores (attention_fast.c): whether it can serve this call (target
 * tensors, bf16, dh in {32, 64, 80, 96, 128}, 16-byte aligned rows), and the kernel. */
int ompk_attn_fwd_fast_ok(ompk_exec ex, const ompk_attn_geom *g, const void *q, const void *k,
                          const void *v, const void *out);
void ompk_attn_fwd_fast(ompk_exec ex, const ompk_attn_geom *g, const void *q, const void *k,
                        const void *v, void *out, float *lse);
/* GPU split-KV forward for few queries (decode, N <= 16; attention_fast.c): the group's query
 * heads share the K/V tiles and the keys are split over teams; the same conditions as the
 * tensor-core forward otherwise. ws: ompk_attn_fwd_decode_ws(g) bytes on ex's device. */
int ompk_attn_fwd_decode_ok(ompk_exec ex, const ompk_attn_geom *g, const void *q, const void *k,
                            const void *v, const void *out);
int64_t ompk_attn_fwd_decode_ws(const ompk_attn_geom *g);
void ompk_attn_fwd_decode(ompk_exec ex, const ompk_attn_geom *g, const void *q, const void *k,
                          const void *v, void *out, float *lse, float *ws);
/* GPU forward for f32 on the tensor cores through 3xTF32 (attention_f32tc.c): whether it can
 * serve this call (target tensors, f32, dh in {32, 64, 80, 96, 128}, 16-byte aligned rows),
 * and the kernel. */
int ompk_attn_fwd_f32tc_ok(ompk_exec ex, const ompk_attn_geom *g, const void *q, const void *k,
                           const void *v, const void *out);
void ompk_attn_fwd_f32tc(ompk_exec ex, const ompk_attn_geom *g, const void *q, const void *k,
                         const void *v, void *out, float *lse);
/* Whether q, k, v and dout (NULL: not asked) of an f32 call are all finite: the 3xTF32 kernels
 * then split operands with fewer instructions (attention_f32tc.h). */
int ompk_attn_f32tc_finite(ompk_exec ex, const ompk_attn_geom *g, const void *q, const void *k,
                           const void *v, const void *dout);
/* GPU backward for f32 on the tensor cores through 3xTF32 (attention_f32tc_bwd.c): the forward's
 * conditions for all eight tensors (ptrs as ompk_attn_bwd_fast takes them), and the kernels. */
int ompk_attn_bwd_f32tc_ok(ompk_exec ex, const ompk_attn_geom *g, const void *const ptrs[8]);
void ompk_attn_bwd_f32tc(ompk_exec ex, const ompk_attn_geom *g, const void *dout, const void *q,
                         const void *k, const void *v, const void *out, const float *lse, void *dq,
                         void *dk, void *dv, float *dsum);
/* GPU backward on tensor cores: same conditions as the forward for all eight tensors
 * (q, k, v, out, dout, dq, dk, dv in that order in ptrs). */
int ompk_attn_bwd_fast_ok(ompk_exec ex, const ompk_attn_geom *g, const void *const ptrs[8]);
void ompk_attn_bwd_fast(ompk_exec ex, const ompk_attn_geom *g, const void *dout, const void *q,
                        const void *k, const void *v, const void *out, const float *lse, void *dq,
                        void *dk, void *dv, float *dsum);

/* Host kernels on AVX-512 (src/host/attention/attention_host.c; bf16 needs AVX-512 BF16): whether
 * they can serve this call (bwd: the backward), the forward, and the backward given dsum from
 * ompk_attn_rowsum (returns nonzero, with dq/dk/dv incomplete, when its f32 workspace cannot
 * be allocated). */
int ompk_attn_host_ok(ompk_exec ex, const ompk_attn_geom *g, int bwd);
void ompk_attn_fwd_host(const ompk_attn_geom *g, const void *q, const void *k, const void *v,
                        void *out, float *lse);
int ompk_attn_bwd_host(const ompk_attn_geom *g, const void *dout, const void *q, const void *k,
                       const void *v, const float *lse, void *dq, void *dk, void *dv,
                       const float *dsum);

/* Host kernels on AMX tiles for bf16 (src/host/attention/attention_amx.c), on the instructions
 * or, with emulated, on the tile emulation (tests): whether they can serve this call, the
 * forward and the backward (given dsum from ompk_attn_rowsum); both return nonzero, having
 * written nothing, when their packed operands cannot be allocated. */
int ompk_attn_amx_ok(ompk_exec ex, const ompk_attn_geom *g, int emulated);
int ompk_attn_fwd_amx(const ompk_attn_geom *g, const void *q, const void *k, const void *v,
                      void *out, float *lse, int emulated);
int ompk_attn_bwd_amx(const ompk_attn_geom *g, const void *dout, const void *q, const void *k,
                      const void *v, const float *lse, void *dq, void *dk, void *dv,
                      const float *dsum, int emulated);

/* The head dims of the tensor-core kernels (attention_fast.c, attention_f32tc.c and their host
 * emulation tests); callers check dh first, so 128 is the remaining case. */
#define ATT_SWITCH_DH_TC(dh, CALL)                                                                 \
    switch (dh) {                                                                                  \
    case 32:                                                                                       \
        CALL(32);                                                                                  \
        break;                                                                                     \
    case 64:                                                                                       \
        CALL(64);                                                                                  \
        break;                                                                                     \
    case 80:                                                                                       \
        CALL(80);                                                                                  \
        break;                                                                                     \
    case 96:                                                                                       \
        CALL(96);                                                                                  \
        break;                                                                                     \
    default:                                                                                       \
        CALL(128);                                                                                 \
        break;                                                                                     \
    }

/* One instance per supported head dim (dh is a compile-time constant inside each), shared by
 * the portable and host kernels: the tensor-core head dims plus 256; callers check dh first. */
#define ATT_SWITCH_DH(dh, CALL)                                                                    \
    if ((dh) == 256) {                                                                             \
        CALL(256);                                                                                 \
    } else {                                                                                       \
        ATT_SWITCH_DH_TC(dh, CALL)                                                                 \
    }

#endif
