/* Tolerances, in one place, for verify mode and the test suites.
 *
 * A kernel output is compared with the double-accumulated reference as
 *     |out - ref| <= atol * scale + rtol * |ref|
 * where scale is the typical magnitude of the quantity the output sums (the caller passes it;
 * for a dot product of length K over unit-scale data, sqrt(K)). f32 outputs carry fp32
 * accumulation error only; bf16 outputs add one rounding (half an ulp, 2^-9 relative). */
#ifndef OMPK_TOLERANCE_H
#define OMPK_TOLERANCE_H

#include "ompk/tensor.h"
#include "verify.h"

static inline ompk_tol ompk_tol_for(ompk_dtype out_dtype, double scale) {
    ompk_tol t;
    if (out_dtype == OMPK_BF16) {
        t.atol = 2e-3 * scale;
        t.rtol = 8e-3; /* one bf16 rounding plus fp32 noise, with margin */
    } else {
        t.atol = 2e-5 * scale;
        t.rtol = 1e-4;
    }
    return t;
}

#endif
