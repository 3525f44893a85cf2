/* ompk_router_topk_fwd against the brute-force reference (every N^2 sum, full sort): scores and
 * indices must match exactly, since the kernel forms the same fp32 sums and the tie rule is part
 * of the contract. Every N x k x input class x dtype of issue 6 (plain N(0,1) inputs: test_ops),
 * the seed implementation's defects as named regressions, and strided views. Runs on the host and
 * on every GPU. */
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "ompk/router.h"
#include "ref/router_ref.h"
#include "test_util.h"
#include "verify.h"

typedef enum in_class {
    IN_RANDN,     /* N(0,1) */
    IN_LSM,       /* log-softmax rows: every value and every sum negative */
    IN_TIES,      /* a few distinct values (bf16-exact): most sums tie */
    IN_NEGINF,    /* -inf entries, a row of only -inf, a token whose sums are all -inf */
    IN_IDENTICAL, /* every token the same row, and sy == sx (sum(i,j) == sum(j,i)) */
    IN_ROUNDTIE,  /* sx differences far below one ulp of the sums: ties by rounding */
    IN_COUNT
} in_class;

static const char *class_name[IN_COUNT] = {"randn",  "lsm",       "ties",
                                           "neginf", "identical", "roundtie"};

/* host values (double) for sx and sy [T,N] of class c */
static void gen(in_class c, int64_t T, int64_t N, uint64_t seed, double *x, double *y) {
    tu_rng r = tu_rng_make(seed);
    for (int64_t t = 0; t < T; t++) {
        double *xr = x + t * N, *yr = y + t * N;
        for (int64_t i = 0; i < N; i++) {
            double a = tu_normal(&r), b = tu_normal(&r);
            switch (c) {
            case IN_TIES:
                a = floor(a * 2.0) / 2.0;
                b = floor(b * 2.0) / 2.0;
                break;
            case IN_NEGINF:
                if (tu_uniform(&r) < 0.25) a = -INFINITY;
                if (tu_uniform(&r) < 0.25) b = -INFINITY;
                if (t == 0) a = -INFINITY;
                if (t == 1) a = b = -INFINITY;
                break;
            case IN_ROUNDTIE:
                a = 1.0 + (double)(tu_next(&r) % 16) * 0x1p-22;
                b = 1024.0 + floor(b * 4.0) * 0x1p-10;
                break;
            default:
                break;
            }
            xr[i] = a;
            yr[i] = b;
        }
        if (c == IN_LSM)
            for (int p = 0; p < 2; p++) {
                double *v = p ? yr : xr, m = -INFINITY, s = 0.0;
                for (int64_t i = 0; i < N; i++) v[i] *= 2.0;
                for (int64_t i = 0; i < N; i++) m = v[i] > m ? v[i] : m;
                for (int64_t i = 0; i < N; i++) s += exp(v[i] - m);
                for (int64_t i = 0; i < N; i++) v[i] = v[i] - m - log(s) - 1e-3;
            }
        if (c == IN_IDENTICAL) {
            memcpy(xr, x, sizeof(double) * (size_t)N);
            memcpy(yr, x, sizeof(double) * (size_t)N);
        }
    }
}

typedef struct fwd_case {
    int64_t T, N;
    ompk_dtype dt;
    tu_buf sx, sy;
    ompk_tensor tsx, tsy;
    float *ref_s; /* [T, N^2]: the whole sorted order */
    int32_t *ref_i;
} fwd_case;

static void case_new(fwd_case *c, ompk_device dev, ompk_dtype dt, in_class cls, int64_t T,
                     int64_t N, uint64_t seed) {
    c->T = T, c->N = N, c->dt = dt;
    double *x = malloc(sizeof(double) * (size_t)(T * N)),
           *y = malloc(sizeof(double) * (size_t)(T * N));
    gen(cls, T, N, seed, x, y);
    c->sx = tu_buf_new(dev, dt, T * N);
    c->sy = tu_buf_new(dev, dt, T * N);
    for (int64_t e = 0; e < T * N; e++) {
        tu_buf_set(&c->sx, e, x[e]);
        tu_buf_set(&c->sy, e, y[e]);
    }
    tu_buf_upload(&c->sx);
    tu_buf_upload(&c->sy);
    free(x);
    free(y);
    const int64_t sh[2] = {T, N};
    c->tsx = tu_view(&c->sx, 2, sh);
    c->tsy = tu_view(&c->sy, 2, sh);
    ompk_tensor hx = ompk_tensor_make(c->sx.host, dt, 2, sh, ompk_device_host());
    ompk_tensor hy = ompk_tensor_make(c->sy.host, dt, 2, sh, ompk_device_host());
    c->ref_s = malloc(sizeof(float) * (size_t)(T * N * N));
    c->ref_i = malloc(sizeof(int32_t) * (size_t)(T * N * N));
    cr_assert_eq(ompk_ref_router_topk_fwd(&hx, &hy, N * N, c->ref_s, c->ref_i), OMPK_OK);
}

static void case_free(fwd_case *c) {
    tu_buf_free(&c->sx);
    tu_buf_free(&c->sy);
    free(c->ref_s);
    free(c->ref_i);
}

static int same_float(float a, float b) {
    return a == b || (a != a && b != b);
}

/* run the kernel for k and compare with the reference's first k, bit for bit */
static void check_k(fwd_case *c, int64_t k, const char *what) {
    const int64_t T = c->T, NN = c->N * c->N;
    ompk_device dev = c->sx.device;
    tu_buf sc = tu_buf_new(dev, OMPK_F32, T * k), ix = tu_buf_new(dev, OMPK_I32, T * k);
    tu_buf_fill_bytes(&sc, 0xA5);
    tu_buf_fill_bytes(&ix, 0xA5);
    const int64_t sh[2] = {T, k};
    ompk_tensor tsc = tu_view(&sc, 2, sh), tix = tu_view(&ix, 2, sh);
    ompk_status st = ompk_router_topk_fwd(&c->tsx, &c->tsy, k, &tsc, &tix);
    cr_assert_eq(st, OMPK_OK, "%s: %s: %s", what, ompk_status_str(st), ompk_last_error());
    tu_buf_download(&sc);
    tu_buf_download(&ix);
    const float *s = sc.host;
    const int32_t *id = ix.host;
    for (int64_t t = 0; t < T; t++)
        for (int64_t r = 0; r < k; r++) {
            const float es = c->ref_s[t * NN + r], gs = s[t * k + r];
            const int32_t ei = c->ref_i[t * NN + r], gi = id[t * k + r];
            if (ei != gi || !same_float(es, gs))
                cr_assert_fail("%s %s N=%lld k=%lld on %s: token %lld slot %lld: got (%.9g, %d), "
                               "expected (%.9g, %d)",
                               what, ompk_dtype_name(c->dt), (long long)c->N, (long long)k,
                               tu_device_name(dev), (long long)t, (long long)r, gs, gi, es, ei);
        }
    tu_buf_free(&sc);
    tu_buf_free(&ix);
}

static void run_class(in_class cls, ompk_dtype dt) {
    ompk_device devs[4];
    const int nd = tu_devices(devs, 4);
    const int64_t Ns[] = {1, 2, 7, 48, 64, 100, 256};
    const int64_t ks[] = {1, 2, 8, 33, -1}; /* -1: N^2 */
    for (int di = 0; di < nd; di++)
        for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++) {
            const int64_t N = Ns[ni], T = N >= 100 ? 3 : 5;
            fwd_case c;
            case_new(&c, devs[di], dt, cls, T, N, (uint64_t)(N * 31 + cls));
            for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
                const int64_t k = ks[ki] < 0 ? N * N : ks[ki];
                if (k > N * N || (ks[ki] > 0 && k == N * N && ki + 1 < sizeof ks / sizeof ks[0]))
                    continue;
                check_k(&c, k, class_name[cls]);
            }
            case_free(&c);
        }
}

Test(router_fwd, lsm_f32) {
    run_class(IN_LSM, OMPK_F32);
}
Test(router_fwd, lsm_bf16) {
    run_class(IN_LSM, OMPK_BF16);
}
Test(router_fwd, ties_f32) {
    run_class(IN_TIES, OMPK_F32);
}
Test(router_fwd, ties_bf16) {
    run_class(IN_TIES, OMPK_BF16);
}
Test(router_fwd, neginf_f32) {
    run_class(IN_NEGINF, OMPK_F32);
}
Test(router_fwd, neginf_bf16) {
    run_class(IN_NEGINF, OMPK_BF16);
}
Test(router_fwd, identical_f32) {
    run_class(IN_IDENTICAL, OMPK_F32);
}
Test(router_fwd, identical_bf16) {
    run_class(IN_IDENTICAL, OMPK_BF16);
}
Test(router_fwd, roundtie_f32) {
    run_class(IN_ROUNDTIE, OMPK_F32);
}

/* k past the on-stack capacity (64) and up to 1024, with N both below and above k+1, so the
 * workspace path and the heap-in-output path are both covered. */
Test(router_fwd, large_k) {
    ompk_device devs[4];
    const int nd = tu_devices(devs, 4);
    const int64_t cases[][2] = {{48, 65}, {64, 1024}, {100, 100}, {100, 1024}, {256, 1024}};
    for (int di = 0; di < nd; di++)
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
            for (int cls = 0; cls < IN_COUNT; cls += 2) {
                fwd_case c;
                case_new(&c, devs[di], OMPK_F32, (in_class)cls, 3, cases[ci][0], 77 + ci);
                check_k(&c, cases[ci][1], class_name[cls]);
                case_free(&c);
            }
}

/* Seed defect 1: when every candidate sum was negative, slots were never filled and came back as
 * score 0.0 / index -1. Every slot must hold a real pair with its (negative) sum. */
Test(router_fwd, regression_all_negative_rows_fill_every_slot) {
    ompk_device devs[4];
    const int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++) {
        const int64_t T = 4, N = 48, k = 33;
        fwd_case c;
        case_new(&c, devs[di], OMPK_F32, IN_LSM, T, N, 5);
        check_k(&c, k, "lsm");
        tu_buf sc = tu_buf_new(devs[di], OMPK_F32, T * k),
               ix = tu_buf_new(devs[di], OMPK_I32, T * k);
        const int64_t sh[2] = {T, k};
        ompk_tensor tsc = tu_view(&sc, 2, sh), tix = tu_view(&ix, 2, sh);
        cr_assert_eq(ompk_router_topk_fwd(&c.tsx, &c.tsy, k, &tsc, &tix), OMPK_OK);
        tu_buf_download(&sc);
        tu_buf_download(&ix);
        for (int64_t e = 0; e < T * k; e++) {
            cr_expect_lt(((float *)sc.host)[e], 0.0f, "slot %lld has a non-negative score",
                         (long long)e);
            cr_expect(((int32_t *)ix.host)[e] >= 0 && ((int32_t *)ix.host)[e] < N * N,
                      "slot %lld index %d", (long long)e, ((int32_t *)ix.host)[e]);
        }
        tu_buf_free(&sc);
        tu_buf_free(&ix);
        case_free(&c);
    }
}

/* Seed defect 2: out-of-bounds reads when N was not a power of two. Each row sits in a wider
 * buffer whose padding columns hold +1e30: a kernel that reads past N picks them up. The same
 * layout also checks that row strides are honoured. */
Test(router_fwd, regression_non_power_of_two_reads_stay_in_row) {
    ompk_device devs[4];
    const int nd = tu_devices(devs, 4);
    const int64_t Ns[] = {7, 100};
    for (int di = 0; di < nd; di++)
        for (int ni = 0; ni < 2; ni++) {
            const int64_t T = 3, N = Ns[ni], P = 128 - N % 64 + N, k = 8;
            fwd_case c;
            case_new(&c, devs[di], OMPK_F32, IN_RANDN, T, N, 9);
            tu_buf wx = tu_buf_new(devs[di], OMPK_F32, T * P),
                   wy = tu_buf_new(devs[di], OMPK_F32, T * P);
            for (int64_t t = 0; t < T; t++)
                for (int64_t i = 0; i < P; i++) {
                    tu_buf_set(&wx, t * P + i, i < N ? tu_buf_get(&c.sx, t * N + i) : 1e30);
                    tu_buf_set(&wy, t * P + i, i < N ? tu_buf_get(&c.sy, t * N + i) : 1e30);
                }
            tu_buf_upload(&wx);
            tu_buf_upload(&wy);
            const int64_t sh[2] = {T, N}, st[2] = {P, 1};
            cr_assert_eq(ompk_tensor_init(&c.tsx, wx.dev, OMPK_F32, 2, sh, st, devs[di]), OMPK_OK);
            cr_assert_eq(ompk_tensor_init(&c.tsy, wy.dev, OMPK_F32, 2, sh, st, devs[di]), OMPK_OK);
            check_k(&c, k, "padded rows");
            check_k(&c, N * N, "padded rows");
            tu_buf_free(&wx);
            tu_buf_free(&wy);
            case_free(&c);
        }
}

/* Found while writing the kernel: the usual pruning (i among the top-k of sx, j among the top-k
 * of sy) is not exact under the tie rule, because a larger sx can round to the same sum as a
 * smaller one at a higher flattened index. Here sum(0,0) == sum(1,0) == 1 in fp32, sx[1] > sx[0],
 * and the answer for k = 1 is index 0, which that pruning never looks at. */
Test(router_fwd, regression_rounding_tie_outside_axis_top_k) {
    ompk_device devs[4];
    const int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++) {
        tu_buf x = tu_buf_new(devs[di], OMPK_F32, 2), y = tu_buf_new(devs[di], OMPK_F32, 2);
        tu_buf_set(&x, 0, 0.0);
        tu_buf_set(&x, 1, 1e-10);
        tu_buf_set(&y, 0, 1.0);
        tu_buf_set(&y, 1, -5.0);
        tu_buf_upload(&x);
        tu_buf_upload(&y);
        tu_buf sc = tu_buf_new(devs[di], OMPK_F32, 2), ix = tu_buf_new(devs[di], OMPK_I32, 2);
        const int64_t sh[2] = {1, 2};
        ompk_tensor tx = tu_view(&x, 2, sh), ty = tu_view(&y, 2, sh);
        ompk_tensor tsc = tu_view(&sc, 2, sh), tix = tu_view(&ix, 2, sh);
        for (int64_t k = 1; k <= 2; k++) {
            const int64_t osh[2] = {1, k};
            tsc = tu_view(&sc, 2, osh), tix = tu_view(&ix, 2, osh);
            cr_assert_eq(ompk_router_topk_fwd(&tx, &ty, k, &tsc, &tix), OMPK_OK);
            tu_buf_download(&sc);
            tu_buf_download(&ix);
            cr_expect_eq(((int32_t *)ix.host)[0], 0, "k=%lld: slot 0 index %d, expected 0",
                         (long long)k, ((int32_t *)ix.host)[0]);
            cr_expect_eq(((float *)sc.host)[0], 1.0f);
            if (k == 2)
                cr_expect_eq(((int32_t *)ix.host)[1], 2, "slot 1 index %d",
                             ((int32_t *)ix.host)[1]);
        }
        tu_buf_free(&x);
        tu_buf_free(&y);
        tu_buf_free(&sc);
        tu_buf_free(&ix);
    }
}

/* sx as a transposed (column-major) view and strided outputs */
Test(router_fwd, strided_views) {
    ompk_device devs[4];
    const int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++)
        for (int bf = 0; bf < 2; bf++) {
            const ompk_dtype dt = bf ? OMPK_BF16 : OMPK_F32;
            const int64_t T = 6, N = 33, k = 20, NN = N * N;
            fwd_case c;
            case_new(&c, devs[di], dt, IN_RANDN, T, N, 21);
            tu_buf xt = tu_buf_new(devs[di], dt, T * N);
            for (int64_t t = 0; t < T; t++)
                for (int64_t i = 0; i < N; i++)
                    tu_buf_set(&xt, i * T + t, tu_buf_get(&c.sx, t * N + i));
            tu_buf_upload(&xt);
            const int64_t sh[2] = {T, N}, st[2] = {1, T};
            cr_assert_eq(ompk_tensor_init(&c.tsx, xt.dev, dt, 2, sh, st, devs[di]), OMPK_OK);
            tu_buf sc = tu_buf_new(devs[di], OMPK_F32, T * k * 2),
                   ix = tu_buf_new(devs[di], OMPK_I32, T * k * 3);
            const int64_t osh[2] = {T, k}, ss[2] = {2 * k, 2}, is[2] = {1, T * 3};
            ompk_tensor tsc, tix;
            cr_assert_eq(ompk_tensor_init(&tsc, sc.dev, OMPK_F32, 2, osh, ss, devs[di]), OMPK_OK);
            cr_assert_eq(ompk_tensor_init(&tix, ix.dev, OMPK_I32, 2, osh, is, devs[di]), OMPK_OK);
            cr_assert_eq(ompk_router_topk_fwd(&c.tsx, &c.tsy, k, &tsc, &tix), OMPK_OK, "%s",
                         ompk_last_error());
            tu_buf_download(&sc);
            tu_buf_download(&ix);
            for (int64_t t = 0; t < T; t++)
                for (int64_t r = 0; r < k; r++) {
                    cr_expect_eq(((float *)sc.host)[t * 2 * k + r * 2], c.ref_s[t * NN + r]);
                    cr_expect_eq(((int32_t *)ix.host)[t + r * T * 3], c.ref_i[t * NN + r]);
                }
            tu_buf_free(&xt);
            tu_buf_free(&sc);
            tu_buf_free(&ix);
            case_free(&c);
        }
}

/* many tokens, so every thread of every team gets several; bit-identical on a second call */
Test(router_fwd, many_tokens_deterministic) {
    ompk_device devs[4];
    const int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++) {
        fwd_case c;
        case_new(&c, devs[di], OMPK_BF16, IN_RANDN, 1000, 64, 3);
        check_k(&c, 8, "many tokens");
        check_k(&c, 8, "many tokens, second call");
        case_free(&c);
    }
}

Test(router_fwd, zero_tokens) {
    const int64_t sh[2] = {0, 4}, osh[2] = {0, 3};
    ompk_tensor x = ompk_tensor_make(NULL, OMPK_F32, 2, sh, ompk_device_host());
    ompk_tensor y = x, s = ompk_tensor_make(NULL, OMPK_F32, 2, osh, ompk_device_host());
    ompk_tensor i = ompk_tensor_make(NULL, OMPK_I32, 2, osh, ompk_device_host());
    cr_expect_eq(ompk_router_topk_fwd(&x, &y, 3, &s, &i), OMPK_OK, "%s", ompk_last_error());
}

/* OMPK_VERIFY=1 reruns the brute force after the call and reports each output; OMPK_TRACE=1
 * prints the norms of the inputs and scores. */
Test(router_fwd, verify_and_trace_modes, .init = cr_redirect_stderr) {
    fwd_case c;
    case_new(&c, ompk_device_host(), OMPK_BF16, IN_TIES, 4, 7, 2);
    tu_buf sc = tu_buf_new(ompk_device_host(), OMPK_F32, 4 * 5);
    tu_buf ix = tu_buf_new(ompk_device_host(), OMPK_I32, 4 * 5);
    const int64_t sh[2] = {4, 5};
    ompk_tensor tsc = tu_view(&sc, 2, sh), tix = tu_view(&ix, 2, sh);
    ompk_verify_force(1, 1);
    cr_assert_eq(ompk_router_topk_fwd(&c.tsx, &c.tsy, 5, &tsc, &tix), OMPK_OK);
    ompk_verify_force(-1, -1);
    fflush(stderr);
    char buf[8192] = {0};
    const size_t got = fread(buf, 1, sizeof buf - 1, cr_get_redirected_stderr());
    buf[got] = 0;
    cr_assert(strstr(buf, "ompk verify router_topk_fwd scores n=20") != NULL, "%s", buf);
    cr_assert(strstr(buf, "ompk verify router_topk_fwd indices n=20") != NULL, "%s", buf);
    cr_assert(strstr(buf, "MISMATCH") == NULL && strstr(buf, "mismatches=0"), "%s", buf);
    cr_assert(strstr(buf, "ompk trace router_topk_fwd sx ") != NULL, "%s", buf);
    tu_buf_free(&sc);
    tu_buf_free(&ix);
    case_free(&c);
}

/* NaN and +inf have no place in the order (+inf + -inf is NaN), so only the promise of the
 * header is checked: the call succeeds and every slot holds a real pair index. */
Test(router_fwd, nan_and_inf_inputs_give_valid_indices) {
    ompk_device devs[4];
    const int nd = tu_devices(devs, 4);
    const int64_t Ns[] = {7, 64, 256}, ks[] = {8, 32, 100};
    for (int di = 0; di < nd; di++)
        for (int ni = 0; ni < 3; ni++) {
            const int64_t T = 4, N = Ns[ni], k = ks[ni];
            fwd_case c;
            case_new(&c, devs[di], OMPK_F32, IN_NEGINF, T, N, 40);
            tu_buf_set(&c.sx, 2 * N + 1, NAN);
            tu_buf_set(&c.sy, 2 * N + 3, INFINITY);
            tu_buf_set(&c.sx, 3 * N + 0, INFINITY);
            for (int64_t i = 0; i < N; i++) tu_buf_set(&c.sy, 3 * N + i, i % 2 ? NAN : -INFINITY);
            tu_buf_upload(&c.sx);
            tu_buf_upload(&c.sy);
            tu_buf sc = tu_buf_new(devs[di], OMPK_F32, T * k),
                   ix = tu_buf_new(devs[di], OMPK_I32, T * k);
            const int64_t sh[2] = {T, k};
            ompk_tensor tsc = tu_view(&sc, 2, sh), tix = tu_view(&ix, 2, sh);
            cr_assert_eq(ompk_router_topk_fwd(&c.tsx, &c.tsy, k, &tsc, &tix), OMPK_OK, "%s",
                         ompk_last_error());
            tu_buf_download(&ix);
            for (int64_t e = 0; e < T * k; e++) {
                const int32_t v = ((int32_t *)ix.host)[e];
                cr_assert(v >= 0 && v < N * N, "N=%lld k=%lld on %s: slot %lld index %d",
                          (long long)N, (long long)k, tu_device_name(devs[di]), (long long)e, v);
            }
            tu_buf_free(&sc);
            tu_buf_free(&ix);
            case_free(&c);
        }
}
