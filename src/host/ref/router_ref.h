/* Internal: product-key router reference implementations on host views (docs/KERNELS.md section 4).
 * Brute force: every one of the N^2 sums is formed in fp32 exactly as the kernels form it
 * (fp32(sx) + fp32(sy), one rounding), then all are sorted. Used by verify mode and the tests. */
#ifndef OMPK_ROUTER_REF_H
#define OMPK_ROUTER_REF_H

#include <stdint.h>

#include "ompk/tensor.h"

/* sx, sy: host views [T,N] (f32|bf16, any strides). scores/indices: dense row-major [T,k].
 * Sorted by sum descending, ties (equal fp32 sums) to the lower flattened index; NaN sums are
 * ranked below every number so the order stays total. Returns OMPK_ERR_OUT_OF_MEMORY if the
 * N^2 scratch cannot be allocated, else OMPK_OK. */
ompk_status ompk_ref_router_topk_fwd(const ompk_tensor *sx, const ompk_tensor *sy, int64_t k,
                                     float *scores, int32_t *indices);

/* dscores [T,k] (f32|bf16), indices [T,k] i32 host views; dsx/dsy dense row-major [T,n] f32.
 * Each output is the fp32 sum of its contributions in slot order starting from 0 (the order the
 * kernels promise), so f32 results must match bit for bit. Index -1 is skipped; any other index
 * outside [0, n^2) returns OMPK_ERR_INDEX_OUT_OF_RANGE with dsx and dsy all zero. */
ompk_status ompk_ref_router_topk_bwd(const ompk_tensor *dscores, const ompk_tensor *indices,
                                     int64_t n, float *dsx, float *dsy);

#endif
