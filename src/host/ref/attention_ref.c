/* Golden attention: materialises each score row in double, no tiling, no online softmax, so it
 * shares no algorithmic shortcut with the kernels it checks. */
#include "attention_ref.h"

#include <math.h>
#include <stdlib.h>

#include "bf16.h"

static double at(const ompk_tensor *t, int64_t b, int64_t h, int64_t n, int64_t d) {
    int64_t off = b * t->strides[0] + h * t->strides[1] + n * t->strides[2] + d * t->strides[3];
    if (t->dtype == OMPK_BF16) return ompk_bf16_to_f32(((const uint16_t *)t->data)[off]);
    return ((const float *)t->data)[off];
}

/* Dense double copy [B,H,L,dh] of a rank-4 host tensor. */
static double *dense(const ompk_tensor *t) {
    int64_t B = t->shape[0], H = t->shape[1], L = t->shape[2], D = t->shape[3];
    double *p = malloc((size_t)(B * H * L * D + 1) * sizeof(double));
    if (!p) abort();
    int64_t idx = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t n = 0; n < L; n++)
                for (int64_t d = 0; d < D; d++) p[idx++] = at(t, b, h, n, d);
    return p;
}

/* Softmax row i of head (b,h): p[j] for j < lim, returns lse (or -inf when lim == 0). */
static double prob_row(const double *qi, const double *kh, int64_t lim, int64_t D, double scale,
                       double *p) {
    if (lim == 0) return -INFINITY;
    double mx = -INFINITY;
    for (int64_t j = 0; j < lim; j++) {
        double s = 0;
        for (int64_t d = 0; d < D; d++) s += qi[d] * kh[j * D + d];
        p[j] = s * scale;
        if (p[j] > mx) mx = p[j];
    }
    double sum = 0;
    for (int64_t j = 0; j < lim; j++) {
        p[j] = exp(p[j] - mx);
        sum += p[j];
    }
    for (int64_t j = 0; j < lim; j++) p[j] /= sum;
    return mx + log(sum);
}

void ompk_attention_ref_fwd(const ompk_tensor *q, const ompk_tensor *k, const ompk_tensor *v,
                            double scale, ompk_attention_mask mask, double *out, double *lse) {
    int64_t B = q->shape[0], Hq = q->shape[1], N = q->shape[2], D = q->shape[3];
    int64_t Hkv = k->shape[1], M = k->shape[2], G = Hq / Hkv;
    double *Q = dense(q), *K = dense(k), *V = dense(v);
    double *p = malloc((size_t)(M + 1) * sizeof(double));
    if (!p) abort();
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++) {
            const double *kh = K + ((b * Hkv + h / G) * M) * D;
            const double *vh = V + ((b * Hkv + h / G) * M) * D;
            for (int64_t i = 0; i < N; i++) {
                int64_t row = (b * Hq + h) * N + i;
                int64_t lim = ompk_attention_key_limit(mask, i, N, M);
                double l = prob_row(Q + row * D, kh, lim, D, scale, p);
                if (lse) lse[row] = l;
                for (int64_t d = 0; d < D; d++) {
                    double o = 0;
                    for (int64_t j = 0; j < lim; j++) o += p[j] * vh[j * D + d];
                    out[row * D + d] = o;
                }
            }
        }
    free(p);
    free(Q);
    free(K);
    free(V);
}

void ompk_attention_ref_bwd(const ompk_tensor *dout, const ompk_tensor *q, const ompk_tensor *k,
                            const ompk_tensor *v, const ompk_tensor *out, double scale,
                            ompk_attention_mask mask, double *dq, double *dk, double *dv) {
    int64_t B = q->shape[0], Hq = q->shape[1], N = q->shape[2], D = q->shape[3];
    int64_t Hkv = k->shape[1], M = k->shape[2], G = Hq / Hkv;
    double *Q = dense(q), *K = dense(k), *V = dense(v), *dO = dense(dout);
    double *O = out ? dense(out) : NULL;
    double *p = malloc((size_t)(M + 1) * sizeof(double));
    double *ds = malloc((size_t)(M + 1) * sizeof(double));
    if (!p || !ds) abort();
    for (int64_t i = 0; i < B * Hkv * M * D; i++) dk[i] = dv[i] = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++) {
            int64_t kvo = ((b * Hkv + h / G) * M) * D;
            const double *kh = K + kvo, *vh = V + kvo;
            for (int64_t i = 0; i < N; i++) {
                int64_t row = (b * Hq + h) * N + i;
                const double *qi = Q + row * D, *doi = dO + row * D;
                int64_t lim = ompk_attention_key_limit(mask, i, N, M);
                prob_row(qi, kh, lim, D, scale, p);
                double Di = 0;
                for (int64_t j = 0; j < lim; j++) {
                    double dp = 0;
                    for (int64_t d = 0; d < D; d++) dp += doi[d] * vh[j * D + d];
                    ds[j] = dp;
                    Di += p[j] * dp;
                }
                if (O) {
                    Di = 0;
                    for (int64_t d = 0; d < D; d++) Di += doi[d] * O[row * D + d];
                }
                for (int64_t d = 0; d < D; d++) dq[row * D + d] = 0;
                for (int64_t j = 0; j < lim; j++) {
                    ds[j] = p[j] * (ds[j] - Di);
                    for (int64_t d = 0; d < D; d++) {
                        dq[row * D + d] += scale * ds[j] * kh[j * D + d];
                        dk[kvo + j * D + d] += scale * ds[j] * qi[d];
                        dv[kvo + j * D + d] += p[j] * doi[d];
                    }
                }
            }
        }
    free(p);
    free(ds);
    free(Q);
    free(K);
    free(V);
    free(dO);
    free(O);
}
