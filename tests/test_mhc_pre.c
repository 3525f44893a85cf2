/* ompk_mhc_pre_fwd / ompk_mhc_pre_bwd: PyTorch autograd fixtures, finite differences, the
 * regressions of docs/KERNELS.md 1, determinism and bad inputs (the double reference at every n,
 * many tokens, with and without gamma, the fused Sinkhorn and grad_x_post: test_ops). Every test
 * runs on the host and on every GPU that tu_devices lists. */
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <omp.h>

#include "mhc_test_common.h"
#include "verify.h"

/* kernel forward vs reference; returns 0 if the call failed */
static void check_fwd(pre_prob *q) {
    ompk_status st = pre_run_fwd(q);
    cr_assert_eq(st, OMPK_OK, "pre_fwd: %s (%s)", ompk_status_str(st), ompk_last_error());
    const int64_t T = q->T, n = q->n, D = q->D, M = q->M;
    double *x = tt_get(&q->x), *phi = tt_get(&q->phi), *al = tt_get(&q->alpha);
    double *bias = tt_get(&q->bias), *g = q->has_gamma ? tt_get(&q->gamma) : NULL;
    double *h_in = calloc(T * D, 8), *h_post = calloc(T * n, 8), *lg = calloc(T * n * n, 8);
    double *comb = calloc(T * n * n, 8), *h_mix = calloc(T * M, 8), *inv = calloc(T, 8);
    double *h_pre = calloc(T * n, 8);
    ompk_mhc_ref_pre_fwd(T, (int)n, D, x, phi, g, al, bias, &q->p, h_in, h_post, lg, comb, h_mix,
                         inv, h_pre);
    char what[128];
    snprintf(what, sizeof what, "fwd %s n=%lld D=%lld %s", tu_device_name(q->dev), (long long)n,
             (long long)D, ompk_dtype_name(q->dt));
    cr_expect(tt_cmp("h_in", &q->h_in, h_in, 1) <= 1, "h_in %s", what);
    cr_expect(tt_cmp("h_post", &q->h_post, h_post, 1) <= 1, "h_post %s", what);
    cr_expect(tt_cmp("res_logits", &q->logits, lg, 1) <= 1, "res_logits %s", what);
    if (q->p.fuse_sinkhorn) cr_expect(tt_cmp("comb", &q->comb, comb, 1) <= 1, "comb %s", what);
    cr_expect(tt_cmp("h_mix", &q->h_mix, h_mix, 1) <= 1, "h_mix %s", what);
    cr_expect(tt_cmp("inv_rms", &q->inv_rms, inv, 1) <= 1, "inv_rms %s", what);
    cr_expect(tt_cmp("h_pre", &q->h_pre, h_pre, 1) <= 1, "h_pre %s", what);
    free(x), free(phi), free(al), free(bias), free(g), free(h_in), free(h_post), free(lg);
    free(comb), free(h_mix), free(inv), free(h_pre);
}

/* reference backward fed with the kernel's saved tensors */
typedef struct bwd_ref {
    double *dx, *dphi, *dalpha, *dbias, *dgamma;
} bwd_ref;

static bwd_ref ref_bwd(pre_prob *q, int with_gxp) {
    const int64_t T = q->T, n = q->n, D = q->D, M = q->M, K = q->K;
    double *x = tt_get(&q->x), *phi = tt_get(&q->phi), *al = tt_get(&q->alpha);
    double *g = q->has_gamma ? tt_get(&q->gamma) : NULL;
    double *dh = tt_get(&q->dh_in), *dp = tt_get(&q->dh_post), *dr = tt_get(&q->dh_res);
    double *gx = with_gxp ? tt_get(&q->gxp) : NULL;
    double *hm = tt_get(&q->h_mix), *inv = tt_get(&q->inv_rms), *hp = tt_get(&q->h_pre);
    double *hpo = tt_get(&q->h_post);
    bwd_ref r;
    r.dx = calloc(T * K, 8), r.dphi = calloc(M * K, 8), r.dalpha = calloc(3, 8);
    r.dbias = calloc(M, 8), r.dgamma = calloc(K, 8);
    ompk_mhc_ref_pre_bwd(T, (int)n, D, x, phi, g, al, &q->p, dh, dp, dr, gx, hm, inv, hp, hpo, r.dx,
                         r.dphi, r.dalpha, r.dbias, g ? r.dgamma : NULL);
    free(x), free(phi), free(al), free(g), free(dh), free(dp), free(dr), free(gx), free(hm);
    free(inv), free(hp), free(hpo);
    return r;
}

static void ref_free(bwd_ref *r) {
    free(r->dx), free(r->dphi), free(r->dalpha), free(r->dbias), free(r->dgamma);
}

static void check_bwd(pre_prob *q, int with_gxp) {
    ompk_status st = pre_run_bwd(q, with_gxp);
    cr_assert_eq(st, OMPK_OK, "pre_bwd: %s (%s)", ompk_status_str(st), ompk_last_error());
    bwd_ref r = ref_bwd(q, with_gxp);
    char what[128];
    snprintf(what, sizeof what, "bwd %s n=%lld D=%lld %s gamma=%d gxp=%d", tu_device_name(q->dev),
             (long long)q->n, (long long)q->D, ompk_dtype_name(q->dt), q->has_gamma, with_gxp);
    cr_expect(tt_cmp("dx", &q->dx, r.dx, 1) <= 1, "dx %s", what);
    cr_expect(tt_cmp("dphi", &q->dphi, r.dphi, 1) <= 1, "dphi %s", what);
    cr_expect(tt_cmp("dalpha", &q->dalpha, r.dalpha, 1) <= 1, "dalpha %s", what);
    cr_expect(tt_cmp("dbias", &q->dbias, r.dbias, 1) <= 1, "dbias %s", what);
    if (q->has_gamma) cr_expect(tt_cmp("dgamma", &q->dgamma, r.dgamma, 1) <= 1, "dgamma %s", what);
    ref_free(&r);
}

/* regression: the D tile smaller than D, and D not a multiple of any tile or vector width */
Test(mhc_pre, d_not_multiple_of_any_tile) {
    const int64_t Ds[] = {1000, 1023, 2049};
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++)
        for (int k = 0; k < 3; k++)
            for (int bf = 0; bf < 2; bf++) {
                pre_prob q;
                pre_new(&q, devs[di], bf ? OMPK_BF16 : OMPK_F32, 1, 5, 4, Ds[k], 1, 77 + k, 1.0);
                check_fwd(&q);
                check_bwd(&q, k == 1);
                pre_free(&q);
            }
}

/* regression: dbias_res must be sum_t dh_res (no a_res factor, summed once), checked against
 * the sum taken here, not against the reference code */
Test(mhc_pre, dbias_res_is_plain_sum_of_dh_res) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++) {
        pre_prob q;
        pre_new(&q, devs[di], OMPK_F32, 2, 5, 4, 40, 1, 123, 1.0);
        cr_assert_eq(pre_run_fwd(&q), OMPK_OK);
        cr_assert_eq(pre_run_bwd(&q, 0), OMPK_OK, "%s", ompk_last_error());
        double *dr = tt_get(&q.dh_res), *db = tt_get(&q.dbias);
        const int64_t n = q.n, nn = n * n;
        for (int64_t e = 0; e < nn; e++) {
            double s = 0;
            for (int64_t t = 0; t < q.T; t++) s += dr[t * nn + e];
            cr_expect(fabs(db[2 * n + e] - s) <= 1e-5 * (1 + fabs(s)),
                      "dbias_res[%lld] = %g, sum dh_res = %g (%s)", (long long)e, db[2 * n + e], s,
                      tu_device_name(devs[di]));
        }
        free(dr), free(db);
        pre_free(&q);
    }
}

/* regression: inv_rms on every section of dh_mix. x is scaled by 4 so inv_rms ~ 1/4 and a
 * section that misses it is off by 4x; each section of dphi, dbias and dalpha is checked on
 * its own. */
Test(mhc_pre, inv_rms_on_every_section) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++) {
        pre_prob q;
        pre_new(&q, devs[di], OMPK_F32, 2, 3, 4, 48, 1, 321, 4.0);
        cr_assert_eq(pre_run_fwd(&q), OMPK_OK);
        cr_assert_eq(pre_run_bwd(&q, 0), OMPK_OK);
        bwd_ref r = ref_bwd(&q, 0);
        double *dphi = tt_get(&q.dphi), *dal = tt_get(&q.dalpha), *inv = tt_get(&q.inv_rms);
        cr_expect(inv[0] < 0.35 && inv[0] > 0.15, "inv_rms %g not ~1/4", inv[0]);
        const int64_t n = q.n, K = q.K, lo[3] = {0, n, 2 * n}, hi[3] = {n, 2 * n, q.M};
        const char *sec[3] = {"pre", "post", "res"};
        for (int s = 0; s < 3; s++) {
            double scale = dmax(r.dphi + lo[s] * K, (hi[s] - lo[s]) * K), worst = 0;
            for (int64_t i = lo[s] * K; i < hi[s] * K; i++)
                worst = fmax(worst,
                             fabs(dphi[i] - r.dphi[i]) / (1e-5 * scale + 1e-4 * fabs(r.dphi[i])));
            cr_expect(worst <= 1, "dphi[%s] off (ratio %g) on %s", sec[s], worst,
                      tu_device_name(devs[di]));
            cr_expect(fabs(dal[s] - r.dalpha[s]) <= 1e-4 * (1 + fabs(r.dalpha[s])),
                      "dalpha[%s] %g vs %g", sec[s], dal[s], r.dalpha[s]);
        }
        free(dphi), free(dal), free(inv);
        ref_free(&r);
        pre_free(&q);
    }
}

/* Token blocks of several shared-memory chunks on the GPU's portable team stage 4 (64 tokens a
 * chunk for n <= 4, 32 for n = 5, 6, 16 above; D and n*D that the tensor-core stage 4 does not
 * take): the chunks' two buffers alternate, a block ends inside a chunk and inside a group of
 * tokens loaded ahead, teams take runs past the last stream, with and without grad_x_post. */
Test(mhc_pre, backward_multi_chunk_token_blocks) {
    const int64_t shapes[][4] = {{2, 2100, 4, 24}, {1, 150, 6, 16}, {1, 301, 8, 18}};
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++)
        for (int k = 0; k < 3; k++) {
            const int64_t *sh = shapes[k];
            pre_prob q;
            pre_new(&q, devs[di], OMPK_BF16, sh[0], sh[1], sh[2], sh[3], 1, 90 + k, 1.0);
            cr_assert_eq(pre_run_fwd(&q), OMPK_OK);
            check_bwd(&q, k != 1);
            pre_free(&q);
        }
}

/* regression: dx covers every stream (a grid over stream 0 only leaves the rest poisoned) */
Test(mhc_pre, dx_all_streams) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++)
        for (int bf = 0; bf < 2; bf++) {
            pre_prob q;
            pre_new(&q, devs[di], bf ? OMPK_BF16 : OMPK_F32, 1, 4, 8, 33, 1, 44, 1.0);
            cr_assert_eq(pre_run_fwd(&q), OMPK_OK);
            cr_assert_eq(pre_run_bwd(&q, 1), OMPK_OK);
            bwd_ref r = ref_bwd(&q, 1);
            double *dx = tt_get(&q.dx);
            const int64_t n = q.n, D = q.D;
            for (int64_t i = 0; i < n; i++) {
                int64_t bad = 0;
                for (int64_t t = 0; t < q.T; t++)
                    for (int64_t d = 0; d < D; d++) {
                        int64_t j = (t * n + i) * D + d;
                        double tol = (bf ? 2e-2 : 1e-4) * (1 + fabs(r.dx[j]));
                        bad += !(fabs(dx[j] - r.dx[j]) <= tol);
                    }
                cr_expect_eq(bad, 0, "stream %lld: %lld dx values off (%s)", (long long)i,
                             (long long)bad, tu_device_name(devs[di]));
            }
            free(dx);
            ref_free(&r);
            pre_free(&q);
        }
}

/* regression: gamma is used by both passes. gamma = ones must give the bits of gamma absent,
 * and a non-trivial gamma must match the reference (whose gradient the FD test checks). */
Test(mhc_pre, gamma_consistent_forward_backward) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++) {
        pre_prob a, b;
        pre_new(&a, devs[di], OMPK_F32, 1, 3, 4, 20, 0, 9, 1.0);
        pre_new(&b, devs[di], OMPK_F32, 1, 3, 4, 20, 1, 9, 1.0);
        /* same data, b with gamma = 1 */
        tt *pairs[][2] = {{&a.x, &b.x}, {&a.phi, &b.phi}, {&a.bias, &b.bias}};
        for (int i = 0; i < 3; i++) {
            memcpy(pairs[i][1]->b.host, pairs[i][0]->b.host, pairs[i][0]->b.bytes);
            tu_buf_upload(&pairs[i][1]->b);
        }
        memcpy(b.dh_in.b.host, a.dh_in.b.host, a.dh_in.b.bytes);
        memcpy(b.dh_post.b.host, a.dh_post.b.host, a.dh_post.b.bytes);
        memcpy(b.dh_res.b.host, a.dh_res.b.host, a.dh_res.b.bytes);
        tu_buf_upload(&b.dh_in.b), tu_buf_upload(&b.dh_post.b), tu_buf_upload(&b.dh_res.b);
        for (int64_t k = 0; k < b.K; k++) tu_buf_set(&b.gamma.b, k, 1.0);
        tu_buf_upload(&b.gamma.b);
        cr_assert_eq(pre_run_fwd(&a), OMPK_OK);
        cr_assert_eq(pre_run_fwd(&b), OMPK_OK);
        cr_assert_eq(pre_run_bwd(&a, 0), OMPK_OK);
        cr_assert_eq(pre_run_bwd(&b, 0), OMPK_OK);
        tt *oa[] = {&a.h_in, &a.h_mix, &a.comb, &a.dx, &a.dphi, &a.dbias, &a.dalpha};
        tt *ob[] = {&b.h_in, &b.h_mix, &b.comb, &b.dx, &b.dphi, &b.dbias, &b.dalpha};
        for (int i = 0; i < 7; i++) {
            tu_buf_download(&oa[i]->b), tu_buf_download(&ob[i]->b);
            cr_expect(memcmp(oa[i]->b.host, ob[i]->b.host, oa[i]->b.bytes) == 0,
                      "output %d differs between gamma=NULL and gamma=ones", i);
        }
        pre_free(&a);
        pre_free(&b);
        pre_prob c;
        pre_new(&c, devs[di], OMPK_F32, 2, 2, 3, 50, 1, 10, 1.0);
        check_fwd(&c);
        check_bwd(&c, 0);
        pre_free(&c);
    }
}

/* ---- finite differences on the reference (double) ------------------------------------------ */

typedef struct fd_in {
    int64_t T, n, D;
    double *x, *phi, *gamma, *alpha, *bias, *wi, *wp, *wr;
    ompk_mhc_params p;
} fd_in;

/* L = sum wi*h_in + sum wp*h_post + sum wr*res_logits */
static double fd_loss(const fd_in *f) {
    const int64_t T = f->T, n = f->n, D = f->D, M = 2 * n + n * n;
    double *h_in = calloc(T * D, 8), *h_post = calloc(T * n, 8), *lg = calloc(T * n * n, 8);
    double *h_mix = calloc(T * M, 8), *inv = calloc(T, 8), *h_pre = calloc(T * n, 8);
    ompk_mhc_ref_pre_fwd(T, (int)n, D, f->x, f->phi, f->gamma, f->alpha, f->bias, &f->p, h_in,
                         h_post, lg, NULL, h_mix, inv, h_pre);
    double L = 0;
    for (int64_t i = 0; i < T * D; i++) L += f->wi[i] * h_in[i];
    for (int64_t i = 0; i < T * n; i++) L += f->wp[i] * h_post[i];
    for (int64_t i = 0; i < T * n * n; i++) L += f->wr[i] * lg[i];
    free(h_in), free(h_post), free(lg), free(h_mix), free(inv), free(h_pre);
    return L;
}

static void fd_check(fd_in *f, double *param, int64_t count, const double *grad, const char *name) {
    for (int64_t i = 0; i < count; i++) {
        const double h = 1e-6 * (1 + fabs(param[i])), save = param[i];
        param[i] = save + h;
        double lp = fd_loss(f);
        param[i] = save - h;
        double lm = fd_loss(f);
        param[i] = save;
        double fd = (lp - lm) / (2 * h);
        cr_expect(fabs(fd - grad[i]) <= 1e-6 * (1 + fabs(fd)),
                  "d%s[%lld]: analytic %.10g, fd %.10g", name, (long long)i, grad[i], fd);
    }
}

Test(mhc_pre, finite_difference_gradients_double) {
    for (int64_t n = 1; n <= 3; n++) {
        const int64_t T = 3, D = 5, K = n * D, M = 2 * n + n * n;
        tu_rng r = tu_rng_make(1000 + (uint64_t)n);
        fd_in f;
        f.T = T, f.n = n, f.D = D, f.p = ompk_mhc_params_default();
        f.p.post_mult = 1.7f;
        f.x = calloc(T * K, 8), f.phi = calloc(M * K, 8), f.gamma = calloc(K, 8);
        f.alpha = calloc(3, 8), f.bias = calloc(M, 8);
        f.wi = calloc(T * D, 8), f.wp = calloc(T * n, 8), f.wr = calloc(T * n * n, 8);
        for (int64_t i = 0; i < T * K; i++) f.x[i] = tu_normal(&r);
        for (int64_t i = 0; i < M * K; i++) f.phi[i] = tu_normal(&r) / sqrt((double)K);
        for (int64_t i = 0; i < K; i++) f.gamma[i] = 1 + 0.3 * tu_normal(&r);
        f.alpha[0] = 0.7, f.alpha[1] = 1.2, f.alpha[2] = 1.5;
        for (int64_t i = 0; i < M; i++) f.bias[i] = 0.3 * tu_normal(&r);
        for (int64_t i = 0; i < T * D; i++) f.wi[i] = tu_normal(&r);
        for (int64_t i = 0; i < T * n; i++) f.wp[i] = tu_normal(&r);
        for (int64_t i = 0; i < T * n * n; i++) f.wr[i] = tu_normal(&r);
        double *h_in = calloc(T * D, 8), *h_post = calloc(T * n, 8), *lg = calloc(T * n * n, 8);
        double *h_mix = calloc(T * M, 8), *inv = calloc(T, 8), *h_pre = calloc(T * n, 8);
        ompk_mhc_ref_pre_fwd(T, (int)n, D, f.x, f.phi, f.gamma, f.alpha, f.bias, &f.p, h_in, h_post,
                             lg, NULL, h_mix, inv, h_pre);
        double *dx = calloc(T * K, 8), *dphi = calloc(M * K, 8), *dal = calloc(3, 8);
        double *db = calloc(M, 8), *dg = calloc(K, 8);
        ompk_mhc_ref_pre_bwd(T, (int)n, D, f.x, f.phi, f.gamma, f.alpha, &f.p, f.wi, f.wp, f.wr,
                             NULL, h_mix, inv, h_pre, h_post, dx, dphi, dal, db, dg);
        fd_check(&f, f.x, T * K, dx, "x");
        fd_check(&f, f.phi, M * K, dphi, "phi");
        fd_check(&f, f.gamma, K, dg, "gamma");
        fd_check(&f, f.alpha, 3, dal, "alpha");
        fd_check(&f, f.bias, M, db, "bias");
        free(h_in), free(h_post), free(lg), free(h_mix), free(inv), free(h_pre);
        free(dx), free(dphi), free(dal), free(db), free(dg);
        free(f.x), free(f.phi), free(f.gamma), free(f.alpha), free(f.bias), free(f.wi);
        free(f.wp), free(f.wr);
    }
}

/* ---- PyTorch autograd fixture: pre forward, Sinkhorn, and the backward of the chain ------- */
Test(mhc_pre, pytorch_fixture_pre_sinkhorn_chain) {
    fixture fx;
    cr_assert(fixture_load(&fx, "mhc_pre.bin"), "cannot read mhc_pre.bin");
    const double *dims = fixture_get(&fx, "dims", 4);
    const int64_t B = (int64_t)dims[0], S = (int64_t)dims[1], n = (int64_t)dims[2];
    const int64_t D = (int64_t)dims[3], T = B * S, K = n * D, M = 2 * n + n * n;
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++) {
        pre_prob q;
        pre_new(&q, devs[di], OMPK_F32, B, S, n, D, 1, 1, 1.0);
        tt_set(&q.x, fixture_get(&fx, "x", T * K));
        tt_set(&q.phi, fixture_get(&fx, "phi", M * K));
        tt_set(&q.gamma, fixture_get(&fx, "gamma", K));
        tt_set(&q.alpha, fixture_get(&fx, "alpha", 3));
        tt_set(&q.bias, fixture_get(&fx, "bias", M));
        cr_assert_eq(pre_run_fwd(&q), OMPK_OK, "%s", ompk_last_error());
        EXPECT_CLOSE("torch h_in", &q.h_in, fixture_get(&fx, "h_in", T * D), 1);
        EXPECT_CLOSE("torch h_post", &q.h_post, fixture_get(&fx, "h_post", T * n), 1);
        EXPECT_CLOSE("torch res_logits", &q.logits, fixture_get(&fx, "res_logits", T * n * n), 1);
        EXPECT_CLOSE("torch comb", &q.comb, fixture_get(&fx, "comb", T * n * n), 1);
        EXPECT_CLOSE("torch h_mix", &q.h_mix, fixture_get(&fx, "h_mix", T * M), 1);
        EXPECT_CLOSE("torch inv_rms", &q.inv_rms, fixture_get(&fx, "inv_rms", T), 1);
        EXPECT_CLOSE("torch h_pre", &q.h_pre, fixture_get(&fx, "h_pre", T * n), 1);
        /* backward of loss = w_in.h_in + w_post.h_post + w_comb.comb */
        tt dcomb = tt_new(devs[di], OMPK_F32, 4, B, S, n, n);
        tt_set(&dcomb, fixture_get(&fx, "w_comb", T * n * n));
        cr_assert_eq(ompk_mhc_sinkhorn_bwd(&q.logits.t, &dcomb.t, &q.dh_res.t, &q.p), OMPK_OK, "%s",
                     ompk_last_error());
        EXPECT_CLOSE("torch dres", &q.dh_res, fixture_get(&fx, "dres", T * n * n), 1);
        tt_set(&q.dh_in, fixture_get(&fx, "w_in", T * D));
        tt_set(&q.dh_post, fixture_get(&fx, "w_post", T * n));
        cr_assert_eq(pre_run_bwd(&q, 0), OMPK_OK, "%s", ompk_last_error());
        EXPECT_CLOSE("torch dx", &q.dx, fixture_get(&fx, "dx", T * K), 1);
        EXPECT_CLOSE("torch dphi", &q.dphi, fixture_get(&fx, "dphi", M * K), 1);
        EXPECT_CLOSE("torch dgamma", &q.dgamma, fixture_get(&fx, "dgamma", K), 1);
        EXPECT_CLOSE("torch dalpha", &q.dalpha, fixture_get(&fx, "dalpha", 3), 1);
        EXPECT_CLOSE("torch dbias", &q.dbias, fixture_get(&fx, "dbias", M), 1);
        tt_free(&dcomb);
        pre_free(&q);
    }
    fixture_free(&fx);
}

/* ---- determinism --------------------------------------------------------------------------- */
/* n = 4 everywhere, and on a GPU n = 8 too (the tensor-core stage 4's 16-k warps) */
Test(mhc_pre, backward_bit_identical_20x) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    for (int run = 0; run < 2 * nd; run++) {
        const int di = run / 2, n = run & 1 ? 8 : 4;
        if (n == 8 && devs[di].type == OMPK_HOST) continue;
        pre_prob q;
        pre_new(&q, devs[di], OMPK_BF16, 4, 300, n, 256, 1, 2024, 1.0);
        cr_assert_eq(pre_run_fwd(&q), OMPK_OK);
        tt *outs[] = {&q.dx, &q.dphi, &q.dalpha, &q.dbias, &q.dgamma, &q.h_in, &q.h_mix};
        void *first[7];
        cr_assert_eq(pre_run_bwd(&q, 1), OMPK_OK);
        for (int i = 0; i < 7; i++) {
            tu_buf_download(&outs[i]->b);
            first[i] = malloc(outs[i]->b.bytes);
            memcpy(first[i], outs[i]->b.host, outs[i]->b.bytes);
        }
        for (int rep = 0; rep < 20; rep++) {
            for (int i = 0; i < 7; i++) tu_buf_fill_bytes(&outs[i]->b, rep & 1 ? 0x11 : 0x77);
            cr_assert_eq(pre_run_fwd(&q), OMPK_OK);
            cr_assert_eq(pre_run_bwd(&q, 1), OMPK_OK);
            for (int i = 0; i < 7; i++) {
                tu_buf_download(&outs[i]->b);
                cr_assert(memcmp(first[i], outs[i]->b.host, outs[i]->b.bytes) == 0,
                          "output %d differs on repetition %d (%s, n=%d)", i, rep,
                          tu_device_name(devs[di]), n);
            }
        }
        for (int i = 0; i < 7; i++) free(first[i]);
        pre_free(&q);
    }
}

/* The host form of the forward (mhc_pre_fwd_host.h) tiles tokens by the thread count; its sums
 * must not depend on it: 1, 2 and 7 threads give the same bits for token counts that give each
 * a different tile size (6, 185), stream counts with and without a remainder block of weight
 * rows (3, 4, 8), D with a vector tail and a K-block tail (7, 133), bf16 and f32 x. */
Test(mhc_pre, host_forward_bits_independent_of_thread_count) {
    const ompk_device host = {OMPK_HOST, 0};
    const int64_t shapes[][4] = {{2, 3, 3, 133}, {5, 37, 4, 7}, {1, 6, 8, 133}, {5, 37, 8, 133}};
    const int threads[] = {1, 2, 7};
    const int max_threads = omp_get_max_threads();
    for (int k = 0; k < 4; k++)
        for (int bf = 0; bf < 2; bf++) {
            const int64_t *sh = shapes[k];
            pre_prob q;
            pre_new(&q, host, bf ? OMPK_BF16 : OMPK_F32, sh[0], sh[1], sh[2], sh[3], k & 1, 300 + k,
                    1.0);
            q.p.fuse_sinkhorn = 1;
            tt *outs[] = {&q.h_in, &q.h_post, &q.logits, &q.comb, &q.h_mix, &q.inv_rms, &q.h_pre};
            void *first[7];
            for (int th = 0; th < 3; th++) {
                omp_set_num_threads(threads[th]);
                for (int i = 0; i < 7; i++) tu_buf_fill_bytes(&outs[i]->b, th & 1 ? 0x11 : 0x77);
                const ompk_status st = pre_run_fwd(&q);
                omp_set_num_threads(max_threads);
                cr_assert_eq(st, OMPK_OK, "pre_fwd: %s (%s)", ompk_status_str(st),
                             ompk_last_error());
                for (int i = 0; i < 7; i++) {
                    if (th == 0) {
                        first[i] = malloc(outs[i]->b.bytes);
                        memcpy(first[i], outs[i]->b.host, outs[i]->b.bytes);
                    } else {
                        cr_expect(memcmp(first[i], outs[i]->b.host, outs[i]->b.bytes) == 0,
                                  "output %d differs with %d threads (T=%lld n=%lld D=%lld %s)", i,
                                  threads[th], (long long)q.T, (long long)q.n, (long long)q.D,
                                  ompk_dtype_name(q.dt));
                    }
                }
            }
            omp_set_num_threads(7);
            check_fwd(&q);
            omp_set_num_threads(max_threads);
            for (int i = 0; i < 7; i++) free(first[i]);
            pre_free(&q);
        }
}

/* x as a padded, permuted view: the non-vector path must agree with the contiguous one */
Test(mhc_pre, strided_x_matches_contiguous) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++) {
        const int64_t B = 2, S = 3, n = 4, D = 37, Dp = 41;
        pre_prob q;
        pre_new(&q, devs[di], OMPK_BF16, B, S, n, D, 1, 55, 1.0);
        tu_buf xb = tu_buf_new(devs[di], OMPK_BF16, B * n * S * Dp);
        tu_buf_download(&q.x.b);
        for (int64_t b = 0; b < B; b++)
            for (int64_t s = 0; s < S; s++)
                for (int64_t i = 0; i < n; i++)
                    for (int64_t d = 0; d < D; d++)
                        tu_buf_set(&xb, ((b * n + i) * S + s) * Dp + d,
                                   tu_buf_get(&q.x.b, ((b * S + s) * n + i) * D + d));
        tu_buf_upload(&xb);
        cr_assert_eq(pre_run_fwd(&q), OMPK_OK);
        cr_assert_eq(pre_run_bwd(&q, 0), OMPK_OK);
        double *h1 = tt_get(&q.h_in), *dx1 = tt_get(&q.dx), *dp1 = tt_get(&q.dphi);
        int64_t sh[4] = {B, S, n, D}, st[4] = {n * S * Dp, Dp, S * Dp, 1};
        cr_assert_eq(ompk_tensor_init(&q.x.t, xb.dev, OMPK_BF16, 4, sh, st, devs[di]), OMPK_OK);
        cr_assert_eq(pre_run_fwd(&q), OMPK_OK, "%s", ompk_last_error());
        cr_assert_eq(pre_run_bwd(&q, 0), OMPK_OK, "%s", ompk_last_error());
        EXPECT_CLOSE("strided h_in", &q.h_in, h1, 1);
        EXPECT_CLOSE("strided dx", &q.dx, dx1, 1);
        EXPECT_CLOSE("strided dphi", &q.dphi, dp1, 1);
        free(h1), free(dx1), free(dp1);
        tu_buf_free(&xb);
        pre_free(&q);
    }
}

Test(mhc_pre, verify_mode_reports_sections, .init = cr_redirect_stderr) {
    ompk_verify_force(1, 1);
    pre_prob q;
    pre_new(&q, ompk_device_host(), OMPK_BF16, 1, 2, 4, 16, 1, 3, 1.0);
    cr_assert_eq(pre_run_fwd(&q), OMPK_OK);
    cr_assert_eq(pre_run_bwd(&q, 0), OMPK_OK);
    ompk_verify_force(-1, -1);
    fflush(stderr);
    FILE *e = cr_get_redirected_stderr();
    static char buf[1 << 16];
    size_t got = fread(buf, 1, sizeof buf - 1, e);
    buf[got] = 0;
    const char *want[] = {
        "ompk verify mhc_pre_fwd h_mix[pre]", "ompk verify mhc_pre_fwd h_mix[res]",
        "ompk verify mhc_pre_fwd comb[res]",  "ompk verify mhc_pre_bwd dphi[pre]",
        "ompk verify mhc_pre_bwd dphi[post]", "ompk verify mhc_pre_bwd dphi[res]",
        "ompk verify mhc_pre_bwd dbias[res]", "ompk verify mhc_pre_bwd dalpha[post]",
        "ompk trace mhc_pre_fwd h_in ",       "ompk trace mhc_pre_bwd dx "};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_expect(strstr(buf, want[i]) != NULL, "missing '%s' in:\n%s", want[i], buf);
    cr_expect(strstr(buf, "MISMATCH") == NULL, "verify reported a mismatch:\n%s", buf);
    pre_free(&q);
}

Test(mhc_pre, empty_tokens_ok) {
    pre_prob q;
    pre_new(&q, ompk_device_host(), OMPK_F32, 1, 2, 4, 8, 1, 1, 1.0);
    tt *all[] = {&q.x,     &q.h_in,    &q.h_post, &q.logits, &q.comb,
                 &q.dh_in, &q.dh_post, &q.dh_res, &q.dx};
    for (int i = 0; i < 9; i++) all[i]->t.shape[1] = 0;
    q.h_mix.t.shape[0] = q.inv_rms.t.shape[0] = q.h_pre.t.shape[0] = 0;
    cr_assert_eq(pre_run_fwd(&q), OMPK_OK, "%s", ompk_last_error());
    cr_assert_eq(pre_run_bwd(&q, 0), OMPK_OK, "%s", ompk_last_error());
    double *db = tt_get(&q.dbias), *dp = tt_get(&q.dphi);
    cr_expect(dmax(db, q.M) == 0 && dmax(dp, q.M * q.K) == 0, "empty sums must be zero");
    free(db), free(dp);
    pre_free(&q);
}
