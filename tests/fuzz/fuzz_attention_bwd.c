/* ompk_attention_bwd: dout, q, out [B,Hq,N,dh], k, v [B,Hkv,M,dh], lse [B,Hq,N]
 * -> dq [B,Hq,N,dh], dk, dv [B,Hkv,M,dh]. lse comes from the input bytes (any value, -inf and
 * NaN included), not from a forward. */
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
    ompk_tensor dout, q, k, v, out, lse, dq, dk, dv;
    ompk_tensor *pdo = fz_in(&dout, dt, 4, B, Hq, N, dh);
    ompk_tensor *pq = fz_in(&q, dt, 4, B, Hq, N, dh);
    ompk_tensor *pk = fz_in(&k, dt, 4, B, Hkv, M, dh);
    ompk_tensor *pv = fz_in(&v, dt, 4, B, Hkv, M, dh);
    ompk_tensor *po = fz_in(&out, dt, 4, B, Hq, N, dh);
    ompk_tensor *pl = fz_in(&lse, OMPK_F32, 3, B, Hq, N);
    ompk_tensor *pdq = fz_out(&dq, dt, 4, B, Hq, N, dh);
    ompk_tensor *pdk = fz_out(&dk, dt, 4, B, Hkv, M, dh);
    ompk_tensor *pdv = fz_out(&dv, dt, 4, B, Hkv, M, dh);
    fz_arm();
    fz_check(ompk_attention_bwd(pdo, pq, pk, pv, po, pl, pdq, pdk, pdv, (opt & 16) ? NULL : &prm),
             OMPK_OK);
    fz_end();
    return 0;
}
