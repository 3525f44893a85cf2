/* Internal: the mHC post-forward kernel and its argument block. */
#ifndef OMPK_MHC_POST_H
#define OMPK_MHC_POST_H

#include <stdint.h>

#include "route.h"

typedef struct ompk_mhc_post_args {
    const void *x;     /* [B,S,n,D] f32|bf16 */
    const float *comb; /* [B,S,n,n] */
    const float *post; /* [B,S,n] */
    const void *f;     /* [B,S,D] */
    void *out;         /* [B,S,n,D] */
    int64_t B, S, D;
    int n, is_bf16;
    int64_t sx[4], sc[4], sp[3], sf[3], so[4]; /* element strides */
} ompk_mhc_post_args;

/* 1 when x, f and out allow 16-byte chunk moves of 8 elements (unit stride on D, D and every
 * other stride a multiple of 8 elements, 16-byte aligned bases). */
int ompk_mhc_post_vec_ok(const ompk_mhc_post_args *a);

/* The portable kernels: 16-byte chunks where ompk_mhc_post_vec_ok, else element by element. */
void ompk_mhc_post_fwd_kernel(ompk_exec ex, const ompk_mhc_post_args *a);

/* Whether the bare GPU kernels (the first, "bare1", and the streaming ones) can serve the call:
 * target tensors on the vector path, D >= 512. */
int ompk_mhc_post_bare_fits(ompk_exec ex, const ompk_mhc_post_args *a);
/* One team per token (grid-stride), its threads striding over the token's chunks. */
void ompk_mhc_post_fwd_bare1(ompk_exec ex, const ompk_mhc_post_args *a);

/* Streaming GPU kernels (mhc_post_kern.h): one team per token (T < 2^31), launched with a team
 * size. mhc_post_fwd_stream.c lists its instances, the defaults with name NULL. */
typedef void (*ompk_mhc_post_stream_fn)(ompk_exec ex, const ompk_mhc_post_args *a, int threads);
typedef struct ompk_mhc_post_stream_cfg {
    const char *name; /* the mhc_post_fwd entry; NULL: the default for (n, is_bf16) */
    int n, is_bf16, U;
    ompk_mhc_post_stream_fn fn;
} ompk_mhc_post_stream_cfg;
const ompk_mhc_post_stream_cfg *ompk_mhc_post_stream_list(int *count);
/* The configuration for (n, dtype) named name (NULL: the default one), or NULL. */
const ompk_mhc_post_stream_cfg *ompk_mhc_post_stream_find(const char *name, int n, int bf16);
/* Runs cfg with `threads` threads a team (0: sized from D). */
void ompk_mhc_post_fwd_stream(ompk_exec ex, const ompk_mhc_post_args *a,
                              const ompk_mhc_post_stream_cfg *cfg, int64_t threads);

/* Benchmark probe: the vector path under `omp parallel for` on the host (requires
 * ompk_mhc_post_vec_ok). */
void ompk_mhc_post_fwd_plain_host(const ompk_mhc_post_args *a);
#endif
