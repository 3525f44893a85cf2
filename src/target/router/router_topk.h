/* Internal: product-key router kernels (docs/KERNELS.md section 4) and their argument blocks. */
#ifndef OMPK_ROUTER_TOPK_H
#define OMPK_ROUTER_TOPK_H

#include <stdint.h>

#include "ompk/tensor.h"
#include "route.h"

typedef struct ompk_router_fwd_args {
    const void *sx, *sy; /* [T,N] f32|bf16 */
    float *scores;       /* [T,k] */
    int32_t *indices;    /* [T,k] */
    int64_t T, N, k;
    int is_bf16;
    int64_t sx0, sx1, sy0, sy1, sc0, sc1, ix0, ix1; /* element strides */
    ompk_device device;                             /* where a workspace is allocated */
} ompk_router_fwd_args;

typedef struct ompk_router_bwd_args {
    const void *dscores;    /* [T,k] f32|bf16 */
    const int32_t *indices; /* [T,k] */
    void *dsx, *dsy;        /* [T,N] f32|bf16 */
    int64_t T, N, k;
    int ds_bf16, out_bf16;
    int64_t ds0, ds1, ix0, ix1, dx0, dx1, dy0, dy1;
} ompk_router_bwd_args;

/* The portable kernel: OMPK_OK, or OMPK_ERR_OUT_OF_MEMORY when the k > 64 workspace cannot be
 * allocated (then nothing was written). */
ompk_status ompk_router_topk_fwd_kernel(ompk_exec ex, const ompk_router_fwd_args *a);
/* Whether the warp-per-token bare GPU kernels can serve the call (target tensors, small k and N,
 * in-row strides that fit int32). */
int ompk_router_bare_fits(ompk_exec ex, const ompk_router_fwd_args *a);
/* The bare GPU kernels: sort = full axis sorts where arg-max rounds are the default; warp1 = one
 * token a warp where the default takes two. */
void ompk_router_topk_fwd_bare(ompk_exec ex, const ompk_router_fwd_args *a, int sort, int warp1);

/* Row-major slot number t*k + r of the first index outside {-1} U [0, N^2), or -1 if none. */
int64_t ompk_router_first_bad_index(ompk_exec ex, const ompk_router_bwd_args *a);
/* dsx = dsy = 0 */
void ompk_router_bwd_zero(ompk_exec ex, const ompk_router_bwd_args *a);
/* dsx, dsy = the gradient (overwrites; indices already checked). */
void ompk_router_topk_bwd_kernel(ompk_exec ex, const ompk_router_bwd_args *a);

#endif
