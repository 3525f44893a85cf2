/* mHC: manifold-constrained hyper-connections (KERNELS.md section 1). */
#ifndef OMPK_MHC_H
#define OMPK_MHC_H

#include "ompk/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* post, forward (KERNELS.md 1.2):
 *     out[b,s,o,d] = post[b,s,o] * f[b,s,d] + sum_i comb[b,s,i,o] * x[b,s,i,d]
 * x [B,S,n,D] f32|bf16 (any non-negative strides), comb [B,S,n,n] f32, post [B,S,n] f32,
 * f [B,S,D] same dtype as x, out [B,S,n,D] same dtype as x (must not overlap any input).
 * n in 1..8. Accumulates in fp32, rounds out once. All tensors on one device. */
ompk_status ompk_mhc_post_fwd(const ompk_tensor *x, const ompk_tensor *comb,
                              const ompk_tensor *post, const ompk_tensor *f, ompk_tensor *out);

#ifdef __cplusplus
}
#endif
#endif
