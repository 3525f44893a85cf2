/* Internal: golden mHC pre / Sinkhorn / post-backward in double (docs/KERNELS.md 1.1, 1.3-1.6).
 * Every array is contiguous row-major double; T tokens, n streams, K = n*D, M = 2n + n^2.
 * Used by verify mode and the test suites. */
#ifndef OMPK_MHC_REF_PRE_H
#define OMPK_MHC_REF_PRE_H

#include <stdint.h>

#include "ompk/mhc.h"

/* x [T,n,D], phi [M,K], gamma [K] or NULL (ones), alpha [3], bias [M].
 * Outputs h_in [T,D], h_post [T,n], res_logits [T,n,n], h_mix [T,M], inv_rms [T], h_pre [T,n];
 * comb [T,n,n] (Sinkhorn of res_logits) when non-NULL. */
void ompk_mhc_ref_pre_fwd(int64_t T, int n, int64_t D, const double *x, const double *phi,
                          const double *gamma, const double *alpha, const double *bias,
                          const ompk_mhc_params *p, double *h_in, double *h_post,
                          double *res_logits, double *comb, double *h_mix, double *inv_rms,
                          double *h_pre);

void ompk_mhc_ref_sinkhorn_fwd(int64_t T, int n, int repeat, double eps, const double *logits,
                               double *comb);
void ompk_mhc_ref_sinkhorn_bwd(int64_t T, int n, int repeat, double eps, const double *logits,
                               const double *dcomb, double *dlogits);

/* Saved tensors h_mix [T,M], inv_rms [T], h_pre [T,n], h_post [T,n] as the forward wrote them;
 * grad_x_post [T,n,D] or NULL; dgamma may be NULL (and is when gamma is NULL). */
void ompk_mhc_ref_pre_bwd(int64_t T, int n, int64_t D, const double *x, const double *phi,
                          const double *gamma, const double *alpha, const ompk_mhc_params *p,
                          const double *dh_in, const double *dh_post, const double *dh_res,
                          const double *grad_x_post, const double *h_mix, const double *inv_rms,
                          const double *h_pre, const double *h_post, double *dx, double *dphi,
                          double *dalpha, double *dbias, double *dgamma);

/* x [T,n,D], comb [T,n,n], post [T,n], f [T,D], dout [T,n,D] -> dx, df, dpost, dcomb. */
void ompk_mhc_ref_post_bwd(int64_t T, int n, int64_t D, const double *x, const double *comb,
                           const double *post, const double *f, const double *dout, double *dx,
                           double *df, double *dpost, double *dcomb);

#endif
