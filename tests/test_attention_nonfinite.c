/* Non-finite inputs, extreme logits and empty sizes in ompk_attention_fwd / _bwd (KERNELS.md
 * section 2 and its conventions), on every device and both variants, f32 and bf16: a NaN or inf
 * in one q row, k row or v element makes exactly the outputs the float64 math makes non-finite
 * non-finite (a masked pair never carries it), a huge scale gives NaN or the right value, large
 * logits keep f32 gradients at fp32 accuracy, and verify mode agrees with the default kernels. */
#include <criterion/criterion.h>
#include <criterion/redirect.h>

#include "test_attention_common.h"

static const char *const variants[2] = {"fast", "portable"};

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

/* Forward and backward of c against the float64 reference under mode; dq and dk bands are
 * widened by dqk_mult. */
static void check_case(att_case *c, const char *label, cmp_mode mode, double dqk_mult) {
    cr_assert_eq(att_fwd(c), OMPK_OK, "%s: %s", label, ompk_last_error());
    cr_assert_eq(att_bwd(c), OMPK_OK, "%s: %s", label, ompk_last_error());
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
        char w[200];
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
static void poke_sweep(double val, cmp_mode mode) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    const int64_t nm[2][2] = {{37, 45}, {45, 37}};
    for (int di = 0; di < nd; di++)
        for (int vi = 0; vi < 2; vi++) {
            setenv("OMPK_ATTN_VARIANT", variants[vi], 1);
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
                                     tu_device_name(devs[di]), variants[vi], bf ? "bf16" : "f32",
                                     (long long)N, (long long)M, att_mask_name(att_mask(m)), val,
                                     "qkv"[which]);
                            check_case(&c, label, mode, 1.0);
                            att_case_free(&c);
                        }
        }
    unsetenv("OMPK_ATTN_VARIANT");
}

Test(attention_nonfinite, nan_in_q_k_v) {
    poke_sweep(NAN, CMP_NAN);
}

Test(attention_nonfinite, inf_in_q_k_v) {
    poke_sweep(INFINITY, CMP_NONFINITE);
    poke_sweep(-INFINITY, CMP_NONFINITE);
}

/* A finite scale large enough to overflow the fp32 scores: NaN (inf - inf) or the right value,
 * never a wrong finite one, and fully masked rows (bottom-right, N > M) still 0 / -inf. The
 * gradients' sums meet score errors times the scale itself, so only dv (no scale factor) is
 * held to the band; dq and dk must be NaN or finite. */
Test(attention_nonfinite, huge_scale) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++)
        for (int vi = 0; vi < 2; vi++) {
            setenv("OMPK_ATTN_VARIANT", variants[vi], 1);
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
                    check_case(&c, label, CMP_NAN_OK, 1e300);
                    att_case_free(&c);
                }
        }
    unsetenv("OMPK_ATTN_VARIANT");
}
