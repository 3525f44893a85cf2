/* ompk_router_topk_bwd: dscores [T,k], indices [T,k] (in range, -1 padding, N*N, INT_MIN, ...),
 * n -> dsx, dsy [T,N]. OMPK_ERR_INDEX_OUT_OF_RANGE documents zeroed outputs, so only that
 * status may write on failure. */
#include "fuzz_common.h"

FZ_INIT {
    fz_begin(data, size);
    int64_t T = fz_range(0, 4), N = fz_range(1, 24);
    int64_t k = fz_range(1, (int)(N * N < 100 ? N * N : 100));
    int64_t n = fz_int(N, N * N, 0);
    ompk_dtype dt = fz_float_dtype();
    ompk_tensor dscores, indices, dsx, dsy;
    ompk_tensor *pd = fz_in(&dscores, dt, 2, T, k);
    ompk_tensor *pi = fz_in(&indices, OMPK_I32, 2, T, k);
    fz_indices(pi, 0, N * N, N * N + 1);
    ompk_tensor *px = fz_out(&dsx, dt, 2, T, N);
    ompk_tensor *py = fz_out(&dsy, dt, 2, T, N);
    fz_arm();
    fz_check(ompk_router_topk_bwd(pd, pi, n, px, py), OMPK_ERR_INDEX_OUT_OF_RANGE);
    fz_end();
    return 0;
}
