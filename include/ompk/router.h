/* Product-key router: exact top-k over pairwise sums (docs/KERNELS.md section 4).
 *
 * Thread safety: both entry points may run on any number of host threads at once, on one
 * device or several (the forward's workspace for k > 64 is allocated per call); results do not
 * depend on what other threads run. The caller keeps one call's outputs away from every other
 * call running at the same time. */
#ifndef OMPK_ROUTER_H
#define OMPK_ROUTER_H

#include <stdint.h>

#include "ompk/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Forward. For every token t, the k largest of
 *     s(i,j) = sx[t,i] + sy[t,j]      (both read as fp32, summed once in fp32)
 * in descending order; ties (equal fp32 sums) go to the lower flattened index i*N + j.
 *     scores[t,r] = s(i,j),  indices[t,r] = i*N + j   for the r-th best pair.
 * sx, sy [T,N] f32 or bf16 (one dtype, any non-negative strides); scores [T,k] f32; indices
 * [T,k] i32. 1 <= k <= N^2 and N^2 < 2^31. Exact for any N (no power-of-two requirement) and any
 * k in range, including all-negative rows and -inf entries. Non-finite sums are ranked too (the
 * order torch.topk uses): a NaN sum (a NaN term, or +inf + -inf) ranks above +inf, equal sums of
 * any kind (NaN and NaN, +inf and +inf, -inf and -inf, and -0.0 and +0.0, which compare equal) go
 * to the lower flattened index, and the k indices are always k distinct pairs; scores hold the
 * fp32 sums themselves (NaN stays NaN). A token holding NaN or +inf is ranked over all N^2 pairs
 * (O(N^2) for that token). Outputs must not overlap each other or the inputs; all tensors on one
 * device. When k > 64 the call allocates a workspace on the tensors' device (2*min(k+1,N)*8 bytes
 * per token, at most 64 MiB at a time). On a GPU, k <= 32 with N <= 256 runs a warp-per-token
 * variant with results identical to the portable kernel (the process-wide selection, README, can
 * force the portable kernel). */
ompk_status ompk_router_topk_fwd(const ompk_tensor *sx, const ompk_tensor *sy, int64_t k,
                                 ompk_tensor *scores, ompk_tensor *indices);

/* Backward of the forward above:
 *     dsx[t,i] = sum of dscores[t,r] over slots r with indices[t,r] / N == i
 *     dsy[t,j] = sum of dscores[t,r] over slots r with indices[t,r] % N == j
 * dscores [T,k] f32 or bf16, indices [T,k] i32, dsx and dsy [T,N] f32 or bf16 (one dtype; bf16
 * gradients are accumulated in fp32 and rounded once). 1 <= k <= N^2. Each output element is the
 * fp32 sum of its contributions in slot order starting from 0, so results are bit-identical run to
 * run and device to device. The outputs are overwritten, never accumulated onto. Index -1 is
 * padding and contributes nothing. Any other index outside [0, N^2) returns
 * OMPK_ERR_INDEX_OUT_OF_RANGE and leaves dsx and dsy all zero (so a stale gradient can never pass
 * for a fresh one). Descriptor errors (shape, dtype, device, overlap) write nothing. */
ompk_status ompk_router_topk_bwd(const ompk_tensor *dscores, const ompk_tensor *indices, int64_t n,
                                 ompk_tensor *dsx, ompk_tensor *dsy);

#ifdef __cplusplus
}
#endif
#endif
