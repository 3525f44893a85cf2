/* ompk_mhc_pre_bwd: x [B,S,n,D], phi [M,K], gamma, alpha, the upstream gradients and the saved
 * tensors -> dx, dphi, dalpha, dbias, dgamma. */
#include "fuzz_common.h"

FZ_INIT {
    fz_begin(data, size);
    int64_t B = fz_range(0, 2), S = fz_range(1, 2), n = fz_range(1, 9), D = fz_range(1, 24);
    int64_t T = B * S, K = n * D, M = 2 * n + n * n;
    ompk_dtype dt = fz_float_dtype();
    uint8_t opt = fz_u8();
    ompk_mhc_params prm = ompk_mhc_params_default(), *pp = (opt & 1) ? NULL : &prm;
    prm.hc_eps = fz_float(prm.hc_eps);
    prm.post_mult = fz_float(prm.post_mult);
    int with_gamma = !(opt & 2);
    ompk_tensor x, phi, gamma, alpha, dh_in, dh_post, dh_res, gxp, h_mix, inv_rms, h_pre, h_post;
    ompk_tensor dx, dphi, dalpha, dbias, dgamma;
    ompk_tensor *px = fz_in(&x, dt, 4, B, S, n, D);
    ompk_tensor *pphi = fz_in(&phi, OMPK_F32, 2, M, K);
    ompk_tensor *pg = with_gamma ? fz_in(&gamma, OMPK_F32, 1, K) : NULL;
    ompk_tensor *pa = fz_in(&alpha, OMPK_F32, 1, 3);
    ompk_tensor *pdhin = fz_in(&dh_in, dt, 3, B, S, D);
    ompk_tensor *pdhpost = fz_in(&dh_post, OMPK_F32, 3, B, S, n);
    ompk_tensor *pdhres = fz_in(&dh_res, OMPK_F32, 4, B, S, n, n);
    ompk_tensor *pgxp = (opt & 4) ? fz_in(&gxp, dt, 4, B, S, n, D) : NULL;
    ompk_tensor *pmix = fz_in(&h_mix, OMPK_F32, 2, T, M);
    ompk_tensor *pinv = fz_in(&inv_rms, OMPK_F32, 1, T);
    ompk_tensor *phpre = fz_in(&h_pre, OMPK_F32, 2, T, n);
    ompk_tensor *phpost = fz_in(&h_post, OMPK_F32, 3, B, S, n);
    ompk_tensor *pdx = fz_out(&dx, dt, 4, B, S, n, D);
    ompk_tensor *pdphi = fz_out(&dphi, OMPK_F32, 2, M, K);
    ompk_tensor *pdalpha = fz_out(&dalpha, OMPK_F32, 1, 3);
    ompk_tensor *pdbias = fz_out(&dbias, OMPK_F32, 1, M);
    /* dgamma must come exactly when gamma does; bit 3 flips that */
    ompk_tensor *pdgamma = (with_gamma != !!(opt & 8)) ? fz_out(&dgamma, OMPK_F32, 1, K) : NULL;
    fz_arm();
    fz_check(ompk_mhc_pre_bwd(&(ompk_mhc_pre_bwd_args){.x = px,
                                                       .phi = pphi,
                                                       .gamma = pg,
                                                       .alpha = pa,
                                                       .dh_in = pdhin,
                                                       .dh_post = pdhpost,
                                                       .dh_res = pdhres,
                                                       .grad_x_post = pgxp,
                                                       .h_mix = pmix,
                                                       .inv_rms = pinv,
                                                       .h_pre = phpre,
                                                       .h_post = phpost,
                                                       .dx = pdx,
                                                       .dphi = pdphi,
                                                       .dalpha = pdalpha,
                                                       .dbias = pdbias,
                                                       .dgamma = pdgamma},
                              pp),
             OMPK_OK);
    fz_end();
    return 0;
}
