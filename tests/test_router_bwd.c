/* ompk_router_topk_bwd: against the reference (same fp32 sums in slot order, so f32 matches bit
 * for bit and bf16 after one rounding: the f32 outputs' sweep is test_ops'), -1 padding, invalid
 * indices, repeated calls, and the seed implementation's backward defects as named regressions.
 * Runs on the host and on every GPU. */
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "ompk/router.h"
#include "ref/router_ref.h"
#include "test_util.h"
#include "verify.h"

typedef struct bwd_case {
    int64_t T, N, k;
    tu_buf ds, ix, dx, dy;
    ompk_tensor tds, tix, tdx, tdy;
} bwd_case;

/* indices: random pairs (duplicates allowed, so several slots hit one row), a share of -1 */
static void case_new(bwd_case *c, ompk_device dev, ompk_dtype ds_dt, ompk_dtype out_dt, int64_t T,
                     int64_t N, int64_t k, double pad_share, uint64_t seed) {
    tu_rng r = tu_rng_make(seed);
    c->T = T, c->N = N, c->k = k;
    c->ds = tu_buf_new(dev, ds_dt, T * k);
    c->ix = tu_buf_new(dev, OMPK_I32, T * k);
    c->dx = tu_buf_new(dev, out_dt, T * N);
    c->dy = tu_buf_new(dev, out_dt, T * N);
    tu_buf_randn(&c->ds, &r, 1.0);
    for (int64_t e = 0; e < T * k; e++)
        tu_buf_set(&c->ix, e,
                   tu_uniform(&r) < pad_share ? -1.0 : (double)(tu_next(&r) % (uint64_t)(N * N)));
    tu_buf_upload(&c->ix);
    tu_buf_fill_bytes(&c->dx, 0x5A);
    tu_buf_fill_bytes(&c->dy, 0x5A);
    const int64_t sk[2] = {T, k}, sn[2] = {T, N};
    c->tds = tu_view(&c->ds, 2, sk);
    c->tix = tu_view(&c->ix, 2, sk);
    c->tdx = tu_view(&c->dx, 2, sn);
    c->tdy = tu_view(&c->dy, 2, sn);
}

static void case_free(bwd_case *c) {
    tu_buf_free(&c->ds);
    tu_buf_free(&c->ix);
    tu_buf_free(&c->dx);
    tu_buf_free(&c->dy);
}

static ompk_status run(bwd_case *c) {
    return ompk_router_topk_bwd(&c->tds, &c->tix, c->N, &c->tdx, &c->tdy);
}

/* compare dx/dy with the reference: bit-exact for f32, exact after rounding for bf16 */
static void check_ref(bwd_case *c, const char *what) {
    const int64_t T = c->T, N = c->N, k = c->k;
    tu_buf_download(&c->dx);
    tu_buf_download(&c->dy);
    const int64_t sk[2] = {T, k};
    ompk_tensor hds = ompk_tensor_make(c->ds.host, c->ds.dtype, 2, sk, ompk_device_host());
    ompk_tensor hix = ompk_tensor_make(c->ix.host, OMPK_I32, 2, sk, ompk_device_host());
    float *rx = malloc(sizeof(float) * (size_t)(T * N)),
          *ry = malloc(sizeof(float) * (size_t)(T * N));
    cr_assert_eq(ompk_ref_router_topk_bwd(&hds, &hix, N, rx, ry), OMPK_OK);
    const int bf = c->dx.dtype == OMPK_BF16;
    for (int64_t e = 0; e < T * N; e++) {
        const float ex = bf ? ompk_round_bf16(rx[e]) : rx[e];
        const float ey = bf ? ompk_round_bf16(ry[e]) : ry[e];
        const float gx = (float)tu_buf_get(&c->dx, e), gy = (float)tu_buf_get(&c->dy, e);
        if (gx != ex || gy != ey)
            cr_assert_fail("%s on %s (N=%lld k=%lld out %s): element %lld: dsx %.9g vs %.9g, "
                           "dsy %.9g vs %.9g",
                           what, tu_device_name(c->dx.device), (long long)N, (long long)k,
                           ompk_dtype_name(c->dx.dtype), (long long)e, gx, ex, gy, ey);
    }
    free(rx);
    free(ry);
}

/* bf16 outputs: the reference rounded once, exactly (verify mode's band is wider) */
static void sweep_bf16_out(ompk_dtype ds_dt) {
    ompk_device devs[4];
    const int nd = tu_devices(devs, 4);
    const int64_t shapes[][3] = {{5, 1, 1},  {5, 2, 4},    {4, 7, 8},     {3, 48, 33},
                                 {9, 64, 8}, {3, 100, 33}, {2, 256, 1024}};
    for (int di = 0; di < nd; di++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            bwd_case c;
            case_new(&c, devs[di], ds_dt, OMPK_BF16, shapes[s][0], shapes[s][1], shapes[s][2], 0.2,
                     (uint64_t)s + 1);
            cr_assert_eq(run(&c), OMPK_OK, "%s", ompk_last_error());
            check_ref(&c, "sweep");
            case_free(&c);
        }
}

Test(router_bwd, f32_grads_bf16_out) {
    sweep_bf16_out(OMPK_F32);
}
Test(router_bwd, bf16_grads_bf16_out) {
    sweep_bf16_out(OMPK_BF16);
}

/* The forward's own output as indices: every slot distinct, the realistic input. */
Test(router_bwd, from_forward_indices) {
    ompk_device devs[4];
    const int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++) {
        const int64_t T = 40, N = 48, k = 33;
        bwd_case c;
        case_new(&c, devs[di], OMPK_F32, OMPK_F32, T, N, k, 0.0, 4);
        tu_rng r = tu_rng_make(8);
        tu_buf sx = tu_buf_new(devs[di], OMPK_F32, T * N),
               sy = tu_buf_new(devs[di], OMPK_F32, T * N);
        tu_buf sc = tu_buf_new(devs[di], OMPK_F32, T * k);
        tu_buf_randn(&sx, &r, 1.0);
        tu_buf_randn(&sy, &r, 1.0);
        const int64_t sn[2] = {T, N}, sk[2] = {T, k};
        ompk_tensor tx = tu_view(&sx, 2, sn), ty = tu_view(&sy, 2, sn), ts = tu_view(&sc, 2, sk);
        cr_assert_eq(ompk_router_topk_fwd(&tx, &ty, k, &ts, &c.tix), OMPK_OK);
        tu_buf_download(&c.ix);
        cr_assert_eq(run(&c), OMPK_OK, "%s", ompk_last_error());
        check_ref(&c, "forward indices");
        tu_buf_free(&sx);
        tu_buf_free(&sy);
        tu_buf_free(&sc);
        case_free(&c);
    }
}

/* Seed defect 3: a -1 index wrote into the previous token's row (row t, column -1 == row t-1,
 * column N-1). Token 1 is all padding; token 0 has no slot touching its last column, so both
 * must stay exactly zero there. */
Test(router_bwd, regression_padding_does_not_touch_previous_token) {
    ompk_device devs[4];
    const int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++)
        for (int bf = 0; bf < 2; bf++) {
            const int64_t T = 3, N = 7, k = 5;
            bwd_case c;
            case_new(&c, devs[di], OMPK_F32, bf ? OMPK_BF16 : OMPK_F32, T, N, k, 0.0, 6);
            for (int64_t r = 0; r < k; r++) {
                tu_buf_set(&c.ix, 0 * k + r,
                           (double)(r * N)); /* (r, 0): column N-1 of dsy unused */
                tu_buf_set(&c.ix, 1 * k + r, -1.0);
                tu_buf_set(&c.ix, 2 * k + r, r % 2 ? -1.0 : (double)(N * N - 1 - r));
            }
            tu_buf_upload(&c.ix);
            cr_assert_eq(run(&c), OMPK_OK, "%s", ompk_last_error());
            check_ref(&c, "padding");
            for (int64_t i = 0; i < N; i++) {
                cr_expect_eq(tu_buf_get(&c.dx, 1 * N + i), 0.0, "padded token dsx[%lld]",
                             (long long)i);
                cr_expect_eq(tu_buf_get(&c.dy, 1 * N + i), 0.0, "padded token dsy[%lld]",
                             (long long)i);
            }
            cr_expect_eq(tu_buf_get(&c.dx, 0 * N + N - 1), 0.0, "token 0 dsx[N-1] was written");
            cr_expect_eq(tu_buf_get(&c.dy, 0 * N + N - 1), 0.0, "token 0 dsy[N-1] was written");
            case_free(&c);
        }
}

/* Seed defect 4: outputs were zeroed only on the first call, so later calls accumulated onto
 * stale memory. Two consecutive calls on the same buffers must equal one call. */
Test(router_bwd, regression_repeated_calls_do_not_accumulate) {
    ompk_device devs[4];
    const int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++)
        for (int bf = 0; bf < 2; bf++) {
            bwd_case c;
            case_new(&c, devs[di], OMPK_F32, bf ? OMPK_BF16 : OMPK_F32, 16, 64, 8, 0.1, 12);
            cr_assert_eq(run(&c), OMPK_OK);
            tu_buf_download(&c.dx);
            void *first = malloc(c.dx.bytes);
            memcpy(first, c.dx.host, c.dx.bytes);
            cr_assert_eq(run(&c), OMPK_OK);
            check_ref(&c, "second call");
            cr_expect(memcmp(first, c.dx.host, c.dx.bytes) == 0, "second call differs from first");
            free(first);
            case_free(&c);
        }
}

/* An index outside {-1} U [0, N^2): error status, the offending slot named, and dsx/dsy all zero
 * (they were poisoned before the call). */
Test(router_bwd, invalid_index_leaves_outputs_zero) {
    ompk_device devs[4];
    const int nd = tu_devices(devs, 4);
    const double bad[] = {49.0, -2.0, 2147483647.0, -2147483648.0};
    for (int di = 0; di < nd; di++)
        for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++)
            for (int bf = 0; bf < 2; bf++) {
                bwd_case c;
                case_new(&c, devs[di], OMPK_F32, bf ? OMPK_BF16 : OMPK_F32, 4, 7, 5, 0.2, 14);
                tu_buf_set(&c.ix, 2 * 5 + 3, bad[b]);
                tu_buf_upload(&c.ix);
                ompk_status st = run(&c);
                cr_expect_eq(st, OMPK_ERR_INDEX_OUT_OF_RANGE, "index %g: got %s", bad[b],
                             ompk_status_str(st));
                cr_expect(strstr(ompk_last_error(), "indices[2,3]") != NULL, "message: %s",
                          ompk_last_error());
                cr_expect(tu_buf_all_bytes(&c.dx, 0), "dsx not all zero after a bad index");
                cr_expect(tu_buf_all_bytes(&c.dy, 0), "dsy not all zero after a bad index");
                case_free(&c);
            }
}

/* strided views of every tensor */
Test(router_bwd, strided_views) {
    ompk_device devs[4];
    const int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++) {
        const int64_t T = 5, N = 9, k = 6;
        bwd_case c;
        case_new(&c, devs[di], OMPK_F32, OMPK_F32, T, N, k, 0.2, 15);
        /* dscores and indices transposed in memory, dsx/dsy with padded rows */
        tu_buf dst = tu_buf_new(devs[di], OMPK_F32, T * k),
               ixt = tu_buf_new(devs[di], OMPK_I32, T * k);
        for (int64_t t = 0; t < T; t++)
            for (int64_t r = 0; r < k; r++) {
                tu_buf_set(&dst, r * T + t, tu_buf_get(&c.ds, t * k + r));
                tu_buf_set(&ixt, r * T + t, tu_buf_get(&c.ix, t * k + r));
            }
        tu_buf_upload(&dst);
        tu_buf_upload(&ixt);
        tu_buf px = tu_buf_new(devs[di], OMPK_F32, T * (N + 3)),
               py = tu_buf_new(devs[di], OMPK_F32, T * (N + 3));
        tu_buf_fill_bytes(&px, 0x5A);
        tu_buf_fill_bytes(&py, 0x5A);
        const int64_t sk[2] = {T, k}, tk[2] = {1, T}, sn[2] = {T, N}, pn[2] = {N + 3, 1};
        ompk_tensor tds, tix, tdx, tdy;
        ompk_tensor_init(&tds, dst.dev, OMPK_F32, 2, sk, tk, devs[di]);
        ompk_tensor_init(&tix, ixt.dev, OMPK_I32, 2, sk, tk, devs[di]);
        ompk_tensor_init(&tdx, px.dev, OMPK_F32, 2, sn, pn, devs[di]);
        ompk_tensor_init(&tdy, py.dev, OMPK_F32, 2, sn, pn, devs[di]);
        cr_assert_eq(ompk_router_topk_bwd(&tds, &tix, N, &tdx, &tdy), OMPK_OK, "%s",
                     ompk_last_error());
        cr_assert_eq(run(&c), OMPK_OK);
        tu_buf_download(&c.dx);
        tu_buf_download(&c.dy);
        tu_buf_download(&px);
        tu_buf_download(&py);
        for (int64_t t = 0; t < T; t++)
            for (int64_t i = 0; i < N + 3; i++) {
                const uint32_t *ux = px.host, *uy = py.host;
                if (i >= N) {
                    cr_expect_eq(ux[t * (N + 3) + i], 0x5A5A5A5Au, "padding written");
                    cr_expect_eq(uy[t * (N + 3) + i], 0x5A5A5A5Au, "padding written");
                    continue;
                }
                cr_expect_eq(tu_buf_get(&px, t * (N + 3) + i), tu_buf_get(&c.dx, t * N + i));
                cr_expect_eq(tu_buf_get(&py, t * (N + 3) + i), tu_buf_get(&c.dy, t * N + i));
            }
        tu_buf_free(&dst);
        tu_buf_free(&ixt);
        tu_buf_free(&px);
        tu_buf_free(&py);
        case_free(&c);
    }
}

Test(router_bwd, verify_mode_reports_each_output, .init = cr_redirect_stderr) {
    bwd_case c;
    case_new(&c, ompk_device_host(), OMPK_F32, OMPK_BF16, 6, 9, 4, 0.2, 21);
    ompk_verify_force(1, -1);
    cr_assert_eq(run(&c), OMPK_OK);
    ompk_verify_force(-1, -1);
    fflush(stderr);
    char buf[8192] = {0};
    const size_t got = fread(buf, 1, sizeof buf - 1, cr_get_redirected_stderr());
    buf[got] = 0;
    cr_assert(strstr(buf, "ompk verify router_topk_bwd dsx n=54") != NULL, "%s", buf);
    cr_assert(strstr(buf, "ompk verify router_topk_bwd dsy n=54") != NULL, "%s", buf);
    cr_assert(strstr(buf, "MISMATCH") == NULL, "%s", buf);
    case_free(&c);
}
