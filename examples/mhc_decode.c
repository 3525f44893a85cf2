/* A stack of L mHC layers run forward one token at a time, the shape of a decode step, on the
 * first GPU when there is one, else on the host.
 *
 * Each layer l has its own pre weights (phi, alpha, bias) and a sublayer (here f = 0.5 * h_in, a
 * stand-in for attention or an MLP). The residual stream x [1,1,n,D] goes
 *   pre(0); then for l = 0..L-2: f_l = sublayer(h_in_l), ompk_mhc_post_pre_fwd(post of layer l +
 *   pre of layer l+1); finally post(L-1)
 * so that every layer boundary is one call. The same chain with separate ompk_mhc_post_fwd and
 * ompk_mhc_pre_fwd calls must give the same final x bit for bit. Exit status 0 when it does. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ompk/ompk.h>

enum { L = 4, n = 4, D = 256, K = n * D, M = 2 * n + n * n };

static ompk_device dev;

static uint64_t rng = 0x243F6A8885A308D3ull;
static float uniform(void) { /* [-1, 1) */
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

static void check(const char *what, ompk_status st) {
    if (st == OMPK_OK) return;
    fprintf(stderr, "mhc_decode: %s: %s (%s)\n", what, ompk_status_str(st), ompk_last_error());
    exit(1);
}

/* an f32 tensor on dev, filled with scale * uniform values (scale 0: zeros) */
static ompk_tensor tensor(int ndim, const int64_t *shape, float scale) {
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) numel *= shape[i];
    const size_t bytes = sizeof(float) * (size_t)numel;
    float *h = malloc(bytes);
    for (int64_t i = 0; i < numel; i++) h[i] = scale * uniform();
    void *p = ompk_malloc(dev, bytes);
    if (!p) check("ompk_malloc", OMPK_ERR_OUT_OF_MEMORY);
    check("ompk_memcpy", ompk_memcpy(p, dev, h, ompk_device_host(), bytes));
    free(h);
    return ompk_tensor_make(p, OMPK_F32, ndim, shape, dev);
}

static const int64_t sx[4] = {1, 1, n, D}, sh[3] = {1, 1, D}, sp[3] = {1, 1, n},
                     sc[4] = {1, 1, n, n}, sphi[2] = {M, K}, s3[1] = {3}, sm[1] = {M};

typedef struct layer {
    ompk_tensor phi, alpha, bias;      /* the pre's weights */
    ompk_tensor h_in, h_post, comb, f; /* its outputs and the sublayer's */
} layer;

static ompk_mhc_pre_fwd_args pre_args(layer *y, const ompk_tensor *x) {
    return (ompk_mhc_pre_fwd_args){.x = x,
                                   .phi = &y->phi,
                                   .alpha = &y->alpha,
                                   .bias = &y->bias,
                                   .h_in = &y->h_in,
                                   .h_post = &y->h_post,
                                   .comb = &y->comb};
}

/* f = 0.5 * h_in, through the host (a real model runs its attention or MLP here) */
static void sublayer(layer *y) {
    float h[D];
    check("ompk_memcpy", ompk_memcpy(h, ompk_device_host(), y->h_in.data, dev, sizeof h));
    for (int d = 0; d < D; d++) h[d] *= 0.5f;
    check("ompk_memcpy", ompk_memcpy(y->f.data, dev, h, ompk_device_host(), sizeof h));
}

/* the whole stack on x0, into x[0] / x[1] (alternating residual buffers); returns the final one */
static ompk_tensor *run(layer *ys, ompk_tensor *x, int fused) {
    ompk_mhc_pre_fwd_args a = pre_args(&ys[0], &x[0]);
    check("ompk_mhc_pre_fwd", ompk_mhc_pre_fwd(&a, NULL));
    int cur = 0;
    for (int l = 0; l < L - 1; l++) {
        sublayer(&ys[l]);
        if (fused) {
            ompk_mhc_post_pre_fwd_args pp = {.x = &x[cur],
                                             .comb = &ys[l].comb,
                                             .post = &ys[l].h_post,
                                             .f = &ys[l].f,
                                             .x_out = &x[!cur],
                                             .pre = pre_args(&ys[l + 1], NULL)};
            check("ompk_mhc_post_pre_fwd", ompk_mhc_post_pre_fwd(&pp, NULL));
        } else {
            check("ompk_mhc_post_fwd",
                  ompk_mhc_post_fwd(&x[cur], &ys[l].comb, &ys[l].h_post, &ys[l].f, &x[!cur]));
            a = pre_args(&ys[l + 1], &x[!cur]);
            check("ompk_mhc_pre_fwd", ompk_mhc_pre_fwd(&a, NULL));
        }
        cur = !cur;
    }
    sublayer(&ys[L - 1]);
    check("ompk_mhc_post_fwd",
          ompk_mhc_post_fwd(&x[cur], &ys[L - 1].comb, &ys[L - 1].h_post, &ys[L - 1].f, &x[!cur]));
    return &x[!cur];
}

int main(void) {
    dev = ompk_device_count() > 0 ? ompk_device_target(0) : ompk_device_host();
    layer ys[L];
    for (int l = 0; l < L; l++) {
        ys[l].phi = tensor(2, sphi, 1.0f / sqrtf((float)K));
        ys[l].alpha = tensor(1, s3, 1.0f);
        ys[l].bias = tensor(1, sm, 0.3f);
        ys[l].h_in = tensor(3, sh, 0);
        ys[l].h_post = tensor(3, sp, 0);
        ys[l].comb = tensor(4, sc, 0);
        ys[l].f = tensor(3, sh, 0);
    }
    const ompk_tensor x0 = tensor(4, sx, 1.0f);
    float first[K], out[K];
    for (int fused = 0; fused < 2; fused++) {
        ompk_tensor x[2] = {tensor(4, sx, 0), tensor(4, sx, 0)};
        check("ompk_memcpy", ompk_memcpy(x[0].data, dev, x0.data, dev, sizeof(float) * K));
        const ompk_tensor *y = run(ys, x, fused);
        check("ompk_memcpy", ompk_memcpy(fused ? out : first, ompk_device_host(), y->data, dev,
                                         sizeof(float) * K));
        ompk_free(dev, x[0].data), ompk_free(dev, x[1].data);
    }
    const int same = memcmp(first, out, sizeof out) == 0;
    double norm = 0;
    for (int k = 0; k < K; k++) norm += (double)out[k] * out[k];
    printf("mhc_decode on %s: %d layers, n %d, D %d: |x_L| = %.6f; fused chain %s the two-call "
           "chain bit for bit\n",
           dev.type == OMPK_HOST ? "the host" : "a GPU", L, n, D, sqrt(norm),
           same ? "equals" : "DIFFERS from");
    for (int l = 0; l < L; l++) {
        ompk_tensor *all[] = {&ys[l].phi,    &ys[l].alpha, &ys[l].bias, &ys[l].h_in,
                              &ys[l].h_post, &ys[l].comb,  &ys[l].f};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ompk_free(dev, all[i]->data);
    }
    ompk_free(dev, x0.data);
    return same && isfinite(norm) ? 0 : 1;
}
