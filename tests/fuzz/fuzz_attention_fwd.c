/* ompk_attention_fwd: q [B,Hq,N,dh], k, v [B,Hkv,M,dh] -> out [B,Hq,N,dh], lse [B,Hq,N] or
 * NULL; scale and mask from the input (bad masks, NaN and huge scales included). */
#include "fuzz_common.h"

static const int64_t dhs[] = {32, 32, 32, 64, 80, 96, 128, 256, 0, 16, 33};

FZ_INIT {
    fz_begin(data, size);
    int64_t B = fz_range(1, 2), Hkv = fz_range(1, 2), Hq = Hkv * fz_range(1, 3);
    int64_t N = fz_range(0, 20), M = fz_range(0, 20), dh = dhs[fz_u8() % 11];
    ompk_dtype dt = fz_float_dtype();
    uint8_t opt = fz_u8();
    ompk_attention_params prm = {0.0f, (ompk_attention_mask)(opt % 3)};
    if (opt & 4) prm.mask = (ompk_attention_mask)fz_int(3, -1, INT_MAX);
    prm.scale = fz_float(0.0f);
    ompk_tensor q, k, v, out, lse;
    ompk_tensor *pq = fz_in(&q, dt, 4, B, Hq, N, dh);
    ompk_tensor *pk = fz_in(&k, dt, 4, B, Hkv, M, dh);
    ompk_tensor *pv = fz_in(&v, dt, 4, B, Hkv, M, dh);
    ompk_tensor *po = fz_out(&out, dt, 4, B, Hq, N, dh);
    ompk_tensor *pl = (opt & 8) ? NULL : fz_out(&lse, OMPK_F32, 3, B, Hq, N);
    fz_arm();
    fz_check(ompk_attention_fwd(pq, pk, pv, po, pl, (opt & 16) ? NULL : &prm), OMPK_OK);
    fz_end();
    return 0;
}
