/* Attention: scaled dot-product attention, flash-style (docs/KERNELS.md section 2).
 *
 * Kernels: one portable OpenMP kernel runs on the host's threads for host tensors and on the GPU
 * for target tensors; bf16 on a GPU can use tensor-core kernels, the f32 forward on a GPU a
 * 3xTF32 tensor-core kernel of fp32 accuracy, and host tensors on AVX-512 CPUs host kernels (bf16
 * needs AVX-512 BF16). A call takes the first of these that serves it unless the process-wide
 * selection (README) names one. One that cannot serve a call (GPU: f32 backward, dh 256,
 * unaligned rows; host: no AVX-512, or an f32 backward whose B*Hkv heads do not spread evenly over
 * the threads) leaves it to the portable kernel. The README also lists the switches that check or
 * trace every call against the reference.
 *
 * Thread safety: both entry points may run on any number of host threads at once, on one
 * device or several; they keep no state between calls, and results do not depend on what other
 * threads run. The caller keeps one call's outputs away from every other call running at the
 * same time. */
#ifndef OMPK_ATTENTION_H
#define OMPK_ATTENTION_H

#include "ompk/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ompk_attention_mask {
    OMPK_ATTN_MASK_NONE = 0,
    OMPK_ATTN_MASK_CAUSAL_TOP_LEFT =
        1, /* key j visible to query i when j <= i (PyTorch is_causal) */
    OMPK_ATTN_MASK_CAUSAL_BOTTOM_RIGHT = 2, /* j <= i + M - N: the last query sees every key */
    OMPK_ATTN_MASK_COUNT_ = 3
} ompk_attention_mask;

typedef struct ompk_attention_params {
    float scale; /* multiplies <q_i, k_j>; 0 selects 1/sqrt(dh). Must be finite. */
    ompk_attention_mask mask;
} ompk_attention_params;

/* scale 0 (= 1/sqrt(dh)), no mask. */
ompk_attention_params ompk_attention_params_default(void);

/* Forward:
 *     s[i,j] = scale * <q_i, k_j> (masked: -inf),  out_i = sum_j softmax_j(s_i) v_j,
 *     lse_i = log sum_j exp(s[i,j])
 * q [B,Hq,N,dh], k and v [B,Hkv,M,dh], out [B,Hq,N,dh]: one dtype, f32 or bf16; any
 * non-negative strides, but stride 1 on dh. dh in {32, 64, 80, 96, 128, 256}; Hq a multiple of
 * Hkv (query head h reads kv head h / (Hq / Hkv)). lse: NULL, or [B,Hq,N] f32 (any strides).
 * A row with no visible key (bottom-right causal with N > M, or M == 0) gives out = 0 and
 * lse = -inf. params NULL means ompk_attention_params_default(). Accumulation and softmax
 * statistics in fp32; no [N,M] score matrix is formed (no workspace at all).
 * Errors: OMPK_ERR_INVALID_ARGUMENT (shape, dtype, stride, dh, head ratio, params, an output
 * overlapping another tensor), OMPK_ERR_DEVICE_MISMATCH. Nothing is written on error. */
ompk_status ompk_attention_fwd(const ompk_tensor *q, const ompk_tensor *k, const ompk_tensor *v,
                               ompk_tensor *out, ompk_tensor *lse,
                               const ompk_attention_params *params);

/* Backward of ompk_attention_fwd: given dout = dL/dout and the forward's out and lse (both
 * required), writes dq [B,Hq,N,dh], dk and dv [B,Hkv,M,dh] (dk/dv summed over the Hq/Hkv query
 * heads that share a kv head, in a fixed order: repeated calls are bit-identical). dout, out,
 * dq, dk, dv have q's dtype; lse [B,Hq,N] f32. Same layout rules and errors as the forward, plus
 * OMPK_ERR_OUT_OF_MEMORY when the B*Hq*N f32 workspace (rowsum(dout * out)) cannot be allocated.
 * Rows whose lse is -inf (fully masked) contribute nothing. */
ompk_status ompk_attention_bwd(const ompk_tensor *dout, const ompk_tensor *q, const ompk_tensor *k,
                               const ompk_tensor *v, const ompk_tensor *out, const ompk_tensor *lse,
                               ompk_tensor *dq, ompk_tensor *dk, ompk_tensor *dv,
                               const ompk_attention_params *params);

#ifdef __cplusplus
}
#endif
#endif
