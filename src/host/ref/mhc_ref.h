/* Internal: mHC reference implementations (double accumulation) on host views. Used by verify
 * mode and by the tests; outputs are dense row-major double arrays. */
#ifndef OMPK_MHC_REF_H
#define OMPK_MHC_REF_H

#include "ompk/tensor.h"

/* out[B*S*n*D] = post*f + sum_i comb[i,o]*x[i] (docs/KERNELS.md 1.2) */
void ompk_ref_mhc_post_fwd(const ompk_tensor *x, const ompk_tensor *comb, const ompk_tensor *post,
                           const ompk_tensor *f, double *out);

#endif
