/* MoE experts reference: one token and one slot at a time, double sums. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "moe_ref.h"

/* Per-row symmetric int8 as moe.h defines it, in double, written apart from the kernels'
 * quantizer: a NaN makes the row NaN; an infinity gives +-127*inf there and 0*inf = NaN
 * elsewhere; else q = rint(v*(127/max)) in f32 arithmetic, times the f32 scale max/127. */
static void quant_row(const double *v, int64_t n, double *out) {
    double m = 0.0;
    int nan = 0, inf = 0;
    for (int64_t i = 0; i < n; i++) {
        double a = fabs((double)(float)v[i]);
        nan |= a != a;
        inf |= a == INFINITY;
        if (a > m) m = a;
    }
    for (int64_t i = 0; i < n; i++) {
        double f = (double)(float)v[i];
        if (nan) {
            out[i] = NAN;
        } else if (inf) {
            out[i] = (isinf(f) ? copysign(127.0, f) : 0.0) * INFINITY;
        } else if (m == 0.0) {
            out[i] = 0.0;
        } else {
            /* f32 arithmetic of moe.h, through doubles: rounding a double quotient or product of
             * floats to float equals the float operation (53 >= 2*24 + 2), and 2^100 is exact */
            const double r = m < 0x1p-100 ? 0x1p100 : 1.0;
            const double inv = (double)(float)(127.0 / (m * r));
            double q = nearbyint((double)(float)(f * r * inv));
            out[i] = fmax(-127.0, fmin(127.0, q)) * (double)(float)(m / 127.0);
        }
    }
}

void ompk_moe_ref_present(const double *v, int64_t n, ompk_moe_ref_act act, double *out) {
    if (act == OMPK_MOE_REF_ACT_EXACT) {
        memcpy(out, v, (size_t)n * sizeof *out);
    } else if (act == OMPK_MOE_REF_ACT_BF16) {
        for (int64_t i = 0; i < n; i++) out[i] = ompk_round_bf16((float)v[i]);
    } else {
        quant_row(v, n, out);
    }
}

void ompk_moe_ref_forward(int64_t T, int64_t E, int64_t H, int64_t I, int k, const float *x,
                          const int64_t *ids, const float *w, const float *gate, const float *up,
                          const float *down, ompk_moe_ref_act act, double *y) {
    (void)E;
    int64_t nmax = H > I ? H : I;
    double *xv = malloc((size_t)nmax * sizeof *xv);
    double *xp = malloc((size_t)nmax * sizeof *xp);
    double *av = malloc((size_t)I * sizeof *av);
    double *ap = malloc((size_t)I * sizeof *ap);
    for (int64_t t = 0; t < T; t++) {
        double *yt = y + t * H;
        for (int64_t h = 0; h < H; h++) yt[h] = 0.0;
        for (int64_t h = 0; h < H; h++) xv[h] = x[t * H + h];
        ompk_moe_ref_present(xv, H, act, xp);
        for (int j = 0; j < k; j++) {
            int64_t e = ids[t * k + j];
            if (e < 0) continue;
            for (int64_t i = 0; i < I; i++) {
                const float *gr = gate + (e * I + i) * H, *ur = up + (e * I + i) * H;
                double g = 0.0, u = 0.0;
                for (int64_t h = 0; h < H; h++) {
                    g += (double)gr[h] * xp[h];
                    u += (double)ur[h] * xp[h];
                }
                av[i] = g / (1.0 + exp(-g)) * u;
            }
            ompk_moe_ref_present(av, I, act, ap);
            double wt = w[t * k + j];
            for (int64_t h = 0; h < H; h++) {
                const float *dr = down + (e * H + h) * I;
                double s = 0.0;
                for (int64_t i = 0; i < I; i++) s += (double)dr[i] * ap[i];
                yt[h] += wt * s;
            }
        }
    }
    free(xv);
    free(xp);
    free(av);
    free(ap);
}
