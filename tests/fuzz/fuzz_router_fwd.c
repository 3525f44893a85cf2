/* ompk_router_topk_fwd: sx, sy [T,N] -> scores [T,k], indices [T,k]. k from the input (0, -1,
 * N*N, N*N + 1, INT_MIN, ...). An OK call must give k distinct in-range pairs per token. */
#include "fuzz_common.h"

static int64_t read_index(const ompk_tensor *t, int64_t r, int64_t c) {
    const int32_t *p = (const int32_t *)t->data;
    return p[r * t->strides[0] + c * t->strides[1]];
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

FZ_INIT {
    fz_begin(data, size);
    int64_t T = fz_range(0, 4), N = fz_range(1, 24);
    int64_t k = fz_int(fz_range(1, (int)(N * N < 200 ? N * N : 200)), N * N, N * N + 1);
    int64_t kk = k >= 0 && k <= 4096 ? k : 1; /* the nominal output width */
    ompk_dtype dt = fz_float_dtype();
    ompk_tensor sx, sy, scores, indices;
    ompk_tensor *px = fz_in(&sx, dt, 2, T, N);
    ompk_tensor *py = fz_in(&sy, dt, 2, T, N);
    ompk_tensor *ps = fz_out(&scores, OMPK_F32, 2, T, kk);
    ompk_tensor *pi = fz_out(&indices, OMPK_I32, 2, T, kk);
    fz_arm();
    ompk_status st = ompk_router_topk_fwd(px, py, k, ps, pi);
    fz_check(st, OMPK_OK);
    if (st == OMPK_OK) {
        /* the call accepted k and shapes, so indices is [T,k] i32 over an allocated buffer */
        int64_t n2 = px->shape[1] * px->shape[1], kr = pi->shape[1];
        int64_t *row = malloc(sizeof(int64_t) * (size_t)(kr ? kr : 1));
        for (int64_t t = 0; t < pi->shape[0]; t++) {
            for (int64_t r = 0; r < kr; r++) {
                row[r] = read_index(pi, t, r);
                if (row[r] < 0 || row[r] >= n2) fz_fail("router index out of range");
            }
            qsort(row, (size_t)kr, sizeof *row, cmp_i64);
            for (int64_t r = 1; r < kr; r++)
                if (row[r] == row[r - 1]) fz_fail("router returned one pair twice");
        }
        free(row);
    }
    fz_end();
    return 0;
}
