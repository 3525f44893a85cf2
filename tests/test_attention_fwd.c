/* ompk_attention_fwd against the double reference: odd and unequal N/M, strided (BSHD) views,
 * rows not 16-byte aligned, fully masked rows, large logits, optional lse, empty shapes, verify
 * mode; every variant, bf16 and f32 (every mask with GQA 1/4/8 and every dh: test_ops). Runs on
 * the host and on every GPU. */
#include <criterion/criterion.h>
#include <criterion/redirect.h>

#include "test_attention_common.h"
#include "verify.h"

/* Sizes that are multiples of no tile, N != M both ways, single rows and keys. */
Test(attention_fwd, odd_and_unequal_lengths) {
    const int64_t nm[][2] = {{1, 1},    {1, 17},     {17, 1},    {17, 129},
                             {129, 17}, {1000, 129}, {129, 1000}};
    att_sweep_lengths(att_check_fwd, nm, sizeof nm / sizeof nm[0], 4, 2, 200);
}

Test(attention_fwd, one_thousand_square) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++) {
        att_case c;
        att_case_new(&c, devs[di], OMPK_F32, 1, 2, 1, 1000, 1000, 64,
                     OMPK_ATTN_MASK_CAUSAL_BOTTOM_RIGHT, 300, 1.0, 0);
        double w = att_check_fwd(&c, tu_device_name(devs[di]));
        cr_expect(w <= 1.0, "N=M=1000: worst ratio %g", w);
        att_case_free(&c);
    }
}

/* q, k, v, out in the [B,S,H,dh] storage of real models (non-contiguous views). */
Test(attention_fwd, strided_bshd_views) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++)
        for (int bf = 0; bf < 2; bf++) {
            att_case c;
            att_case_new(&c, devs[di], bf ? OMPK_BF16 : OMPK_F32, 2, 4, 2, 33, 50, 96,
                         OMPK_ATTN_MASK_CAUSAL_TOP_LEFT, (uint64_t)(400 + bf), 1.0, 1);
            double w = att_check_fwd(&c, "bshd");
            cr_expect(w <= 1.0, "bshd %s: worst ratio %g", ompk_dtype_name(c.dt), w);
            att_case_free(&c);
        }
}

/* dh 64 views of rows 65 elements apart: the GPU tensor-core kernels load 16-byte row pieces
 * and leave such calls to the portable kernel, which must give the same answers. */
Test(attention_fwd, unaligned_row_pitch) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++)
        for (int bf = 0; bf < 2; bf++) {
            att_case c;
            att_case_new(&c, devs[di], bf ? OMPK_BF16 : OMPK_F32, 1, 2, 1, 33, 40, 65,
                         OMPK_ATTN_MASK_CAUSAL_TOP_LEFT, (uint64_t)(450 + bf), 1.0, 0);
            ompk_tensor *views[8] = {&c.tq,    &c.tk,  &c.tv,  &c.tout,
                                     &c.tdout, &c.tdq, &c.tdk, &c.tdv};
            for (int i = 0; i < 8; i++) views[i]->shape[3] = 64;
            c.dh = 64;
            c.p.scale = 0.125f;
            c.scale = 0.125;
            double w = att_check_fwd(&c, "pitch 65");
            cr_expect(w <= 1.0, "pitch 65 %s: worst ratio %g", ompk_dtype_name(c.dt), w);
            att_case_free(&c);
        }
}

/* Bottom-right causal with N > M: rows i < N - M see no key. */
Test(attention_fwd, fully_masked_rows_zero_and_minus_inf) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++)
        for (int bf = 0; bf < 2; bf++) {
            att_case c;
            att_case_new(&c, devs[di], bf ? OMPK_BF16 : OMPK_F32, 1, 2, 1, 40, 9, 64,
                         OMPK_ATTN_MASK_CAUSAL_BOTTOM_RIGHT, (uint64_t)(500 + bf), 1.0, 0);
            double w = att_check_fwd(&c, "fully masked");
            cr_expect(w <= 1.0, "worst ratio %g", w);
            for (int64_t h = 0; h < 2; h++)
                for (int64_t i = 0; i < 40; i++) {
                    double l = tu_buf_get(&c.lse, h * 40 + i);
                    if (i < 31)
                        cr_expect(isinf(l) && l < 0, "row %lld lse %g", (long long)i, l);
                    else
                        cr_expect(isfinite(l), "row %lld lse %g", (long long)i, l);
                    for (int64_t d = 0; d < 64; d++) {
                        double o = tu_buf_get(&c.out, (h * 40 + i) * 64 + d);
                        cr_expect(!isnan(o), "NaN in out");
                        if (i < 31) cr_expect(o == 0.0, "masked row %lld out %g", (long long)i, o);
                    }
                }
            att_case_free(&c);
        }
}

/* q and k scaled by 30: logits of several hundred, where a softmax without running-max
 * rescaling overflows. */
Test(attention_fwd, large_logits_stay_finite) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++)
        for (int m = 0; m < 3; m++)
            for (int bf = 0; bf < 2; bf++) {
                att_case c;
                att_case_new(&c, devs[di], bf ? OMPK_BF16 : OMPK_F32, 1, 2, 2, 65, 80, 128,
                             att_mask(m), (uint64_t)(600 + m * 2 + bf), 30.0, 0);
                char label[64];
                snprintf(label, sizeof label, "x30 %s %s", att_mask_name(att_mask(m)),
                         ompk_dtype_name(c.dt));
                /* Logits of std ~900: a score sums 128 products of |q k| ~ 600, so its fp32
                 * rounding is eps * scale * sum |q k| ~ 6e-8 * 6800 ~ 4e-4 absolute before the
                 * exponential (the inputs' precision, not the kernel's), and an out element
                 * moves by about twice that times |v| ~ 1 with the two competing scores: a
                 * 50x wider band (1e-3), still far below what a missing rescale or overflow
                 * would give. The summation order decides where in it a compiler lands. */
                c.tol_mult = bf ? 1.0 : 50.0;
                double w = att_check_fwd(&c, label);
                cr_expect(w <= 1.0, "%s: worst ratio %g", label, w);
                att_case_free(&c);
            }
}

Test(attention_fwd, lse_optional_and_explicit_scale) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++) {
        att_case c;
        att_case_new(&c, devs[di], OMPK_F32, 1, 4, 1, 20, 30, 80, OMPK_ATTN_MASK_NONE, 700, 1.0, 0);
        c.p.scale = 0.3f;
        c.scale = 0.3;
        double w = att_check_fwd(&c, "scale 0.3");
        cr_expect(w <= 1.0, "explicit scale: worst ratio %g", w);
        tu_buf_fill_bytes(&c.out, 0xA5);
        tu_buf_fill_bytes(&c.lse, 0xA5);
        cr_assert_eq(ompk_attention_fwd(&c.tq, &c.tk, &c.tv, &c.tout, NULL, NULL), OMPK_OK);
        cr_expect(tu_buf_all_bytes(&c.lse, 0xA5), "lse written although not passed");
        cr_expect(!tu_buf_all_bytes(&c.out, 0xA5), "out not written");
        att_case_free(&c);
    }
}

Test(attention_fwd, empty_shapes_ok) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++) {
        att_case c;
        att_case_new(&c, devs[di], OMPK_F32, 1, 2, 1, 0, 5, 32, OMPK_ATTN_MASK_NONE, 1, 1.0, 0);
        cr_expect_eq(att_fwd(&c), OMPK_OK, "%s", ompk_last_error());
        att_case_free(&c);
        /* M == 0: every row fully masked */
        att_case_new(&c, devs[di], OMPK_F32, 1, 2, 1, 3, 0, 32, OMPK_ATTN_MASK_NONE, 1, 1.0, 0);
        cr_assert_eq(att_fwd(&c), OMPK_OK, "%s", ompk_last_error());
        tu_buf_download(&c.out);
        tu_buf_download(&c.lse);
        for (int64_t i = 0; i < c.out.numel; i++) cr_expect(tu_buf_get(&c.out, i) == 0.0);
        for (int64_t i = 0; i < c.lse.numel; i++) cr_expect(isinf(tu_buf_get(&c.lse, i)));
        att_case_free(&c);
    }
}

Test(attention_fwd, verify_mode_reports, .init = cr_redirect_stderr) {
    att_case c;
    att_case_new(&c, ompk_device_host(), OMPK_F32, 1, 2, 1, 9, 12, 32,
                 OMPK_ATTN_MASK_CAUSAL_TOP_LEFT, 800, 1.0, 0);
    ompk_verify_force(1, -1);
    cr_assert_eq(att_fwd(&c), OMPK_OK);
    ompk_verify_force(-1, -1);
    fflush(stderr);
    char buf[4096] = {0};
    FILE *f = cr_get_redirected_stderr();
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    cr_expect(strstr(buf, "attention_fwd out") != NULL, "no out line in: %s", buf);
    cr_expect(strstr(buf, "attention_fwd lse") != NULL, "no lse line in: %s", buf);
    cr_expect(strstr(buf, "MISMATCH") == NULL, "verify reported a mismatch: %s", buf);
    att_case_free(&c);
}

/* Every variant (att_variant: portable, the default order, amx-emulated) against the reference on
 * every device, bf16 and f32: on a GPU "fast" takes the calls it can serve (bf16 tensor cores, f32
 * through 3xTF32), the rest and "portable" run the portable kernel; on the host amx-emulated runs
 * bf16 on the AMX kernels' tile emulation. */
Test(attention_fwd, variants_match_reference) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    const char *variants[3] = {"portable", "fast", "amx-emulated"};
    const struct {
        int64_t B, Hq, Hkv, N, M, dh;
        int bshd;
    } shapes[] = {{1, 4, 1, 200, 200, 128, 0},
                  {2, 2, 2, 65, 130, 64, 1},
                  {1, 8, 2, 1, 77, 96, 0},
                  {1, 2, 1, 129, 31, 80, 0},
                  {1, 2, 2, 100, 64, 32, 0}};
    const ompk_dtype dts[2] = {OMPK_BF16, OMPK_F32};
    for (int di = 0; di < nd; di++)
        for (int vi = 0; vi < 6; vi++) {
            att_variant(variants[vi % 3]);
            for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
                for (int m = 0; m < 3; m++) {
                    att_case c;
                    att_case_new(&c, devs[di], dts[vi / 3], shapes[si].B, shapes[si].Hq,
                                 shapes[si].Hkv, shapes[si].N, shapes[si].M, shapes[si].dh,
                                 att_mask(m), (uint64_t)(900 + si * 3 + (size_t)m), 1.0,
                                 shapes[si].bshd);
                    char label[160];
                    snprintf(label, sizeof label, "%s %s %s shape %zu mask=%s",
                             tu_device_name(devs[di]), variants[vi % 3], ompk_dtype_name(c.dt), si,
                             att_mask_name(att_mask(m)));
                    double w = att_check_fwd(&c, label);
                    cr_expect(w <= 1.0, "%s: worst ratio %g", label, w);
                    att_case_free(&c);
                }
            att_variant(NULL);
        }
}
