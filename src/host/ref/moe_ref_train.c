/* MoE training reference: forward with LoRA and the full backward of docs/KERNELS.md section 3, one
 * route at a time, double sums, on dequantized f32 weights. Shares nothing with the kernels but
 * the dropout mask generator; activations are rounded by the reference's own quantizer. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "moe_ref.h"

static double sigm(double g) {
    return 1.0 / (1.0 + exp(-g));
}

/* out[n] = W[e] v for W [E,N,K] */
static void matvec(const float *W, int64_t e, int64_t N, int64_t K, const double *v, double *out) {
    for (int64_t n = 0; n < N; n++) {
        const float *row = W + (e * N + n) * K;
        double s = 0.0;
        for (int64_t kk = 0; kk < K; kk++) s += (double)row[kk] * v[kk];
        out[n] = s;
    }
}

/* out[k] += W[e]^T v for W [E,N,K] */
static void matvec_t(const float *W, int64_t e, int64_t N, int64_t K, const double *v,
                     double *out) {
    for (int64_t n = 0; n < N; n++) {
        const float *row = W + (e * N + n) * K;
        for (int64_t kk = 0; kk < K; kk++) out[kk] += (double)row[kk] * v[n];
    }
}

void ompk_moe_ref_train(int64_t T, int64_t E, int64_t H, int64_t I, int k, const float *x,
                        const int64_t *ids, const float *w, const float *gate, const float *up,
                        const float *down, ompk_moe_ref_act act, const ompk_moe_ref_lora *lora,
                        double *y, const float *dy, const ompk_moe_ref_grads *gr) {
    const int r = lora && lora->r > 0 ? lora->r : 0;
    const double s = r ? lora->s : 0.0;
    const uint64_t seed = r ? lora->seed : 0;
    const float drop = r ? lora->dropout : 0.0f;
    const int64_t nmax = H > I ? H : I;
    const int64_t in[3] = {H, H, I}, out[3] = {I, I, H};
    double *xv = calloc((size_t)nmax, 8), *xp = calloc((size_t)nmax, 8);
    double *g = calloc((size_t)I, 8), *u = calloc((size_t)I, 8), *av = calloc((size_t)I, 8);
    double *ap = calloc((size_t)I, 8), *z = calloc((size_t)H, 8), *gy = calloc((size_t)H, 8);
    double *da = calloc((size_t)I, 8), *dg = calloc((size_t)I, 8), *du = calloc((size_t)I, 8);
    double *tmp = calloc((size_t)nmax, 8), *lin[3], *ax[3], *bt[3];
    for (int p = 0; p < 3; p++) {
        lin[p] = calloc((size_t)nmax, 8);
        ax[p] = calloc((size_t)(r + 1), 8);
        bt[p] = calloc((size_t)(r + 1), 8);
    }
    if (gr) {
        if (gr->dx) memset(gr->dx, 0, (size_t)(T * H) * 8);
        if (gr->dw) memset(gr->dw, 0, (size_t)(T * k) * 8);
        for (int p = 0; p < 3; p++) {
            if (gr->da[p]) memset(gr->da[p], 0, (size_t)(E * r * in[p]) * 8);
            if (gr->db[p]) memset(gr->db[p], 0, (size_t)(E * out[p] * r) * 8);
            if (gr->dW[p]) memset(gr->dW[p], 0, (size_t)(E * out[p] * in[p]) * 8);
        }
    }
    for (int64_t t = 0; t < T; t++) {
        if (y)
            for (int64_t h = 0; h < H; h++) y[t * H + h] = 0.0;
        for (int64_t h = 0; h < H; h++) xv[h] = x[t * H + h];
        ompk_moe_ref_present(xv, H, act, xp);
        for (int j = 0; j < k; j++) {
            const int64_t e = ids[t * k + j];
            if (e < 0) continue;
            /* forward of the route; lin[p] is the masked LoRA input, ax[p] = A lin[p] */
            for (int p = 0; p < 2; p++)
                for (int64_t h = 0; h < H; h++)
                    lin[p][h] = xp[h] * ompk_moe_lora_keep(seed, p, t, h, drop);
            matvec(gate, e, I, H, xp, g);
            matvec(up, e, I, H, xp, u);
            for (int p = 0; p < 2 && r; p++) {
                matvec(lora->a[p], e, r, H, lin[p], ax[p]);
                matvec(lora->b[p], e, I, r, ax[p], tmp);
                for (int64_t i = 0; i < I; i++) (p ? u : g)[i] += s * tmp[i];
            }
            for (int64_t i = 0; i < I; i++) av[i] = g[i] * sigm(g[i]) * u[i];
            ompk_moe_ref_present(av, I, act, ap);
            matvec(down, e, H, I, ap, z);
            if (r) {
                for (int64_t i = 0; i < I; i++)
                    lin[2][i] = ap[i] * ompk_moe_lora_keep(seed, 2, t, i, drop);
                matvec(lora->a[2], e, r, I, lin[2], ax[2]);
                matvec(lora->b[2], e, H, r, ax[2], tmp);
                for (int64_t h = 0; h < H; h++) z[h] += s * tmp[h];
            }
            const double wt = w[t * k + j];
            if (y)
                for (int64_t h = 0; h < H; h++) y[t * H + h] += wt * z[h];
            if (!dy || !gr) continue;
            /* backward of the route */
            const float *dyt = dy + t * H;
            double dot = 0.0;
            for (int64_t h = 0; h < H; h++) {
                dot += (double)dyt[h] * z[h];
                gy[h] = wt * (double)dyt[h];
            }
            if (gr->dw) gr->dw[t * k + j] = dot;
            memset(da, 0, (size_t)I * 8);
            matvec_t(down, e, H, I, gy, da);
            if (r) {
                memset(bt[2], 0, (size_t)r * 8);
                matvec_t(lora->b[2], e, H, r, gy, bt[2]);
                memset(tmp, 0, (size_t)I * 8);
                matvec_t(lora->a[2], e, r, I, bt[2], tmp);
                for (int64_t i = 0; i < I; i++)
                    da[i] += s * tmp[i] * ompk_moe_lora_keep(seed, 2, t, i, drop);
            }
            for (int64_t i = 0; i < I; i++) {
                double sg = sigm(g[i]);
                dg[i] = da[i] * u[i] * sg * (1.0 + g[i] * (1.0 - sg));
                du[i] = da[i] * g[i] * sg;
            }
            const double *dproj[3] = {dg, du, gy};
            if (gr->dx) {
                double *dxt = gr->dx + t * H;
                matvec_t(gate, e, I, H, dg, dxt);
                matvec_t(up, e, I, H, du, dxt);
            }
            for (int p = 0; p < 3 && r; p++) {
                if (p < 2) {
                    memset(bt[p], 0, (size_t)r * 8);
                    matvec_t(lora->b[p], e, I, r, dproj[p], bt[p]);
                    if (gr->dx) {
                        memset(tmp, 0, (size_t)H * 8);
                        matvec_t(lora->a[p], e, r, H, bt[p], tmp);
                        for (int64_t h = 0; h < H; h++)
                            gr->dx[t * H + h] +=
                                s * tmp[h] * ompk_moe_lora_keep(seed, p, t, h, drop);
                    }
                }
                if (gr->db[p])
                    for (int64_t n = 0; n < out[p]; n++)
                        for (int q = 0; q < r; q++)
                            gr->db[p][(e * out[p] + n) * r + q] += s * dproj[p][n] * ax[p][q];
                if (gr->da[p])
                    for (int q = 0; q < r; q++)
                        for (int64_t kk = 0; kk < in[p]; kk++)
                            gr->da[p][(e * r + q) * in[p] + kk] += s * bt[p][q] * lin[p][kk];
            }
            for (int p = 0; p < 3; p++) {
                if (!gr->dW[p]) continue;
                const double *src = p < 2 ? xp : ap;
                for (int64_t n = 0; n < out[p]; n++)
                    for (int64_t kk = 0; kk < in[p]; kk++)
                        gr->dW[p][(e * out[p] + n) * in[p] + kk] += dproj[p][n] * src[kk];
            }
        }
    }
    free(xv);
    free(xp);
    free(g);
    free(u);
    free(av);
    free(ap);
    free(z);
    free(gy);
    free(da);
    free(dg);
    free(du);
    free(tmp);
    for (int p = 0; p < 3; p++) {
        free(lin[p]);
        free(ax[p]);
        free(bt[p]);
    }
}
