/* ompk_attention_bwd against the double reference (every dh on strided views, odd and unequal
 * lengths), fully masked rows, large logits, and bit-identical repeats (every mask with GQA 1/4/8:
 * test_ops). Runs on the host and on every GPU. */
#include <criterion/criterion.h>
#include <criterion/redirect.h>

#include <omp.h>

#include "attention_kernels.h"
#include "test_attention_common.h"
#include "verify.h"

Test(attention_bwd, f32_head_dims) {
    att_sweep_head_dims(att_check_bwd, OMPK_F32, 4, 2, 50, 61, OMPK_ATTN_MASK_CAUSAL_BOTTOM_RIGHT,
                        1100);
}
Test(attention_bwd, bf16_head_dims) {
    att_sweep_head_dims(att_check_bwd, OMPK_BF16, 4, 2, 50, 61, OMPK_ATTN_MASK_CAUSAL_BOTTOM_RIGHT,
                        1100);
}

Test(attention_bwd, odd_and_unequal_lengths) {
    const int64_t nm[][2] = {{1, 1},    {1, 17},    {17, 1},   {17, 129},
                             {129, 17}, {300, 129}, {129, 300}};
    att_sweep_lengths(att_check_bwd, nm, sizeof nm / sizeof nm[0], 4, 1, 1200);
}

Test(attention_bwd, one_thousand_square) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++) {
        att_case c;
        att_case_new(&c, devs[di], OMPK_F32, 1, 2, 1, 1000, 1000, 32,
                     OMPK_ATTN_MASK_CAUSAL_TOP_LEFT, 1300, 1.0, 0);
        double w = att_check_bwd(&c, tu_device_name(devs[di]));
        cr_expect(w <= 1.0, "N=M=1000: worst ratio %g", w);
        att_case_free(&c);
    }
}

/* Rows with no visible key: zero dq, and nothing added to dk/dv (the reference agrees), with no
 * NaN in any gradient. */
Test(attention_bwd, fully_masked_rows_zero_grads) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++)
        for (int bf = 0; bf < 2; bf++) {
            att_case c;
            att_case_new(&c, devs[di], bf ? OMPK_BF16 : OMPK_F32, 1, 2, 1, 40, 9, 64,
                         OMPK_ATTN_MASK_CAUSAL_BOTTOM_RIGHT, (uint64_t)(1400 + bf), 1.0, 0);
            double w = att_check_bwd(&c, "fully masked");
            cr_expect(w <= 1.0, "worst ratio %g", w);
            for (int64_t i = 0; i < c.dq.numel; i++) {
                double g = tu_buf_get(&c.dq, i);
                cr_expect(!isnan(g), "NaN in dq");
                if ((i / 64) % 40 < 31) cr_expect(g == 0.0, "masked row dq %g", g);
            }
            for (int64_t i = 0; i < c.dk.numel; i++)
                cr_expect(isfinite(tu_buf_get(&c.dk, i)) && isfinite(tu_buf_get(&c.dv, i)),
                          "non-finite dk/dv");
            att_case_free(&c);
        }
}

Test(attention_bwd, large_logits) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++)
        for (int m = 0; m < 3; m++) {
            att_case c;
            att_case_new(&c, devs[di], OMPK_F32, 1, 2, 1, 40, 50, 64, att_mask(m),
                         (uint64_t)(1500 + m), 30.0, 0);
            /* fp32 scores of std ~900 (up to ~4000 in the log2 domain the kernels use) are
             * summed with ~1e-3 absolute rounding, recomputed in the backward with another
             * rounding order than the forward's lse, so each O(1) term p_ij * dout_i of dv (and
             * of ds) moves by up to ~2e-3: the gradients get a 100x wider band (abs ~3e-3),
             * still far below the O(1) errors a wrong rescale or an overflow gives. */
            c.tol_mult = 100.0;
            double w = att_check_bwd(&c, "x30");
            cr_expect(w <= 1.0, "x30 mask=%s: worst ratio %g", att_mask_name(att_mask(m)), w);
            att_case_free(&c);
        }
}

/* dk/dv sum over the query heads of a group: repeated calls must be bit-identical. */
Test(attention_bwd, deterministic_repeats) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++)
        for (int bf = 0; bf < 2; bf++) {
            att_case c;
            att_case_new(&c, devs[di], bf ? OMPK_BF16 : OMPK_F32, 2, 8, 1, 77, 93, 64,
                         OMPK_ATTN_MASK_NONE, (uint64_t)(1600 + bf), 1.0, 0);
            cr_assert_eq(att_fwd(&c), OMPK_OK);
            cr_assert_eq(att_bwd(&c), OMPK_OK);
            tu_buf *g[3] = {&c.dq, &c.dk, &c.dv};
            void *first[3];
            for (int i = 0; i < 3; i++) {
                tu_buf_download(g[i]);
                first[i] = malloc(g[i]->bytes);
                memcpy(first[i], g[i]->host, g[i]->bytes);
            }
            for (int rep = 0; rep < 3; rep++) {
                for (int i = 0; i < 3; i++) tu_buf_fill_bytes(g[i], 0x5A);
                cr_assert_eq(att_bwd(&c), OMPK_OK);
                for (int i = 0; i < 3; i++) {
                    tu_buf_download(g[i]);
                    cr_expect(memcmp(first[i], g[i]->host, g[i]->bytes) == 0,
                              "gradient %d differs on repeat %d (%s)", i, rep,
                              tu_device_name(devs[di]));
                }
            }
            for (int i = 0; i < 3; i++) free(first[i]);
            att_case_free(&c);
        }
}

/* The geometry the entry points give the kernels for host case c (contiguous BHSD). */
static ompk_attn_geom host_geom(const att_case *c) {
    ompk_attn_geom g;
    memset(&g, 0, sizeof g);
    g.B = c->B, g.Hq = c->Hq, g.Hkv = c->Hkv, g.N = c->N, g.M = c->M, g.dh = c->dh;
    const int64_t qs[3] = {c->Hq * c->N * c->dh, c->N * c->dh, c->dh};
    const int64_t ks[3] = {c->Hkv * c->M * c->dh, c->M * c->dh, c->dh};
    const int64_t ls[3] = {c->Hq * c->N, c->N, 1};
    for (int d = 0; d < 3; d++) {
        g.qs[d] = g.os[d] = g.dos[d] = g.dqs[d] = qs[d];
        g.ks[d] = g.vs[d] = g.dks[d] = g.dvs[d] = ks[d];
        g.ls[d] = ls[d];
    }
    g.scale = (float)c->scale;
    g.mask = (int)c->p.mask;
    g.bf16 = c->dt == OMPK_BF16;
    return g;
}

/* amx-emulated, bf16, every mask with GQA: the API runs the AMX kernels (its forward equals a
 * direct call of the kernel bit for bit), and the forward and backward give the same bits on 1, 2
 * and 3 threads (each work item owns its outputs and sums in a fixed order). */
Test(attention_bwd, amx_emulated_runs_and_is_thread_count_invariant) {
    const ompk_device host = ompk_device_host();
    const int max_threads = omp_get_max_threads();
    for (int m = 0; m < 3; m++) {
        att_case c;
        att_case_new(&c, host, OMPK_BF16, 2, 4, 2, 77, 93, 80, att_mask(m), (uint64_t)(3100 + m),
                     1.0, 0);
        const ompk_attn_geom g = host_geom(&c);
        if (!ompk_attn_amx_ok(ompk_exec_for(host), &g, 1)) {
            att_case_free(&c);
            cr_skip_test("no AVX-512 BF16: the AMX kernels' emulation does not run here");
        }
        att_variant("amx-emulated");
        tu_buf *o[5] = {&c.out, &c.lse, &c.dq, &c.dk, &c.dv};
        void *first[5];
        const int threads[3] = {1, 2, 3};
        for (int th = 0; th < 3; th++) {
            omp_set_num_threads(threads[th]);
            for (int i = 0; i < 5; i++) tu_buf_fill_bytes(o[i], 0x5A);
            cr_assert_eq(att_fwd(&c), OMPK_OK, "%s", ompk_last_error());
            cr_assert_eq(att_bwd(&c), OMPK_OK, "%s", ompk_last_error());
            for (int i = 0; i < 5; i++) {
                tu_buf_download(o[i]);
                if (th == 0) {
                    first[i] = malloc(o[i]->bytes);
                    memcpy(first[i], o[i]->host, o[i]->bytes);
                }
                cr_expect(memcmp(first[i], o[i]->host, o[i]->bytes) == 0,
                          "mask %d output %d differs on %d threads", m, i, threads[th]);
            }
        }
        omp_set_num_threads(max_threads);
        att_variant(NULL);
        tu_buf_fill_bytes(&c.out, 0x5A);
        tu_buf_fill_bytes(&c.lse, 0x5A);
        cr_assert_eq(ompk_attn_fwd_amx(&g, c.q.host, c.k.host, c.v.host, c.out.host, c.lse.host, 1),
                     0);
        cr_expect(memcmp(first[0], c.out.host, c.out.bytes) == 0 &&
                      memcmp(first[1], c.lse.host, c.lse.bytes) == 0,
                  "mask %d: the amx-emulated forward is not the AMX kernel's", m);
        for (int i = 0; i < 5; i++) free(first[i]);
        att_case_free(&c);
    }
}

/* Every variant (att_variant: portable, the default order, amx-emulated) against the reference on
 * every device: on a GPU "fast" runs the tensor-core backward for bf16, where P and dS enter the
 * tensor cores as bf16 (twice the band, as in test_attention_fast_emu); on the host amx-emulated
 * runs the AMX kernels on the tile emulation. */
Test(attention_bwd, variants_match_reference) {
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
    for (int di = 0; di < nd; di++)
        for (int vi = 0; vi < 3; vi++) {
            att_variant(variants[vi]);
            for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
                for (int m = 0; m < 3; m++) {
                    att_case c;
                    att_case_new(&c, devs[di], OMPK_BF16, shapes[si].B, shapes[si].Hq,
                                 shapes[si].Hkv, shapes[si].N, shapes[si].M, shapes[si].dh,
                                 att_mask(m), (uint64_t)(1900 + si * 3 + (size_t)m), 1.0,
                                 shapes[si].bshd);
                    c.tol_mult = 2.0;
                    char label[160];
                    snprintf(label, sizeof label, "%s %s shape %zu mask=%s",
                             tu_device_name(devs[di]), variants[vi], si,
                             att_mask_name(att_mask(m)));
                    double w = att_check_bwd(&c, label);
                    cr_expect(w <= 1.0, "%s: worst ratio %g", label, w);
                    att_case_free(&c);
                }
            att_variant(NULL);
        }
}

/* The golden backward itself against central differences of the golden forward (double):
 * L = sum(out * dout), so dL/dx must match the reference gradients. Guards the oracle every
 * other backward check leans on. */
Test(attention_bwd, reference_matches_finite_differences) {
    const ompk_attention_mask ms[3] = {OMPK_ATTN_MASK_NONE, OMPK_ATTN_MASK_CAUSAL_TOP_LEFT,
                                       OMPK_ATTN_MASK_CAUSAL_BOTTOM_RIGHT};
    for (int mi = 0; mi < 3; mi++) {
        att_case c;
        att_case_new(&c, ompk_device_host(), OMPK_F32, 1, 4, 2, 5, 7, 32, ms[mi],
                     (uint64_t)(1700 + mi), 1.0, 0);
        ompk_tensor hq = att_host(&c.q, &c.tq), hk = att_host(&c.k, &c.tk);
        ompk_tensor hv = att_host(&c.v, &c.tv), hdo = att_host(&c.dout, &c.tdout);
        double *g[3];
        int64_t n[3] = {c.q.numel, c.k.numel, c.v.numel};
        for (int i = 0; i < 3; i++) g[i] = malloc(sizeof(double) * (size_t)n[i]);
        ompk_attention_ref_bwd(&hdo, &hq, &hk, &hv, NULL, c.scale, ms[mi], g[0], g[1], g[2]);
        double *o = malloc(sizeof(double) * (size_t)c.out.numel);
        tu_buf *bufs[3] = {&c.q, &c.k, &c.v};
        const double eps = 1e-3;
        double worst = 0;
        for (int t = 0; t < 3; t++)
            for (int64_t e = 0; e < n[t]; e += 7) {
                float *x = (float *)bufs[t]->host + e, x0 = *x;
                double lp = 0, lm = 0;
                *x = x0 + (float)eps;
                double xp = *x;
                ompk_attention_ref_fwd(&hq, &hk, &hv, c.scale, ms[mi], o, NULL);
                for (int64_t i = 0; i < c.out.numel; i++) lp += o[i] * tu_buf_get(&c.dout, i);
                *x = x0 - (float)eps;
                double xm = *x;
                ompk_attention_ref_fwd(&hq, &hk, &hv, c.scale, ms[mi], o, NULL);
                for (int64_t i = 0; i < c.out.numel; i++) lm += o[i] * tu_buf_get(&c.dout, i);
                *x = x0;
                double fd = (lp - lm) / (xp - xm),
                       err = fabs(fd - g[t][e]) / (1e-4 + 1e-3 * fabs(fd));
                worst = err > worst ? err : worst;
            }
        cr_expect(worst <= 1.0, "mask %s: reference gradient vs finite differences ratio %g",
                  att_mask_name(ms[mi]), worst);
        for (int i = 0; i < 3; i++) free(g[i]);
        free(o);
        att_case_free(&c);
    }
}

Test(attention_bwd, verify_mode_reports, .init = cr_redirect_stderr) {
    att_case c;
    att_case_new(&c, ompk_device_host(), OMPK_F32, 1, 4, 2, 9, 12, 32,
                 OMPK_ATTN_MASK_CAUSAL_BOTTOM_RIGHT, 1800, 1.0, 0);
    cr_assert_eq(att_fwd(&c), OMPK_OK);
    ompk_verify_force(1, -1);
    cr_assert_eq(att_bwd(&c), OMPK_OK);
    ompk_verify_force(-1, -1);
    fflush(stderr);
    char buf[4096] = {0};
    FILE *f = cr_get_redirected_stderr();
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    const char *names[3] = {"attention_bwd dq", "attention_bwd dk", "attention_bwd dv"};
    for (int i = 0; i < 3; i++)
        cr_expect(strstr(buf, names[i]) != NULL, "no %s line in: %s", names[i], buf);
    cr_expect(strstr(buf, "MISMATCH") == NULL, "verify reported a mismatch: %s", buf);
    att_case_free(&c);
}

/* No query rows: dk and dv are still outputs and must come back zero; no keys: every row is
 * fully masked and dq is zero. */
Test(attention_bwd, empty_lengths_write_zeros) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++) {
        att_case c;
        att_case_new(&c, devs[di], OMPK_F32, 1, 2, 1, 0, 5, 32, OMPK_ATTN_MASK_NONE, 3, 1.0, 0);
        cr_assert_eq(att_fwd(&c), OMPK_OK, "%s", ompk_last_error());
        cr_assert_eq(att_bwd(&c), OMPK_OK, "%s", ompk_last_error());
        tu_buf_download(&c.dk);
        tu_buf_download(&c.dv);
        for (int64_t i = 0; i < c.dk.numel; i++)
            cr_expect(tu_buf_get(&c.dk, i) == 0.0 && tu_buf_get(&c.dv, i) == 0.0,
                      "N = 0: dk/dv element %lld not zero", (long long)i);
        att_case_free(&c);
        att_case_new(&c, devs[di], OMPK_BF16, 1, 2, 1, 4, 0, 32, OMPK_ATTN_MASK_NONE, 4, 1.0, 0);
        cr_assert_eq(att_fwd(&c), OMPK_OK, "%s", ompk_last_error());
        cr_assert_eq(att_bwd(&c), OMPK_OK, "%s", ompk_last_error());
        tu_buf_download(&c.dq);
        for (int64_t i = 0; i < c.dq.numel; i++)
            cr_expect(tu_buf_get(&c.dq, i) == 0.0, "M = 0: dq element %lld not zero", (long long)i);
        att_case_free(&c);
    }
}
