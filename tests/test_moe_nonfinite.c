/* ompk_moe_fwd with non-finite and extreme inputs, every format on the portable, AVX-512 and
 * emulated-AMX paths (docs/KERNELS.md 3): a NaN or an infinity in a row of x, or in a weight,
 * makes exactly the outputs that depend on it non-finite (NaN for a NaN) and leaves every other
 * output bit-identical; tiny (subnormal) and huge finite rows of x and of the weights quantize
 * without overflow and match the double reference, which quantizes on its own. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "ompk/moe.h"
#include "ref/moe_ref.h"
#include "test_util.h"

/* H and I leave padding in the last k-tile and in the last int4 group (group_size 64) */
#define E_ 3
#define H_ 72
#define I_ 80
#define K_ 2
#define T_ 6

typedef struct net {
    float *w[3];   /* master f32 gate [E,I,H], up [E,I,H], down [E,H,I] */
    float *deq[3]; /* as the layer stores them */
    ompk_moe *moe;
} net;

static const int64_t NW[3] = {(int64_t)E_ * I_ * H_, (int64_t)E_ *I_ *H_, (int64_t)E_ *H_ *I_};

static const char *fmt_name(int f) {
    static const char *n[] = {"bf16", "int8", "int4", "int4-zp"};
    return n[f];
}

static void masters(net *n, double gu_scale, double d_scale) {
    tu_rng r = tu_rng_make(4321);
    for (int w = 0; w < 3; w++) {
        double sc = (w < 2 ? gu_scale / sqrt(H_) : d_scale / sqrt(I_));
        n->w[w] = malloc((size_t)NW[w] * 4);
        for (int64_t i = 0; i < NW[w]; i++) n->w[w][i] = (float)(tu_normal(&r) * sc);
    }
}

static void net_load(net *n, int fmt, ompk_moe_isa isa) {
    ompk_moe_config c;
    memset(&c, 0, sizeof c);
    c.experts = E_;
    c.hidden = H_;
    c.intermediate = I_;
    c.top_k = K_;
    c.max_tokens = T_;
    c.format = (ompk_moe_format)fmt;
    c.group_size = 64;
    c.numa = OMPK_MOE_NUMA_FORCED;
    c.numa_split = 1;
    c.isa = isa;
    c.threads = 2;
    c.amx_min_rows = 1;
    cr_assert_eq(ompk_moe_create(&c, &n->moe), OMPK_OK, "%s", ompk_last_error());
    int64_t s1[3] = {E_, I_, H_}, s2[3] = {E_, H_, I_};
    ompk_tensor t[3];
    for (int w = 0; w < 3; w++)
        t[w] = ompk_tensor_make(n->w[w], OMPK_F32, 3, w < 2 ? s1 : s2, ompk_device_host());
    cr_assert_eq(ompk_moe_load_weights(n->moe, &t[0], &t[1], &t[2]), OMPK_OK, "%s",
                 ompk_last_error());
    for (int w = 0; w < 3; w++) {
        n->deq[w] = malloc((size_t)NW[w] * 4);
        t[w].data = n->deq[w];
        cr_assert_eq(ompk_moe_get_weights(n->moe, w, &t[w]), OMPK_OK, "%s", ompk_last_error());
    }
}

static void net_free(net *n) {
    ompk_moe_destroy(n->moe);
    for (int w = 0; w < 3; w++) {
        free(n->w[w]);
        free(n->deq[w]);
    }
}

/* token t goes to experts t%3 and (t+1)%3 */
static int64_t IDS[T_ * K_];
static float WTS[T_ * K_];

static void routes(void) {
    for (int t = 0; t < T_; t++)
        for (int j = 0; j < K_; j++) {
            IDS[t * K_ + j] = (t + j) % E_;
            WTS[t * K_ + j] = 0.25f + 0.5f * (float)j + 0.125f * (float)t;
        }
}

static int routed_to(int t, int e) {
    for (int j = 0; j < K_; j++)
        if (IDS[t * K_ + j] == e) return 1;
    return 0;
}

static float *x_new(double scale) {
    tu_rng r = tu_rng_make(77);
    float *x = malloc((size_t)T_ * H_ * 4);
    for (int64_t i = 0; i < (int64_t)T_ * H_; i++) x[i] = (float)(tu_normal(&r) * scale);
    return x;
}

static void fwd(const net *n, const float *x, float *y) {
    int64_t sx[2] = {T_, H_}, si[2] = {T_, K_};
    ompk_tensor tx = ompk_tensor_make((void *)x, OMPK_F32, 2, sx, ompk_device_host());
    ompk_tensor ti = ompk_tensor_make(IDS, OMPK_I64, 2, si, ompk_device_host());
    ompk_tensor tw = ompk_tensor_make(WTS, OMPK_F32, 2, si, ompk_device_host());
    ompk_tensor ty = ompk_tensor_make(y, OMPK_F32, 2, sx, ompk_device_host());
    cr_assert_eq(ompk_moe_fwd(n->moe, &tx, &ti, &tw, &ty), OMPK_OK, "%s", ompk_last_error());
}

#define NISA 4
static const ompk_moe_isa ISAS[NISA] = {OMPK_MOE_ISA_PORTABLE, OMPK_MOE_ISA_AVX512BF16,
                                        OMPK_MOE_ISA_AMX_EMULATED, OMPK_MOE_ISA_AMX};

static int isa_ok(ompk_moe_isa isa) {
    if (ompk_moe_isa_available(isa)) return 1;
    printf("moe nonfinite: ISA %s not available on this CPU, skipped\n", ompk_moe_isa_name(isa));
    return 0;
}

/* kind of each output: 0 = bit-identical to the clean run, 1 = NaN, 2 = non-finite */
static void expect_pattern(const char *what, const float *y, const float *y0, const int *kind) {
    for (int64_t i = 0; i < (int64_t)T_ * H_; i++) {
        if (kind[i] == 1)
            cr_expect(isnan(y[i]), "%s: y[%lld,%lld] = %g, expected NaN", what, (long long)(i / H_),
                      (long long)(i % H_), y[i]);
        else if (kind[i] == 2)
            cr_expect(!isfinite(y[i]), "%s: y[%lld,%lld] = %g, expected non-finite", what,
                      (long long)(i / H_), (long long)(i % H_), y[i]);
        else
            cr_expect(memcmp(&y[i], &y0[i], 4) == 0, "%s: y[%lld,%lld] = %g changed from %g", what,
                      (long long)(i / H_), (long long)(i % H_), y[i], y0[i]);
    }
}

/* NaN, +inf and -inf in one element of one token's x: that token's whole y row. */
Test(moe_nonfinite, x_row) {
    routes();
    float *x = x_new(1.0), *y0 = malloc(T_ * H_ * 4), *y = malloc(T_ * H_ * 4);
    int kind[T_ * H_];
    for (int i = 0; i < NISA; i++) {
        if (!isa_ok(ISAS[i])) continue;
        for (int f = 0; f <= OMPK_MOE_INT4_ZP; f++) {
            net n;
            masters(&n, 1.0, 1.0);
            net_load(&n, f, ISAS[i]);
            fwd(&n, x, y0);
            const float bad[3] = {NAN, INFINITY, -INFINITY};
            for (int b = 0; b < 3; b++) {
                const int t = 1 + 2 * b, h = 5 + 20 * b;
                float keep = x[t * H_ + h];
                x[t * H_ + h] = bad[b];
                fwd(&n, x, y);
                x[t * H_ + h] = keep;
                for (int64_t j = 0; j < T_ * H_; j++) kind[j] = j / H_ == t ? (b ? 2 : 1) : 0;
                char what[96];
                snprintf(what, sizeof what, "%s %s x[%d,%d] = %g", ompk_moe_isa_name(ISAS[i]),
                         fmt_name(f), t, h, bad[b]);
                expect_pattern(what, y, y0, kind);
            }
            net_free(&n);
        }
    }
    free(x);
    free(y0);
    free(y);
}

/* A NaN in a gate weight (row n of expert 1) reaches every output of the tokens routed to
 * expert 1 (through a[n] into every down row); a NaN in a down weight only column h of those
 * tokens; an inf in an up weight every output of the tokens routed to its expert. */
Test(moe_nonfinite, weight_row) {
    routes();
    float *x = x_new(1.0), *y0 = malloc(T_ * H_ * 4), *y = malloc(T_ * H_ * 4);
    int kind[T_ * H_];
    /* (matrix, expert, row, column, value) */
    const struct {
        int w, e, r, c;
        float v;
    } cases[3] = {{0, 1, 3, 10, NAN}, {2, 2, 4, 70, NAN}, {1, 0, 2, 66, INFINITY}};
    for (int i = 0; i < NISA; i++) {
        if (!isa_ok(ISAS[i])) continue;
        for (int f = 0; f <= OMPK_MOE_INT4_ZP; f++) {
            net n0;
            masters(&n0, 1.0, 1.0);
            net_load(&n0, f, ISAS[i]);
            fwd(&n0, x, y0);
            for (int c = 0; c < 3; c++) {
                net n;
                masters(&n, 1.0, 1.0);
                const int64_t K = cases[c].w < 2 ? H_ : I_, N = cases[c].w < 2 ? I_ : H_;
                n.w[cases[c].w][(cases[c].e * N + cases[c].r) * K + cases[c].c] = cases[c].v;
                net_load(&n, f, ISAS[i]);
                fwd(&n, x, y);
                for (int64_t j = 0; j < T_ * H_; j++) {
                    int t = (int)(j / H_), hit = routed_to(t, cases[c].e);
                    if (cases[c].w == 2) hit &= j % H_ == cases[c].r;
                    kind[j] = hit ? (isnan(cases[c].v) ? 1 : 2) : 0;
                }
                char what[96];
                snprintf(what, sizeof what, "%s %s weight %d[%d,%d,%d] = %g",
                         ompk_moe_isa_name(ISAS[i]), fmt_name(f), cases[c].w, cases[c].e,
                         cases[c].r, cases[c].c, cases[c].v);
                expect_pattern(what, y, y0, kind);
                net_free(&n);
            }
            net_free(&n0);
        }
    }
    free(x);
    free(y0);
    free(y);
}

/* |deq - w| within half a quantization step of the row or group (a full step for int4-zp), plus
 * the rounding of a subnormal scale; bf16 exactly the rounded value. */
static void check_weights(const net *n, int f, const char *what) {
    for (int w = 0; w < 3; w++) {
        const int64_t K = w < 2 ? H_ : I_, G = f >= OMPK_MOE_INT4 ? 64 : K;
        for (int64_t i = 0; i < NW[w]; i++) {
            const float src = n->w[w][i], deq = n->deq[w][i];
            if (f == OMPK_MOE_BF16) {
                cr_assert_eq(deq, ompk_round_bf16(src), "%s: bf16 weight %d[%lld]", what, w,
                             (long long)i);
                continue;
            }
            const int64_t g0 = i - (i % K) % G,
                          g1 = g0 + G < i - i % K + K ? g0 + G : i - i % K + K;
            double mx = 0;
            for (int64_t j = g0; j < g1; j++) mx = fmax(mx, fabs(n->w[w][j]));
            const double step = f == OMPK_MOE_INT8   ? 0.5 * mx / 127
                                : f == OMPK_MOE_INT4 ? 0.5 * mx / 7
                                                     : 2 * mx / 15;
            const double err = fabs((double)deq - src);
            cr_assert(err <= step * 1.0001 + 128 * 0x1p-149, "%s: weight %d[%lld] = %g from %g",
                      what, w, (long long)i, deq, src);
        }
    }
}

static void flush_subnormal(float *v, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (fpclassify(v[i]) == FP_SUBNORMAL) v[i] = copysignf(0.0f, v[i]);
}

/* Per token: ||y - ref|| <= rtol ||ref|| + floor, where floor bounds what the f32 format itself
 * cannot resolve: the spacing of a at its subnormal end (bf16 2^-133; the int8 scale of a row
 * with a subnormal max is rounded to 2^-149, 127 codes of it) carried through |down| and w. */
static void expect_close(const char *what, const net *n, const float *y, const double *ref, int f) {
    const double ulp_a = f == OMPK_MOE_BF16 ? 0x1p-133 : 127 * 0x1p-149;
    for (int t = 0; t < T_; t++) {
        double e2 = 0, r2 = 0, fl = 0;
        for (int64_t h = 0; h < H_; h++) {
            double d = (double)y[t * H_ + h] - ref[t * H_ + h];
            e2 += d * d;
            r2 += ref[t * H_ + h] * ref[t * H_ + h];
        }
        for (int j = 0; j < K_; j++) {
            double worst = 0;
            for (int64_t h = 0; h < H_; h++) {
                double s = 0;
                for (int64_t i = 0; i < I_; i++)
                    s += fabs(n->deq[2][(IDS[t * K_ + j] * H_ + h) * I_ + i]);
                worst = fmax(worst, s);
            }
            fl += fabs(WTS[t * K_ + j]) * worst * ulp_a * sqrt(H_);
        }
        const double rtol = f == OMPK_MOE_BF16 ? 1e-2 : 2e-2;
        cr_expect(sqrt(e2) <= rtol * sqrt(r2) + fl && isfinite(sqrt(r2)),
                  "%s: token %d: |y - ref| = %g, |ref| = %g, floor %g", what, t, sqrt(e2), sqrt(r2),
                  fl);
    }
}

/* x and weights at both ends of the f32 range: x ~ 1e-20 (a row of a with a subnormal max),
 * x subnormal (~1e-40, with gate/up ~1e30 so the layer's values stay normal), x ~ 1e38 (with
 * subnormal gate/up weights), down weights ~1e30, and down weights ~1e38 (an int4-zp group
 * range above FLT_MAX; its forward only in bf16, as the int formats' weight scale times an
 * integer dot product overflows fp32 for weights above ~1e32, see moe.h). */
Test(moe_nonfinite, tiny_and_huge_rows) {
    routes();
    const struct {
        double x, gu, d;
        const char *name;
    } cases[5] = {{0x1p-66, 1, 1, "x 1e-20"},
                  {0x1p-133, 0x1p100, 1, "x 1e-40, gate/up 1e30"},
                  {0x1p126, 0x1p-126, 1, "x 1e38, gate/up 1e-38"},
                  {1, 0x1p-6, 0x1p100, "down 1e30"},
                  {1, 0x1p-6, 0x1p126, "down 1e38"}};
    float *y = malloc(T_ * H_ * 4);
    double *ref = malloc(T_ * H_ * 8);
    for (int i = 0; i < NISA; i++) {
        if (!isa_ok(ISAS[i])) continue;
        for (int c = 0; c < 5; c++) {
            float *x = x_new(cases[c].x), *xr = malloc(T_ * H_ * 4);
            for (int f = 0; f <= OMPK_MOE_INT4_ZP; f++) {
                memcpy(xr, x, T_ * H_ * 4);
                net n;
                masters(&n, cases[c].gu, cases[c].d);
                net_load(&n, f, ISAS[i]);
                char what[96];
                snprintf(what, sizeof what, "%s %s %s", ompk_moe_isa_name(ISAS[i]), fmt_name(f),
                         cases[c].name);
                check_weights(&n, f, what);
                if (c == 4 && f != OMPK_MOE_BF16) {
                    net_free(&n);
                    continue;
                }
                fwd(&n, x, y);
                if (c == 1 && f == OMPK_MOE_BF16 && ISAS[i] == OMPK_MOE_ISA_AMX_EMULATED) {
                    /* its small experts take the CPU's vector path, which flushes subnormals
                     * where it is AVX-512 BF16 and not elsewhere: both rules are checked below */
                    net_free(&n);
                    continue;
                }
                /* the bf16 dot-product instructions (AVX-512 BF16, AMX tiles) read subnormal
                 * operands as zero (moe.h): the reference gets the same x and weights */
                const int daz = f == OMPK_MOE_BF16 &&
                                (ISAS[i] == OMPK_MOE_ISA_AVX512BF16 || ISAS[i] == OMPK_MOE_ISA_AMX);
                if (daz) {
                    for (int w = 0; w < 3; w++) flush_subnormal(n.deq[w], NW[w]);
                    flush_subnormal(xr, (int64_t)T_ * H_);
                }
                if (c == 1 && daz)
                    for (int64_t e = 0; e < T_ * H_; e++)
                        cr_expect(y[e] == 0.0f, "%s: y[%lld] = %g, not flushed", what, (long long)e,
                                  y[e]);
                ompk_moe_ref_forward(
                    T_, E_, H_, I_, K_, daz ? xr : x, IDS, WTS, n.deq[0], n.deq[1], n.deq[2],
                    f == OMPK_MOE_BF16 ? OMPK_MOE_REF_ACT_BF16 : OMPK_MOE_REF_ACT_INT8, ref);
                expect_close(what, &n, y, ref, f);
                net_free(&n);
            }
            free(x);
            free(xr);
        }
    }
    free(y);
    free(ref);
}
