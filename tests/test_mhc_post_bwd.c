/* ompk_mhc_post_bwd: PyTorch autograd fixture, finite differences of the reference, determinism,
 * bad inputs (reference agreement at every n, D not a multiple of any chunk, f32/bf16, many
 * tokens: test_ops). Host and every GPU. */
#include <criterion/criterion.h>
#include <criterion/redirect.h>

#include "mhc_test_common.h"
#include "verify.h"

typedef struct pb_case {
    int64_t B, S, n, D, T;
    tt x, comb, post, f, dout, dx, df, dpost, dcomb;
} pb_case;

static void pb_new(pb_case *c, ompk_device dev, ompk_dtype dt, int64_t B, int64_t S, int64_t n,
                   int64_t D, uint64_t seed) {
    c->B = B, c->S = S, c->n = n, c->D = D, c->T = B * S;
    tu_rng r = tu_rng_make(seed);
    c->x = tt_new(dev, dt, 4, B, S, n, D);
    c->comb = tt_new(dev, OMPK_F32, 4, B, S, n, n);
    c->post = tt_new(dev, OMPK_F32, 3, B, S, n, 0);
    c->f = tt_new(dev, dt, 3, B, S, D, 0);
    c->dout = tt_new(dev, dt, 4, B, S, n, D);
    c->dx = tt_new(dev, dt, 4, B, S, n, D);
    c->df = tt_new(dev, dt, 3, B, S, D, 0);
    c->dpost = tt_new(dev, OMPK_F32, 3, B, S, n, 0);
    c->dcomb = tt_new(dev, OMPK_F32, 4, B, S, n, n);
    tu_buf_randn(&c->x.b, &r, 1.0);
    tu_buf_randn(&c->comb.b, &r, 0.5);
    tu_buf_randn(&c->post.b, &r, 1.0);
    tu_buf_randn(&c->f.b, &r, 1.0);
    tu_buf_randn(&c->dout.b, &r, 1.0);
    tt *o[] = {&c->dx, &c->df, &c->dpost, &c->dcomb};
    for (int i = 0; i < 4; i++) tu_buf_fill_bytes(&o[i]->b, POISON);
}

static void pb_free(pb_case *c) {
    tt *a[] = {&c->x, &c->comb, &c->post, &c->f, &c->dout, &c->dx, &c->df, &c->dpost, &c->dcomb};
    for (int i = 0; i < 9; i++) tt_free(a[i]);
}

static ompk_status pb_run(pb_case *c) {
    return ompk_mhc_post_bwd(&c->x.t, &c->comb.t, &c->post.t, &c->f.t, &c->dout.t, &c->dx.t,
                             &c->df.t, &c->dpost.t, &c->dcomb.t);
}

Test(mhc_post_bwd, pytorch_fixture) {
    fixture fx;
    cr_assert(fixture_load(&fx, "mhc_post.bin"), "cannot read mhc_post.bin");
    const double *dims = fixture_get(&fx, "dims", 4);
    const int64_t B = (int64_t)dims[0], S = (int64_t)dims[1], n = (int64_t)dims[2];
    const int64_t D = (int64_t)dims[3], T = B * S;
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++) {
        pb_case c;
        pb_new(&c, devs[di], OMPK_F32, B, S, n, D, 1);
        tt_set(&c.x, fixture_get(&fx, "x", T * n * D));
        tt_set(&c.comb, fixture_get(&fx, "comb", T * n * n));
        tt_set(&c.post, fixture_get(&fx, "post", T * n));
        tt_set(&c.f, fixture_get(&fx, "f", T * D));
        tt_set(&c.dout, fixture_get(&fx, "w", T * n * D));
        cr_assert_eq(pb_run(&c), OMPK_OK, "%s", ompk_last_error());
        EXPECT_CLOSE("torch dx", &c.dx, fixture_get(&fx, "dx", T * n * D), 1);
        EXPECT_CLOSE("torch df", &c.df, fixture_get(&fx, "df", T * D), 1);
        EXPECT_CLOSE("torch dpost", &c.dpost, fixture_get(&fx, "dpost", T * n), 1);
        EXPECT_CLOSE("torch dcomb", &c.dcomb, fixture_get(&fx, "dcomb", T * n * n), 1);
        /* and the forward of the same fixture through the lead's post_fwd */
        tt out = tt_new(devs[di], OMPK_F32, 4, B, S, n, D);
        cr_assert_eq(ompk_mhc_post_fwd(&c.x.t, &c.comb.t, &c.post.t, &c.f.t, &out.t), OMPK_OK);
        EXPECT_CLOSE("torch out", &out, fixture_get(&fx, "out", T * n * D), 1);
        tt_free(&out);
        pb_free(&c);
    }
    fixture_free(&fx);
}

/* L = sum w * post_fwd(x, comb, post, f); the reference backward against central FD */
static double post_loss(int64_t T, int n, int64_t D, const double *x, const double *cm,
                        const double *p, const double *f, const double *w) {
    double L = 0;
    for (int64_t t = 0; t < T; t++)
        for (int o = 0; o < n; o++)
            for (int64_t d = 0; d < D; d++) {
                double v = p[t * n + o] * f[t * D + d];
                for (int i = 0; i < n; i++) v += cm[(t * n + i) * n + o] * x[(t * n + i) * D + d];
                L += w[(t * n + o) * D + d] * v;
            }
    return L;
}

Test(mhc_post_bwd, finite_difference_reference) {
    const int64_t T = 2, D = 3;
    for (int n = 1; n <= 4; n++) {
        tu_rng r = tu_rng_make(900 + (uint64_t)n);
        double x[2 * 4 * 3], cm[2 * 16], p[2 * 4], f[2 * 3], w[2 * 4 * 3];
        double dx[24], df[6], dp[8], dc[32];
        for (int i = 0; i < 24; i++) x[i] = tu_normal(&r), w[i] = tu_normal(&r);
        for (int i = 0; i < 32; i++) cm[i] = tu_normal(&r);
        for (int i = 0; i < 8; i++) p[i] = tu_normal(&r);
        for (int i = 0; i < 6; i++) f[i] = tu_normal(&r);
        ompk_mhc_ref_post_bwd(T, n, D, x, cm, p, f, w, dx, df, dp, dc);
        double *params[4] = {x, cm, p, f}, *grads[4] = {dx, dc, dp, df};
        const int64_t cnt[4] = {T * n * D, T * n * n, T * n, T * D};
        const char *names[4] = {"x", "comb", "post", "f"};
        for (int q = 0; q < 4; q++)
            for (int64_t i = 0; i < cnt[q]; i++) {
                const double h = 1e-5, s = params[q][i];
                params[q][i] = s + h;
                double lp = post_loss(T, n, D, x, cm, p, f, w);
                params[q][i] = s - h;
                double lm = post_loss(T, n, D, x, cm, p, f, w);
                params[q][i] = s;
                double fd = (lp - lm) / (2 * h);
                cr_expect(fabs(fd - grads[q][i]) <= 1e-7 * (1 + fabs(fd)),
                          "n=%d d%s[%lld]: %.10g vs fd %.10g", n, names[q], (long long)i,
                          grads[q][i], fd);
            }
    }
}

Test(mhc_post_bwd, bit_identical_20x) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++) {
        pb_case c;
        pb_new(&c, devs[di], OMPK_BF16, 2, 300, 4, 520, 12);
        tt *o[] = {&c.dx, &c.df, &c.dpost, &c.dcomb};
        void *first[4];
        cr_assert_eq(pb_run(&c), OMPK_OK);
        for (int i = 0; i < 4; i++) {
            tu_buf_download(&o[i]->b);
            first[i] = malloc(o[i]->b.bytes);
            memcpy(first[i], o[i]->b.host, o[i]->b.bytes);
        }
        for (int rep = 0; rep < 20; rep++) {
            for (int i = 0; i < 4; i++) tu_buf_fill_bytes(&o[i]->b, rep & 1 ? 0x11 : 0x77);
            cr_assert_eq(pb_run(&c), OMPK_OK);
            for (int i = 0; i < 4; i++) {
                tu_buf_download(&o[i]->b);
                cr_assert(memcmp(first[i], o[i]->b.host, o[i]->b.bytes) == 0,
                          "output %d differs on repetition %d", i, rep);
            }
        }
        for (int i = 0; i < 4; i++) free(first[i]);
        pb_free(&c);
    }
}

/* ---- bad inputs ---------------------------------------------------------------------------- */
typedef struct pb_args {
    const ompk_tensor *x, *comb, *post, *f, *dout;
    ompk_tensor *dx, *df, *dpost, *dcomb;
} pb_args;

static pb_args pb_default(pb_case *c) {
    pb_args a = {&c->x.t,  &c->comb.t, &c->post.t,  &c->f.t,    &c->dout.t,
                 &c->dx.t, &c->df.t,   &c->dpost.t, &c->dcomb.t};
    return a;
}

static void expect_bad(pb_case *c, pb_args a, ompk_status want, const char *part) {
    ompk_clear_error();
    ompk_status st =
        ompk_mhc_post_bwd(a.x, a.comb, a.post, a.f, a.dout, a.dx, a.df, a.dpost, a.dcomb);
    cr_expect_eq(st, want, "want %s got %s (%s)", ompk_status_str(want), ompk_status_str(st),
                 ompk_last_error());
    cr_expect(strstr(ompk_last_error(), part) != NULL, "message '%s' lacks '%s'", ompk_last_error(),
              part);
    tt *o[] = {&c->dx, &c->df, &c->dpost, &c->dcomb};
    for (int i = 0; i < 4; i++)
        cr_expect(tu_buf_all_bytes(&o[i]->b, POISON), "output %d written by a rejected call ('%s')",
                  i, part);
}

Test(mhc_post_bwd, bad_inputs_write_nothing) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    const ompk_status INV = OMPK_ERR_INVALID_ARGUMENT;
    for (int di = 0; di < nd; di++) {
        pb_case c;
        pb_new(&c, devs[di], OMPK_BF16, 2, 2, 4, 16, 3);
        pb_args a;
        ompk_tensor t, u;
        a = pb_default(&c), a.x = NULL;
        expect_bad(&c, a, INV, "x is NULL");
        a = pb_default(&c), a.dcomb = NULL;
        expect_bad(&c, a, INV, "dcomb is NULL");
        a = pb_default(&c), t = c.x.t, t.shape[2] = 9, a.x = &t;
        expect_bad(&c, a, INV, "n = 9");
        a = pb_default(&c), t = c.x.t, t.shape[2] = 0, a.x = &t;
        expect_bad(&c, a, INV, "n = 0");
        a = pb_default(&c), t = c.x.t, t.shape[3] = 0, a.x = &t;
        expect_bad(&c, a, INV, "D must be");
        a = pb_default(&c), t = c.comb.t, t.shape[2] = 3, a.comb = &t;
        expect_bad(&c, a, INV, "comb dim 2");
        a = pb_default(&c), t = c.post.t, t.dtype = OMPK_BF16, a.post = &t;
        expect_bad(&c, a, INV, "post has unsupported dtype");
        a = pb_default(&c), t = c.f.t, t.dtype = OMPK_F32, a.f = &t;
        expect_bad(&c, a, INV, "same dtype");
        a = pb_default(&c), t = c.dout.t, t.shape[3] = 15, a.dout = &t;
        expect_bad(&c, a, INV, "dout dim 3");
        a = pb_default(&c), t = c.dx.t, t.dtype = OMPK_F32, a.dx = &t;
        expect_bad(&c, a, INV, "same dtype");
        a = pb_default(&c), t = c.df.t, t.strides[2] = 2, t.strides[1] = 32, t.strides[0] = 64,
        a.df = &t;
        expect_bad(&c, a, INV, "unit stride");
        a = pb_default(&c), t = c.dpost.t, t.shape[0] = 1, a.dpost = &t;
        expect_bad(&c, a, INV, "dpost dim 0");
        a = pb_default(&c), t = c.dx.t, t.data = c.dout.t.data, a.dx = &t;
        expect_bad(&c, a, INV, "overlaps");
        a = pb_default(&c), t = c.dcomb.t, t.data = c.dpost.t.data, a.dcomb = &t;
        expect_bad(&c, a, INV, "overlaps");
        a = pb_default(&c), t = c.dpost.t, t.strides[2] = 0, a.dpost = &t;
        expect_bad(&c, a, INV, "overlap");
        a = pb_default(&c), t = c.x.t, t.ndim = 3, a.x = &t;
        expect_bad(&c, a, INV, "rank");
        if (devs[di].type == OMPK_TARGET) {
            pb_case h;
            pb_new(&h, ompk_device_host(), OMPK_BF16, 2, 2, 4, 16, 3);
            a = pb_default(&c), a.f = &h.f.t;
            expect_bad(&c, a, OMPK_ERR_DEVICE_MISMATCH, "f is on");
            pb_free(&h);
        }
        (void)u;
        pb_free(&c);
    }
}

Test(mhc_post_bwd, verify_mode_reports_sections, .init = cr_redirect_stderr) {
    ompk_verify_force(1, 1);
    pb_case c;
    pb_new(&c, ompk_device_host(), OMPK_BF16, 1, 2, 4, 24, 5);
    cr_assert_eq(pb_run(&c), OMPK_OK);
    ompk_verify_force(-1, -1);
    fflush(stderr);
    static char buf[1 << 15];
    size_t got = fread(buf, 1, sizeof buf - 1, cr_get_redirected_stderr());
    buf[got] = 0;
    const char *want[] = {"ompk verify mhc_post_bwd dx ", "ompk verify mhc_post_bwd df ",
                          "ompk verify mhc_post_bwd dpost[post]",
                          "ompk verify mhc_post_bwd dcomb[res]", "ompk trace mhc_post_bwd dout "};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_expect(strstr(buf, want[i]) != NULL, "missing '%s' in:\n%s", want[i], buf);
    cr_expect(strstr(buf, "MISMATCH") == NULL, "verify reported a mismatch:\n%s", buf);
    pb_free(&c);
}
