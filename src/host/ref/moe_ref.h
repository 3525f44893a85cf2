/* Internal: MoE experts reference (docs/KERNELS.md section 3, forward), double accumulation, on
 * dequantized weights, with the activation rounding of each path done here in double. */
#ifndef OMPK_MOE_REF_H
#define OMPK_MOE_REF_H

#include <stdint.h>

/* How the matmul operands x and a are presented to the weights (see moe.h). */
typedef enum ompk_moe_ref_act {
    OMPK_MOE_REF_ACT_EXACT = 0, /* no rounding: the mathematical layer */
    OMPK_MOE_REF_ACT_BF16 = 1,  /* x and a rounded to bf16 */
    OMPK_MOE_REF_ACT_INT8 = 2   /* x and a quantized per row, symmetric int8 (moe.h) */
} ompk_moe_ref_act;

/* out = v as the kernels consume it under act (bf16 rounding or per-row int8, in double). */
void ompk_moe_ref_present(const double *v, int64_t n, ompk_moe_ref_act act, double *out);

/* LoRA dropout: the keep factor (0, or 1/(1-p)) of feature f of token t's LoRA input of
 * projection proj (0 gate, 1 up, 2 down) under seed. A pure function, so the backward
 * regenerates the forward's mask instead of storing it; the kernels and the reference share it. */
static inline float ompk_moe_lora_keep(uint64_t seed, int proj, int64_t t, int64_t f, float p) {
    if (!(p > 0.0f)) return 1.0f;
    uint64_t z = seed ^ ((uint64_t)proj << 62) ^ ((uint64_t)t * 0x9E3779B97F4A7C15ull) ^
                 ((uint64_t)f * 0xC2B2AE3D27D4EB4Full);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    float u = (float)(z >> 40) * (1.0f / 16777216.0f);
    return u < p ? 0.0f : 1.0f / (1.0f - p);
}

/* y[T,H] (double) = the layer on dequantized f32 weights gate/up [E,I,H], down [E,H,I].
 * x [T,H] f32 values, ids [T,k] (already validated: -1 or in [0,E)), w [T,k]. */
void ompk_moe_ref_forward(int64_t T, int64_t E, int64_t H, int64_t I, int k, const float *x,
                          const int64_t *ids, const float *w, const float *gate, const float *up,
                          const float *down, ompk_moe_ref_act act, double *y);

/* LoRA adapters for the reference: A [E,r,in], B [E,out,r] f32 per projection (0 gate, 1 up,
 * 2 down), scale s; NULL lora (or r = 0) = none. */
typedef struct ompk_moe_ref_lora {
    int r;
    double s;
    const float *a[3], *b[3];
    float dropout;
    uint64_t seed;
} ompk_moe_ref_lora;

/* Gradients of the reference backward, double, any pointer NULL = not wanted: dx [T,H],
 * dw [T,k], da[p] [E,r,in], db[p] [E,out,r], dW[p] of the weight shapes. Written (=). */
typedef struct ompk_moe_ref_grads {
    double *dx, *dw;
    double *da[3], *db[3], *dW[3];
} ompk_moe_ref_grads;

/* The training layer (docs/KERNELS.md section 3): x~ = act(x) feeds both W and the LoRA of gate/up,
 * a~ = act(silu(g)*u) both W_down and its LoRA (LoRA inputs masked by ompk_moe_lora_keep):
 *   g = W_g x~ + s B_g A_g (m_g x~),  u likewise,  z = W_d a~ + s B_d A_d (m_d a~),
 *   y_t = sum_j w z.
 * y (may be NULL) [T,H]. With dy (f32 [T,H], may be NULL) the backward of that forward with the
 * roundings act() counted as identity. */
void ompk_moe_ref_train(int64_t T, int64_t E, int64_t H, int64_t I, int k, const float *x,
                        const int64_t *ids, const float *w, const float *gate, const float *up,
                        const float *down, ompk_moe_ref_act act, const ompk_moe_ref_lora *lora,
                        double *y, const float *dy, const ompk_moe_ref_grads *grads);

#endif
