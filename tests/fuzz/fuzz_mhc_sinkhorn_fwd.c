/* ompk_mhc_sinkhorn_fwd: logits [B,S,n,n] -> comb [B,S,n,n]; repeat and eps from the input. */
#include "fuzz_common.h"

FZ_INIT {
    fz_begin(data, size);
    int64_t B = fz_range(0, 2), S = fz_range(1, 4), n = fz_range(1, 9);
    int repeat = (int)fz_int(fz_range(1, 8), 1000, 1001);
    float eps = fz_float(1e-6f);
    ompk_tensor logits, comb;
    ompk_tensor *pl = fz_in(&logits, OMPK_F32, 4, B, S, n, n);
    ompk_tensor *pc = fz_out(&comb, OMPK_F32, 4, B, S, n, n);
    fz_arm();
    ompk_mhc_params p = ompk_mhc_params_default();
    p.sinkhorn_repeat = repeat, p.sinkhorn_eps = eps;
    fz_check(ompk_mhc_sinkhorn_fwd(pl, pc, &p), OMPK_OK);
    fz_end();
    return 0;
}
