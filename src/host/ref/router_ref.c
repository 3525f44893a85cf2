/* Product-key router references: brute force over all N^2 pairs. */
#include <stdlib.h>
#include <string.h>

#include "router_ref.h"
#include "verify.h"

typedef struct ref_pair {
    float s;
    int32_t idx;
} ref_pair;

/* Descending sum, then ascending index; NaN above +inf (docs/KERNELS.md section 4), -0 == +0. */
static int ref_pair_cmp(const void *pa, const void *pb) {
    const ref_pair *a = pa, *b = pb;
    const int na = a->s != a->s, nb = b->s != b->s;
    if (na != nb) return nb - na;
    if (!na) {
        if (a->s > b->s) return -1;
        if (a->s < b->s) return 1;
    }
    return (a->idx > b->idx) - (a->idx < b->idx);
}

ompk_status ompk_ref_router_topk_fwd(const ompk_tensor *sx, const ompk_tensor *sy, int64_t k,
                                     float *scores, int32_t *indices) {
    const int64_t T = sx->shape[0], N = sx->shape[1], NN = N * N;
    ref_pair *all = malloc(sizeof(ref_pair) * (size_t)(NN ? NN : 1));
    float *x = malloc(sizeof(float) * (size_t)(N ? N : 1));
    float *y = malloc(sizeof(float) * (size_t)(N ? N : 1));
    ompk_status st = (all && x && y) ? OMPK_OK : OMPK_ERR_OUT_OF_MEMORY;
    for (int64_t t = 0; t < T && st == OMPK_OK; t++) {
        for (int64_t i = 0; i < N; i++) {
            x[i] = (float)ompk_host_get(sx, t * N + i);
            y[i] = (float)ompk_host_get(sy, t * N + i);
        }
        for (int64_t i = 0; i < N; i++)
            for (int64_t j = 0; j < N; j++) {
                all[i * N + j].s = x[i] + y[j];
                all[i * N + j].idx = (int32_t)(i * N + j);
            }
        qsort(all, (size_t)NN, sizeof(ref_pair), ref_pair_cmp);
        for (int64_t r = 0; r < k; r++) {
            scores[t * k + r] = all[r].s;
            indices[t * k + r] = all[r].idx;
        }
    }
    free(all);
    free(x);
    free(y);
    return st;
}

ompk_status ompk_ref_router_topk_bwd(const ompk_tensor *dscores, const ompk_tensor *indices,
                                     int64_t n, float *dsx, float *dsy) {
    const int64_t T = dscores->shape[0], k = dscores->shape[1];
    memset(dsx, 0, sizeof(float) * (size_t)(T * n));
    memset(dsy, 0, sizeof(float) * (size_t)(T * n));
    for (int64_t e = 0; e < T * k; e++) {
        const double v = ompk_host_get(indices, e);
        if (v != -1.0 && (v < 0.0 || v >= (double)(n * n))) return OMPK_ERR_INDEX_OUT_OF_RANGE;
    }
    for (int64_t t = 0; t < T; t++)
        for (int64_t r = 0; r < k; r++) {
            const int64_t idx = (int64_t)ompk_host_get(indices, t * k + r);
            if (idx < 0) continue;
            const float d = (float)ompk_host_get(dscores, t * k + r);
            dsx[t * n + idx / n] += d;
            dsy[t * n + idx % n] += d;
        }
    return OMPK_OK;
}
