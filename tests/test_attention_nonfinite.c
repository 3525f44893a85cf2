/* Non-finite inputs, extreme logits and empty sizes in ompk_attention_fwd / _bwd (docs/KERNELS.md
 * section 2 and its conventions), on every device and every variant (att_variant), f32 and bf16: a
 * NaN or inf in one q row, k row or v element makes exactly the outputs the float64 math makes
 * non-finite non-finite (a masked pair never carries it), a huge scale gives NaN or the right
 * value, large logits keep f32 gradients at fp32 accuracy, and verify mode agrees with the default
 * kernels. */
#include <criterion/criterion.h>
#include <criterion/redirect.h>

#include <omp.h>

#include "attention_kernels.h"
#include "test_attention_common.h"
#include "verify.h"

static const char *const variants[3] = {"fast", "portable", "amx-emulated"};

typedef enum { CMP_NAN, CMP_NONFINITE, CMP_NAN_OK } cmp_mode;

/* Elements of b (view t) that break the rule against the float64 reference: CMP_NAN, NaN exactly
 * where ref is NaN; CMP_NONFINITE, non-finite exactly where ref is; CMP_NAN_OK, NaN anywhere
 * (the float math of an overflowing scale). Every other element is finite and within tol (an
 * infinite ref must match). Prints the first. */
static int64_t violations(const char *what, tu_buf *b, const ompk_tensor *t, const double *ref,
                          ompk_tol tol, cmp_mode mode) {
    tu_buf_download(b);
    ompk_tensor h = att_host(b, t);
    int64_t n = ompk_tensor_numel(t), bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double g = ompk_host_get(&h, i), r = ref[i];
        int ok;
        if (mode == CMP_NAN && (isnan(r) || isnan(g)))
            ok = isnan(r) && isnan(g);
        else if (mode == CMP_NONFINITE && (!isfinite(r) || !isfinite(g)))
            ok = !isfinite(r) && !isfinite(g);
        else if (mode == CMP_NAN_OK && isnan(g))
            ok = 1;
        else if (isinf(r) || !isfinite(g))
            ok = g == r;
        else
            ok = fabs(g - r) <= tol.atol + tol.rtol * fabs(r);
        if (!ok && bad++ == 0)
            fprintf(stderr, "%s: element %lld got %.9g want %.9g\n", what, (long long)i, g, r);
    }
    return bad;
}

/* Forward and backward of c through the public entry points. */
static void run_api(att_case *c, const char *label) {
    cr_assert_eq(att_fwd(c), OMPK_OK, "%s: %s", label, ompk_last_error());
    cr_assert_eq(att_bwd(c), OMPK_OK, "%s: %s", label, ompk_last_error());
}

/* Forward and backward of c (host buffers) through the portable kernels' GPU form (one row or
 * key per thread), run on the initial device: CI checks here what the GPU runs. */
static void run_scalar_bwd(att_case *c, int fwd_too) {
    ompk_attn_geom g = att_case_geom(c);
    if (c->p.scale != 0.f) g.scale = c->p.scale;
    const ompk_exec ex = {1, omp_get_initial_device()};
    float *dsum = malloc(sizeof(float) * (size_t)(2 * c->B * c->Hq * c->N + 1));
    if (fwd_too)
        ompk_attn_fwd_portable(ex, &g, c->q.host, c->k.host, c->v.host, c->out.host, c->lse.host);
    ompk_attn_bwd_portable(ex, &g, c->dout.host, c->q.host, c->k.host, c->v.host, c->out.host,
                           c->lse.host, c->dq.host, c->dk.host, c->dv.host, dsum);
    free(dsum);
}

static void run_scalar(att_case *c, const char *label) {
    (void)label;
    run_scalar_bwd(c, 1);
}

/* The public forward (on the host: other kernels, other rounding of the scores), then the GPU
 * form's backward, as a GPU runs the 3xTF32 forward before it. */
static void run_mixed(att_case *c, const char *label) {
    cr_assert_eq(att_fwd(c), OMPK_OK, "%s: %s", label, ompk_last_error());
    run_scalar_bwd(c, 0);
}

typedef void (*run_fn)(att_case *c, const char *label);

/* Forward and backward of c (by run) against the float64 reference under mode; dq and dk bands
 * are widened by dqk_mult. */
static void check_case(att_case *c, run_fn run, const char *label, cmp_mode mode, double dqk_mult) {
    run(c, label);
    tu_buf_download(&c->out);
    ompk_tensor hq = att_host(&c->q, &c->tq), hk = att_host(&c->k, &c->tk);
    ompk_tensor hv = att_host(&c->v, &c->tv), hdo = att_host(&c->dout, &c->tdout);
    ompk_tensor ho = att_host(&c->out, &c->tout);
    double *r[5];
    tu_buf *b[5] = {&c->out, &c->lse, &c->dq, &c->dk, &c->dv};
    const ompk_tensor *t[5] = {&c->tout, &c->tlse, &c->tdq, &c->tdk, &c->tdv};
    for (int i = 0; i < 5; i++) r[i] = malloc(sizeof(double) * (size_t)(b[i]->numel + 1));
    ompk_attention_ref_fwd(&hq, &hk, &hv, c->scale, c->p.mask, r[0], r[1]);
    ompk_attention_ref_bwd(&hdo, &hq, &hk, &hv, &ho, c->scale, c->p.mask, r[2], r[3], r[4]);
    const ompk_tol_att what[5] = {OMPK_TOL_ATT_OUT, OMPK_TOL_ATT_LSE, OMPK_TOL_ATT_DQ,
                                  OMPK_TOL_ATT_DKV, OMPK_TOL_ATT_DKV};
    const char *names[5] = {"out", "lse", "dq", "dk", "dv"};
    for (int i = 0; i < 5; i++) {
        char w[240];
        snprintf(w, sizeof w, "%s %s", label, names[i]);
        ompk_tol tol = att_tol(i == 1 ? OMPK_F32 : c->dt, what[i], c->Hq / c->Hkv, att_bf16_p(c),
                               c->tol_mult * (i == 2 || i == 3 ? dqk_mult : 1.0));
        int64_t bad = violations(w, b[i], t[i], r[i], tol, mode);
        cr_expect(bad == 0, "%s: %lld elements break the rule", w, (long long)bad);
        free(r[i]);
    }
}

/* One non-finite value in q (row N/2 of head 1, element 3), k (row M/2, element 7) or v (row
 * M/2, element 5), B1 Hq2 Hkv1 dh64. With N=37, M=45 (top-left: rows 16..20 share a row block
 * with rows that see key 22 but do not see it) and N=45, M=37 (bottom-right: rows 0..7 see
 * nothing). */
static void poke_sweep(double val, cmp_mode mode, int scalar) {
    ompk_device devs[4];
    int nd = scalar ? 1 : tu_devices(devs, 4);
    if (scalar) devs[0] = ompk_device_host();
    const int64_t nm[2][2] = {{37, 45}, {45, 37}};
    for (int di = 0; di < nd; di++)
        for (int vi = 0; vi < (scalar ? 1 : 3); vi++) {
            att_variant(variants[vi]);
            for (int bf = 0; bf < 2; bf++)
                for (int s = 0; s < 2; s++)
                    for (int m = 0; m < 3; m++)
                        for (int which = 0; which < 3; which++) {
                            const int64_t N = nm[s][0], M = nm[s][1], D = 64;
                            att_case c;
                            att_case_new(&c, devs[di], bf ? OMPK_BF16 : OMPK_F32, 1, 2, 1, N, M, D,
                                         att_mask(m), (uint64_t)(2000 + s * 10 + m), 1.0, 0);
                            tu_buf *in = which == 0 ? &c.q : which == 1 ? &c.k : &c.v;
                            int64_t at = which == 0   ? (N + N / 2) * D + 3
                                         : which == 1 ? (M / 2) * D + 7
                                                      : (M / 2) * D + 5;
                            tu_buf_set(in, at, val);
                            tu_buf_upload(in);
                            char label[200];
                            snprintf(label, sizeof label, "%s %s %s N=%lld M=%lld mask=%s %g in %c",
                                     tu_device_name(devs[di]), scalar ? "gpu-form" : variants[vi],
                                     bf ? "bf16" : "f32", (long long)N, (long long)M,
                                     att_mask_name(att_mask(m)), val, "qkv"[which]);
                            check_case(&c, scalar ? run_scalar : run_api, label, mode, 1.0);
                            att_case_free(&c);
                        }
        }
    att_variant(NULL);
}

Test(attention_nonfinite, nan_in_q_k_v) {
    poke_sweep(NAN, CMP_NAN, 0);
}

Test(attention_nonfinite, inf_in_q_k_v) {
    poke_sweep(INFINITY, CMP_NONFINITE, 0);
    poke_sweep(-INFINITY, CMP_NONFINITE, 0);
}

/* The same through the portable kernels' GPU form, on the host. */
Test(attention_nonfinite, gpu_form_nan_inf) {
    poke_sweep(NAN, CMP_NAN, 1);
    poke_sweep(INFINITY, CMP_NONFINITE, 1);
}

/* A finite scale large enough to overflow the fp32 scores: NaN (inf - inf) or the right value,
 * never a wrong finite one, and fully masked rows (bottom-right, N > M) still 0 / -inf. The
 * gradients' sums meet score errors times the scale itself, so only dv (no scale factor) is
 * held to the band; dq and dk must be NaN or finite. */
Test(attention_nonfinite, huge_scale) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++)
        for (int vi = 0; vi < 3; vi++) {
            att_variant(variants[vi]);
            for (int bf = 0; bf < 2; bf++)
                for (int m = 0; m < 3; m++) {
                    att_case c;
                    att_case_new(&c, devs[di], bf ? OMPK_BF16 : OMPK_F32, 1, 2, 1, 45, 37, 64,
                                 att_mask(m), (uint64_t)(2100 + m), 1.0, 0);
                    c.p.scale = 3e38f;
                    c.scale = (double)c.p.scale;
                    char label[160];
                    snprintf(label, sizeof label, "%s %s %s mask=%s scale 3e38",
                             tu_device_name(devs[di]), variants[vi], bf ? "bf16" : "f32",
                             att_mask_name(att_mask(m)));
                    check_case(&c, run_api, label, CMP_NAN_OK, 1e300);
                    att_case_free(&c);
                }
        }
    att_variant(NULL);
}

/* Error bounds of the f32 outputs of c that follow from fp32 rounding of the scores and sums,
 * per element, in units of eps (double, [out, lse, dq, dk, dv] in logical order). Score s_ij is
 * rounded with an error of about eps * S_ij, S_ij = scale * sum_d |q_id k_jd|, and p_ij moves by
 * p_ij (e_ij - sum_k p_ik e_ik) for score errors e: relatively by at most
 * r_ij = S_ij (1 - p_ij) + sum_{k != j} p_ik S_ik, which is 0 for the p = 1 of a one-hot row
 * whatever the logits. The fp32 lse the backward takes moves every p of its row by up to
 * |lse| relatively, unless the row sum rounds to 1 (then lse is the max score itself). */
static void bounds(const att_case *c, double *bo, double *bl, double *bq, double *bk, double *bv) {
    const int64_t N = c->N, M = c->M, D = c->dh, G = c->Hq / c->Hkv;
    double *p = malloc(sizeof(double) * (size_t)M), *S = malloc(sizeof(double) * (size_t)M);
    double *dp = malloc(sizeof(double) * (size_t)M), *A = malloc(sizeof(double) * (size_t)M);
    for (int64_t i = 0; i < c->dk.numel; i++) bk[i] = bv[i] = 0;
    for (int64_t h = 0; h < c->Hq; h++)
        for (int64_t i = 0; i < N; i++) {
            const int64_t row = h * N + i, kh = h / G;
            const int64_t lim = ompk_attention_key_limit(c->p.mask, i, N, M);
            double mx = -INFINITY, sum = 0, Sbar = 0, Smax = 0, Di = 0, Bi = 0;
            for (int64_t j = 0; j < lim; j++) {
                double sv = 0, sa = 0;
                for (int64_t d = 0; d < D; d++) {
                    double x =
                        tu_buf_get(&c->q, row * D + d) * tu_buf_get(&c->k, (kh * M + j) * D + d);
                    sv += x, sa += fabs(x);
                }
                p[j] = sv * c->scale, S[j] = sa * c->scale;
                mx = p[j] > mx ? p[j] : mx;
                Smax = S[j] > Smax ? S[j] : Smax;
            }
            for (int64_t j = 0; j < lim; j++) sum += (p[j] = exp(p[j] - mx));
            for (int64_t d = 0; d < D; d++) {
                double x = tu_buf_get(&c->dout, row * D + d) * tu_buf_get(&c->out, row * D + d);
                Di += x, Bi += fabs(x);
            }
            for (int64_t j = 0; j < lim; j++) {
                p[j] /= sum;
                Sbar += p[j] * S[j];
                double sv = 0, sa = 0;
                for (int64_t d = 0; d < D; d++) {
                    double x =
                        tu_buf_get(&c->dout, row * D + d) * tu_buf_get(&c->v, (kh * M + j) * D + d);
                    sv += x, sa += fabs(x);
                }
                dp[j] = sv, A[j] = sa;
            }
            bl[row] = Smax + fabs(mx + log(sum));
            const double lr = sum - 1 > 0x1p-25 ? fabs(mx + log(sum)) : 0;
            for (int64_t d = 0; d < D; d++) {
                double o = 0, q = 0;
                for (int64_t j = 0; j < lim; j++) {
                    const int64_t kj = (kh * M + j) * D + d;
                    const double r = 1 + S[j] * (1 - p[j]) + Sbar - p[j] * S[j] + lr;
                    const double w = p[j] * (A[j] + Bi + fabs(dp[j] - Di) * r);
                    o += p[j] * r * fabs(tu_buf_get(&c->v, kj));
                    q += w * fabs(tu_buf_get(&c->k, kj));
                    bk[kj] += c->scale * w * fabs(tu_buf_get(&c->q, row * D + d));
                    bv[kj] += p[j] * r * fabs(tu_buf_get(&c->dout, row * D + d));
                }
                bo[row * D + d] = o;
                bq[row * D + d] = c->scale * q;
            }
        }
    free(p), free(S), free(dp), free(A);
}

/* max over elements of |b - ref| / (eps * bound + 1e-30), NaN counting as infinite; the floor
 * covers fp32 underflow of p (about 1e-38 per term). */
static double err_ratio(tu_buf *b, const ompk_tensor *t, const double *ref, const double *bound) {
    tu_buf_download(b);
    ompk_tensor h = att_host(b, t);
    double e = 0;
    int64_t wi = 0;
    for (int64_t i = 0; i < b->numel; i++) {
        double d = fabs(ompk_host_get(&h, i) - ref[i]) / (0x1p-24 * bound[i] + 1e-30);
        if (d > e || isnan(d)) e = d, wi = i;
    }
    if (e > 8)
        fprintf(stderr, "  worst at %lld: got %.9g want %.9g bound %.3g\n", (long long)wi,
                ompk_host_get(&h, wi), ref[wi], bound[wi]);
    return e;
}

/* f32 softmax statistics agree between forward and backward at any logit size: B1 H2 N128 M256
 * dh64, no mask (scale 1/8) and bottom-right (scale 0.1), scores of std 1, 100 and 1e4 (q, k of
 * std 1, 10, 100). Each
 * f32 output stays within a small multiple of eps times the bound its own rounding allows
 * (bounds() above) against the float64 reference. A forward lse that the backward's scores do
 * not reproduce moves the one-hot rows' p = 1 by an ulp of the logit, far outside that. */
static void large_logits(run_fn run, ompk_device dev, const char *vname) {
    const double stds[3] = {1.0, 10.0, 100.0};
    for (int si = 0; si < 3; si++)
        for (int m = 0; m < 2; m++) {
            att_case c;
            att_case_new(&c, dev, OMPK_F32, 1, 2, 1, 128, 256, 64,
                         m ? OMPK_ATTN_MASK_CAUSAL_BOTTOM_RIGHT : OMPK_ATTN_MASK_NONE,
                         (uint64_t)(2200 + si), stds[si], 0);
            if (m) /* a scale whose products round: a score fused into s * scale - lse differs */
                c.p.scale = 0.1f, c.scale = (double)0.1f;
            run(&c, vname);
            tu_buf_download(&c.out);
            ompk_tensor hq = att_host(&c.q, &c.tq), hk = att_host(&c.k, &c.tk);
            ompk_tensor hv = att_host(&c.v, &c.tv), hdo = att_host(&c.dout, &c.tdout);
            ompk_tensor ho = att_host(&c.out, &c.tout);
            double *r[5], *bd[5];
            tu_buf *b[5] = {&c.out, &c.lse, &c.dq, &c.dk, &c.dv};
            const ompk_tensor *t[5] = {&c.tout, &c.tlse, &c.tdq, &c.tdk, &c.tdv};
            for (int i = 0; i < 5; i++) {
                r[i] = malloc(sizeof(double) * (size_t)(b[i]->numel + 1));
                bd[i] = malloc(sizeof(double) * (size_t)(b[i]->numel + 1));
            }
            ompk_attention_ref_fwd(&hq, &hk, &hv, c.scale, c.p.mask, r[0], r[1]);
            ompk_attention_ref_bwd(&hdo, &hq, &hk, &hv, &ho, c.scale, c.p.mask, r[2], r[3], r[4]);
            bounds(&c, bd[0], bd[1], bd[2], bd[3], bd[4]);
            const char *names[5] = {"out", "lse", "dq", "dk", "dv"};
            for (int i = 0; i < 5; i++) {
                double e = err_ratio(b[i], t[i], r[i], bd[i]);
                cr_expect(e <= 8.0, "%s %s q,k std %g mask %d %s: %.3g eps x bound",
                          tu_device_name(dev), vname, stds[si], m, names[i], e);
                free(r[i]);
                free(bd[i]);
            }
            att_case_free(&c);
        }
}

Test(attention_nonfinite, large_logits_f32_accuracy) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++)
        for (int vi = 0; vi < 3; vi++) {
            att_variant(variants[vi]);
            large_logits(run_api, devs[di], variants[vi]);
        }
    att_variant(NULL);
    large_logits(run_scalar, ompk_device_host(), "gpu-form");
    large_logits(run_mixed, ompk_device_host(), "host fwd, gpu-form bwd");
}

static int all_equal(tu_buf *b, double want) {
    tu_buf_download(b);
    for (int64_t i = 0; i < b->numel; i++)
        if (tu_buf_get(b, i) != want) return 0;
    return 1;
}

/* Empty k/v (M = 0) or q (N = 0) with NULL data, as the descriptor checks allow: an M = 0 call
 * has every row fully masked (o = 0, lse = -inf, dq = 0), an N = 0 backward writes dk = dv = 0,
 * and no kernel offsets the NULL pointers (UBSan's pointer-overflow check sees that: the kv
 * head 1 and query head 1 would give nonzero offsets). */
Test(attention_nonfinite, empty_sizes_null_data) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++)
        for (int vi = 0; vi < 3; vi++) {
            att_variant(variants[vi]);
            for (int bf = 0; bf < 2; bf++) {
                att_case c;
                att_case_new(&c, devs[di], bf ? OMPK_BF16 : OMPK_F32, 1, 4, 2, 20, 16, 64,
                             OMPK_ATTN_MASK_NONE, 2300, 1.0, 0);
                const char *name = tu_device_name(devs[di]);
                ompk_tensor k = c.tk, v = c.tv, dk = c.tdk, dv = c.tdv;
                k.shape[2] = v.shape[2] = dk.shape[2] = dv.shape[2] = 0;
                k.data = v.data = dk.data = dv.data = NULL;
                cr_expect_eq(ompk_attention_fwd(&c.tq, &k, &v, &c.tout, &c.tlse, &c.p), OMPK_OK,
                             "%s M=0 fwd: %s", name, ompk_last_error());
                cr_expect(all_equal(&c.out, 0.0) && all_equal(&c.lse, -INFINITY),
                          "%s %s M=0: out 0 and lse -inf", name, variants[vi]);
                cr_expect_eq(ompk_attention_bwd(&c.tdout, &c.tq, &k, &v, &c.tout, &c.tlse, &c.tdq,
                                                &dk, &dv, &c.p),
                             OMPK_OK, "%s M=0 bwd: %s", name, ompk_last_error());
                cr_expect(all_equal(&c.dq, 0.0), "%s %s M=0: dq 0", name, variants[vi]);

                ompk_tensor q = c.tq, out = c.tout, dout = c.tdout, dq = c.tdq, lse = c.tlse;
                q.shape[2] = out.shape[2] = dout.shape[2] = dq.shape[2] = lse.shape[2] = 0;
                q.data = out.data = dout.data = dq.data = lse.data = NULL;
                cr_expect_eq(ompk_attention_fwd(&q, &c.tk, &c.tv, &out, &lse, &c.p), OMPK_OK,
                             "%s N=0 fwd: %s", name, ompk_last_error());
                cr_expect_eq(ompk_attention_bwd(&dout, &q, &c.tk, &c.tv, &out, &lse, &dq, &c.tdk,
                                                &c.tdv, &c.p),
                             OMPK_OK, "%s N=0 bwd: %s", name, ompk_last_error());
                cr_expect(all_equal(&c.dk, 0.0) && all_equal(&c.dv, 0.0), "%s %s N=0: dk, dv 0",
                          name, variants[vi]);
                att_case_free(&c);
            }
        }
    att_variant(NULL);
}

/* Verify mode (OMPK_VERIFY=1) checks each call with the bands the suites use: the default bf16
 * backward at B2 Hq4 Hkv2 N200 M67 dh64, bottom-right, reports no MISMATCH (the host AVX-512
 * BF16 backward rounds P and dS to bf16; a band for one rounding flagged 3 dq, 7 dk and 13 dv
 * elements), and neither does the forward or the f32 pair. */
Test(attention_nonfinite, verify_mode_agrees, .init = cr_redirect_stderr) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    ompk_verify_force(1, -1);
    for (int di = 0; di < nd; di++)
        for (int bf = 0; bf < 2; bf++) {
            att_case c;
            att_case_new(&c, devs[di], bf ? OMPK_BF16 : OMPK_F32, 2, 4, 2, 200, 67, 64,
                         OMPK_ATTN_MASK_CAUSAL_BOTTOM_RIGHT, 2400, 1.0, 0);
            const int64_t before = ompk_verify_mismatches();
            cr_assert_eq(att_fwd(&c), OMPK_OK);
            cr_assert_eq(att_bwd(&c), OMPK_OK);
            cr_expect_eq(ompk_verify_mismatches(), before, "%s %s: %lld verify mismatches",
                         tu_device_name(devs[di]), bf ? "bf16" : "f32",
                         (long long)(ompk_verify_mismatches() - before));
            att_case_free(&c);
        }
    ompk_verify_force(-1, -1);
}
