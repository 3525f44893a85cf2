/* Tolerances, in one place, for verify mode and the test suites.
 *
 * A kernel output is compared with the double-accumulated reference as
 *     |out - ref| <= atol * scale + rtol * |ref|
 * where scale is the typical magnitude of the quantity the output sums (the caller passes it;
 * for a dot product of length K over unit-scale data, sqrt(K)). f32 outputs carry fp32
 * accumulation error only; bf16 outputs add one rounding (half an ulp, 2^-9 relative). */
#ifndef OMPK_TOLERANCE_H
#define OMPK_TOLERANCE_H

#include <math.h>
#include <stdint.h>

#include "ompk/tensor.h"
#include "verify.h"

static inline ompk_tol ompk_tol_for(ompk_dtype out_dtype, double scale) {
    ompk_tol t = {0};
    if (out_dtype == OMPK_BF16) {
        t.atol = 2e-3 * scale;
        t.rtol = 8e-3; /* one bf16 rounding plus fp32 noise, with margin */
    } else {
        t.atol = 2e-5 * scale;
        t.rtol = 1e-4;
    }
    return t;
}

/* int8/int4 bases: a flip of an int8-rounded operand (x, a) moves its product by a whole code
 * step (max|a| / 127), far more than a bf16 rounding: a few elements may reach 8x the band */
static inline ompk_tol ompk_tol_int_flips(ompk_tol t) {
    t.flip_mult = 8.0;
    t.flip_div = 200;
    return t;
}

/* MoE backward outputs: bf16-level; OMPK_MOE_GRAD_BF16 rounds the data-gradient products'
 * operands (dy, dg, du) to bf16 once more, which every gradient downstream carries. */
static inline ompk_tol ompk_tol_moe_grad(int grad_bf16, int int_base, double scale) {
    ompk_tol t = ompk_tol_for(OMPK_BF16, scale);
    if (grad_bf16) {
        t.atol *= 3.0;
        t.rtol *= 3.0;
    }
    return int_base ? ompk_tol_int_flips(t) : t;
}

/* Attention outputs (docs/KERNELS.md section 2), for verify mode and the attention suites alike. */
typedef enum ompk_tol_att {
    OMPK_TOL_ATT_OUT,
    OMPK_TOL_ATT_LSE,
    OMPK_TOL_ATT_DQ,
    OMPK_TOL_ATT_DKV
} ompk_tol_att;

/* out is a convex combination of v rows and lse a log-sum: unit scale; dq sums over keys, and
 * dk, dv over the G query heads of a group too: sqrt(G). bf16_p: the kernel rounds P (and dS in
 * the backward) to bf16 before its second product, as FlashAttention does (the GPU tensor-core
 * and host AVX-512 BF16 kernels). Where one term dominates a sum (causal rows near the diagonal,
 * P ~ 1) that rounding, up to 2^-9 relative, adds to the output's own rounding of the same
 * size. In the backward a key's dk, dv sum such terms over the rows that see it: a bottom-right
 * mask with N > M gives a key several rows where it holds most of P, their P or dS rounded
 * (just below 1 the bf16 step is 2^-8) against dout of a few units, and the sum may cancel to
 * well below any one term: 3x the one-rounding band. In the forward the dominant P is the row
 * maximum's exp(0) = 1, exact in bf16, and only the smaller terms add (1.5x). */
static inline ompk_tol ompk_tol_attention(ompk_dtype dt, ompk_tol_att what, int64_t group,
                                          int bf16_p) {
    const int grad = what == OMPK_TOL_ATT_DQ || what == OMPK_TOL_ATT_DKV;
    const double scale = what == OMPK_TOL_ATT_DKV ? sqrt((double)group) : 1.0;
    ompk_tol t = ompk_tol_for(what == OMPK_TOL_ATT_LSE ? OMPK_F32 : dt, scale);
    const double mult = dt != OMPK_BF16 || !bf16_p || what == OMPK_TOL_ATT_LSE ? 1.0
                        : grad                                                 ? 3.0
                                                                               : 1.5;
    t.atol *= mult;
    t.rtol *= mult;
    return t;
}

#endif
