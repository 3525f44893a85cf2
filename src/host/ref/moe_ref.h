/* Internal: MoE experts reference (KERNELS.md section 3, forward), double accumulation, on
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

/* y[T,H] (double) = the layer on dequantized f32 weights gate/up [E,I,H], down [E,H,I].
 * x [T,H] f32 values, ids [T,k] (already validated: -1 or in [0,E)), w [T,k]. */
void ompk_moe_ref_forward(int64_t T, int64_t E, int64_t H, int64_t I, int k, const float *x,
                          const int64_t *ids, const float *w, const float *gate, const float *up,
                          const float *down, ompk_moe_ref_act act, double *y);

#endif
