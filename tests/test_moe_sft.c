/* MoE fine-tuning (forward cache, LoRA, backward) against the double reference for every
 * output; every base format; every ISA this machine has (portable, amx-emulated, avx512bf16 and
 * amx where available: skipped visibly otherwise); LoRA ranks, top_k 1..8, awkward sizes, -1
 * slots, repeated experts, one hot expert, T = 1 and T = 0; a finite-difference check of the
 * reference; and one named regression test per kt-kernel bug class (see each test's comment). */
#include <criterion/criterion.h>
#include <criterion/redirect.h>

#include "moe_sft_common.h"
#include "verify.h"

/* E, H, I not multiples of any tile size; expert 0 gets every token (two row blocks at T 37) */
static sft_shape shape(ompk_moe_format fmt, ompk_moe_isa isa, int r) {
    sft_shape s = {5, 72, 100, 37, 3, r, 2, 1, fmt, isa, 2, OMPK_MOE_GRAD_SPLIT};
    if (fmt >= OMPK_MOE_INT4) s.H = 136; /* two int4 groups of 64 along H, the last partial */
    return s;
}

static const char *fmt_name(ompk_moe_format f) {
    static const char *n[] = {"bf16", "int8", "int4", "int4-zp"};
    return n[f];
}

static int isa_or_skip(ompk_moe_isa isa) {
    if (ompk_moe_isa_available(isa)) return 1;
    printf("moe_sft: ISA %s not available on this CPU, its tests skipped\n",
           ompk_moe_isa_name(isa));
    return 0;
}

static void full_check(sft_shape s, uint64_t seed) {
    sft_layer L;
    cr_assert(sft_new(&L, s), "create: %s", ompk_last_error());
    sft_batch b = sft_batch_new(&L.sh, s.T, seed);
    sft_out o;
    sft_out_alloc(&L.sh, &o);
    sft_step(&L, &b, &o);
    sft_ref R;
    sft_ref_run(&L, &b, 0.0f, 0, &R);
    char tag[128];
    snprintf(tag, sizeof tag, "%s %s r=%d k=%d T=%lld split=%d", ompk_moe_isa_name(s.isa),
             fmt_name(s.fmt), s.r, s.k, (long long)s.T, s.split);
    sft_check(tag, &L, s.T, &o, &R);
    sft_ref_free(&R);
    sft_out_free(&o);
    sft_batch_free(&b);
    sft_free(&L);
}

static void formats_on(ompk_moe_isa isa) {
    if (!isa_or_skip(isa)) cr_skip_test("ISA %s not available", ompk_moe_isa_name(isa));
    for (int f = 0; f <= OMPK_MOE_INT4_ZP; f++) {
        full_check(shape((ompk_moe_format)f, isa, 8), 5);
        full_check(shape((ompk_moe_format)f, isa, 0), 6);
    }
}

Test(moe_sft, formats_portable) {
    formats_on(OMPK_MOE_ISA_PORTABLE);
}
Test(moe_sft, formats_amx_emulated) {
    formats_on(OMPK_MOE_ISA_AMX_EMULATED);
}
Test(moe_sft, formats_avx512bf16) {
    formats_on(OMPK_MOE_ISA_AVX512BF16);
}
Test(moe_sft, formats_amx) {
    formats_on(OMPK_MOE_ISA_AMX);
}

/* dy passed as bf16 and as f32 of the same values: the same bits in every output on every ISA
 * (with bf16 dy on a bf16 base the dh products skip their zero lo half; the hot expert's 75
 * routes fill two 32-route AMX blocks and part of a third) */
static void dy_dtype_same_bits(ompk_moe_isa isa, ompk_moe_format fmt) {
    sft_shape s = shape(fmt, isa, 8);
    s.T = 75;
    sft_layer L;
    cr_assert(sft_new(&L, s), "create: %s", ompk_last_error());
    sft_batch b = sft_batch_new(&L.sh, s.T, 41);
    sft_out o[2];
    for (int v = 0; v < 2; v++) {
        sft_out_alloc(&L.sh, &o[v]);
        cr_assert_eq(sft_forward(&L, &b, o[v].y, OMPK_MOE_CACHE_PUSH), OMPK_OK, "%s",
                     ompk_last_error());
        cr_assert_eq(sft_backward_dt(&L, &b, &o[v], 0, v ? OMPK_BF16 : OMPK_F32), OMPK_OK, "%s",
                     ompk_last_error());
    }
    const char *tag = ompk_moe_isa_name(isa);
    cr_expect(memcmp(o[0].dx, o[1].dx, (size_t)(s.T * s.H) * 4) == 0, "%s %s dx", tag,
              fmt_name(fmt));
    cr_expect(memcmp(o[0].dw, o[1].dw, (size_t)(s.T * s.k) * 4) == 0, "%s dw", tag);
    for (int p = 0; p < 3; p++) {
        cr_expect(memcmp(o[0].da[p], o[1].da[p], (size_t)(s.E * s.r * sft_in(&s, p)) * 4) == 0,
                  "%s dA %d", tag, p);
        cr_expect(memcmp(o[0].db[p], o[1].db[p], (size_t)(s.E * s.r * sft_outd(&s, p)) * 4) == 0,
                  "%s dB %d", tag, p);
        if (o[0].dW[p])
            cr_expect(memcmp(o[0].dW[p], o[1].dW[p], (size_t)(s.E * s.H * s.I) * 4) == 0,
                      "%s dW %d", tag, p);
    }
    for (int v = 0; v < 2; v++) sft_out_free(&o[v]);
    sft_batch_free(&b);
    sft_free(&L);
}

Test(moe_sft, dy_bf16_same_bits) {
    const ompk_moe_isa isas[4] = {OMPK_MOE_ISA_PORTABLE, OMPK_MOE_ISA_AMX_EMULATED,
                                  OMPK_MOE_ISA_AVX512BF16, OMPK_MOE_ISA_AMX};
    for (int i = 0; i < 4; i++) {
        if (!isa_or_skip(isas[i])) continue;
        dy_dtype_same_bits(isas[i], OMPK_MOE_BF16);
        dy_dtype_same_bits(isas[i], OMPK_MOE_INT8);
    }
}

/* OMPK_MOE_GRAD_BF16: every output against the reference within one more operand rounding */
Test(moe_sft, grad_operands_bf16) {
    const ompk_moe_isa isas[4] = {OMPK_MOE_ISA_PORTABLE, OMPK_MOE_ISA_AMX_EMULATED,
                                  OMPK_MOE_ISA_AVX512BF16, OMPK_MOE_ISA_AMX};
    for (int i = 0; i < 4; i++) {
        if (!isa_or_skip(isas[i])) continue;
        for (int f = 0; f <= OMPK_MOE_INT8; f++) {
            sft_shape s = shape((ompk_moe_format)f, isas[i], 8);
            s.T = 75;
            s.grad = OMPK_MOE_GRAD_BF16;
            full_check(s, 300 + (uint64_t)f);
        }
    }
}

Test(moe_sft, lora_ranks) {
    const int ranks[4] = {1, 8, 16, 64};
    for (int i = 0; i < 4; i++) {
        full_check(shape(OMPK_MOE_BF16, OMPK_MOE_ISA_AMX_EMULATED, ranks[i]), 11 + i);
        full_check(shape(OMPK_MOE_INT4_ZP, OMPK_MOE_ISA_PORTABLE, ranks[i]), 21 + i);
    }
}

Test(moe_sft, top_k_1_to_8) {
    for (int k = 1; k <= 8; k++) {
        sft_shape s = {9,
                       40,
                       70,
                       19,
                       k,
                       4,
                       2,
                       1,
                       OMPK_MOE_BF16,
                       OMPK_MOE_ISA_AMX_EMULATED,
                       2,
                       OMPK_MOE_GRAD_SPLIT};
        full_check(s, 100 + k);
        s.fmt = OMPK_MOE_INT8;
        full_check(s, 200 + k);
    }
}

Test(moe_sft, one_token_and_none) {
    sft_shape s = shape(OMPK_MOE_INT8, OMPK_MOE_ISA_AMX_EMULATED, 8);
    s.T = 1;
    full_check(s, 7);
    /* T = 0: a valid step; LoRA and weight gradients of "=" are all 0 */
    s.T = 0;
    s.fmt = OMPK_MOE_BF16;
    sft_layer L;
    cr_assert(sft_new(&L, s));
    sft_batch b = sft_batch_new(&L.sh, 0, 3);
    sft_out o;
    sft_out_alloc(&L.sh, &o);
    for (int p = 0; p < 3; p++) {
        o.da[p][0] = 5.0f;
        o.dW[p][0] = 5.0f;
    }
    sft_step(&L, &b, &o);
    for (int p = 0; p < 3; p++) {
        cr_expect_eq(o.da[p][0], 0.0f);
        cr_expect_eq(o.dW[p][0], 0.0f);
    }
    ompk_moe_info info;
    ompk_moe_get_info(L.moe, &info);
    cr_expect_eq(info.cache_entries, 0);
    sft_out_free(&o);
    sft_batch_free(&b);
    sft_free(&L);
}

/* every slot padding but the hot expert's: one expert takes every token, the rest no token */
Test(moe_sft, one_hot_expert) {
    sft_shape s = shape(OMPK_MOE_BF16, OMPK_MOE_ISA_AMX_EMULATED, 8);
    sft_layer L;
    cr_assert(sft_new(&L, s));
    sft_batch b = sft_batch_new(&L.sh, s.T, 8);
    for (int64_t t = 0; t < s.T; t++)
        for (int j = 0; j < s.k; j++) b.ids[t * s.k + j] = j == 1 ? 3 : -1;
    sft_out o;
    sft_out_alloc(&L.sh, &o);
    for (int p = 0; p < 3; p++) memset(o.db[p], 0x7F, (size_t)(s.E * s.r * sft_outd(&s, p)) * 4);
    sft_step(&L, &b, &o);
    sft_ref R;
    sft_ref_run(&L, &b, 0.0f, 0, &R);
    sft_check("one hot expert", &L, s.T, &o, &R);
    /* experts no token reached: exactly 0 under "=" */
    for (int p = 0; p < 3; p++)
        for (int64_t i = 0; i < s.E * s.r * sft_outd(&s, p); i++)
            if (i / (s.r * sft_outd(&s, p)) != 3) cr_assert_eq(o.db[p][i], 0.0f);
    sft_ref_free(&R);
    sft_out_free(&o);
    sft_batch_free(&b);
    sft_free(&L);
}

Test(moe_sft, lora_dropout) {
    sft_shape s = shape(OMPK_MOE_BF16, OMPK_MOE_ISA_PORTABLE, 8);
    sft_layer L;
    cr_assert(sft_new(&L, s));
    sft_attach(&L, 8, 16.0f, 0.3f, 4242);
    sft_batch b = sft_batch_new(&L.sh, s.T, 9);
    sft_out o;
    sft_out_alloc(&L.sh, &o);
    sft_step(&L, &b, &o);
    sft_ref R;
    sft_ref_run(&L, &b, 0.3f, 4242, &R);
    sft_check("dropout 0.3", &L, s.T, &o, &R);
    sft_ref_free(&R);
    sft_out_free(&o);
    sft_batch_free(&b);
    sft_free(&L);
}

/* bit-identical across repeats and thread counts on one path */
Test(moe_sft, deterministic_threads) {
    const ompk_moe_isa isas[2] = {OMPK_MOE_ISA_PORTABLE, OMPK_MOE_ISA_AMX_EMULATED};
    for (int ii = 0; ii < 2; ii++) {
        sft_out o[4];
        for (int th = 1; th <= 4; th++) {
            sft_shape s = shape(OMPK_MOE_BF16, isas[ii], 8);
            s.threads = th == 4 ? 3 : th;
            s.split = 3;
            sft_layer L;
            cr_assert(sft_new(&L, s));
            sft_batch b = sft_batch_new(&L.sh, s.T, 31);
            sft_out_alloc(&L.sh, &o[th - 1]);
            sft_step(&L, &b, &o[th - 1]);
            if (th > 1) {
                const sft_out *a = &o[0], *c = &o[th - 1];
                cr_assert(!memcmp(a->dx, c->dx, (size_t)(s.T * s.H) * 4), "dx, threads %d", th);
                cr_assert(!memcmp(a->dw, c->dw, (size_t)(s.T * s.k) * 4), "dw");
                cr_assert(!memcmp(a->y, c->y, (size_t)(s.T * s.H) * 4), "y");
                for (int p = 0; p < 3; p++) {
                    cr_assert(!memcmp(a->da[p], c->da[p], (size_t)(s.E * s.r * sft_in(&s, p)) * 4));
                    cr_assert(
                        !memcmp(a->db[p], c->db[p], (size_t)(s.E * s.r * sft_outd(&s, p)) * 4));
                    cr_assert(!memcmp(a->dW[p], c->dW[p], (size_t)(s.E * s.H * s.I) * 4));
                }
            }
            sft_batch_free(&b);
            sft_free(&L);
        }
        for (int i = 0; i < 4; i++) sft_out_free(&o[i]);
    }
}

/* The reference's own gradients against central differences of L = sum dy * y, in exact
 * arithmetic (no operand rounding): dx, dw and the LoRA gradients of each projection. */
Test(moe_sft, finite_differences_reference) {
    const int64_t E = 3, H = 12, I = 10, T = 4;
    const int k = 2, r = 3;
    tu_rng g = tu_rng_make(5);
    float *W[3], *la[3], *lb[3];
    const int64_t in[3] = {H, H, I}, out[3] = {I, I, H};
    for (int p = 0; p < 3; p++) {
        W[p] = sft_rand(&g, E * H * I, 0.4);
        la[p] = sft_rand(&g, E * r * in[p], 0.4);
        lb[p] = sft_rand(&g, E * out[p] * r, 0.4);
    }
    float *x = sft_rand(&g, T * H, 1.0), *dy = sft_rand(&g, T * H, 1.0), w[8];
    int64_t ids[8] = {0, 2, 1, 1, 2, -1, 0, 1};
    for (int i = 0; i < 8; i++) w[i] = (float)(0.3 + 0.1 * i);
    ompk_moe_ref_lora lr = {r, 1.5, {la[0], la[1], la[2]}, {lb[0], lb[1], lb[2]}, 0.0f, 0};
    double dx[48], dw[8], *da[3], *db[3], y[48];
    ompk_moe_ref_grads gr;
    memset(&gr, 0, sizeof gr);
    gr.dx = dx;
    gr.dw = dw;
    for (int p = 0; p < 3; p++) {
        gr.da[p] = da[p] = calloc((size_t)(E * r * in[p]), 8);
        gr.db[p] = db[p] = calloc((size_t)(E * r * out[p]), 8);
    }
    ompk_moe_ref_train(T, E, H, I, k, x, ids, w, W[0], W[1], W[2], OMPK_MOE_REF_ACT_EXACT, &lr, y,
                       dy, &gr);
    /* L(v) with one float perturbed: returns sum dy*y */
#define LOSS(out)                                                                                  \
    do {                                                                                           \
        ompk_moe_ref_train(T, E, H, I, k, x, ids, w, W[0], W[1], W[2], OMPK_MOE_REF_ACT_EXACT,     \
                           &lr, y, NULL, NULL);                                                    \
        out = 0;                                                                                   \
        for (int64_t i = 0; i < T * H; i++) out += (double)dy[i] * y[i];                           \
    } while (0)
#define FD_CHECK(ptr, idx, analytic, what)                                                         \
    do {                                                                                           \
        float keep = (ptr)[idx];                                                                   \
        double lp, lm;                                                                             \
        (ptr)[idx] = keep + 1e-3f;                                                                 \
        double hp = (double)(ptr)[idx] - keep;                                                     \
        LOSS(lp);                                                                                  \
        (ptr)[idx] = keep - 1e-3f;                                                                 \
        double hm = keep - (double)(ptr)[idx];                                                     \
        LOSS(lm);                                                                                  \
        (ptr)[idx] = keep;                                                                         \
        double fd = (lp - lm) / (hp + hm);                                                         \
        cr_expect(fabs(fd - (analytic)) <= 1e-4 + 1e-4 * fabs(fd), "%s[%d]: fd %.8g vs %.8g",      \
                  what, (int)(idx), fd, (double)(analytic));                                       \
    } while (0)
    for (int i = 0; i < T * H; i += 5) FD_CHECK(x, i, dx[i], "dx");
    for (int i = 0; i < T * k; i++)
        if (ids[i] >= 0) FD_CHECK(w, i, dw[i], "dw");
    for (int p = 0; p < 3; p++) {
        for (int i = 0; i < E * r * in[p]; i += 7) FD_CHECK(la[p], i, da[p][i], "dA");
        for (int i = 0; i < E * r * out[p]; i += 7) FD_CHECK(lb[p], i, db[p][i], "dB");
    }
#undef FD_CHECK
#undef LOSS
    for (int p = 0; p < 3; p++) {
        free(W[p]);
        free(la[p]);
        free(lb[p]);
        free(da[p]);
        free(db[p]);
    }
    free(x);
    free(dy);
}

/* NaN in dy row t0 reaches dx row t0 and dw row t0 only */
Test(moe_sft, nan_in_dy) {
    sft_shape s = shape(OMPK_MOE_INT8, OMPK_MOE_ISA_AMX_EMULATED, 8);
    sft_layer L;
    cr_assert(sft_new(&L, s));
    sft_batch b = sft_batch_new(&L.sh, s.T, 12);
    const int64_t t0 = 5;
    b.dy[t0 * s.H + 7] = NAN;
    sft_out o;
    sft_out_alloc(&L.sh, &o);
    sft_step(&L, &b, &o);
    for (int64_t t = 0; t < s.T; t++) {
        int nan_dx = 0, nan_dw = 0;
        for (int64_t h = 0; h < s.H; h++) nan_dx += isnan(o.dx[t * s.H + h]) != 0;
        for (int j = 0; j < s.k; j++) nan_dw += isnan(o.dw[t * s.k + j]) != 0;
        int routed = 0;
        for (int j = 0; j < s.k; j++) routed += b.ids[t * s.k + j] >= 0;
        if (t == t0) {
            cr_expect_eq(nan_dw, routed, "dw row %lld", (long long)t);
            cr_expect_gt(nan_dx, 0);
        } else {
            cr_expect_eq(nan_dx + nan_dw, 0, "token %lld", (long long)t);
        }
    }
    sft_out_free(&o);
    sft_batch_free(&b);
    sft_free(&L);
}

/* OMPK_VERIFY=1: one line per output of the backward (and the forward's y with LoRA), no
 * mismatch */
Test(moe_sft, verify_mode_reports, .init = cr_redirect_stderr) {
    sft_shape s = shape(OMPK_MOE_BF16, OMPK_MOE_ISA_AMX_EMULATED, 8);
    s.T = 11;
    sft_layer L;
    cr_assert(sft_new(&L, s));
    sft_batch b = sft_batch_new(&L.sh, s.T, 41);
    sft_out o;
    sft_out_alloc(&L.sh, &o);
    ompk_verify_force(1, -1);
    sft_step(&L, &b, &o);
    ompk_verify_force(-1, -1);
    fflush(stderr);
    char buf[8192] = {0};
    FILE *f = cr_get_redirected_stderr();
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    static const char *names[] = {
        "moe_forward y",        "moe_backward dx",      "moe_backward dw",
        "moe_backward gate_da", "moe_backward gate_db", "moe_backward up_da",
        "moe_backward up_db",   "moe_backward down_da", "moe_backward down_db",
        "moe_backward gate_dw", "moe_backward up_dw",   "moe_backward down_dw"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        cr_expect(strstr(buf, names[i]) != NULL, "no %s line in: %s", names[i], buf);
    cr_expect(strstr(buf, "MISMATCH") == NULL, "verify reported a mismatch: %s", buf);
    sft_out_free(&o);
    sft_batch_free(&b);
    sft_free(&L);
}

/* x, dy, y, dx, dw on every device the build has (GPU tensors staged through host buffers):
 * the same numbers as the host step */
Test(moe_sft, devices_staged) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    sft_shape s = shape(OMPK_MOE_INT8, OMPK_MOE_ISA_AMX_EMULATED, 8);
    sft_layer L;
    cr_assert(sft_new(&L, s));
    sft_batch b = sft_batch_new(&L.sh, s.T, 43);
    sft_out host;
    sft_out_alloc(&L.sh, &host);
    sft_step(&L, &b, &host);
    for (int d = 0; d < nd; d++) {
        const int64_t T = s.T, H = s.H, k = s.k;
        tu_buf bx = tu_buf_new(devs[d], OMPK_BF16, T * H),
               bi = tu_buf_new(devs[d], OMPK_I32, T * k);
        tu_buf bw = tu_buf_new(devs[d], OMPK_F32, T * k), by = tu_buf_new(devs[d], OMPK_F32, T * H);
        tu_buf bdy = tu_buf_new(devs[d], OMPK_F32, T * H),
               bdx = tu_buf_new(devs[d], OMPK_BF16, T * H);
        tu_buf bdw = tu_buf_new(devs[d], OMPK_F32, T * k);
        for (int64_t i = 0; i < T * H; i++) {
            tu_buf_set(&bx, i, b.x[i]);
            tu_buf_set(&bdy, i, b.dy[i]);
        }
        for (int64_t i = 0; i < T * k; i++) {
            tu_buf_set(&bi, i, (double)b.ids[i]);
            tu_buf_set(&bw, i, b.w[i]);
        }
        tu_buf_upload(&bx);
        tu_buf_upload(&bi);
        tu_buf_upload(&bw);
        tu_buf_upload(&bdy);
        int64_t sx[2] = {T, H}, si[2] = {T, k};
        ompk_tensor tx = tu_view(&bx, 2, sx), ti = tu_view(&bi, 2, si), tw = tu_view(&bw, 2, si);
        ompk_tensor ty = tu_view(&by, 2, sx), tdy = tu_view(&bdy, 2, sx);
        ompk_tensor tdx = tu_view(&bdx, 2, sx), tdw = tu_view(&bdw, 2, si);
        cr_assert_eq(ompk_moe_fwd_train(L.moe, &tx, &ti, &tw, &ty, OMPK_MOE_CACHE_PUSH), OMPK_OK,
                     "%s", ompk_last_error());
        ompk_moe_grads g;
        memset(&g, 0, sizeof g);
        g.dx = &tdx;
        g.dw = &tdw;
        cr_assert_eq(ompk_moe_bwd(L.moe, &tdy, &g), OMPK_OK, "%s", ompk_last_error());
        tu_buf_download(&by);
        tu_buf_download(&bdx);
        tu_buf_download(&bdw);
        for (int64_t i = 0; i < T * H; i++) {
            cr_assert_eq((float)tu_buf_get(&by, i), host.y[i], "%s y[%lld]",
                         tu_device_name(devs[d]), (long long)i);
            cr_assert_eq((float)tu_buf_get(&bdx, i), ompk_round_bf16(host.dx[i]), "dx[%lld]",
                         (long long)i);
        }
        for (int64_t i = 0; i < T * k; i++) cr_assert_eq((float)tu_buf_get(&bdw, i), host.dw[i]);
        tu_buf_free(&bx);
        tu_buf_free(&bi);
        tu_buf_free(&bw);
        tu_buf_free(&by);
        tu_buf_free(&bdy);
        tu_buf_free(&bdx);
        tu_buf_free(&bdw);
    }
    sft_out_free(&host);
    sft_batch_free(&b);
    sft_free(&L);
}
