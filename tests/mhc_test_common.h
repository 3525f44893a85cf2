/* Shared helpers of the mHC pre / Sinkhorn / post-backward suites: device tensors with host
 * mirrors, problem setup, comparisons and the fixture reader. */
#ifndef OMPK_MHC_TEST_COMMON_H
#define OMPK_MHC_TEST_COMMON_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mhc_ref_pre.h"
#include "test_util.h"
#include "tolerance.h"

#define POISON 0xA5

/* a buffer on a device and a contiguous view of it */
typedef struct tt {
    tu_buf b;
    ompk_tensor t;
    int live;
} tt;

static inline tt tt_new(ompk_device dev, ompk_dtype dt, int nd, int64_t s0, int64_t s1, int64_t s2,
                        int64_t s3) {
    tt r;
    int64_t sh[4] = {s0, s1, s2, s3}, numel = 1;
    for (int i = 0; i < nd; i++) numel *= sh[i];
    r.b = tu_buf_new(dev, dt, numel);
    r.t = tu_view(&r.b, nd, sh);
    r.live = 1;
    return r;
}

static inline void tt_free(tt *r) {
    if (r->live) tu_buf_free(&r->b);
    r->live = 0;
}

/* host copy of the device data as doubles (caller frees) */
static inline double *tt_get(tt *r) {
    tu_buf_download(&r->b);
    double *d = malloc(sizeof(double) * (size_t)(r->b.numel ? r->b.numel : 1));
    for (int64_t i = 0; i < r->b.numel; i++) d[i] = tu_buf_get(&r->b, i);
    return d;
}

static inline void tt_set(tt *r, const double *v) {
    for (int64_t i = 0; i < r->b.numel; i++) tu_buf_set(&r->b, i, v[i]);
    tu_buf_upload(&r->b);
}

static inline double dmax(const double *r, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs(r[i]));
    return m;
}

/* tolerance of ompk_tol_for(dtype, max|ref|) scaled by `loose`; returns the worst ratio */
static inline double tt_cmp(const char *what, tt *r, const double *ref, double loose) {
    tu_buf_download(&r->b);
    double s = dmax(ref, r->b.numel);
    ompk_tol tol = ompk_tol_for(r->b.dtype, s > 0 ? s : 1);
    return tu_compare(what, &r->b, ref, r->b.numel, tol.atol * loose, tol.rtol * loose);
}

/* the same with an explicit magnitude (e.g. the incoming gradient's, where the output may be
 * ~0 because it was squashed, like a saturated softmax) */
static inline double tt_cmp_scale(const char *what, tt *r, const double *ref, double scale) {
    tu_buf_download(&r->b);
    scale = fmax(scale, dmax(ref, r->b.numel));
    ompk_tol tol = ompk_tol_for(r->b.dtype, scale > 0 ? scale : 1);
    return tu_compare(what, &r->b, ref, r->b.numel, tol.atol, tol.rtol);
}

#define EXPECT_CLOSE(what, r, ref, loose)                                                          \
    do {                                                                                           \
        double w_ = tt_cmp(what, r, ref, loose);                                                   \
        cr_expect(w_ <= 1.0, "%s differs from the reference (worst ratio %g)", what, w_);          \
    } while (0)

/* ---- the pre problem ----------------------------------------------------------------------- */
typedef struct pre_prob {
    ompk_device dev;
    ompk_dtype dt;
    int64_t B, S, n, D, T, K, M;
    int has_gamma;
    ompk_mhc_params p;
    tt x, phi, gamma, alpha, bias;
    tt h_in, h_post, logits, comb, h_mix, inv_rms, h_pre;
    tt dh_in, dh_post, dh_res, gxp;
    tt dx, dphi, dalpha, dbias, dgamma;
} pre_prob;

static inline void pre_new(pre_prob *q, ompk_device dev, ompk_dtype dt, int64_t B, int64_t S,
                           int64_t n, int64_t D, int has_gamma, uint64_t seed, double xscale) {
    memset(q, 0, sizeof *q);
    q->dev = dev, q->dt = dt, q->B = B, q->S = S, q->n = n, q->D = D;
    q->T = B * S, q->K = n * D, q->M = 2 * n + n * n, q->has_gamma = has_gamma;
    q->p = ompk_mhc_params_default();
    tu_rng r = tu_rng_make(seed);
    const int64_t T = q->T, K = q->K, M = q->M;
    q->x = tt_new(dev, dt, 4, B, S, n, D);
    tu_buf_randn(&q->x.b, &r, xscale);
    q->phi = tt_new(dev, OMPK_F32, 2, M, K, 0, 0);
    tu_buf_randn(&q->phi.b, &r, 1.0 / sqrt((double)K));
    if (has_gamma) {
        q->gamma = tt_new(dev, OMPK_F32, 1, K, 0, 0, 0);
        for (int64_t k = 0; k < K; k++) tu_buf_set(&q->gamma.b, k, 1.0 + 0.2 * tu_normal(&r));
        tu_buf_upload(&q->gamma.b);
    }
    q->alpha = tt_new(dev, OMPK_F32, 1, 3, 0, 0, 0);
    tu_buf_set(&q->alpha.b, 0, 0.8), tu_buf_set(&q->alpha.b, 1, 1.1);
    tu_buf_set(&q->alpha.b, 2, 1.3);
    tu_buf_upload(&q->alpha.b);
    q->bias = tt_new(dev, OMPK_F32, 1, M, 0, 0, 0);
    tu_buf_randn(&q->bias.b, &r, 0.3);
    q->h_in = tt_new(dev, dt, 3, B, S, D, 0);
    q->h_post = tt_new(dev, OMPK_F32, 3, B, S, n, 0);
    q->logits = tt_new(dev, OMPK_F32, 4, B, S, n, n);
    q->comb = tt_new(dev, OMPK_F32, 4, B, S, n, n);
    q->h_mix = tt_new(dev, OMPK_F32, 2, T, M, 0, 0);
    q->inv_rms = tt_new(dev, OMPK_F32, 1, T, 0, 0, 0);
    q->h_pre = tt_new(dev, OMPK_F32, 2, T, n, 0, 0);
    q->dh_in = tt_new(dev, dt, 3, B, S, D, 0);
    tu_buf_randn(&q->dh_in.b, &r, 1.0);
    q->dh_post = tt_new(dev, OMPK_F32, 3, B, S, n, 0);
    tu_buf_randn(&q->dh_post.b, &r, 1.0);
    q->dh_res = tt_new(dev, OMPK_F32, 4, B, S, n, n);
    tu_buf_randn(&q->dh_res.b, &r, 1.0);
    q->gxp = tt_new(dev, dt, 4, B, S, n, D);
    tu_buf_randn(&q->gxp.b, &r, 1.0);
    q->dx = tt_new(dev, dt, 4, B, S, n, D);
    q->dphi = tt_new(dev, OMPK_F32, 2, M, K, 0, 0);
    q->dalpha = tt_new(dev, OMPK_F32, 1, 3, 0, 0, 0);
    q->dbias = tt_new(dev, OMPK_F32, 1, M, 0, 0, 0);
    if (has_gamma) q->dgamma = tt_new(dev, OMPK_F32, 1, K, 0, 0, 0);
    tt *outs[] = {&q->h_in,  &q->h_post, &q->logits, &q->comb,   &q->h_mix, &q->inv_rms,
                  &q->h_pre, &q->dx,     &q->dphi,   &q->dalpha, &q->dbias, &q->dgamma};
    for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++)
        if (outs[i]->live) tu_buf_fill_bytes(&outs[i]->b, POISON);
}

static inline void pre_free(pre_prob *q) {
    tt *all[] = {&q->x,      &q->phi,  &q->gamma, &q->alpha,   &q->bias,   &q->h_in,  &q->h_post,
                 &q->logits, &q->comb, &q->h_mix, &q->inv_rms, &q->h_pre,  &q->dh_in, &q->dh_post,
                 &q->dh_res, &q->gxp,  &q->dx,    &q->dphi,    &q->dalpha, &q->dbias, &q->dgamma};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_free(all[i]);
}

static inline ompk_tensor *opt(tt *r) {
    return r->live ? &r->t : NULL;
}

/* the pre forward's arguments of q (comb only when Sinkhorn is fused) */
static inline ompk_mhc_pre_fwd_args pre_fwd_args(pre_prob *q) {
    return (ompk_mhc_pre_fwd_args){.x = &q->x.t,
                                   .phi = &q->phi.t,
                                   .gamma = opt(&q->gamma),
                                   .alpha = &q->alpha.t,
                                   .bias = &q->bias.t,
                                   .h_in = &q->h_in.t,
                                   .h_post = &q->h_post.t,
                                   .res_logits = &q->logits.t,
                                   .comb = q->p.fuse_sinkhorn ? &q->comb.t : NULL,
                                   .h_mix = &q->h_mix.t,
                                   .inv_rms = &q->inv_rms.t,
                                   .h_pre = &q->h_pre.t};
}

static inline ompk_status pre_run_fwd(pre_prob *q) {
    const ompk_mhc_pre_fwd_args a = pre_fwd_args(q);
    return ompk_mhc_pre_fwd(&a, &q->p);
}

static inline ompk_status pre_run_bwd(pre_prob *q, int with_gxp) {
    return ompk_mhc_pre_bwd(&(ompk_mhc_pre_bwd_args){.x = &q->x.t,
                                                     .phi = &q->phi.t,
                                                     .gamma = opt(&q->gamma),
                                                     .alpha = &q->alpha.t,
                                                     .dh_in = &q->dh_in.t,
                                                     .dh_post = &q->dh_post.t,
                                                     .dh_res = &q->dh_res.t,
                                                     .grad_x_post = with_gxp ? &q->gxp.t : NULL,
                                                     .h_mix = &q->h_mix.t,
                                                     .inv_rms = &q->inv_rms.t,
                                                     .h_pre = &q->h_pre.t,
                                                     .h_post = &q->h_post.t,
                                                     .dx = &q->dx.t,
                                                     .dphi = &q->dphi.t,
                                                     .dalpha = &q->dalpha.t,
                                                     .dbias = &q->dbias.t,
                                                     .dgamma = opt(&q->dgamma)},
                            &q->p);
}

/* ---- fixtures ------------------------------------------------------------------------------ */
typedef struct fixture {
    int count;
    char names[64][33];
    int64_t numel[64];
    double *data[64];
} fixture;

static inline int fixture_load(fixture *f, const char *file) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", OMPK_FIXTURE_DIR, file);
    FILE *fh = fopen(path, "rb");
    if (!fh) return 0;
    char magic[4];
    int32_t count = 0;
    int ok = fread(magic, 1, 4, fh) == 4 && memcmp(magic, "MHCF", 4) == 0 &&
             fread(&count, 4, 1, fh) == 1 && count > 0 && count <= 64;
    f->count = 0;
    for (int i = 0; ok && i < count; i++) {
        memset(f->names[i], 0, 33);
        ok = fread(f->names[i], 1, 32, fh) == 32 && fread(&f->numel[i], 8, 1, fh) == 1 &&
             f->numel[i] >= 0 && f->numel[i] < (1 << 24);
        if (!ok) break;
        f->data[i] = malloc(sizeof(double) * (size_t)(f->numel[i] ? f->numel[i] : 1));
        ok = fread(f->data[i], 8, (size_t)f->numel[i], fh) == (size_t)f->numel[i];
        f->count = i + 1;
    }
    fclose(fh);
    return ok;
}

static inline const double *fixture_get(const fixture *f, const char *name, int64_t numel) {
    for (int i = 0; i < f->count; i++)
        if (strcmp(f->names[i], name) == 0) {
            cr_assert_eq(f->numel[i], numel, "fixture %s has %lld values, want %lld", name,
                         (long long)f->numel[i], (long long)numel);
            return f->data[i];
        }
    cr_assert_fail("fixture array %s missing", name);
    return NULL;
}

static inline void fixture_free(fixture *f) {
    for (int i = 0; i < f->count; i++) free(f->data[i]);
    f->count = 0;
}

#endif
