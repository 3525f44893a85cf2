/* ompk_mhc_post_pre_fwd: the same results as ompk_mhc_post_fwd followed by ompk_mhc_pre_fwd, bit
 * for bit, with the decode kernel (named on the host, the default for T <= 64 on a GPU) and with
 * the two-kernel path (T > 64, or the host form); agreement with the double references; repeats;
 * NaN and inf inputs; the decode kernel's bits at any thread count; bad inputs that must leave
 * every output untouched. Runs on the host and on every GPU. */
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <omp.h>

#include "mhc_test_common.h"
#include "test_variant_util.h"

/* layer l's post inputs and the new residual, then layer l+1's pre problem (q.x is x_out) */
typedef struct pp_case {
    pre_prob q;
    tt xin, f, comb_l, post_l;
} pp_case;

static void pp_new(pp_case *c, ompk_device dev, ompk_dtype dt, int64_t B, int64_t S, int64_t n,
                   int64_t D, int has_gamma, uint64_t seed) {
    pre_new(&c->q, dev, dt, B, S, n, D, has_gamma, seed, 1.0);
    tu_buf_fill_bytes(&c->q.x.b, POISON);
    tu_rng r = tu_rng_make(seed ^ 0x5eedu);
    c->xin = tt_new(dev, dt, 4, B, S, n, D);
    tu_buf_randn(&c->xin.b, &r, 1.0);
    c->f = tt_new(dev, dt, 3, B, S, D, 0);
    tu_buf_randn(&c->f.b, &r, 1.0);
    c->comb_l = tt_new(dev, OMPK_F32, 4, B, S, n, n);
    tu_buf_randn(&c->comb_l.b, &r, 0.5);
    c->post_l = tt_new(dev, OMPK_F32, 3, B, S, n, 0);
    tu_buf_randn(&c->post_l.b, &r, 1.0);
}

static void pp_free(pp_case *c) {
    pre_free(&c->q);
    tt_free(&c->xin), tt_free(&c->f), tt_free(&c->comb_l), tt_free(&c->post_l);
}

static ompk_status pp_fused(pp_case *c) {
    ompk_mhc_post_pre_fwd_args a = {.x = &c->xin.t,
                                    .comb = &c->comb_l.t,
                                    .post = &c->post_l.t,
                                    .f = &c->f.t,
                                    .x_out = &c->q.x.t,
                                    .pre = pre_fwd_args(&c->q)};
    a.pre.x = NULL;
    return ompk_mhc_post_pre_fwd(&a, &c->q.p);
}

static ompk_status pp_two_calls(pp_case *c) {
    ompk_status st = ompk_mhc_post_fwd(&c->xin.t, &c->comb_l.t, &c->post_l.t, &c->f.t, &c->q.x.t);
    if (st != OMPK_OK) return st;
    ompk_mhc_pre_fwd_args a = pre_fwd_args(&c->q);
    return ompk_mhc_pre_fwd(&a, &c->q.p);
}

/* the outputs of a case, in order: x_out, h_in, h_post, logits, comb, h_mix, inv_rms, h_pre */
#define PP_NOUT 8
static tt *pp_out(pp_case *c, int i) {
    tt *o[PP_NOUT] = {&c->q.x,    &c->q.h_in,  &c->q.h_post,  &c->q.logits,
                      &c->q.comb, &c->q.h_mix, &c->q.inv_rms, &c->q.h_pre};
    return o[i];
}
static const char *const pp_names[PP_NOUT] = {"x_out", "h_in",  "h_post",  "res_logits",
                                              "comb",  "h_mix", "inv_rms", "h_pre"};

/* host copies of every output's bytes (caller frees each) */
static void pp_grab(pp_case *c, void *copy[PP_NOUT]) {
    for (int i = 0; i < PP_NOUT; i++) {
        tt *o = pp_out(c, i);
        tu_buf_download(&o->b);
        copy[i] = malloc(o->b.bytes);
        memcpy(copy[i], o->b.host, o->b.bytes);
    }
}

static void pp_expect_same(pp_case *c, void *const ref[PP_NOUT], const char *what) {
    for (int i = 0; i < PP_NOUT; i++) {
        tt *o = pp_out(c, i);
        tu_buf_download(&o->b);
        cr_expect(memcmp(o->b.host, ref[i], o->b.bytes) == 0, "%s: %s differs (%s)", pp_names[i],
                  what, tu_device_name(c->q.dev));
    }
}

static void pp_release(void *copy[PP_NOUT]) {
    for (int i = 0; i < PP_NOUT; i++) free(copy[i]);
}

/* fused vs the two calls under the same selection (pre variant `name`, NULL: the defaults) */
static void same_as_two_calls(ompk_device dev, ompk_dtype dt, int64_t B, int64_t S, int64_t n,
                              int64_t D, int has_gamma, const char *name, uint64_t seed) {
    char what[160];
    snprintf(what, sizeof what, "%s B%lld S%lld n%lld D%lld gamma %d pre %s", ompk_dtype_name(dt),
             (long long)B, (long long)S, (long long)n, (long long)D, has_gamma,
             name ? name : "default");
    cr_assert_eq(ompk_variant_force("mhc_pre_fwd", name), OMPK_OK);
    pp_case c;
    pp_new(&c, dev, dt, B, S, n, D, has_gamma, seed);
    ompk_status st = pp_two_calls(&c);
    cr_assert_eq(st, OMPK_OK, "two calls %s: %s", what, ompk_last_error());
    void *ref[PP_NOUT];
    pp_grab(&c, ref);
    for (int i = 0; i < PP_NOUT; i++) tu_buf_fill_bytes(&pp_out(&c, i)->b, POISON);
    st = pp_fused(&c);
    cr_assert_eq(st, OMPK_OK, "fused %s: %s", what, ompk_last_error());
    pp_expect_same(&c, ref, what);
    /* a repeat gives the same bits */
    for (int i = 0; i < PP_NOUT; i++) tu_buf_fill_bytes(&pp_out(&c, i)->b, POISON);
    cr_assert_eq(pp_fused(&c), OMPK_OK);
    pp_expect_same(&c, ref, what);
    pp_release(ref);
    pp_free(&c);
    ompk_variant_force("mhc_pre_fwd", NULL);
}

Test(mhc_post_pre, same_bits_as_the_two_calls) {
    ompk_device devs[4];
    const int nd = tu_devices(devs, 4);
    static const int ns[] = {1, 2, 3, 4, 6, 8};
    for (int di = 0; di < nd; di++)
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
            for (int bf = 0; bf < 2; bf++) {
                const ompk_dtype dt = bf ? OMPK_BF16 : OMPK_F32;
                /* decode sizes through the decode kernel, odd D, one token, T at the limit */
                same_as_two_calls(devs[di], dt, 1, 1, ns[k], 40, k & 1, "decode", 11 + k);
                same_as_two_calls(devs[di], dt, 2, 5, ns[k], 136, !(k & 1), "decode", 23 + k);
                same_as_two_calls(devs[di], dt, 4, 16, ns[k], 64, 1, "decode", 37 + k);
                /* the defaults: the host form on the host, decode or tensor cores on a GPU */
                same_as_two_calls(devs[di], dt, 1, 16, ns[k], 256, 1, NULL, 41 + k);
                /* past the decode limit: the two kernels */
                same_as_two_calls(devs[di], dt, 1, 65, ns[k], 64, 0, NULL, 53 + k);
            }
}

/* x_out against the double post reference, the rest against the pre reference on x_out as
 * stored */
Test(mhc_post_pre, matches_the_references) {
    ompk_device devs[4];
    const int nd = tu_devices(devs, 4);
    cr_assert_eq(ompk_variant_force("mhc_pre_fwd", "decode"), OMPK_OK);
    for (int di = 0; di < nd; di++)
        for (int n = 1; n <= 8; n++)
            for (int bf = 0; bf < 2; bf++) {
                const ompk_dtype dt = bf ? OMPK_BF16 : OMPK_F32;
                const int64_t B = 2, S = 3, D = 72, T = B * S;
                pp_case c;
                pp_new(&c, devs[di], dt, B, S, n, D, n & 1, 100 + n);
                cr_assert_eq(pp_fused(&c), OMPK_OK, "%s", ompk_last_error());
                double *x = tt_get(&c.xin), *f = tt_get(&c.f), *cm = tt_get(&c.comb_l);
                double *po = tt_get(&c.post_l), *xo = calloc(T * n * D, 8);
                for (int64_t t = 0; t < T; t++)
                    for (int o = 0; o < n; o++)
                        for (int64_t d = 0; d < D; d++) {
                            double y = po[t * n + o] * f[t * D + d];
                            for (int i = 0; i < n; i++)
                                y += cm[(t * n + i) * n + o] * x[(t * n + i) * D + d];
                            xo[(t * n + o) * D + d] = y;
                        }
                char what[64];
                snprintf(what, sizeof what, "%s n%d %s", tu_device_name(devs[di]), n,
                         ompk_dtype_name(dt));
                cr_expect(tt_cmp("x_out", &c.q.x, xo, 1) <= 1, "x_out %s", what);
                pre_prob *q = &c.q;
                const int64_t M = q->M;
                double *xs = tt_get(&q->x), *phi = tt_get(&q->phi), *al = tt_get(&q->alpha);
                double *bias = tt_get(&q->bias), *g = q->has_gamma ? tt_get(&q->gamma) : NULL;
                double *h_in = calloc(T * D, 8), *h_post = calloc(T * n, 8);
                double *lg = calloc(T * n * n, 8), *comb = calloc(T * n * n, 8);
                double *h_mix = calloc(T * M, 8), *inv = calloc(T, 8), *h_pre = calloc(T * n, 8);
                ompk_mhc_ref_pre_fwd(T, n, D, xs, phi, g, al, bias, &q->p, h_in, h_post, lg, comb,
                                     h_mix, inv, h_pre);
                cr_expect(tt_cmp("h_in", &q->h_in, h_in, 1) <= 1, "h_in %s", what);
                cr_expect(tt_cmp("h_post", &q->h_post, h_post, 1) <= 1, "h_post %s", what);
                cr_expect(tt_cmp("res_logits", &q->logits, lg, 1) <= 1, "res_logits %s", what);
                cr_expect(tt_cmp("comb", &q->comb, comb, 1) <= 1, "comb %s", what);
                cr_expect(tt_cmp("h_mix", &q->h_mix, h_mix, 1) <= 1, "h_mix %s", what);
                cr_expect(tt_cmp("inv_rms", &q->inv_rms, inv, 1) <= 1, "inv_rms %s", what);
                cr_expect(tt_cmp("h_pre", &q->h_pre, h_pre, 1) <= 1, "h_pre %s", what);
                free(x), free(f), free(cm), free(po), free(xo), free(xs), free(phi), free(al);
                free(bias), free(g), free(h_in), free(h_post), free(lg), free(comb), free(h_mix);
                free(inv), free(h_pre);
                pp_free(&c);
            }
    ompk_variant_force("mhc_pre_fwd", NULL);
}

/* NaN in x and inf in f reach the same outputs, bit for bit, as through the two calls */
Test(mhc_post_pre, nonfinite_as_the_two_calls) {
    ompk_device devs[4];
    const int nd = tu_devices(devs, 4);
    cr_assert_eq(ompk_variant_force("mhc_pre_fwd", "decode"), OMPK_OK);
    for (int di = 0; di < nd; di++)
        for (int bf = 0; bf < 2; bf++) {
            pp_case c;
            pp_new(&c, devs[di], bf ? OMPK_BF16 : OMPK_F32, 1, 3, 4, 48, 1, 7);
            tu_buf_set(&c.xin.b, 1 * 4 * 48 + 2 * 48 + 5, NAN);
            tu_buf_upload(&c.xin.b);
            tu_buf_set(&c.f.b, 2 * 48 + 9, INFINITY);
            tu_buf_upload(&c.f.b);
            cr_assert_eq(pp_two_calls(&c), OMPK_OK, "%s", ompk_last_error());
            void *ref[PP_NOUT];
            pp_grab(&c, ref);
            double *xo = tt_get(&c.q.x);
            cr_expect(isnan(xo[1 * 4 * 48 + 2 * 48 + 5]), "a NaN in x reaches x_out");
            cr_expect(isinf(xo[2 * 4 * 48 + 9]) || isnan(xo[2 * 4 * 48 + 9]),
                      "an inf in f reaches x_out");
            free(xo);
            for (int i = 0; i < PP_NOUT; i++) tu_buf_fill_bytes(&pp_out(&c, i)->b, POISON);
            cr_assert_eq(pp_fused(&c), OMPK_OK, "%s", ompk_last_error());
            pp_expect_same(&c, ref, bf ? "bf16 nonfinite" : "f32 nonfinite");
            pp_release(ref);
            pp_free(&c);
        }
    ompk_variant_force("mhc_pre_fwd", NULL);
}

/* a rejected call writes nothing */
static void expect_rejected(pp_case *c, ompk_mhc_post_pre_fwd_args *a, const char *what) {
    for (int i = 0; i < PP_NOUT; i++) tu_buf_fill_bytes(&pp_out(c, i)->b, POISON);
    const ompk_status st = ompk_mhc_post_pre_fwd(a, &c->q.p);
    cr_expect_eq(st, OMPK_ERR_INVALID_ARGUMENT, "%s: status %s", what, ompk_status_str(st));
    cr_expect(strlen(ompk_last_error()) > 0, "%s: no message", what);
    for (int i = 0; i < PP_NOUT; i++)
        cr_expect(tu_buf_all_bytes(&pp_out(c, i)->b, POISON), "%s: %s written", what, pp_names[i]);
}

Test(mhc_post_pre, bad_inputs) {
    ompk_device devs[4];
    const int nd = tu_devices(devs, 4);
    cr_expect_eq(ompk_mhc_post_pre_fwd(NULL, NULL), OMPK_ERR_INVALID_ARGUMENT);
    for (int di = 0; di < nd; di++) {
        pp_case c;
        pp_new(&c, devs[di], OMPK_BF16, 1, 4, 4, 64, 1, 3);
        ompk_mhc_post_pre_fwd_args a = {.x = &c.xin.t,
                                        .comb = &c.comb_l.t,
                                        .post = &c.post_l.t,
                                        .f = &c.f.t,
                                        .x_out = &c.q.x.t,
                                        .pre = pre_fwd_args(&c.q)};
        ompk_mhc_post_pre_fwd_args b = a;
        b.pre.x = &c.xin.t;
        expect_rejected(&c, &b, "pre.x neither NULL nor x_out");
        b = a;
        b.x_out = NULL;
        expect_rejected(&c, &b, "x_out NULL");
        b = a;
        b.x_out = &c.xin.t;
        b.pre.x = NULL;
        expect_rejected(&c, &b, "x_out is x");
        tt wide = tt_new(devs[di], OMPK_BF16, 1, 2 * 4 * 4 * 64, 0, 0, 0);
        ompk_tensor xo = c.q.x.t;
        xo.data = wide.t.data;
        xo.strides[3] = 2, xo.strides[2] = 128, xo.strides[1] = 512, xo.strides[0] = 2048;
        b = a;
        b.x_out = &xo;
        expect_rejected(&c, &b, "x_out with stride 2 on D");
        tt_free(&wide);
        ompk_tensor xo2 = c.q.x.t;
        xo2.shape[2] = 3;
        b.x_out = &xo2;
        expect_rejected(&c, &b, "x_out with the wrong stream count");
        b = a;
        b.pre.h_in = &c.f.t;
        expect_rejected(&c, &b, "h_in is f (an input)");
        b = a;
        b.pre.comb = &c.comb_l.t;
        expect_rejected(&c, &b, "the pre's comb is the post's comb (an input)");
        b = a;
        b.pre.h_pre = &c.q.x.t;
        expect_rejected(&c, &b, "h_pre is x_out");
        b = a;
        b.pre.phi = NULL;
        expect_rejected(&c, &b, "phi NULL");
        pp_free(&c);
    }
}

/* The decode kernel on the host: the same bits with one thread (its epilogue on one thread, as
 * pre_token) and with enough threads for the team-wide epilogue (N^2 of them, as on a GPU) */
Test(mhc_post_pre, decode_bits_independent_of_thread_count) {
    const ompk_device host = {OMPK_HOST, 0};
    const int max_threads = omp_get_max_threads();
    static const int ns[] = {1, 3, 4, 8}, threads[] = {1, 3, 64};
    cr_assert_eq(ompk_variant_force("mhc_pre_fwd", "decode"), OMPK_OK);
    for (int k = 0; k < 4; k++) {
        pp_case c;
        pp_new(&c, host, OMPK_BF16, 1, 2, ns[k], 133, k & 1, 500 + k);
        void *first[PP_NOUT];
        for (int th = 0; th < 3; th++) {
            omp_set_num_threads(threads[th]);
            for (int i = 0; i < PP_NOUT; i++) tu_buf_fill_bytes(&pp_out(&c, i)->b, POISON);
            const ompk_status st = pp_fused(&c);
            omp_set_num_threads(max_threads);
            cr_assert_eq(st, OMPK_OK, "%s", ompk_last_error());
            if (th == 0)
                pp_grab(&c, first);
            else
                pp_expect_same(&c, first, threads[th] == 3 ? "3 threads" : "64 threads");
        }
        pp_release(first);
        pp_free(&c);
    }
    ompk_variant_force("mhc_pre_fwd", NULL);
}
