/* ompk_moe_fwd: every ISA path (portable, AVX-512 BF16, the AMX tile code on the C tile
 * emulation, real AMX where the CPU has it) against the double reference on the dequantized
 * weights, for every weight format; NUMA split 1/2/3 with I not divisible; -1 slots; bit-identical
 * repeats and thread counts; pre-quantized loading; quantization error per format.
 * x/y run on the host and on every GPU (staged through host buffers). */
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "ompk/moe.h"
#include "ref/moe_ref.h"
#include "test_util.h"
#include "tolerance.h"
#include "variant.h"
#include "verify.h"

/* Small but awkward: H and I not multiples of the 32/64-wide k-tiles, I = 200 splits unevenly,
 * one expert gets > 32 rows (two row blocks), one gets 1..3 rows (below amx_min_rows). */
#define E_ 6
#define H_ 136
#define I_ 200
#define K_ 3
#define T_ 37

typedef struct layer {
    ompk_moe *moe;
    ompk_moe_config cfg;
    float *gate, *up, *down; /* dequantized, as the kernels use them */
} layer;

static const char *fmt_name(ompk_moe_format f) {
    static const char *n[] = {"bf16", "int8", "int4", "int4-zp"};
    return n[f];
}

static float *rand_f32(tu_rng *r, int64_t n, double scale) {
    float *p = malloc((size_t)n * sizeof *p);
    for (int64_t i = 0; i < n; i++) p[i] = (float)(tu_normal(r) * scale);
    return p;
}

static ompk_moe_config base_cfg(ompk_moe_format fmt, ompk_moe_isa isa, int split) {
    ompk_moe_config c;
    memset(&c, 0, sizeof c);
    c.experts = E_;
    c.hidden = H_;
    c.intermediate = I_;
    c.top_k = K_;
    c.max_tokens = 64;
    c.format = fmt;
    c.group_size = 64;
    c.numa = OMPK_MOE_NUMA_FORCED;
    c.numa_split = split;
    c.isa = isa;
    c.threads = 2;
    return c;
}

/* f32 master weights (same seed for every format) -> layer; reads back the dequantized ones */
static int layer_new(layer *L, ompk_moe_config cfg) {
    memset(L, 0, sizeof *L);
    L->cfg = cfg;
    ompk_status st = ompk_moe_create(&cfg, &L->moe);
    if (st != OMPK_OK) return 0;
    tu_rng r = tu_rng_make(1234);
    int64_t ng = (int64_t)E_ * I_ * H_;
    float *g = rand_f32(&r, ng, 1.0 / sqrt(H_)), *u = rand_f32(&r, ng, 1.0 / sqrt(H_));
    float *d = rand_f32(&r, ng, 1.0 / sqrt(I_));
    int64_t s1[3] = {E_, I_, H_}, s2[3] = {E_, H_, I_};
    ompk_tensor tg = ompk_tensor_make(g, OMPK_F32, 3, s1, ompk_device_host());
    ompk_tensor tu = ompk_tensor_make(u, OMPK_F32, 3, s1, ompk_device_host());
    ompk_tensor td = ompk_tensor_make(d, OMPK_F32, 3, s2, ompk_device_host());
    cr_assert_eq(ompk_moe_load_weights(L->moe, &tg, &tu, &td), OMPK_OK, "%s", ompk_last_error());
    L->gate = malloc((size_t)ng * 4);
    L->up = malloc((size_t)ng * 4);
    L->down = malloc((size_t)ng * 4);
    tg.data = L->gate;
    tu.data = L->up;
    td.data = L->down;
    cr_assert_eq(ompk_moe_get_weights(L->moe, OMPK_MOE_WEIGHT_GATE, &tg), OMPK_OK, "%s",
                 ompk_last_error());
    cr_assert_eq(ompk_moe_get_weights(L->moe, OMPK_MOE_WEIGHT_UP, &tu), OMPK_OK);
    cr_assert_eq(ompk_moe_get_weights(L->moe, OMPK_MOE_WEIGHT_DOWN, &td), OMPK_OK);
    /* the packed layout must give back what was loaded, within the format's quantization */
    for (int w = 0; w < 3; w++) {
        const float *src = w == 0   ? g
                           : w == 1 ? u
                                    : d,
                    *deq = w == 0   ? L->gate
                           : w == 1 ? L->up
                                    : L->down;
        int64_t K = w < 2 ? H_ : I_;
        for (int64_t row = 0; row < ng / K; row++) {
            /* |err| <= half a step of the row's (or group's) scale (a full step for int4-zp, whose
             * rounded zero point can push the top code into the clamp); bounded by the row max */
            double mx = 0;
            for (int64_t kk = 0; kk < K; kk++) mx = fmax(mx, fabs(src[row * K + kk]));
            double step = cfg.format == OMPK_MOE_INT8   ? 0.5 * mx / 127
                          : cfg.format == OMPK_MOE_INT4 ? 0.5 * mx / 7
                                                        : 2 * mx / 15;
            for (int64_t i = row * K; i < row * K + K; i++) {
                if (cfg.format == OMPK_MOE_BF16) {
                    cr_assert_eq(deq[i], ompk_round_bf16(src[i]),
                                 "bf16 weight %d[%lld] repacked wrong", w, (long long)i);
                    continue;
                }
                double err = fabs((double)deq[i] - src[i]);
                cr_assert(err <= step * 1.0001 + 1e-7, "weight %d[%lld]: %g vs %g (step %g)", w,
                          (long long)i, deq[i], src[i], step);
            }
        }
    }
    free(g);
    free(u);
    free(d);
    return 1;
}

static void layer_free(layer *L) {
    ompk_moe_destroy(L->moe);
    free(L->gate);
    free(L->up);
    free(L->down);
}

typedef struct route {
    float *x;
    int64_t *ids;
    float *w;
    int64_t T;
} route;

/* expert 0 gets a slot of every token (> 32 rows), expert 5 only token 3 (1 row), token 7 is
 * routed nowhere (all -1), a few more -1 slots */
static route route_new(int64_t T, uint64_t seed) {
    route rt;
    tu_rng r = tu_rng_make(seed);
    rt.T = T;
    rt.x = rand_f32(&r, T * H_, 1.0);
    rt.ids = malloc((size_t)(T * K_) * 8);
    rt.w = malloc((size_t)(T * K_) * 4);
    for (int64_t t = 0; t < T; t++)
        for (int j = 0; j < K_; j++) {
            int64_t e = j == 0 ? 0 : 1 + (int64_t)(tu_uniform(&r) * 4);
            if (j == 2 && t % 5 == 1) e = -1;
            if (t == 3 && j == 2) e = 5;
            if (t == 7) e = -1;
            rt.ids[t * K_ + j] = e;
            rt.w[t * K_ + j] = (float)(0.2 + tu_uniform(&r));
        }
    for (int64_t i = 0; i < T * H_; i++) rt.x[i] = ompk_round_bf16(rt.x[i]);
    return rt;
}

static void route_free(route *rt) {
    free(rt->x);
    free(rt->ids);
    free(rt->w);
}

static ompk_moe_ref_act act_of(ompk_moe_format f) {
    return f == OMPK_MOE_BF16 ? OMPK_MOE_REF_ACT_BF16 : OMPK_MOE_REF_ACT_INT8;
}

/* Run on device dev with x/y of dtype dt and ids of idt; y (as double) into yout. */
static void run_fwd(layer *L, const route *rt, ompk_device dev, ompk_dtype xdt, ompk_dtype ydt,
                    ompk_dtype idt, double *yout) {
    int64_t T = rt->T;
    tu_buf bx = tu_buf_new(dev, xdt, T * H_), bi = tu_buf_new(dev, idt, T * K_);
    tu_buf bw = tu_buf_new(dev, OMPK_F32, T * K_), by = tu_buf_new(dev, ydt, T * H_);
    for (int64_t i = 0; i < T * H_; i++) tu_buf_set(&bx, i, rt->x[i]);
    for (int64_t i = 0; i < T * K_; i++) {
        tu_buf_set(&bi, i, (double)rt->ids[i]);
        tu_buf_set(&bw, i, rt->w[i]);
    }
    tu_buf_upload(&bx);
    tu_buf_upload(&bi);
    tu_buf_upload(&bw);
    tu_buf_fill_bytes(&by, 0x7F); /* poison: the call must write every element */
    int64_t sx[2] = {T, H_}, si[2] = {T, K_};
    ompk_tensor tx = tu_view(&bx, 2, sx), ti = tu_view(&bi, 2, si), tw = tu_view(&bw, 2, si);
    ompk_tensor ty = tu_view(&by, 2, sx);
    cr_assert_eq(ompk_moe_fwd(L->moe, &tx, &ti, &tw, &ty), OMPK_OK, "%s", ompk_last_error());
    tu_buf_download(&by);
    for (int64_t i = 0; i < T * H_; i++) yout[i] = tu_buf_get(&by, i);
    tu_buf_free(&bx);
    tu_buf_free(&bi);
    tu_buf_free(&bw);
    tu_buf_free(&by);
}

static double rms(const double *v, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += v[i] * v[i];
    return sqrt(s / (double)n);
}

/* worst |y - ref| / (atol*scale + rtol*|ref|); f32 y allows the rare operand-rounding flip (a
 * value within fp32 noise of a bf16/int8 rounding boundary), bf16 y one more rounding */
static double compare(const char *what, const double *y, const double *ref, int64_t n,
                      ompk_dtype ydt) {
    double sc = rms(ref, n), atol = ydt == OMPK_BF16 ? 4e-3 : 1.5e-3,
           rtol = ydt == OMPK_BF16 ? 8e-3 : 1e-3;
    double worst = 0;
    int64_t wi = 0;
    for (int64_t i = 0; i < n; i++) {
        double q = fabs(y[i] - ref[i]) / (atol * sc + rtol * fabs(ref[i]));
        if (!(q <= worst)) {
            worst = isnan(q) ? INFINITY : q;
            wi = i;
        }
    }
    if (worst > 1)
        fprintf(stderr, "%s: worst at %lld: %.9g vs %.9g (ratio %.3g)\n", what, (long long)wi,
                y[wi], ref[wi], worst);
    return worst;
}

static void ref_of(const layer *L, const route *rt, ompk_moe_ref_act act, double *ref) {
    ompk_moe_ref_forward(rt->T, E_, H_, I_, K_, rt->x, rt->ids, rt->w, L->gate, L->up, L->down, act,
                         ref);
}

/* Skips (visibly) when the machine cannot run the ISA; never passes silently. */
static int isa_or_skip(ompk_moe_isa isa) {
    if (ompk_moe_isa_available(isa)) return 1;
    cr_log_info(
        "moe: ISA %s is NOT available on this CPU: its tests are skipped here (the AMX tile "
        "code is still tested through the amx-emulated path)",
        ompk_moe_isa_name(isa));
    printf("moe: ISA %s not available on this CPU, tests for it skipped\n", ompk_moe_isa_name(isa));
    return 0;
}

static void check_isa(ompk_moe_isa isa, int amx_min_rows) {
    if (!isa_or_skip(isa)) cr_skip_test("ISA %s not available on this CPU", ompk_moe_isa_name(isa));
    if (isa == OMPK_MOE_ISA_AMX) printf("moe: AMX available: testing the real AMX tile path\n");
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    route rt = route_new(T_, 77);
    double *y = malloc(T_ * H_ * sizeof *y), *ref = malloc(T_ * H_ * sizeof *ref);
    for (int f = 0; f <= OMPK_MOE_INT4_ZP; f++) {
        layer L;
        ompk_moe_config cfg = base_cfg((ompk_moe_format)f, isa, 2);
        cfg.amx_min_rows = amx_min_rows;
        cr_assert(layer_new(&L, cfg), "create %s: %s", fmt_name(f), ompk_last_error());
        ompk_moe_info info;
        ompk_moe_get_info(L.moe, &info);
        cr_assert_eq(info.isa, isa);
        ref_of(&L, &rt, act_of(f), ref);
        for (int d = 0; d < nd; d++)
            for (int yd = 0; yd < 2; yd++) {
                ompk_dtype ydt = yd ? OMPK_BF16 : OMPK_F32;
                run_fwd(&L, &rt, devs[d], yd ? OMPK_F32 : OMPK_BF16, ydt, yd ? OMPK_I64 : OMPK_I32,
                        y);
                char what[128];
                snprintf(what, sizeof what, "%s %s %s y=%s", ompk_moe_isa_name(isa), fmt_name(f),
                         tu_device_name(devs[d]), yd ? "bf16" : "f32");
                cr_expect(compare(what, y, ref, T_ * H_, ydt) <= 1.0, "%s", what);
                for (int64_t h = 0; h < H_; h++)
                    cr_assert_eq(y[7 * H_ + h], 0.0, "%s: unrouted token", what);
            }
        ompk_moe_stats st;
        ompk_moe_get_stats(L.moe, &st);
        if (isa == OMPK_MOE_ISA_AMX || isa == OMPK_MOE_ISA_AMX_EMULATED) {
            cr_expect_gt(st.experts_amx, 0, "no expert ran on the tile path");
            if (amx_min_rows > 1)
                cr_expect_gt(st.experts_vector, 0, "expert 5 (1 row) should use AVX-512");
        }
        layer_free(&L);
    }
    free(y);
    free(ref);
    route_free(&rt);
}

Test(moe_fwd, portable) {
    check_isa(OMPK_MOE_ISA_PORTABLE, 0);
}
Test(moe_fwd, avx512bf16) {
    check_isa(OMPK_MOE_ISA_AVX512BF16, 0);
}
Test(moe_fwd, amx_emulated_all_experts) {
    check_isa(OMPK_MOE_ISA_AMX_EMULATED, 1);
}
Test(moe_fwd, amx_emulated_mixed) {
    check_isa(OMPK_MOE_ISA_AMX_EMULATED, 4);
}
Test(moe_fwd, amx) {
    check_isa(OMPK_MOE_ISA_AMX, 4);
}

/* Split 1 vs 2 vs 3 partitions (I = 200: 64+64+72 columns; int4 groups of 128 straddle the
 * split) gives the same y within fp32 reassociation, for every available ISA. */
static void split_case(ompk_moe_format f, ompk_moe_isa isa) {
    route rt = route_new(T_, 5);
    double *y[3], *ref = malloc(T_ * H_ * sizeof *ref);
    for (int s = 0; s < 3; s++) {
        layer L;
        ompk_moe_config cfg = base_cfg(f, isa, s + 1);
        cfg.group_size = 128;
        cr_assert(layer_new(&L, cfg), "%s", ompk_last_error());
        y[s] = malloc(T_ * H_ * sizeof *y[s]);
        run_fwd(&L, &rt, ompk_device_host(), OMPK_F32, OMPK_F32, OMPK_I64, y[s]);
        if (s == 0) ref_of(&L, &rt, act_of(f), ref);
        layer_free(&L);
    }
    double sc = rms(ref, T_ * H_);
    for (int s = 1; s < 3; s++) {
        double worst = 0;
        for (int64_t i = 0; i < T_ * H_; i++) {
            double q = fabs(y[s][i] - y[0][i]) / (2e-5 * sc + 1e-4 * fabs(y[0][i]));
            worst = q > worst ? q : worst;
        }
        cr_expect(worst <= 1.0, "%s %s: split %d differs from split 1 (ratio %g)",
                  ompk_moe_isa_name(isa), fmt_name(f), s + 1, worst);
        cr_expect(compare("split vs ref", y[s], ref, T_ * H_, OMPK_F32) <= 1.0);
    }
    for (int s = 0; s < 3; s++) free(y[s]);
    free(ref);
    route_free(&rt);
}

Test(moe_split, all_formats_all_isas) {
    ompk_moe_isa isas[] = {OMPK_MOE_ISA_PORTABLE, OMPK_MOE_ISA_AVX512BF16,
                           OMPK_MOE_ISA_AMX_EMULATED, OMPK_MOE_ISA_AMX};
    for (int i = 0; i < 4; i++) {
        if (!isa_or_skip(isas[i])) continue;
        for (int f = 0; f <= OMPK_MOE_INT4_ZP; f++) split_case((ompk_moe_format)f, isas[i]);
    }
}

/* Same inputs twice, and with 1 vs 2 threads: bit-identical y. */
Test(moe_fwd, bit_identical_repeats_and_threads) {
    route rt = route_new(T_, 9);
    for (int f = 0; f <= OMPK_MOE_INT4_ZP; f += 1) {
        double *y1 = malloc(T_ * H_ * 8), *y2 = malloc(T_ * H_ * 8), *y3 = malloc(T_ * H_ * 8);
        layer L, L1;
        cr_assert(layer_new(&L, base_cfg((ompk_moe_format)f, OMPK_MOE_ISA_AUTO, 2)));
        ompk_moe_config c1 = base_cfg((ompk_moe_format)f, OMPK_MOE_ISA_AUTO, 2);
        c1.threads = 1;
        cr_assert(layer_new(&L1, c1));
        run_fwd(&L, &rt, ompk_device_host(), OMPK_F32, OMPK_F32, OMPK_I32, y1);
        run_fwd(&L, &rt, ompk_device_host(), OMPK_F32, OMPK_F32, OMPK_I32, y2);
        run_fwd(&L1, &rt, ompk_device_host(), OMPK_F32, OMPK_F32, OMPK_I32, y3);
        cr_expect(memcmp(y1, y2, T_ * H_ * 8) == 0, "%s: repeated forward differs", fmt_name(f));
        cr_expect(memcmp(y1, y3, T_ * H_ * 8) == 0, "%s: 1 thread vs 2 threads differ",
                  fmt_name(f));
        layer_free(&L);
        layer_free(&L1);
        free(y1);
        free(y2);
        free(y3);
    }
    route_free(&rt);
}

/* A -1 slot contributes nothing: same y as the layer with that slot's weight set to 0 and a
 * valid id, and a token with only -1 slots gets exactly 0. */
Test(moe_fwd, padding_slots) {
    route rt = route_new(T_, 11), rt2 = route_new(T_, 11);
    for (int64_t i = 0; i < T_ * K_; i++)
        if (rt2.ids[i] < 0) {
            rt2.ids[i] = 2;
            rt2.w[i] = 0.0f;
        }
    layer L;
    cr_assert(layer_new(&L, base_cfg(OMPK_MOE_BF16, OMPK_MOE_ISA_AUTO, 1)));
    double *y1 = malloc(T_ * H_ * 8), *y2 = malloc(T_ * H_ * 8);
    run_fwd(&L, &rt, ompk_device_host(), OMPK_F32, OMPK_F32, OMPK_I64, y1);
    run_fwd(&L, &rt2, ompk_device_host(), OMPK_F32, OMPK_F32, OMPK_I64, y2);
    /* not bitwise: the extra rows change expert 2's row blocking, hence fp32 summation order */
    double sc = rms(y1, T_ * H_);
    for (int64_t i = 0; i < T_ * H_; i++)
        cr_assert(fabs(y1[i] - y2[i]) <= 1e-5 * sc + 1e-5 * fabs(y1[i]), "element %lld: %g vs %g",
                  (long long)i, y1[i], y2[i]);
    for (int64_t h = 0; h < H_; h++) cr_assert_eq(y1[7 * H_ + h], 0.0);
    layer_free(&L);
    free(y1);
    free(y2);
    route_free(&rt);
    route_free(&rt2);
}

/* Pre-quantized loading: the test quantizes and dequantizes on its own, so the layout, nibble
 * order, signedness and zero points are checked against an independent decoding. */
Test(moe_fwd, prequantized) {
    for (int f = OMPK_MOE_INT8; f <= OMPK_MOE_INT4_ZP; f++) {
        const int is4 = f >= OMPK_MOE_INT4, zp = f == OMPK_MOE_INT4_ZP, gs = 64;
        ompk_moe_config cfg = base_cfg((ompk_moe_format)f, OMPK_MOE_ISA_AUTO, 3);
        ompk_moe *moe;
        cr_assert_eq(ompk_moe_create(&cfg, &moe), OMPK_OK, "%s", ompk_last_error());
        tu_rng r = tu_rng_make(99 + (uint64_t)f);
        float *deq[3];
        void *qd[3];
        float *sd[3];
        int8_t *zd[3];
        ompk_tensor tq[3], ts[3], tz[3];
        ompk_moe_quantized mq[3];
        for (int w = 0; w < 3; w++) {
            int64_t N = w < 2 ? I_ : H_, K = w < 2 ? H_ : I_, G = is4 ? (K + gs - 1) / gs : 1;
            int64_t n = (int64_t)E_ * N * K;
            deq[w] = malloc((size_t)n * 4);
            qd[w] = calloc((size_t)(is4 ? n / 2 : n), 1);
            sd[w] = malloc((size_t)(E_ * N * G) * 4);
            zd[w] = malloc((size_t)(E_ * N * G));
            for (int64_t i = 0; i < E_ * N * G; i++) {
                sd[w][i] = (float)((0.5 + tu_uniform(&r)) * 0.02);
                zd[w][i] = (int8_t)(tu_uniform(&r) * 16);
            }
            for (int64_t i = 0; i < n; i++) {
                int64_t row = i / K, g = (i % K) / gs;
                int v;
                if (!is4) {
                    v = (int)(tu_uniform(&r) * 256) - 128;
                    ((int8_t *)qd[w])[i] = (int8_t)v;
                    deq[w][i] = (float)v * sd[w][row];
                    continue;
                }
                v = (int)(tu_uniform(&r) * 16); /* nibble 0..15 */
                uint8_t *b = (uint8_t *)qd[w] + i / 2;
                *b = (uint8_t)(i % 2 ? (*b & 0x0f) | (v << 4) : (*b & 0xf0) | v);
                int q = zp ? v - zd[w][row * G + g] : (v ^ 8) - 8;
                deq[w][i] = (float)q * sd[w][row * G + g];
            }
            int64_t s3[3] = {E_, N, K}, sg[3] = {E_, N, G};
            tq[w] = ompk_tensor_make(qd[w], is4 ? OMPK_I4 : OMPK_I8, 3, s3, ompk_device_host());
            ts[w] = ompk_tensor_make(sd[w], OMPK_F32, is4 ? 3 : 2, sg, ompk_device_host());
            tz[w] = ompk_tensor_make(zd[w], OMPK_I8, 3, sg, ompk_device_host());
            mq[w].q = &tq[w];
            mq[w].scale = &ts[w];
            mq[w].zero = zp ? &tz[w] : NULL;
        }
        cr_assert_eq(ompk_moe_load_quantized(moe, &mq[0], &mq[1], &mq[2]), OMPK_OK, "%s",
                     ompk_last_error());
        for (int w = 0; w < 3; w++) {
            int64_t n = (int64_t)E_ * I_ * H_;
            float *back = malloc((size_t)n * 4);
            int64_t s3[3] = {E_, w < 2 ? I_ : H_, w < 2 ? H_ : I_};
            ompk_tensor tb = ompk_tensor_make(back, OMPK_F32, 3, s3, ompk_device_host());
            cr_assert_eq(ompk_moe_get_weights(moe, w, &tb), OMPK_OK);
            for (int64_t i = 0; i < n; i++)
                cr_assert_eq(back[i], deq[w][i], "%s weight %d[%lld]", fmt_name(f), w,
                             (long long)i);
            free(back);
        }
        layer L = {.moe = moe, .cfg = cfg, .gate = deq[0], .up = deq[1], .down = deq[2]};
        route rt = route_new(T_, 13);
        double *y = malloc(T_ * H_ * 8), *ref = malloc(T_ * H_ * 8);
        ref_of(&L, &rt, OMPK_MOE_REF_ACT_INT8, ref);
        run_fwd(&L, &rt, ompk_device_host(), OMPK_BF16, OMPK_F32, OMPK_I32, y);
        cr_expect(compare(fmt_name(f), y, ref, T_ * H_, OMPK_F32) <= 1.0, "pre-quantized %s",
                  fmt_name(f));
        free(y);
        free(ref);
        route_free(&rt);
        layer_free(&L);
        for (int w = 0; w < 3; w++) {
            free(qd[w]);
            free(sd[w]);
            free(zd[w]);
        }
    }
}

/* Error of each format against the unquantized layer (the same f32 master weights, exact
 * operands): reported, and bounded loosely so a broken quantizer cannot pass. */
Test(moe_fwd, quantization_error_report) {
    route rt = route_new(T_, 21);
    double *exact = malloc(T_ * H_ * 8), *y = malloc(T_ * H_ * 8);
    {
        tu_rng r = tu_rng_make(1234);
        int64_t ng = (int64_t)E_ * I_ * H_;
        float *g = rand_f32(&r, ng, 1.0 / sqrt(H_)), *u = rand_f32(&r, ng, 1.0 / sqrt(H_));
        float *d = rand_f32(&r, ng, 1.0 / sqrt(I_));
        ompk_moe_ref_forward(T_, E_, H_, I_, K_, rt.x, rt.ids, rt.w, g, u, d,
                             OMPK_MOE_REF_ACT_EXACT, exact);
        free(g);
        free(u);
        free(d);
    }
    const double bound[4] = {0.02, 0.05, 0.35, 0.35};
    double sc = rms(exact, T_ * H_);
    for (int f = 0; f <= OMPK_MOE_INT4_ZP; f++) {
        layer L;
        cr_assert(layer_new(&L, base_cfg((ompk_moe_format)f, OMPK_MOE_ISA_AUTO, 1)));
        run_fwd(&L, &rt, ompk_device_host(), OMPK_F32, OMPK_F32, OMPK_I64, y);
        double e2 = 0;
        for (int64_t i = 0; i < T_ * H_; i++) e2 += (y[i] - exact[i]) * (y[i] - exact[i]);
        double rel = sqrt(e2 / (double)(T_ * H_)) / sc;
        printf("moe quantization error vs unquantized layer: %-8s rms rel %.4f\n", fmt_name(f),
               rel);
        cr_log_info("moe quantization error %s: rms rel %.4f", fmt_name(f), rel);
        cr_expect(rel < bound[f], "%s: error %g above %g", fmt_name(f), rel, bound[f]);
        layer_free(&L);
    }
    free(exact);
    free(y);
    route_free(&rt);
}

/* The K-blocked AMX kernels (bf16, int8) park C tiles between K chunks without changing any
 * element's operation sequence: bit-identical to the one-step kernels, emulated and real; the
 * prefetch modes change no arithmetic either. The shape gives several K chunks in both matmuls
 * (H = 600: 19 bf16 / 10 int8 k-tiles; I = 1100) and experts with 1, 2 and 3 row blocks. */
static void kblock_case(ompk_moe_isa isa) {
    const int64_t E = 3, H = 600, I = 1100, T = 72;
    /* (kblock, prefetch) per variant; variant 0 is the reference */
    static const int var[6][2] = {{1, 0}, {-1, 0}, {-1, 1}, {1, 2}, {0, 0}, {-1, 3}};
    const int k = 2;
    tu_rng r = tu_rng_make(41);
    float *g = rand_f32(&r, E * I * H, 1.0 / sqrt((double)H)),
          *u = rand_f32(&r, E * I * H, 1.0 / sqrt((double)H));
    float *d = rand_f32(&r, E * H * I, 1.0 / sqrt((double)I)), *x = rand_f32(&r, T * H, 1.0);
    float *w = malloc((size_t)(T * k) * 4),
          *y[2] = {malloc((size_t)(T * H) * 4), malloc((size_t)(T * H) * 4)};
    cr_assert(w && y[0] && y[1]);
    int64_t *ids = malloc((size_t)(T * k) * 8);
    for (int64_t i = 0; i < T * k; i++) {
        ids[i] = i % k == 0 ? 0 : 1 + (int64_t)(tu_uniform(&r) * 2);
        w[i] = (float)tu_uniform(&r);
    }
    int64_t s1[3] = {E, I, H}, s2[3] = {E, H, I}, sx[2] = {T, H}, si[2] = {T, k};
    ompk_tensor tg = ompk_tensor_make(g, OMPK_F32, 3, s1, ompk_device_host());
    ompk_tensor tu = ompk_tensor_make(u, OMPK_F32, 3, s1, ompk_device_host());
    ompk_tensor td = ompk_tensor_make(d, OMPK_F32, 3, s2, ompk_device_host());
    ompk_tensor tx = ompk_tensor_make(x, OMPK_F32, 2, sx, ompk_device_host());
    ompk_tensor ti = ompk_tensor_make(ids, OMPK_I64, 2, si, ompk_device_host());
    ompk_tensor tw = ompk_tensor_make(w, OMPK_F32, 2, si, ompk_device_host());
    for (int f = OMPK_MOE_BF16; f <= OMPK_MOE_INT8; f++) {
        for (int v = 0; v < 6; v++) {
            ompk_moe_config c;
            memset(&c, 0, sizeof c);
            c.experts = E;
            c.hidden = H;
            c.intermediate = I;
            c.top_k = k;
            c.max_tokens = T;
            c.format = (ompk_moe_format)f;
            c.isa = isa;
            c.threads = 2;
            c.amx_min_rows = 1;
            ompk_moe *m;
            cr_assert_eq(ompk_moe_create(&c, &m), OMPK_OK, "%s", ompk_last_error());
            cr_assert_eq(ompk_moe_tuning_set(m, var[v][0], var[v][1]), OMPK_OK, "%s",
                         ompk_last_error());
            cr_assert_eq(ompk_moe_load_weights(m, &tg, &tu, &td), OMPK_OK);
            ompk_tensor ty = ompk_tensor_make(y[v > 0], OMPK_F32, 2, sx, ompk_device_host());
            cr_assert_eq(ompk_moe_fwd(m, &tx, &ti, &tw, &ty), OMPK_OK, "%s", ompk_last_error());
            ompk_moe_destroy(m);
            if (v == 0) {
                double sc = 0;
                for (int64_t i = 0; i < T * H; i++) sc += fabs(y[0][i]);
                cr_expect(sc > 0, "zero output");
                continue;
            }
            cr_expect(memcmp(y[0], y[1], (size_t)(T * H) * 4) == 0,
                      "%s %s: kblock %d prefetch %d differs from K-blocked, pipelined",
                      ompk_moe_isa_name(isa), fmt_name(f), var[v][0], var[v][1]);
        }
    }
    free(g);
    free(u);
    free(d);
    free(x);
    free(w);
    free(y[0]);
    free(y[1]);
    free(ids);
}

Test(moe_fwd, kblock_identical_emulated) {
    kblock_case(OMPK_MOE_ISA_AMX_EMULATED);
}
Test(moe_fwd, kblock_identical_amx) {
    if (!isa_or_skip(OMPK_MOE_ISA_AMX)) cr_skip_test("AMX not available on this CPU");
    kblock_case(OMPK_MOE_ISA_AMX);
}

/* OMPK_VERIFY / OMPK_TRACE: each forward reports y against the reference, and traces x and y. */
Test(moe_fwd, verify_mode, .init = cr_redirect_stderr) {
    route rt = route_new(T_, 51);
    double *y = malloc(T_ * H_ * 8);
    layer L;
    cr_assert(layer_new(&L, base_cfg(OMPK_MOE_INT4_ZP, OMPK_MOE_ISA_AUTO, 2)));
    ompk_verify_force(1, 1);
    run_fwd(&L, &rt, ompk_device_host(), OMPK_BF16, OMPK_BF16, OMPK_I32, y);
    ompk_verify_force(-1, -1);
    fflush(stderr);
    FILE *e = cr_get_redirected_stderr();
    char buf[4096] = {0};
    size_t got = fread(buf, 1, sizeof buf - 1, e);
    buf[got] = 0;
    cr_assert(strstr(buf, "ompk verify moe_forward y[") != NULL, "verify line missing: %s", buf);
    cr_assert(strstr(buf, "mismatches=0") && strstr(buf, " OK"), "verify not OK: %s", buf);
    cr_assert(strstr(buf, "ompk trace moe_forward x ") && strstr(buf, "ompk trace moe_forward y "),
              "trace lines missing: %s", buf);
    layer_free(&L);
    free(y);
    route_free(&rt);
}

/* More partitions than 64-column blocks of I (I = 200: 4 blocks, 6 partitions, two empty), and
 * the automatic policy (one partition per NUMA node hwloc reports). */
Test(moe_split, empty_partitions_and_auto) {
    route rt = route_new(T_, 61);
    double *y1 = malloc(T_ * H_ * 8), *y6 = malloc(T_ * H_ * 8), *ya = malloc(T_ * H_ * 8);
    layer L1, L6, La;
    cr_assert(layer_new(&L1, base_cfg(OMPK_MOE_INT8, OMPK_MOE_ISA_AUTO, 1)));
    cr_assert(layer_new(&L6, base_cfg(OMPK_MOE_INT8, OMPK_MOE_ISA_AUTO, 6)));
    ompk_moe_config ca = base_cfg(OMPK_MOE_INT8, OMPK_MOE_ISA_AUTO, 0);
    ca.numa = OMPK_MOE_NUMA_AUTO;
    cr_assert(layer_new(&La, ca));
    ompk_moe_info info;
    ompk_moe_get_info(La.moe, &info);
    cr_expect_eq(info.partitions, info.numa_nodes, "auto policy: %d partitions on %d NUMA nodes",
                 info.partitions, info.numa_nodes);
    run_fwd(&L1, &rt, ompk_device_host(), OMPK_F32, OMPK_F32, OMPK_I32, y1);
    run_fwd(&L6, &rt, ompk_device_host(), OMPK_F32, OMPK_F32, OMPK_I32, y6);
    run_fwd(&La, &rt, ompk_device_host(), OMPK_F32, OMPK_F32, OMPK_I32, ya);
    double sc = rms(y1, T_ * H_);
    for (int64_t i = 0; i < T_ * H_; i++)
        cr_assert(fabs(y6[i] - y1[i]) <= 2e-5 * sc + 1e-4 * fabs(y1[i]),
                  "split 6 element %lld: %g vs %g", (long long)i, y6[i], y1[i]);
    if (info.partitions == 1)
        cr_expect(memcmp(y1, ya, T_ * H_ * 8) == 0, "auto (1 node) differs from split 1");
    layer_free(&L1);
    layer_free(&L6);
    layer_free(&La);
    free(y1);
    free(y6);
    free(ya);
    route_free(&rt);
}
