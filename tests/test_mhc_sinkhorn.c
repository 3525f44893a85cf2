/* ompk_mhc_sinkhorn_fwd / ompk_mhc_sinkhorn_bwd: reference agreement for every n, peaked and huge
 * logits, PyTorch autograd fixture, finite differences of the reference, determinism and bad
 * inputs. Host and every GPU. */
#include <criterion/criterion.h>
#include <criterion/redirect.h>

#include "mhc_test_common.h"
#include "verify.h"

typedef struct sk_case {
    int64_t B, S, n;
    tt lg, dc, comb, dl;
} sk_case;

static void sk_new(sk_case *c, ompk_device dev, int64_t B, int64_t S, int64_t n) {
    c->B = B, c->S = S, c->n = n;
    c->lg = tt_new(dev, OMPK_F32, 4, B, S, n, n);
    c->dc = tt_new(dev, OMPK_F32, 4, B, S, n, n);
    c->comb = tt_new(dev, OMPK_F32, 4, B, S, n, n);
    c->dl = tt_new(dev, OMPK_F32, 4, B, S, n, n);
    tu_buf_fill_bytes(&c->comb.b, POISON);
    tu_buf_fill_bytes(&c->dl.b, POISON);
}

static void sk_free(sk_case *c) {
    tt_free(&c->lg), tt_free(&c->dc), tt_free(&c->comb), tt_free(&c->dl);
}

/* logits = scale * N(0,1) + peak * I */
static void sk_fill(sk_case *c, uint64_t seed, double scale, double peak) {
    tu_rng r = tu_rng_make(seed);
    const int64_t n = c->n;
    for (int64_t i = 0; i < c->lg.b.numel; i++) {
        int64_t e = i % (n * n);
        tu_buf_set(&c->lg.b, i, scale * tu_normal(&r) + (e / n == e % n ? peak : 0));
        tu_buf_set(&c->dc.b, i, tu_normal(&r));
    }
    tu_buf_upload(&c->lg.b);
    tu_buf_upload(&c->dc.b);
}

static int all_finite(tt *t) {
    tu_buf_download(&t->b);
    for (int64_t i = 0; i < t->b.numel; i++)
        if (!isfinite(tu_buf_get(&t->b, i))) return 0;
    return 1;
}

static void sk_check(sk_case *c, int repeat, float eps, const char *what) {
    const int64_t T = c->B * c->S, n = c->n, N = T * n * n;
    const ompk_mhc_params p = tu_sk_params(repeat, eps);
    ompk_status st = ompk_mhc_sinkhorn_fwd(&c->lg.t, &c->comb.t, &p);
    cr_assert_eq(st, OMPK_OK, "fwd %s: %s", what, ompk_last_error());
    st = ompk_mhc_sinkhorn_bwd(&c->lg.t, &c->dc.t, &c->dl.t, &p);
    cr_assert_eq(st, OMPK_OK, "bwd %s: %s", what, ompk_last_error());
    double *lg = tt_get(&c->lg), *dc = tt_get(&c->dc);
    double *comb = calloc(N, 8), *dl = calloc(N, 8);
    ompk_mhc_ref_sinkhorn_fwd(T, (int)n, repeat, eps, lg, comb);
    ompk_mhc_ref_sinkhorn_bwd(T, (int)n, repeat, eps, lg, dc, dl);
    cr_expect(all_finite(&c->comb) && all_finite(&c->dl), "non-finite output (%s)", what);
    double w1 = tt_cmp("comb", &c->comb, comb, 1);
    double w2 = tt_cmp_scale("dlogits", &c->dl, dl, dmax(dc, N));
    cr_expect(w1 <= 1, "comb off (%g) %s", w1, what);
    cr_expect(w2 <= 1, "dlogits off (%g) %s", w2, what);
    free(lg), free(dc), free(comb), free(dl);
}

Test(mhc_sinkhorn, matches_reference_all_n_and_repeats) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    const int reps[] = {1, 2, 7, 20};
    for (int di = 0; di < nd; di++)
        for (int64_t n = 1; n <= 8; n++)
            for (int k = 0; k < 4; k++) {
                sk_case c;
                sk_new(&c, devs[di], 3, 5, n);
                sk_fill(&c, (uint64_t)(n * 10 + k), 1.5, 0);
                char what[96];
                snprintf(what, sizeof what, "%s n=%lld repeat=%d", tu_device_name(devs[di]),
                         (long long)n, reps[k]);
                sk_check(&c, reps[k], 1e-6f, what);
                sk_free(&c);
            }
}

/* identity-like logits at scale 8 and huge logits (1e4): no inf/NaN, matches the reference */
Test(mhc_sinkhorn, peaked_and_huge_logits) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++)
        for (int64_t n = 2; n <= 8; n += 2) {
            sk_case c;
            sk_new(&c, devs[di], 2, 9, n);
            sk_fill(&c, 5 + (uint64_t)n, 0.3, 8.0);
            sk_check(&c, 20, 1e-6f, "peaked");
            sk_fill(&c, 6 + (uint64_t)n, 1e4, 0);
            sk_check(&c, 20, 1e-6f, "huge");
            sk_free(&c);
        }
}

Test(mhc_sinkhorn, many_tokens_batches) {
    /* more tokens than one workspace batch holds at this repeat count */
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++) {
        sk_case c;
        sk_new(&c, devs[di], 1, 40000, 8);
        sk_fill(&c, 77, 1.0, 0);
        sk_check(&c, 30, 1e-6f, "batched");
        sk_free(&c);
    }
}

Test(mhc_sinkhorn, pytorch_fixture_peaked_huge) {
    fixture fx;
    cr_assert(fixture_load(&fx, "mhc_sinkhorn.bin"), "cannot read mhc_sinkhorn.bin");
    const double *dims = fixture_get(&fx, "dims", 4);
    const int64_t T = (int64_t)dims[1], n = (int64_t)dims[2];
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++) {
        sk_case c;
        sk_new(&c, devs[di], 1, T, n);
        tt_set(&c.dc, fixture_get(&fx, "w", T * n * n));
        const char *in[2] = {"peaked", "huge"}, *co[2] = {"comb_peaked", "comb_huge"};
        const char *gr[2] = {"d_peaked", "d_huge"};
        for (int k = 0; k < 2; k++) {
            tt_set(&c.lg, fixture_get(&fx, in[k], T * n * n));
            cr_assert_eq(ompk_mhc_sinkhorn_fwd(&c.lg.t, &c.comb.t, NULL), OMPK_OK);
            cr_assert_eq(ompk_mhc_sinkhorn_bwd(&c.lg.t, &c.dc.t, &c.dl.t, NULL), OMPK_OK);
            EXPECT_CLOSE(co[k], &c.comb, fixture_get(&fx, co[k], T * n * n), 1);
            double *w = tt_get(&c.dc);
            double q =
                tt_cmp_scale(gr[k], &c.dl, fixture_get(&fx, gr[k], T * n * n), dmax(w, T * n * n));
            cr_expect(q <= 1, "%s differs from torch (worst ratio %g)", gr[k], q);
            free(w);
        }
        sk_free(&c);
    }
    fixture_free(&fx);
}

/* the reference backward is the gradient of the reference forward (double, central FD) */
Test(mhc_sinkhorn, finite_difference_reference) {
    for (int n = 1; n <= 5; n++)
        for (int peak = 0; peak < 2; peak++) {
            const int nn = n * n, repeat = 6;
            tu_rng r = tu_rng_make(50 + (uint64_t)n);
            double lg[64], w[64], g[64], c1[64], c2[64];
            for (int e = 0; e < nn; e++) {
                lg[e] = tu_normal(&r) + (peak && e / n == e % n ? 8.0 : 0.0);
                w[e] = tu_normal(&r);
            }
            ompk_mhc_ref_sinkhorn_bwd(1, n, repeat, 1e-6, lg, w, g);
            for (int e = 0; e < nn; e++) {
                const double h = 1e-6, s = lg[e];
                lg[e] = s + h;
                ompk_mhc_ref_sinkhorn_fwd(1, n, repeat, 1e-6, lg, c1);
                lg[e] = s - h;
                ompk_mhc_ref_sinkhorn_fwd(1, n, repeat, 1e-6, lg, c2);
                lg[e] = s;
                double fd = 0;
                for (int k = 0; k < nn; k++) fd += w[k] * (c1[k] - c2[k]) / (2 * h);
                cr_expect(fabs(fd - g[e]) <= 1e-7 + 1e-6 * fabs(fd),
                          "n=%d peak=%d dlogit[%d]: analytic %.10g fd %.10g", n, peak, e, g[e], fd);
            }
        }
}

Test(mhc_sinkhorn, backward_bit_identical_20x) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++) {
        sk_case c;
        sk_new(&c, devs[di], 4, 1000, 4);
        sk_fill(&c, 3, 2.0, 1.0);
        cr_assert_eq(ompk_mhc_sinkhorn_bwd(&c.lg.t, &c.dc.t, &c.dl.t, NULL), OMPK_OK);
        tu_buf_download(&c.dl.b);
        void *first = malloc(c.dl.b.bytes);
        memcpy(first, c.dl.b.host, c.dl.b.bytes);
        for (int rep = 0; rep < 20; rep++) {
            tu_buf_fill_bytes(&c.dl.b, rep & 1 ? 0x11 : 0x77);
            cr_assert_eq(ompk_mhc_sinkhorn_bwd(&c.lg.t, &c.dc.t, &c.dl.t, NULL), OMPK_OK);
            tu_buf_download(&c.dl.b);
            cr_assert(memcmp(first, c.dl.b.host, c.dl.b.bytes) == 0, "repetition %d differs", rep);
        }
        free(first);
        sk_free(&c);
    }
}

/* ---- bad inputs ---------------------------------------------------------------------------- */
static void expect_bad_fwd(sk_case *c, const ompk_tensor *lg, int repeat, float eps,
                           ompk_tensor *out, ompk_status want, const char *part) {
    ompk_clear_error();
    const ompk_mhc_params p = tu_sk_params(repeat, eps);
    ompk_status st = ompk_mhc_sinkhorn_fwd(lg, out, &p);
    cr_expect_eq(st, want, "want %s got %s (%s)", ompk_status_str(want), ompk_status_str(st),
                 ompk_last_error());
    cr_expect(strstr(ompk_last_error(), part) != NULL, "message '%s' lacks '%s'", ompk_last_error(),
              part);
    cr_expect(tu_buf_all_bytes(&c->comb.b, POISON), "comb written by a rejected call");
}

static void expect_bad_bwd(sk_case *c, const ompk_tensor *lg, const ompk_tensor *dc, int repeat,
                           float eps, ompk_tensor *out, ompk_status want, const char *part) {
    ompk_clear_error();
    const ompk_mhc_params p = tu_sk_params(repeat, eps);
    ompk_status st = ompk_mhc_sinkhorn_bwd(lg, dc, out, &p);
    cr_expect_eq(st, want, "want %s got %s (%s)", ompk_status_str(want), ompk_status_str(st),
                 ompk_last_error());
    cr_expect(strstr(ompk_last_error(), part) != NULL, "message '%s' lacks '%s'", ompk_last_error(),
              part);
    cr_expect(tu_buf_all_bytes(&c->dl.b, POISON), "dlogits written by a rejected call");
    cr_expect(tu_buf_all_bytes(&c->comb.b, POISON), "comb written by a rejected call");
}

Test(mhc_sinkhorn, bad_inputs_write_nothing) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    const ompk_status INV = OMPK_ERR_INVALID_ARGUMENT;
    for (int di = 0; di < nd; di++) {
        sk_case c;
        sk_new(&c, devs[di], 2, 3, 4);
        sk_fill(&c, 1, 1.0, 0);
        ompk_tensor t;
        expect_bad_fwd(&c, NULL, 20, 1e-6f, &c.comb.t, INV, "logits is NULL");
        expect_bad_fwd(&c, &c.lg.t, 20, 1e-6f, NULL, INV, "comb is NULL");
        expect_bad_fwd(&c, &c.lg.t, 0, 1e-6f, &c.comb.t, INV, "repeat");
        expect_bad_fwd(&c, &c.lg.t, 1001, 1e-6f, &c.comb.t, INV, "repeat");
        expect_bad_fwd(&c, &c.lg.t, 20, -1.f, &c.comb.t, INV, "eps");
        expect_bad_fwd(&c, &c.lg.t, 20, NAN, &c.comb.t, INV, "eps");
        t = c.lg.t, t.shape[2] = t.shape[3] = 0;
        expect_bad_fwd(&c, &t, 20, 1e-6f, &c.comb.t, INV, "n = 0");
        t = c.lg.t, t.shape[2] = t.shape[3] = 9;
        expect_bad_fwd(&c, &t, 20, 1e-6f, &c.comb.t, INV, "n = 9");
        t = c.lg.t, t.shape[3] = 3;
        expect_bad_fwd(&c, &t, 20, 1e-6f, &c.comb.t, INV, "logits dim 3");
        t = c.comb.t, t.shape[1] = 2;
        expect_bad_fwd(&c, &c.lg.t, 20, 1e-6f, &t, INV, "comb dim 1");
        t = c.lg.t, t.dtype = OMPK_BF16;
        expect_bad_fwd(&c, &t, 20, 1e-6f, &c.comb.t, INV, "dtype");
        t = c.lg.t, t.ndim = 3;
        expect_bad_fwd(&c, &t, 20, 1e-6f, &c.comb.t, INV, "rank");
        t = c.comb.t, t.data = c.lg.t.data;
        expect_bad_fwd(&c, &c.lg.t, 20, 1e-6f, &t, INV, "overlaps");
        t = c.comb.t, t.strides[3] = 0;
        expect_bad_fwd(&c, &c.lg.t, 20, 1e-6f, &t, INV, "overlap");
        expect_bad_bwd(&c, &c.lg.t, NULL, 20, 1e-6f, &c.dl.t, INV, "dcomb is NULL");
        t = c.dc.t, t.shape[0] = 1;
        expect_bad_bwd(&c, &c.lg.t, &t, 20, 1e-6f, &c.dl.t, INV, "dcomb dim 0");
        t = c.dl.t, t.data = c.dc.t.data;
        expect_bad_bwd(&c, &c.lg.t, &c.dc.t, 20, 1e-6f, &t, INV, "overlaps");
        expect_bad_bwd(&c, &c.lg.t, &c.dc.t, -3, 1e-6f, &c.dl.t, INV, "repeat");
        if (devs[di].type == OMPK_TARGET) {
            sk_case h;
            sk_new(&h, ompk_device_host(), 2, 3, 4);
            expect_bad_bwd(&c, &c.lg.t, &h.dc.t, 20, 1e-6f, &c.dl.t, OMPK_ERR_DEVICE_MISMATCH,
                           "dcomb");
            sk_free(&h);
        }
        sk_free(&c);
    }
}

Test(mhc_sinkhorn, verify_mode_reports, .init = cr_redirect_stderr) {
    ompk_verify_force(1, 1);
    sk_case c;
    sk_new(&c, ompk_device_host(), 1, 3, 4);
    sk_fill(&c, 9, 1.0, 0);
    cr_assert_eq(ompk_mhc_sinkhorn_fwd(&c.lg.t, &c.comb.t, NULL), OMPK_OK);
    cr_assert_eq(ompk_mhc_sinkhorn_bwd(&c.lg.t, &c.dc.t, &c.dl.t, NULL), OMPK_OK);
    ompk_verify_force(-1, -1);
    fflush(stderr);
    static char buf[1 << 14];
    size_t got = fread(buf, 1, sizeof buf - 1, cr_get_redirected_stderr());
    buf[got] = 0;
    const char *want[] = {"ompk verify sinkhorn_fwd comb[res]",
                          "ompk verify sinkhorn_bwd dlogits[res]",
                          "ompk trace sinkhorn_bwd dcomb "};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_expect(strstr(buf, want[i]) != NULL, "missing '%s' in:\n%s", want[i], buf);
    cr_expect(strstr(buf, "MISMATCH") == NULL, "verify reported a mismatch:\n%s", buf);
    sk_free(&c);
}
