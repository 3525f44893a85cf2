/* Golden mHC pre forward/backward, Sinkhorn forward/backward and post backward, in double.
 * Written straight from the formulas of docs/KERNELS.md 1, with no attempt at speed, so that the
 * kernels and the PyTorch fixtures have an independent third opinion. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mhc_ref_pre.h"

static double sigm(double z) {
    return 1.0 / (1.0 + exp(-z));
}

/* One token's Sinkhorn forward. states (2*repeat matrices of n*n) receives every
 * intermediate when non-NULL: state 0 = the softmax (before + eps), state 2r+1 = after the
 * column step of round r, state 2r (r > 0) = after the row step of round r. */
static void sk_token(int n, int repeat, double eps, const double *lg, double *out, double *states) {
    double c[64];
    const size_t nnb = sizeof(double) * (size_t)(n * n);
    for (int i = 0; i < n; i++) {
        double mx = -INFINITY, s = 0;
        for (int j = 0; j < n; j++) mx = fmax(mx, lg[i * n + j]);
        for (int j = 0; j < n; j++) s += exp(lg[i * n + j] - mx);
        for (int j = 0; j < n; j++) c[i * n + j] = exp(lg[i * n + j] - mx) / s;
    }
    if (states) memcpy(states, c, nnb);
    for (int e = 0; e < n * n; e++) c[e] += eps;
    for (int r = 0; r < repeat; r++) {
        if (r > 0) {
            for (int i = 0; i < n; i++) {
                double s = 0;
                for (int j = 0; j < n; j++) s += c[i * n + j];
                for (int j = 0; j < n; j++) c[i * n + j] /= s + eps;
            }
            if (states) memcpy(states + (size_t)(2 * r) * n * n, c, nnb);
        }
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int i = 0; i < n; i++) s += c[i * n + j];
            for (int i = 0; i < n; i++) c[i * n + j] /= s + eps;
        }
        if (states) memcpy(states + (size_t)(2 * r + 1) * n * n, c, nnb);
    }
    memcpy(out, c, nnb);
}

void ompk_mhc_ref_sinkhorn_fwd(int64_t T, int n, int repeat, double eps, const double *logits,
                               double *comb) {
    for (int64_t t = 0; t < T; t++)
        sk_token(n, repeat, eps, logits + t * n * n, comb + t * n * n, NULL);
}

void ompk_mhc_ref_sinkhorn_bwd(int64_t T, int n, int repeat, double eps, const double *logits,
                               const double *dcomb, double *dlogits) {
    const int nn = n * n;
    double *st = malloc(sizeof(double) * (size_t)(2 * repeat) * nn);
    double out[64], g[64], z[64];
    for (int64_t t = 0; t < T; t++) {
        sk_token(n, repeat, eps, logits + t * nn, out, st);
        memcpy(g, dcomb + t * nn, sizeof(double) * nn);
        /* steps in reverse: step 2r+1 is the column step of round r (input: state 2r, or the
         * softmax + eps for r = 0), step 2r (r > 0) the row step (input: state 2r-1). */
        for (int s = 2 * repeat - 1; s >= 1; s--) {
            const int col = (s % 2) == 1;
            const double *zin = st + (s - 1) * nn;
            for (int e = 0; e < nn; e++) z[e] = zin[e] + (s == 1 ? eps : 0.0);
            for (int a = 0; a < n; a++) {
                double sum = 0, gz = 0;
                for (int b = 0; b < n; b++) {
                    int e = col ? b * n + a : a * n + b;
                    sum += z[e];
                    gz += g[e] * z[e];
                }
                double den = sum + eps;
                for (int b = 0; b < n; b++) {
                    int e = col ? b * n + a : a * n + b;
                    g[e] = (g[e] - gz / den) / den;
                }
            }
        }
        /* the first column step's input is softmax + eps: the eps has zero gradient */
        const double *p = st;
        for (int i = 0; i < n; i++) {
            double gp = 0;
            for (int j = 0; j < n; j++) gp += g[i * n + j] * p[i * n + j];
            for (int j = 0; j < n; j++)
                dlogits[t * nn + i * n + j] = (g[i * n + j] - gp) * p[i * n + j];
        }
    }
    free(st);
}

void ompk_mhc_ref_pre_fwd(int64_t T, int n, int64_t D, const double *x, const double *phi,
                          const double *gamma, const double *alpha, const double *bias,
                          const ompk_mhc_params *p, double *h_in, double *h_post,
                          double *res_logits, double *comb, double *h_mix, double *inv_rms,
                          double *h_pre) {
    const int64_t K = (int64_t)n * D;
    const int M = 2 * n + n * n;
    for (int64_t t = 0; t < T; t++) {
        const double *v = x + t * K;
        double ss = 0;
        for (int64_t k = 0; k < K; k++) ss += v[k] * v[k];
        double r = 1.0 / sqrt(ss / (double)K + (double)p->norm_eps);
        inv_rms[t] = r;
        for (int m = 0; m < M; m++) {
            double acc = 0;
            for (int64_t k = 0; k < K; k++) acc += v[k] * (gamma ? gamma[k] : 1.0) * phi[m * K + k];
            h_mix[t * M + m] = acc;
        }
        const double *hm = h_mix + t * M;
        for (int i = 0; i < n; i++) {
            h_pre[t * n + i] = sigm(alpha[0] * hm[i] * r + bias[i]) + p->hc_eps;
            h_post[t * n + i] = p->post_mult * sigm(alpha[1] * hm[n + i] * r + bias[n + i]);
        }
        for (int e = 0; e < n * n; e++)
            res_logits[t * n * n + e] = alpha[2] * hm[2 * n + e] * r + bias[2 * n + e];
        for (int64_t d = 0; d < D; d++) {
            double acc = 0;
            for (int i = 0; i < n; i++) acc += h_pre[t * n + i] * v[i * D + d];
            h_in[t * D + d] = acc;
        }
    }
    if (comb)
        ompk_mhc_ref_sinkhorn_fwd(T, n, p->sinkhorn_repeat, p->sinkhorn_eps, res_logits, comb);
}

void ompk_mhc_ref_pre_bwd(int64_t T, int n, int64_t D, const double *x, const double *phi,
                          const double *gamma, const double *alpha, const ompk_mhc_params *p,
                          const double *dh_in, const double *dh_post, const double *dh_res,
                          const double *grad_x_post, const double *h_mix, const double *inv_rms,
                          const double *h_pre, const double *h_post, double *dx, double *dphi,
                          double *dalpha, double *dbias, double *dgamma) {
    const int64_t K = (int64_t)n * D;
    const int M = 2 * n + n * n;
    double *dW = calloc((size_t)M * (size_t)K, sizeof(double));
    double *dz = malloc(sizeof(double) * M), *dhmix = malloc(sizeof(double) * M);
    for (int g = 0; g < 3; g++) dalpha[g] = 0;
    for (int m = 0; m < M; m++) dbias[m] = 0;
    for (int64_t t = 0; t < T; t++) {
        const double *v = x + t * K, *hmx = h_mix + t * M;
        const double r = inv_rms[t];
        for (int i = 0; i < n; i++) {
            double dhp = 0;
            for (int64_t d = 0; d < D; d++) dhp += dh_in[t * D + d] * v[i * D + d];
            double s = h_pre[t * n + i] - p->hc_eps;
            dz[i] = dhp * s * (1 - s);
            double hp = h_post[t * n + i];
            dz[n + i] = dh_post[t * n + i] * hp * (1 - hp / p->post_mult);
        }
        for (int e = 0; e < n * n; e++) dz[2 * n + e] = dh_res[t * n * n + e];
        double dinv = 0;
        for (int m = 0; m < M; m++) {
            int g = m < n ? 0 : m < 2 * n ? 1 : 2;
            double dhm = dz[m] * alpha[g];
            dalpha[g] += dz[m] * hmx[m] * r;
            dbias[m] += dz[m];
            dinv += dhm * hmx[m];
            dhmix[m] = dhm * r;
        }
        const double cinv = dinv * r * r * r / (double)K;
        for (int64_t k = 0; k < K; k++) {
            double gk = gamma ? gamma[k] : 1.0, acc = 0;
            for (int m = 0; m < M; m++) {
                acc += dhmix[m] * phi[m * K + k];
                dW[m * K + k] += dhmix[m] * v[k];
            }
            int i = (int)(k / D);
            int64_t d = k % D;
            double val = acc * gk - cinv * v[k] + h_pre[t * n + i] * dh_in[t * D + d];
            if (grad_x_post) val += grad_x_post[t * K + k];
            dx[t * K + k] = val;
        }
    }
    for (int64_t k = 0; k < K; k++) {
        double gk = gamma ? gamma[k] : 1.0, dg = 0;
        for (int m = 0; m < M; m++) {
            dphi[m * K + k] = dW[m * K + k] * gk;
            dg += dW[m * K + k] * phi[m * K + k];
        }
        if (dgamma) dgamma[k] = dg;
    }
    free(dW);
    free(dz);
    free(dhmix);
}

void ompk_mhc_ref_post_bwd(int64_t T, int n, int64_t D, const double *x, const double *comb,
                           const double *post, const double *f, const double *dout, double *dx,
                           double *df, double *dpost, double *dcomb) {
    for (int64_t t = 0; t < T; t++) {
        const double *xt = x + t * n * D, *gt = dout + t * n * D, *ct = comb + t * n * n;
        for (int64_t d = 0; d < D; d++) {
            double a = 0;
            for (int o = 0; o < n; o++) a += post[t * n + o] * gt[o * D + d];
            df[t * D + d] = a;
            for (int i = 0; i < n; i++) {
                double b = 0;
                for (int o = 0; o < n; o++) b += ct[i * n + o] * gt[o * D + d];
                dx[t * n * D + i * D + d] = b;
            }
        }
        for (int o = 0; o < n; o++) {
            double a = 0;
            for (int64_t d = 0; d < D; d++) a += gt[o * D + d] * f[t * D + d];
            dpost[t * n + o] = a;
            for (int i = 0; i < n; i++) {
                double b = 0;
                for (int64_t d = 0; d < D; d++) b += xt[i * D + d] * gt[o * D + d];
                dcomb[t * n * n + i * n + o] = b;
            }
        }
    }
}
