/* ompk_mhc_post_fwd: x [B,S,n,D], comb [B,S,n,n], post [B,S,n], f [B,S,D] -> out [B,S,n,D]. */
#include "fuzz_common.h"

FZ_INIT {
    fz_begin(data, size);
    int64_t B = fz_range(0, 2), S = fz_range(1, 3), n = fz_range(1, 9), D = fz_range(0, 40);
    ompk_dtype dt = fz_float_dtype();
    ompk_tensor x, comb, post, f, out;
    ompk_tensor *px = fz_in(&x, dt, 4, B, S, n, D);
    ompk_tensor *pc = fz_in(&comb, OMPK_F32, 4, B, S, n, n);
    ompk_tensor *pp = fz_in(&post, OMPK_F32, 3, B, S, n);
    ompk_tensor *pf = fz_in(&f, dt, 3, B, S, D);
    ompk_tensor *po = fz_out(&out, dt, 4, B, S, n, D);
    fz_arm();
    fz_check(ompk_mhc_post_fwd(px, pc, pp, pf, po), OMPK_OK);
    fz_end();
    return 0;
}
