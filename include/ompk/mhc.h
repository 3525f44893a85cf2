/* mHC: manifold-constrained hyper-connections (docs/KERNELS.md section 1).
 *
 * Thread safety: every function here may run on any number of host threads at once, on one
 * device or several; the library keeps no per-call state between calls, and GPU workspaces
 * come from a cache shared under a lock. A call's results do not depend on what other threads
 * run. The caller keeps one call's outputs away from every other call running at the same time
 * (the library does not lock tensors). */
#ifndef OMPK_MHC_H
#define OMPK_MHC_H

#include "ompk/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* post, forward (docs/KERNELS.md 1.2):
 *     out[b,s,o,d] = post[b,s,o] * f[b,s,d] + sum_i comb[b,s,i,o] * x[b,s,i,d]
 * x [B,S,n,D] f32|bf16 (any non-negative strides), comb [B,S,n,n] f32, post [B,S,n] f32,
 * f [B,S,D] same dtype as x, out [B,S,n,D] same dtype as x (must not overlap any input).
 * n in 1..8. Accumulates in fp32, rounds out once. All tensors on one device. */
ompk_status ompk_mhc_post_fwd(const ompk_tensor *x, const ompk_tensor *comb,
                              const ompk_tensor *post, const ompk_tensor *f, ompk_tensor *out);

/* Parameters of mHC pre and Sinkhorn (docs/KERNELS.md 1.1, 1.3). */
typedef struct ompk_mhc_params {
    float norm_eps;      /* RMS statistic: 1/sqrt(mean(v^2) + norm_eps); default 1e-6 */
    float hc_eps;        /* added to h_pre after the sigmoid; default 1e-6 */
    float post_mult;     /* h_post = post_mult * sigmoid(...); default 2 */
    int sinkhorn_repeat; /* row+column normalisation rounds, 1..1000; default 20 */
    float sinkhorn_eps;  /* default 1e-6 */
    int fuse_sinkhorn;   /* pre_fwd also runs Sinkhorn and writes comb; default 1 */
} ompk_mhc_params;

ompk_mhc_params ompk_mhc_params_default(void);

/* pre, forward (docs/KERNELS.md 1.1, Sinkhorn 1.3 when params->fuse_sinkhorn). T = B*S, K = n*D,
 * M = 2n + n^2, n in 1..8. One pass over x gives the GEMM and the sum of squares. */
typedef struct ompk_mhc_pre_fwd_args {
    /* Inputs: x [B,S,n,D] f32|bf16 (unit stride on D), phi [M,K] f32 (unit stride on K),
     * gamma [K] f32 (unit stride) or NULL (= ones), alpha [3] f32, bias [M] f32. */
    const ompk_tensor *x, *phi, *gamma, *alpha, *bias;
    /* Outputs: h_in [B,S,D] x's dtype (unit stride on D), h_post [B,S,n] f32,
     * res_logits [B,S,n,n] f32: required when Sinkhorn is not fused, optional when it is (the
     * Sinkhorn backward recomputes from it);
     * comb [B,S,n,n] f32: required when fused, must be NULL otherwise. */
    ompk_tensor *h_in, *h_post, *res_logits, *comb;
    /* Saved for the backward, each optional (NULL = not saved): h_mix [T,M] f32 (the raw GEMM),
     * inv_rms [T] f32, h_pre [T,n] f32. */
    ompk_tensor *h_mix, *inv_rms, *h_pre;
} ompk_mhc_pre_fwd_args;

/* args must not be NULL; params NULL = ompk_mhc_params_default(). */
ompk_status ompk_mhc_pre_fwd(const ompk_mhc_pre_fwd_args *args, const ompk_mhc_params *params);

/* post(l) + pre(l+1), forward (docs/KERNELS.md 1.7): layer l's post forward
 *     x_out[b,s,o,d] = post[b,s,o] * f[b,s,d] + sum_i comb[b,s,i,o] * x[b,s,i,d]
 * (ompk_mhc_post_fwd, rounded once to x's dtype) followed by layer l+1's pre forward on x_out
 * (ompk_mhc_pre_fwd), in one call: the results equal those two calls' bit for bit. Decode-size
 * calls on a GPU (T = B*S <= 64, clang builds) run as one target region that forms x_out and the
 * pre's GEMM in the same pass; larger calls run the two kernels. For training the two backwards
 * need nothing more: ompk_mhc_post_bwd with this call's x, comb, post, f, and ompk_mhc_pre_bwd with
 * x = x_out and the pre outputs saved here (h_mix, inv_rms, h_pre, h_post). */
typedef struct ompk_mhc_post_pre_fwd_args {
    /* Layer l's post inputs, as ompk_mhc_post_fwd's: x [B,S,n,D] f32|bf16 (any non-negative
     * strides), comb [B,S,n,n] f32, post [B,S,n] f32, f [B,S,D] x's dtype. */
    const ompk_tensor *x, *comb, *post, *f;
    /* The new residual [B,S,n,D], x's dtype, unit stride on D; overlaps no other tensor. */
    ompk_tensor *x_out;
    /* Layer l+1's pre forward: phi, gamma, alpha, bias and the outputs as in
     * ompk_mhc_pre_fwd_args; pre.x must be NULL or x_out. */
    ompk_mhc_pre_fwd_args pre;
} ompk_mhc_post_pre_fwd_args;

/* args must not be NULL; params (layer l+1's pre) NULL = ompk_mhc_params_default(). */
ompk_status ompk_mhc_post_pre_fwd(const ompk_mhc_post_pre_fwd_args *args,
                                  const ompk_mhc_params *params);

/* Sinkhorn-Knopp, forward (docs/KERNELS.md 1.3): logits [B,S,n,n] f32 -> comb [B,S,n,n] f32.
 * params: sinkhorn_repeat (1..1000) and sinkhorn_eps (finite, >= 0) are read (NULL = defaults). */
ompk_status ompk_mhc_sinkhorn_fwd(const ompk_tensor *logits, ompk_tensor *comb,
                                  const ompk_mhc_params *params);

/* Sinkhorn-Knopp, backward (docs/KERNELS.md 1.5): the exact gradient of the unrolled forward,
 * recomputed from logits (no implicit-gradient shortcut). dcomb, dlogits [B,S,n,n] f32. params
 * as in the forward. */
ompk_status ompk_mhc_sinkhorn_bwd(const ompk_tensor *logits, const ompk_tensor *dcomb,
                                  ompk_tensor *dlogits, const ompk_mhc_params *params);

/* pre, backward (docs/KERNELS.md 1.4), dW route. Token sums are deterministic (fixed-order
 * partials). */
typedef struct ompk_mhc_pre_bwd_args {
    /* The forward's inputs: x, phi, gamma (NULL = ones), alpha as in ompk_mhc_pre_fwd_args. */
    const ompk_tensor *x, *phi, *gamma, *alpha;
    /* Gradients in: dh_in [B,S,D] f32|bf16 (unit stride on D), dh_post [B,S,n] f32, dh_res
     * [B,S,n,n] f32 (gradient of res_logits), grad_x_post [B,S,n,D] f32|bf16 (unit stride on D)
     * or NULL, added into dx before rounding. */
    const ompk_tensor *dh_in, *dh_post, *dh_res, *grad_x_post;
    /* Saved by the forward: h_mix [T,M], inv_rms [T], h_pre [T,n], h_post [B,S,n] (all f32, all
     * required). */
    const ompk_tensor *h_mix, *inv_rms, *h_pre, *h_post;
    /* Outputs: dx [B,S,n,D] x's dtype (unit stride on D, rounded once), dphi [M,K] f32 (unit
     * stride on K), dalpha [3] f32, dbias [M] f32, dgamma [K] f32 (required when gamma is given,
     * must be NULL when it is not). */
    ompk_tensor *dx, *dphi, *dalpha, *dbias, *dgamma;
} ompk_mhc_pre_bwd_args;

/* args must not be NULL; params: hc_eps and post_mult are read (NULL = defaults). */
ompk_status ompk_mhc_pre_bwd(const ompk_mhc_pre_bwd_args *args, const ompk_mhc_params *params);

/* post, backward (docs/KERNELS.md 1.6), with dout [B,S,n,D] the gradient of post_fwd's out:
 *     dx[t,i,d] = sum_o comb[t,i,o]*dout[t,o,d]     df[t,d] = sum_o post[t,o]*dout[t,o,d]
 *     dpost[t,o] = sum_d dout[t,o,d]*f[t,d]         dcomb[t,i,o] = sum_d x[t,i,d]*dout[t,o,d]
 * x, dout, dx [B,S,n,D] and f, df [B,S,D] share one dtype f32|bf16 (unit stride on D);
 * comb, dcomb [B,S,n,n] f32; post, dpost [B,S,n] f32. */
ompk_status ompk_mhc_post_bwd(const ompk_tensor *x, const ompk_tensor *comb,
                              const ompk_tensor *post, const ompk_tensor *f,
                              const ompk_tensor *dout, ompk_tensor *dx, ompk_tensor *df,
                              ompk_tensor *dpost, ompk_tensor *dcomb);

/* ---- Deprecated names (CHANGELOG.md lists them and their replacements) ---------------------- */

OMPK_DEPRECATED("use ompk_mhc_sinkhorn_fwd")
static inline ompk_status ompk_sinkhorn_fwd(const ompk_tensor *logits, int repeat, float eps,
                                            ompk_tensor *comb) {
    ompk_mhc_params p = ompk_mhc_params_default();
    p.sinkhorn_repeat = repeat;
    p.sinkhorn_eps = eps;
    return ompk_mhc_sinkhorn_fwd(logits, comb, &p);
}

OMPK_DEPRECATED("use ompk_mhc_sinkhorn_bwd")
static inline ompk_status ompk_sinkhorn_bwd(const ompk_tensor *logits, const ompk_tensor *dcomb,
                                            int repeat, float eps, ompk_tensor *dlogits) {
    ompk_mhc_params p = ompk_mhc_params_default();
    p.sinkhorn_repeat = repeat;
    p.sinkhorn_eps = eps;
    return ompk_mhc_sinkhorn_bwd(logits, dcomb, dlogits, &p);
}

/* The positional forms of ompk_mhc_pre_fwd and ompk_mhc_pre_bwd (their old signatures). */
OMPK_DEPRECATED("use ompk_mhc_pre_fwd with ompk_mhc_pre_fwd_args")
static inline ompk_status
ompk_mhc_pre_fwd_positional(const ompk_tensor *x, const ompk_tensor *phi, const ompk_tensor *gamma,
                            const ompk_tensor *alpha, const ompk_tensor *bias,
                            const ompk_mhc_params *params, ompk_tensor *h_in, ompk_tensor *h_post,
                            ompk_tensor *res_logits, ompk_tensor *comb, ompk_tensor *h_mix,
                            ompk_tensor *inv_rms, ompk_tensor *h_pre) {
    ompk_mhc_pre_fwd_args a;
    a.x = x, a.phi = phi, a.gamma = gamma, a.alpha = alpha, a.bias = bias;
    a.h_in = h_in, a.h_post = h_post, a.res_logits = res_logits, a.comb = comb;
    a.h_mix = h_mix, a.inv_rms = inv_rms, a.h_pre = h_pre;
    return ompk_mhc_pre_fwd(&a, params);
}

OMPK_DEPRECATED("use ompk_mhc_pre_bwd with ompk_mhc_pre_bwd_args")
static inline ompk_status ompk_mhc_pre_bwd_positional(
    const ompk_tensor *x, const ompk_tensor *phi, const ompk_tensor *gamma,
    const ompk_tensor *alpha, const ompk_mhc_params *params, const ompk_tensor *dh_in,
    const ompk_tensor *dh_post, const ompk_tensor *dh_res, const ompk_tensor *grad_x_post,
    const ompk_tensor *h_mix, const ompk_tensor *inv_rms, const ompk_tensor *h_pre,
    const ompk_tensor *h_post, ompk_tensor *dx, ompk_tensor *dphi, ompk_tensor *dalpha,
    ompk_tensor *dbias, ompk_tensor *dgamma) {
    ompk_mhc_pre_bwd_args a;
    a.x = x, a.phi = phi, a.gamma = gamma, a.alpha = alpha;
    a.dh_in = dh_in, a.dh_post = dh_post, a.dh_res = dh_res, a.grad_x_post = grad_x_post;
    a.h_mix = h_mix, a.inv_rms = inv_rms, a.h_pre = h_pre, a.h_post = h_post;
    a.dx = dx, a.dphi = dphi, a.dalpha = dalpha, a.dbias = dbias, a.dgamma = dgamma;
    return ompk_mhc_pre_bwd(&a, params);
}

#ifdef __cplusplus
}
#endif
#endif
