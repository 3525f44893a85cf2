/* ompk_mhc_pre_fwd: x [B,S,n,D], phi [M,K], gamma [K] or NULL, alpha [3], bias [M] -> h_in,
 * h_post, res_logits, comb (fused Sinkhorn or not) and the optional saved tensors. */
#include "fuzz_common.h"

FZ_INIT {
    fz_begin(data, size);
    int64_t B = fz_range(0, 2), S = fz_range(1, 2), n = fz_range(1, 9), D = fz_range(1, 24);
    int64_t T = B * S, K = n * D, M = 2 * n + n * n;
    ompk_dtype dt = fz_float_dtype();
    uint8_t opt = fz_u8(); /* which optional tensors are passed */
    ompk_mhc_params prm = ompk_mhc_params_default(), *pp = &prm;
    if (opt & 1) pp = NULL;
    prm.fuse_sinkhorn = !(opt & 2);
    prm.sinkhorn_repeat = (int)fz_int(fz_range(1, 20), 0, 1001);
    prm.norm_eps = fz_float(prm.norm_eps);
    prm.hc_eps = fz_float(prm.hc_eps);
    prm.post_mult = fz_float(prm.post_mult);
    prm.sinkhorn_eps = fz_float(prm.sinkhorn_eps);
    int fused = pp ? prm.fuse_sinkhorn : 1;
    ompk_tensor x, phi, gamma, alpha, bias, h_in, h_post, res, comb, h_mix, inv_rms, h_pre;
    ompk_tensor *px = fz_in(&x, dt, 4, B, S, n, D);
    ompk_tensor *pphi = fz_in(&phi, OMPK_F32, 2, M, K);
    ompk_tensor *pg = (opt & 4) ? NULL : fz_in(&gamma, OMPK_F32, 1, K);
    ompk_tensor *pa = fz_in(&alpha, OMPK_F32, 1, 3);
    ompk_tensor *pb = fz_in(&bias, OMPK_F32, 1, M);
    ompk_tensor *phin = fz_out(&h_in, dt, 3, B, S, D);
    ompk_tensor *phpost = fz_out(&h_post, OMPK_F32, 3, B, S, n);
    ompk_tensor *pres = (fused && (opt & 8)) ? NULL : fz_out(&res, OMPK_F32, 4, B, S, n, n);
    ompk_tensor *pcomb = (!fused && !(opt & 16)) ? NULL : fz_out(&comb, OMPK_F32, 4, B, S, n, n);
    ompk_tensor *pmix = (opt & 32) ? NULL : fz_out(&h_mix, OMPK_F32, 2, T, M);
    ompk_tensor *pinv = (opt & 64) ? NULL : fz_out(&inv_rms, OMPK_F32, 1, T);
    ompk_tensor *phpre = (opt & 128) ? NULL : fz_out(&h_pre, OMPK_F32, 2, T, n);
    fz_arm();
    fz_check(ompk_mhc_pre_fwd(&(ompk_mhc_pre_fwd_args){.x = px,
                                                       .phi = pphi,
                                                       .gamma = pg,
                                                       .alpha = pa,
                                                       .bias = pb,
                                                       .h_in = phin,
                                                       .h_post = phpost,
                                                       .res_logits = pres,
                                                       .comb = pcomb,
                                                       .h_mix = pmix,
                                                       .inv_rms = pinv,
                                                       .h_pre = phpre},
                              pp),
             OMPK_OK);
    fz_end();
    return 0;
}
