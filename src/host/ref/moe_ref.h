/* Internal: MoE experts reference (KERNELS.md section 3, forward), double accumulation, on
 * dequantized weights, plus the activation quantization every path shares. */
#ifndef OMPK_MOE_REF_H
#define OMPK_MOE_REF_H

#include <math.h>
#include <stdint.h>

/* How the matmul operands x and a are presented to the weights (see moe.h). */
typedef enum ompk_moe_ref_act {
    OMPK_MOE_REF_ACT_EXACT = 0, /* no rounding: the mathematical layer */
    OMPK_MOE_REF_ACT_BF16 = 1,  /* x and a rounded to bf16 */
    OMPK_MOE_REF_ACT_INT8 = 2   /* x and a quantized per row, symmetric int8 */
} ompk_moe_ref_act;

/* The one definition of per-row symmetric int8 activation quantization: returns the scale
 * (max|v|/127, 0 for an all-zero row) and writes q = rint(v * 127/max|v|). Every path and the
 * reference call this, so the integers they multiply are the same. */
static inline float ompk_moe_quant_row(const float *v, int64_t n, int8_t *q) {
    float m = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float a = fabsf(v[i]);
        m = a > m ? a : m;
    }
    if (!(m > 0.0f) || !isfinite(m)) {
        for (int64_t i = 0; i < n; i++) q[i] = 0;
        return isfinite(m) ? 0.0f : m;
    }
    float inv = 127.0f / m;
    for (int64_t i = 0; i < n; i++) {
        float r = rintf(v[i] * inv);
        q[i] = (int8_t)(r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r));
    }
    return m / 127.0f;
}

/* y[T,H] (double) = the layer on dequantized f32 weights gate/up [E,I,H], down [E,H,I].
 * x [T,H] f32 values, ids [T,k] (already validated: -1 or in [0,E)), w [T,k]. */
void ompk_moe_ref_forward(int64_t T, int64_t E, int64_t H, int64_t I, int k, const float *x,
                          const int64_t *ids, const float *w, const float *gate, const float *up,
                          const float *down, ompk_moe_ref_act act, double *y);

#endif
