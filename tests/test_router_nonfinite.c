/* ompk_router_topk_fwd / _bwd with NaN, +inf and -inf inputs (docs/KERNELS.md section 4): a NaN sum
 * ranks above +inf, equal sums (NaN, +inf, -inf, +-0) go to the lower flattened index, and the
 * k indices are k distinct pairs. Checked bit for bit against a brute-force ranking of all N^2
 * pairs written here, for f32 and bf16, on the host and on every GPU (where k <= 32, N <= 256
 * runs the warp kernels); the backward from those indices against a slot-order sum. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ompk/router.h"
#include "test_util.h"

typedef struct pair {
    float s;
    int32_t idx;
} pair;

/* 3 NaN, 2 +inf, 1 finite, 0 -inf */
static int cls(float v) {
    return isnan(v) ? 3 : v == INFINITY ? 2 : v == -INFINITY ? 0 : 1;
}

static int pair_cmp(const void *pa, const void *pb) {
    const pair *a = pa, *b = pb;
    const int ca = cls(a->s), cb = cls(b->s);
    if (ca != cb) return cb - ca;
    if (ca == 1 && a->s != b->s) return a->s > b->s ? -1 : 1; /* -0 == +0: a tie */
    return (a->idx > b->idx) - (a->idx < b->idx);
}

#define T_ 8

/* token t of N: one placement of non-finite values per token (token 5 stays finite) */
static void gen(int64_t N, uint64_t seed, double *x, double *y) {
    tu_rng r = tu_rng_make(seed);
    for (int64_t e = 0; e < T_ * N; e++) {
        x[e] = tu_normal(&r);
        y[e] = tu_normal(&r);
    }
    const int64_t a = 7 % N, b = N / 2, z = N - 1;
    for (int t = 0; t < T_; t++) {
        double *xr = x + t * N, *yr = y + t * N;
        switch (t) {
        case 0: /* the case: NaN at sx[7] and sy[7] */
            xr[a] = yr[a] = NAN;
            break;
        case 1: /* +inf + -inf = NaN: a top sum from the x axis' best and the y axis' worst */
            xr[1 % N] = INFINITY;
            yr[2 % N] = -INFINITY;
            break;
        case 2: /* many +inf sums */
            xr[0] = xr[z] = yr[b] = INFINITY;
            break;
        case 3:
            yr[z] = NAN;
            break;
        case 4: /* -inf everywhere in sy but one NaN in sx */
            for (int64_t i = 0; i < N; i += 2) yr[i] = -INFINITY;
            xr[0] = NAN;
            break;
        case 6: /* an all-NaN axis */
            for (int64_t i = 0; i < N; i++) xr[i] = NAN;
            break;
        case 7: /* both infinities on both axes, and signed zeros */
            xr[a] = yr[b] = INFINITY;
            xr[b] = yr[a] = -INFINITY;
            xr[z] = -0.0;
            yr[0] = 0.0;
            if (N > 3) yr[1] = -0.0;
            break;
        default:
            break;
        }
    }
}

static int same_float(float a, float b) {
    return memcmp(&a, &b, 4) == 0 || (isnan(a) && isnan(b));
}

static void check(ompk_device dev, ompk_dtype dt, int64_t N, int64_t k) {
    const int64_t NN = N * N;
    double *x = malloc(sizeof(double) * (size_t)(T_ * N)),
           *y = malloc(sizeof(double) * (size_t)(T_ * N));
    gen(N, (uint64_t)(N * 13 + k), x, y);
    tu_buf bx = tu_buf_new(dev, dt, T_ * N), by = tu_buf_new(dev, dt, T_ * N);
    for (int64_t e = 0; e < T_ * N; e++) {
        tu_buf_set(&bx, e, x[e]);
        tu_buf_set(&by, e, y[e]);
    }
    tu_buf_upload(&bx);
    tu_buf_upload(&by);
    tu_buf sc = tu_buf_new(dev, OMPK_F32, T_ * k), ix = tu_buf_new(dev, OMPK_I32, T_ * k);
    tu_buf_fill_bytes(&sc, 0xA5);
    tu_buf_fill_bytes(&ix, 0xA5);
    const int64_t shx[2] = {T_, N}, shk[2] = {T_, k};
    ompk_tensor tx = tu_view(&bx, 2, shx), ty = tu_view(&by, 2, shx);
    ompk_tensor tsc = tu_view(&sc, 2, shk), tix = tu_view(&ix, 2, shk);
    cr_assert_eq(ompk_router_topk_fwd(&tx, &ty, k, &tsc, &tix), OMPK_OK, "%s", ompk_last_error());
    tu_buf_download(&sc);
    tu_buf_download(&ix);
    const float *gs = sc.host;
    const int32_t *gi = ix.host;

    pair *all = malloc(sizeof(pair) * (size_t)NN);
    char *seen = malloc((size_t)NN);
    for (int64_t t = 0; t < T_; t++) {
        for (int64_t i = 0; i < N; i++)
            for (int64_t j = 0; j < N; j++) {
                /* the stored (dtype-rounded) values, summed once in fp32 */
                const float xv = (float)tu_buf_get(&bx, t * N + i),
                            yv = (float)tu_buf_get(&by, t * N + j);
                all[i * N + j].s = xv + yv;
                all[i * N + j].idx = (int32_t)(i * N + j);
            }
        qsort(all, (size_t)NN, sizeof(pair), pair_cmp);
        memset(seen, 0, (size_t)NN);
        for (int64_t r = 0; r < k; r++) {
            const int32_t g = gi[t * k + r];
            cr_assert(g >= 0 && g < NN, "%s N=%lld k=%lld token %lld slot %lld: index %d",
                      ompk_dtype_name(dt), (long long)N, (long long)k, (long long)t, (long long)r,
                      g);
            cr_assert(!seen[g], "%s N=%lld k=%lld token %lld: pair %d returned twice",
                      ompk_dtype_name(dt), (long long)N, (long long)k, (long long)t, g);
            seen[g] = 1;
            if (g != all[r].idx || !same_float(gs[t * k + r], all[r].s))
                cr_assert_fail("%s N=%lld k=%lld on %s: token %lld slot %lld: got (%.9g, %d), "
                               "expected (%.9g, %d)",
                               ompk_dtype_name(dt), (long long)N, (long long)k, tu_device_name(dev),
                               (long long)t, (long long)r, gs[t * k + r], g, all[r].s, all[r].idx);
        }
    }

    /* backward from these indices: dsx[i] / dsy[j] = sum of dscores over the slots of row i /
     * column j, in slot order */
    tu_buf ds = tu_buf_new(dev, OMPK_F32, T_ * k), dx = tu_buf_new(dev, OMPK_F32, T_ * N),
           dy = tu_buf_new(dev, OMPK_F32, T_ * N);
    tu_rng rr = tu_rng_make(5);
    for (int64_t e = 0; e < T_ * k; e++) tu_buf_set(&ds, e, tu_normal(&rr));
    tu_buf_upload(&ds);
    tu_buf_fill_bytes(&dx, 0x7F);
    tu_buf_fill_bytes(&dy, 0x7F);
    ompk_tensor tds = tu_view(&ds, 2, shk), tdx = tu_view(&dx, 2, shx), tdy = tu_view(&dy, 2, shx);
    cr_assert_eq(ompk_router_topk_bwd(&tds, &tix, N, &tdx, &tdy), OMPK_OK, "%s", ompk_last_error());
    tu_buf_download(&dx);
    tu_buf_download(&dy);
    float *ex = calloc((size_t)(T_ * N), 4), *ey = calloc((size_t)(T_ * N), 4);
    for (int64_t t = 0; t < T_; t++)
        for (int64_t r = 0; r < k; r++) {
            const int32_t g = gi[t * k + r];
            const float d = (float)tu_buf_get(&ds, t * k + r);
            ex[t * N + g / N] += d;
            ey[t * N + g % N] += d;
        }
    for (int64_t e = 0; e < T_ * N; e++)
        cr_assert(same_float((float)tu_buf_get(&dx, e), ex[e]) &&
                      same_float((float)tu_buf_get(&dy, e), ey[e]),
                  "bwd %s N=%lld k=%lld: element %lld: (%g, %g) vs (%g, %g)", ompk_dtype_name(dt),
                  (long long)N, (long long)k, (long long)e, tu_buf_get(&dx, e), tu_buf_get(&dy, e),
                  ex[e], ey[e]);
    free(ex), free(ey), free(all), free(seen), free(x), free(y);
    tu_buf_free(&ds), tu_buf_free(&dx), tu_buf_free(&dy);
    tu_buf_free(&bx), tu_buf_free(&by), tu_buf_free(&sc), tu_buf_free(&ix);
}

static void run(ompk_dtype dt) {
    ompk_device devs[4];
    const int nd = tu_devices(devs, 4);
    const int64_t Ns[] = {3, 24, 64, 100};
    for (int d = 0; d < nd; d++)
        for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++) {
            const int64_t N = Ns[ni], ks[] = {1, 8, N, 64, N * N};
            for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
                if (ks[ki] <= N * N) check(devs[d], dt, N, ks[ki]);
        }
}

Test(router_nonfinite, f32) {
    run(OMPK_F32);
}
Test(router_nonfinite, bf16) {
    run(OMPK_BF16);
}
