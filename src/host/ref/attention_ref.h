/* Internal: golden attention (docs/KERNELS.md section 2) in double precision, for tests and
 * OMPK_VERIFY. Inputs are host tensors of any strides (f32 or bf16); outputs are dense,
 * logical row-major double arrays. `scale` is the resolved scale (never 0 here). */
#ifndef OMPK_ATTENTION_REF_H
#define OMPK_ATTENTION_REF_H

#include "ompk/attention.h"

/* out [B,Hq,N,dh]; lse [B,Hq,N] (may be NULL), -inf for a row with no visible key. */
void ompk_attention_ref_fwd(const ompk_tensor *q, const ompk_tensor *k, const ompk_tensor *v,
                            double scale, ompk_attention_mask mask, double *out, double *lse);

/* dq [B,Hq,N,dh], dk and dv [B,Hkv,M,dh]; P is recomputed from q and k. The row term
 * D_i = sum_j P_ij <dout_i, v_j> equals <dout_i, out_i>; when `out` is non-NULL it is taken from
 * that stored forward output, as the backward contract does (a bf16 out carries its rounding
 * into D), otherwise from the exact P. */
void ompk_attention_ref_bwd(const ompk_tensor *dout, const ompk_tensor *q, const ompk_tensor *k,
                            const ompk_tensor *v, const ompk_tensor *out, double scale,
                            ompk_attention_mask mask, double *dq, double *dk, double *dv);

/* First key index past the last visible one for query row i (keys 0..limit-1 are visible). */
static inline int64_t ompk_attention_key_limit(ompk_attention_mask mask, int64_t i, int64_t n,
                                               int64_t m) {
    int64_t lim = m;
    if (mask == OMPK_ATTN_MASK_CAUSAL_TOP_LEFT)
        lim = i + 1;
    else if (mask == OMPK_ATTN_MASK_CAUSAL_BOTTOM_RIGHT)
        lim = i + 1 + m - n;
    if (lim > m) lim = m;
    if (lim < 0) lim = 0;
    return lim;
}

#endif
