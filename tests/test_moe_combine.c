/* ompk_moe_combine: with z the per-route expert outputs (a top-1 layer of the same weights on
 * the routes' rows with weight 1), it gives ompk_moe_fwd's y bit for bit, on every ISA, format
 * and output dtype (one NUMA partition); with z the training forward's route outputs (a 3-D y),
 * its y; bad inputs return a status with y untouched. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ompk/moe.h"
#include "test_util.h"

#define E_ 5
#define H_ 80
#define I_ 48
#define K_ 3
#define T_ 23

static ompk_moe *layer(ompk_moe_format f, ompk_moe_isa isa, int k, int64_t max_tokens,
                       const ompk_tensor w[3]) {
    ompk_moe_config c;
    memset(&c, 0, sizeof c);
    c.experts = E_;
    c.hidden = H_;
    c.intermediate = I_;
    c.top_k = k;
    c.max_tokens = max_tokens;
    c.format = f;
    c.group_size = 64;
    c.numa = OMPK_MOE_NUMA_FORCED;
    c.numa_split = 1;
    c.isa = isa;
    c.threads = 2;
    c.cache_depth = 1;
    ompk_moe *m = NULL;
    cr_assert_eq(ompk_moe_create(&c, &m), OMPK_OK, "%s", ompk_last_error());
    cr_assert_eq(ompk_moe_load_weights(m, &w[0], &w[1], &w[2]), OMPK_OK, "%s", ompk_last_error());
    return m;
}

/* The training forward's y against the combine of its own route outputs (3-D y): any partition
 * count, since the training forward sums whole routes. */
static void check_train(ompk_moe *m, const ompk_tensor *x, const ompk_tensor *ids,
                        const ompk_tensor *w, ompk_dtype ydt, const char *what) {
    const ompk_device h = ompk_device_host();
    const int64_t sx[2] = {T_, H_}, sz[3] = {T_, K_, H_};
    uint8_t yf[T_ * H_ * 4], yc[T_ * H_ * 4];
    float *z = calloc((size_t)(T_ * K_ * H_), 4);
    ompk_tensor ty = ompk_tensor_make(yf, ydt, 2, sx, h),
                tz = ompk_tensor_make(z, OMPK_F32, 3, sz, h),
                tc = ompk_tensor_make(yc, ydt, 2, sx, h);
    cr_assert_eq(ompk_moe_fwd_train(m, x, ids, w, &ty, OMPK_MOE_CACHE_PUSH), OMPK_OK, "%s",
                 ompk_last_error());
    cr_assert_eq(ompk_moe_fwd_train(m, x, ids, w, &tz, OMPK_MOE_CACHE_RECOMPUTE), OMPK_OK, "%s",
                 ompk_last_error());
    cr_assert_eq(ompk_moe_combine(m, &tz, ids, w, &tc, OMPK_MOE_COMBINE_FWD_TRAIN), OMPK_OK, "%s",
                 ompk_last_error());
    const size_t yes = ydt == OMPK_BF16 ? 2 : 4;
    cr_expect(memcmp(yf, yc, (size_t)(T_ * H_) * yes) == 0, "%s: training combine differs", what);
    /* pop the entry: a backward on a zero dy */
    float *dy = calloc((size_t)(T_ * H_), 4), *dx = calloc((size_t)(T_ * H_), 4);
    ompk_tensor tdy = ompk_tensor_make(dy, OMPK_F32, 2, sx, h),
                tdx = ompk_tensor_make(dx, x->dtype, 2, sx, h);
    ompk_moe_grads g;
    memset(&g, 0, sizeof g);
    g.dx = &tdx;
    cr_assert_eq(ompk_moe_bwd(m, &tdy, &g), OMPK_OK, "%s", ompk_last_error());
    free(z), free(dy), free(dx);
}

static void check(ompk_moe_format f, ompk_moe_isa isa, ompk_dtype ydt) {
    tu_rng r = tu_rng_make(11);
    const int64_t nw = (int64_t)E_ * H_ * I_, sg[3] = {E_, I_, H_}, sd[3] = {E_, H_, I_};
    float *wb = malloc((size_t)(3 * nw) * 4);
    for (int64_t i = 0; i < 3 * nw; i++) wb[i] = (float)(tu_normal(&r) * 0.1);
    const ompk_device h = ompk_device_host();
    const ompk_tensor w[3] = {ompk_tensor_make(wb, OMPK_F32, 3, sg, h),
                              ompk_tensor_make(wb + nw, OMPK_F32, 3, sg, h),
                              ompk_tensor_make(wb + 2 * nw, OMPK_F32, 3, sd, h)};
    float x[T_ * H_], wt[T_ * K_], ones[T_ * K_], *z = calloc((size_t)(T_ * K_ * H_), 4);
    float *xr = malloc((size_t)(T_ * K_ * H_) * 4), *zr = malloc((size_t)(T_ * K_ * H_) * 4);
    int32_t ids[T_ * K_], rid[T_ * K_];
    int64_t rpos[T_ * K_];
    for (int i = 0; i < T_ * H_; i++) x[i] = (float)tu_normal(&r);
    for (int i = 0; i < T_ * K_; i++) {
        const double u = tu_uniform(&r);
        /* -1 padding, an expert twice in one token, one expert much hotter than the rest */
        ids[i] = u < 0.15 ? -1 : u < 0.55 ? 2 : (int32_t)(u * 100) % E_;
        wt[i] = (float)(0.25 + 0.5 * tu_uniform(&r));
        ones[i] = 1.0f;
    }
    ids[4] = ids[3] = 1;
    /* the routes' rows for a top-1 layer, in (t, j) order */
    int n = 0;
    for (int i = 0; i < T_ * K_; i++)
        if (ids[i] >= 0) {
            memcpy(xr + n * H_, x + (i / K_) * H_, H_ * 4);
            rid[n] = ids[i];
            rpos[n++] = i;
        }
    ompk_moe *m = layer(f, isa, K_, T_, w), *m1 = layer(f, isa, 1, T_ * K_, w);
    const size_t yes = ydt == OMPK_BF16 ? 2 : 4;
    uint8_t yf[T_ * H_ * 4], yc[T_ * H_ * 4];
    const int64_t sx[2] = {T_, H_}, sk[2] = {T_, K_}, sr[2] = {n, H_}, s1[2] = {n, 1};
    const int64_t sz[3] = {T_, K_, H_};
    ompk_tensor tx = ompk_tensor_make(x, OMPK_F32, 2, sx, h),
                ti = ompk_tensor_make(ids, OMPK_I32, 2, sk, h),
                tw = ompk_tensor_make(wt, OMPK_F32, 2, sk, h),
                ty = ompk_tensor_make(yf, ydt, 2, sx, h);
    cr_assert_eq(ompk_moe_fwd(m, &tx, &ti, &tw, &ty), OMPK_OK, "%s", ompk_last_error());
    ompk_tensor rx = ompk_tensor_make(xr, OMPK_F32, 2, sr, h),
                ri = ompk_tensor_make(rid, OMPK_I32, 2, s1, h),
                rw = ompk_tensor_make(ones, OMPK_F32, 2, s1, h),
                rz = ompk_tensor_make(zr, OMPK_F32, 2, sr, h);
    cr_assert_eq(ompk_moe_fwd(m1, &rx, &ri, &rw, &rz), OMPK_OK, "%s", ompk_last_error());
    for (int q = 0; q < n; q++) memcpy(z + rpos[q] * H_, zr + q * H_, H_ * 4);
    ompk_tensor tz = ompk_tensor_make(z, OMPK_F32, 3, sz, h),
                tc = ompk_tensor_make(yc, ydt, 2, sx, h);
    cr_assert_eq(ompk_moe_combine(m, &tz, &ti, &tw, &tc, OMPK_MOE_COMBINE_FWD), OMPK_OK, "%s",
                 ompk_last_error());
    cr_expect(memcmp(yf, yc, (size_t)(T_ * H_) * yes) == 0,
              "%s format %d y dtype %d: combine differs from the forward", ompk_moe_isa_name(isa),
              (int)f, (int)ydt);
    char what[96];
    snprintf(what, sizeof what, "%s format %d y dtype %d", ompk_moe_isa_name(isa), (int)f,
             (int)ydt);
    check_train(m, &tx, &ti, &tw, ydt, what);
    ompk_moe_destroy(m);
    ompk_moe_destroy(m1);
    free(wb), free(z), free(xr), free(zr);
}

Test(moe_combine, same_bits_as_forward) {
    const ompk_moe_isa isas[] = {OMPK_MOE_ISA_PORTABLE, OMPK_MOE_ISA_AVX512BF16,
                                 OMPK_MOE_ISA_AMX_EMULATED, OMPK_MOE_ISA_AMX};
    const ompk_moe_format fmts[] = {OMPK_MOE_BF16, OMPK_MOE_INT8, OMPK_MOE_INT4, OMPK_MOE_INT4_ZP};
    int ran = 0;
    for (int i = 0; i < 4; i++) {
        if (!ompk_moe_isa_available(isas[i])) continue;
        for (int f = 0; f < 4; f++) {
            check(fmts[f], isas[i], OMPK_F32);
            check(fmts[f], isas[i], OMPK_BF16);
            ran++;
        }
    }
    cr_assert_geq(ran, 8, "portable and amx-emulated always run");
}

Test(moe_combine, bad_inputs) {
    ompk_moe_config c;
    memset(&c, 0, sizeof c);
    c.experts = 4, c.hidden = 8, c.intermediate = 16, c.top_k = 2, c.max_tokens = 2;
    ompk_moe *m = NULL;
    cr_assert_eq(ompk_moe_create(&c, &m), OMPK_OK, "%s", ompk_last_error());
    float z[2 * 2 * 8] = {0}, w[4] = {1, 1, 1, 1}, y[2 * 8];
    int32_t ids[4] = {0, 1, -1, 3};
    const ompk_device h = ompk_device_host();
    const int64_t sz[3] = {2, 2, 8}, sk[2] = {2, 2}, sy[2] = {2, 8}, sbad[2] = {3, 8};
    ompk_tensor tz = ompk_tensor_make(z, OMPK_F32, 3, sz, h),
                ti = ompk_tensor_make(ids, OMPK_I32, 2, sk, h),
                tw = ompk_tensor_make(w, OMPK_F32, 2, sk, h),
                ty = ompk_tensor_make(y, OMPK_F32, 2, sy, h);
    const ompk_moe_combine_of of = OMPK_MOE_COMBINE_FWD;
    struct {
        const char *what;
        ompk_status st;
    } r[10];
    int n = 0;
    memset(y, 0x5A, sizeof y);
    ompk_tensor yb = ompk_tensor_make(y, OMPK_F32, 2, sbad, h);
    r[n].what = "NULL moe", r[n++].st = ompk_moe_combine(NULL, &tz, &ti, &tw, &ty, of);
    r[n].what = "NULL z", r[n++].st = ompk_moe_combine(m, NULL, &ti, &tw, &ty, of);
    r[n].what = "y of 3 rows", r[n++].st = ompk_moe_combine(m, &tz, &ti, &tw, &yb, of);
    ompk_tensor zi = ompk_tensor_make(z, OMPK_BF16, 3, sz, h);
    r[n].what = "bf16 z", r[n++].st = ompk_moe_combine(m, &zi, &ti, &tw, &ty, of);
    r[n].what = "unknown combine",
    r[n++].st = ompk_moe_combine(m, &tz, &ti, &tw, &ty, (ompk_moe_combine_of)42);
    const int64_t sz6[3] = {2, 2, 6}, sy6[2] = {2, 6};
    ompk_tensor z6 = ompk_tensor_make(z, OMPK_F32, 3, sz6, h),
                y6 = ompk_tensor_make(y, OMPK_F32, 2, sy6, h);
    r[n].what = "H not the layer's", r[n++].st = ompk_moe_combine(m, &z6, &ti, &tw, &y6, of);
    ompk_tensor yo = ompk_tensor_make(z, OMPK_F32, 2, sy, h); /* y over z */
    r[n].what = "y overlapping z", r[n++].st = ompk_moe_combine(m, &tz, &ti, &tw, &yo, of);
    for (int i = 0; i < n; i++)
        cr_expect_eq(r[i].st, OMPK_ERR_INVALID_ARGUMENT, "%s: %s", r[i].what,
                     ompk_status_str(r[i].st));
    ids[1] = -2;
    cr_expect_eq(ompk_moe_combine(m, &tz, &ti, &tw, &ty, of), OMPK_ERR_INDEX_OUT_OF_RANGE);
    for (size_t i = 0; i < sizeof y; i++)
        cr_assert_eq(((uint8_t *)y)[i], 0x5A, "y written by a rejected call");
    ids[1] = 1;
    cr_expect_eq(ompk_moe_combine(m, &tz, &ti, &tw, &ty, of), OMPK_OK, "%s", ompk_last_error());
    ompk_moe_destroy(m);
}
