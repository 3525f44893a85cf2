/* One mHC layer, forward and backward, on the first GPU when there is one, else on the host.
 *
 * The residual stream x [B,S,n,D] holds n parallel streams. The layer
 *   pre:  h_in = the streams mixed by h_pre, h_post and comb (Sinkhorn-normalised) from x
 *   f:    the sublayer (attention or an MLP in a model; the identity here: f = h_in)
 *   post: out = h_post * f + comb^T x
 * Loss = sum(w * out) for a fixed random w, so dout = w. The backward runs the same chain in
 * reverse: post_bwd, Sinkhorn bwd (from the saved res_logits), pre_bwd. The gradient of the
 * loss with respect to alpha is then checked against central finite differences of the forward.
 * Exit status 0 when the check passes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <ompk/ompk.h>

enum { B = 2, S = 8, n = 4, D = 64, T = B * S, K = n * D, M = 2 * n + n * n };

static ompk_device dev; /* where every tensor lives */

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float uniform(void) { /* [-1, 1) */
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

/* An f32 tensor on `dev`, filled from `init` (host memory) or zeroed. The same code serves
 * both devices: ompk_malloc and ompk_memcpy take the device as an argument. */
static ompk_tensor tensor(int ndim, const int64_t *shape, const float *init) {
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) numel *= shape[i];
    const size_t bytes = sizeof(float) * (size_t)numel;
    void *p = ompk_malloc(dev, bytes);
    if (!p) {
        fprintf(stderr, "mhc_layer: %s\n", ompk_last_error());
        exit(1);
    }
    if (init)
        ompk_memcpy(p, dev, init, ompk_device_host(), bytes);
    else
        ompk_memset(p, dev, 0, bytes);
    return ompk_tensor_make(p, OMPK_F32, ndim, shape, dev);
}

static void to_host(float *dst, const ompk_tensor *t) {
    ompk_memcpy(dst, ompk_device_host(), t->data, dev,
                sizeof(float) * (size_t)ompk_tensor_numel(t));
}

static void check(const char *what, ompk_status st) {
    if (st == OMPK_OK) return;
    fprintf(stderr, "mhc_layer: %s: %s (%s)\n", what, ompk_status_str(st), ompk_last_error());
    exit(1);
}

static const int64_t sx[4] = {B, S, n, D}, sh[3] = {B, S, D}, sp[3] = {B, S, n},
                     sc[4] = {B, S, n, n}, sphi[2] = {M, K}, sk[1] = {K}, s3[1] = {3}, sm[1] = {M},
                     stm[2] = {T, M}, st1[1] = {T}, stn[2] = {T, n};
static ompk_tensor x, phi, gamma_, alpha, bias, w;      /* inputs and parameters */
static ompk_tensor h_in, h_post, res_logits, comb, out; /* forward results */
static ompk_tensor h_mix, inv_rms, h_pre;               /* saved for the backward */
static ompk_mhc_params params;

/* Forward; returns the loss sum(w * out), read back to the host. */
static double forward(void) {
    const ompk_mhc_pre_fwd_args pre = {.x = &x,
                                       .phi = &phi,
                                       .gamma = &gamma_,
                                       .alpha = &alpha,
                                       .bias = &bias,
                                       .h_in = &h_in,
                                       .h_post = &h_post,
                                       .res_logits = &res_logits,
                                       .comb = &comb,
                                       .h_mix = &h_mix,
                                       .inv_rms = &inv_rms,
                                       .h_pre = &h_pre};
    check("ompk_mhc_pre_fwd", ompk_mhc_pre_fwd(&pre, &params));
    check("ompk_mhc_post_fwd", ompk_mhc_post_fwd(&x, &comb, &h_post, &h_in, &out));
    static float o[T * n * D], wh[T * n * D];
    to_host(o, &out);
    to_host(wh, &w);
    double loss = 0;
    for (int e = 0; e < T * n * D; e++) loss += (double)wh[e] * o[e];
    return loss;
}

int main(void) {
    dev = ompk_device_count() > 0 ? ompk_device_target(0) : ompk_device_host();
    printf("mhc_layer: B=%d S=%d n=%d D=%d on %s\n", B, S, n, D,
           dev.type == OMPK_HOST ? "the host" : "GPU 0");
    params = ompk_mhc_params_default(); /* Sinkhorn fused into pre, 20 rounds */

    static float hx[T * n * D], hphi[M * K], hgamma[K], hbias[M], hw[T * n * D];
    float halpha[3] = {0.8f, 0.6f, 0.4f};
    for (int e = 0; e < T * n * D; e++) hx[e] = uniform();
    for (int e = 0; e < M * K; e++) hphi[e] = 0.05f * uniform();
    for (int e = 0; e < K; e++) hgamma[e] = 1.0f + 0.1f * uniform();
    for (int e = 0; e < M; e++) hbias[e] = 0.1f * uniform();
    for (int e = 0; e < T * n * D; e++) hw[e] = uniform();
    x = tensor(4, sx, hx), phi = tensor(2, sphi, hphi), gamma_ = tensor(1, sk, hgamma);
    alpha = tensor(1, s3, halpha), bias = tensor(1, sm, hbias), w = tensor(4, sx, hw);
    h_in = tensor(3, sh, NULL), h_post = tensor(3, sp, NULL), res_logits = tensor(4, sc, NULL);
    comb = tensor(4, sc, NULL), out = tensor(4, sx, NULL), h_mix = tensor(2, stm, NULL);
    inv_rms = tensor(1, st1, NULL), h_pre = tensor(2, stn, NULL);

    const double loss = forward();

    /* backward: dout = w; f = h_in, so df is the gradient of h_in */
    ompk_tensor dx_post = tensor(4, sx, NULL), df = tensor(3, sh, NULL),
                dpost = tensor(3, sp, NULL), dcomb = tensor(4, sc, NULL);
    check("ompk_mhc_post_bwd",
          ompk_mhc_post_bwd(&x, &comb, &h_post, &h_in, &w, &dx_post, &df, &dpost, &dcomb));
    ompk_tensor dres = tensor(4, sc, NULL);
    check("ompk_mhc_sinkhorn_bwd", ompk_mhc_sinkhorn_bwd(&res_logits, &dcomb, &dres, &params));
    /* the residual path's dx (from post) is added into pre's dx: grad_x_post */
    ompk_tensor dx = tensor(4, sx, NULL), dphi = tensor(2, sphi, NULL),
                dalpha = tensor(1, s3, NULL), dbias = tensor(1, sm, NULL),
                dgamma = tensor(1, sk, NULL);
    const ompk_mhc_pre_bwd_args pre = {.x = &x,
                                       .phi = &phi,
                                       .gamma = &gamma_,
                                       .alpha = &alpha,
                                       .dh_in = &df,
                                       .dh_post = &dpost,
                                       .dh_res = &dres,
                                       .grad_x_post = &dx_post,
                                       .h_mix = &h_mix,
                                       .inv_rms = &inv_rms,
                                       .h_pre = &h_pre,
                                       .h_post = &h_post,
                                       .dx = &dx,
                                       .dphi = &dphi,
                                       .dalpha = &dalpha,
                                       .dbias = &dbias,
                                       .dgamma = &dgamma};
    check("ompk_mhc_pre_bwd", ompk_mhc_pre_bwd(&pre, &params));
    float ga[3];
    to_host(ga, &dalpha);
    printf("loss %.6f, dL/dalpha = (%.5f, %.5f, %.5f)\n", loss, ga[0], ga[1], ga[2]);

    /* finite differences of the forward in each alpha */
    int bad = 0;
    for (int k = 0; k < 3; k++) {
        const float h = 1e-2f, a0 = halpha[k];
        halpha[k] = a0 + h;
        ompk_memcpy(alpha.data, dev, halpha, ompk_device_host(), sizeof halpha);
        const double lp = forward();
        halpha[k] = a0 - h;
        ompk_memcpy(alpha.data, dev, halpha, ompk_device_host(), sizeof halpha);
        const double lm = forward();
        halpha[k] = a0;
        const double fd = (lp - lm) / (2.0 * h);
        const int ok = fabs(fd - ga[k]) <= 1e-2 * fmax(1.0, fabs(fd));
        printf("alpha[%d]: backward %.5f, finite difference %.5f %s\n", k, ga[k], fd,
               ok ? "ok" : "MISMATCH");
        bad += !ok;
    }
    ompk_tensor *all[] = {&x,       &phi,    &gamma_,     &alpha,  &bias,  &w,
                          &h_in,    &h_post, &res_logits, &comb,   &out,   &h_mix,
                          &inv_rms, &h_pre,  &dx_post,    &df,     &dpost, &dcomb,
                          &dres,    &dx,     &dphi,       &dalpha, &dbias, &dgamma};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ompk_free(dev, all[i]->data);
    printf("mhc_layer: %s\n", bad ? "FAILED" : "OK");
    return bad != 0;
}
