/* Internal: the kernels' per-row symmetric int8 quantization (activations x and a, int8 weights
 * at load). The double reference in src/host/ref/moe_ref.c quantizes on its own, so the tests
 * and verify mode check this code instead of repeating it. */
#ifndef OMPK_MOE_QUANT_H
#define OMPK_MOE_QUANT_H

#include <math.h>
#include <stdint.h>

/* Returns the row scale and writes q with v ~ q * scale.
 * Finite row: scale = max|v|/127 (0 for an all-zero row), q = rint(v * 127/max|v|); the row is
 * first scaled by an exact power of two where max|v| is tiny, so 127/max cannot overflow.
 * A NaN in the row: scale NaN, q = 0, so every product with the row is NaN.
 * An infinity (no NaN): scale +inf, q = +-127 at the infinities and 0 elsewhere, so every
 * product with the row is +-inf or NaN (0 * inf): non-finite, as the float math gives. */
static inline float moe_quant_row(const float *v, int64_t n, int8_t *q) {
    float m = 0.0f;
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        float a = fabsf(v[i]);
        bad |= !(a <= 0x1.fffffep127f);
        m = a > m ? a : m;
    }
    if (bad) {
        int nan = 0;
        for (int64_t i = 0; i < n; i++) nan |= isnan(v[i]);
        for (int64_t i = 0; i < n; i++)
            q[i] = (int8_t)(!nan && isinf(v[i]) ? (v[i] > 0.0f ? 127 : -127) : 0);
        return nan ? NAN : INFINITY;
    }
    if (m == 0.0f) {
        for (int64_t i = 0; i < n; i++) q[i] = 0;
        return 0.0f;
    }
    const float r = m < 0x1p-100f ? 0x1p100f : 1.0f;
    const float inv = 127.0f / (m * r);
    for (int64_t i = 0; i < n; i++) {
        float t = rintf((v[i] * r) * inv);
        q[i] = (int8_t)(t > 127.0f ? 127.0f : (t < -127.0f ? -127.0f : t));
    }
    return m / 127.0f;
}

#endif
