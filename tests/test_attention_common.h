/* Shared by the attention suites: a case (q, k, v, out, lse, dout, dq, dk, dv mirrored on one
 * device, contiguous BHSD or strided BSHD views), reference comparison in logical order, and
 * the tolerances the suites use. */
#ifndef TEST_ATTENTION_COMMON_H
#define TEST_ATTENTION_COMMON_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention_ref.h"
#include "ompk/attention.h"
#include "test_util.h"
#include "tolerance.h"
#include "variant.h"
#include "verify.h"

typedef struct att_case {
    ompk_device dev;
    ompk_dtype dt;
    int64_t B, Hq, Hkv, N, M, dh;
    ompk_attention_params p;
    double scale;    /* resolved */
    double tol_mult; /* widens every tolerance (large-logit cases) */
    tu_buf q, k, v, out, lse, dout, dq, dk, dv;
    ompk_tensor tq, tk, tv, tout, tlse, tdout, tdq, tdk, tdv;
} att_case;

/* A [B,H,L,dh] view of b: BHSD (contiguous) or, with bshd, the [B,L,H,dh] storage models use. */
static inline ompk_tensor att_view(const tu_buf *b, int64_t B, int64_t H, int64_t L, int64_t D,
                                   int bshd) {
    int64_t shape[4] = {B, H, L, D};
    ompk_tensor t = tu_view(b, 4, shape);
    if (bshd) {
        t.strides[0] = L * H * D;
        t.strides[1] = D;
        t.strides[2] = H * D;
        t.strides[3] = 1;
    }
    return t;
}

/* Inputs N(0, qk_std^2) for q and k, N(0,1) for v and dout; outputs poisoned with 0xA5. */
static inline void att_case_new(att_case *c, ompk_device dev, ompk_dtype dt, int64_t B, int64_t Hq,
                                int64_t Hkv, int64_t N, int64_t M, int64_t dh,
                                ompk_attention_mask mask, uint64_t seed, double qk_std, int bshd) {
    memset(c, 0, sizeof *c);
    c->dev = dev, c->dt = dt, c->B = B, c->Hq = Hq, c->Hkv = Hkv, c->N = N, c->M = M;
    c->dh = dh;
    c->p = ompk_attention_params_default();
    c->p.mask = mask;
    c->scale = 1.0 / sqrt((double)dh);
    c->tol_mult = 1.0;
    tu_rng r = tu_rng_make(seed);
    int64_t nq = B * Hq * N * dh, nk = B * Hkv * M * dh;
    c->q = tu_buf_new(dev, dt, nq);
    c->k = tu_buf_new(dev, dt, nk);
    c->v = tu_buf_new(dev, dt, nk);
    c->out = tu_buf_new(dev, dt, nq);
    c->lse = tu_buf_new(dev, OMPK_F32, B * Hq * N);
    c->dout = tu_buf_new(dev, dt, nq);
    c->dq = tu_buf_new(dev, dt, nq);
    c->dk = tu_buf_new(dev, dt, nk);
    c->dv = tu_buf_new(dev, dt, nk);
    tu_buf_randn(&c->q, &r, qk_std);
    tu_buf_randn(&c->k, &r, qk_std);
    tu_buf_randn(&c->v, &r, 1.0);
    tu_buf_randn(&c->dout, &r, 1.0);
    tu_buf *outs[] = {&c->out, &c->lse, &c->dq, &c->dk, &c->dv};
    for (int i = 0; i < 5; i++) tu_buf_fill_bytes(outs[i], 0xA5);
    c->tq = att_view(&c->q, B, Hq, N, dh, bshd);
    c->tk = att_view(&c->k, B, Hkv, M, dh, bshd);
    c->tv = att_view(&c->v, B, Hkv, M, dh, bshd);
    c->tout = att_view(&c->out, B, Hq, N, dh, bshd);
    c->tdout = att_view(&c->dout, B, Hq, N, dh, bshd);
    c->tdq = att_view(&c->dq, B, Hq, N, dh, bshd);
    c->tdk = att_view(&c->dk, B, Hkv, M, dh, bshd);
    c->tdv = att_view(&c->dv, B, Hkv, M, dh, bshd);
    int64_t ls[3] = {B, Hq, N};
    c->tlse = tu_view(&c->lse, 3, ls);
}

static inline void att_case_free(att_case *c) {
    tu_buf *all[] = {&c->q, &c->k, &c->v, &c->out, &c->lse, &c->dout, &c->dq, &c->dk, &c->dv};
    for (int i = 0; i < 9; i++) tu_buf_free(all[i]);
}

/* Host view of the host mirror of b with t's shape and strides. */
static inline ompk_tensor att_host(const tu_buf *b, const ompk_tensor *t) {
    ompk_tensor h = *t;
    h.data = b->host;
    h.device = ompk_device_host();
    return h;
}

#ifdef OMPK_ATTENTION_KERNELS_H
/* The kernels' geometry of case c (suites that call the kernels directly): shapes, the strides of
 * its nine tensors, its scale and mask, bf16 from its dtype. */
static inline ompk_attn_geom att_case_geom(const att_case *c) {
    ompk_attn_geom g;
    memset(&g, 0, sizeof g);
    g.B = c->B, g.Hq = c->Hq, g.Hkv = c->Hkv, g.N = c->N, g.M = c->M, g.dh = c->dh;
    const ompk_tensor *ts[9] = {&c->tq,    &c->tk,  &c->tv,  &c->tout, &c->tlse,
                                &c->tdout, &c->tdq, &c->tdk, &c->tdv};
    int64_t *ss[9] = {g.qs, g.ks, g.vs, g.os, g.ls, g.dos, g.dqs, g.dks, g.dvs};
    for (int i = 0; i < 9; i++)
        for (int d = 0; d < 3; d++) ss[i][d] = ts[i]->strides[d];
    g.scale = (float)c->scale;
    g.mask = (int)c->p.mask;
    g.bf16 = c->dt == OMPK_BF16;
    return g;
}
#endif

static inline ompk_status att_fwd(att_case *c) {
    return ompk_attention_fwd(&c->tq, &c->tk, &c->tv, &c->tout, &c->tlse, &c->p);
}

static inline ompk_status att_bwd(att_case *c) {
    return ompk_attention_bwd(&c->tdout, &c->tq, &c->tk, &c->tv, &c->tout, &c->tlse, &c->tdq,
                              &c->tdk, &c->tdv, &c->p);
}

/* Worst |got-ref| / (atol + rtol |ref|) in logical order; infinite ref values must match
 * exactly, and any NaN fails (returns INFINITY). Downloads b first. */
static inline double att_worst(const char *what, tu_buf *b, const ompk_tensor *t, const double *ref,
                               ompk_tol tol) {
    tu_buf_download(b);
    ompk_tensor h = att_host(b, t);
    int64_t n = ompk_tensor_numel(t), wi = -1;
    double worst = 0, wg = 0, wr = 0;
    for (int64_t i = 0; i < n; i++) {
        double g = ompk_host_get(&h, i), r = ref[i], e;
        if (isnan(g) || isnan(r))
            e = INFINITY;
        else if (isinf(r) || isinf(g))
            e = g == r ? 0 : INFINITY;
        else
            e = fabs(g - r) / (tol.atol + tol.rtol * fabs(r));
        if (e > worst || wi < 0) {
            if (e > worst) worst = e;
            wi = i, wg = g, wr = r;
        }
    }
    if (worst > 1.0)
        fprintf(stderr, "%s: worst at %lld: got %.9g want %.9g (ratio %.3g)\n", what, (long long)wi,
                wg, wr, worst);
    return worst;
}

/* Tolerance scale of each output. out is a convex combination of v rows and lse a log-sum:
 * unit scale. dq, dk, dv sum up to M (dq) or G*N (dk, dv) terms whose size shrinks as 1/length
 * for spread-out softmax rows; sqrt(G) covers the group sum. bf16 adds that out (rounded) feeds
 * D = rowsum(dout * out) in the backward, an error the double reference does not make. */
static inline ompk_tol att_tol_m(ompk_dtype dt, double scale, double mult) {
    ompk_tol t = ompk_tol_for(dt, scale);
    t.atol *= mult;
    t.rtol *= mult;
    return t;
}

/* The band of one attention output, from the source verify mode uses (ompk_tol_attention),
 * widened by mult. */
static inline ompk_tol att_tol(ompk_dtype dt, ompk_tol_att what, int64_t group, int bf16_p,
                               double mult) {
    ompk_tol t = ompk_tol_attention(dt, what, group, bf16_p);
    t.atol *= mult;
    t.rtol *= mult;
    return t;
}

/* Whether this thread's attention calls run the portable kernels (att_variant). */
static _Thread_local int att_portable;

/* "portable": the portable kernels for the attention forward and backward on this thread's later
 * calls; "amx-emulated": the AMX kernels on the tile emulation where they serve (bf16 on a CPU
 * with AVX-512 BF16), else the default order; "fast" or NULL: the default order (GPU tensor
 * cores, host AMX or AVX-512, where they serve). */
static inline void att_variant(const char *v) {
    att_portable = v && strcmp(v, "portable") == 0;
    const char *name = att_portable ? "portable" : NULL;
    if (v && strcmp(v, "amx-emulated") == 0) name = v;
    cr_assert_eq(ompk_variant_force("attention_fwd", name), OMPK_OK);
    cr_assert_eq(ompk_variant_force("attention_bwd", name), OMPK_OK);
}

/* Whether the kernels c runs may round P and dS to bf16: every bf16 variant but the portable
 * one (the GPU tensor-core kernels, the host AMX and AVX-512 BF16 kernels). */
static inline int att_bf16_p(const att_case *c) {
    return c->dt == OMPK_BF16 && !att_portable;
}

/* Forward on c and comparison with the reference; returns the worst ratio of out and lse. */
static inline double att_check_fwd(att_case *c, const char *label) {
    ompk_status st = att_fwd(c);
    cr_assert_eq(st, OMPK_OK, "%s: fwd failed: %s", label, ompk_last_error());
    ompk_tensor hq = att_host(&c->q, &c->tq), hk = att_host(&c->k, &c->tk);
    ompk_tensor hv = att_host(&c->v, &c->tv);
    double *ro = malloc(sizeof(double) * (size_t)(c->out.numel + 1));
    double *rl = malloc(sizeof(double) * (size_t)(c->lse.numel + 1));
    ompk_attention_ref_fwd(&hq, &hk, &hv, c->scale, c->p.mask, ro, rl);
    char what[200];
    snprintf(what, sizeof what, "%s out", label);
    const int64_t G = c->Hq / c->Hkv;
    double w1 = att_worst(what, &c->out, &c->tout, ro,
                          att_tol(c->dt, OMPK_TOL_ATT_OUT, G, att_bf16_p(c), c->tol_mult));
    snprintf(what, sizeof what, "%s lse", label);
    double w2 = att_worst(what, &c->lse, &c->tlse, rl,
                          att_tol(OMPK_F32, OMPK_TOL_ATT_LSE, G, 0, c->tol_mult));
    free(ro);
    free(rl);
    return w1 > w2 ? w1 : w2;
}

/* Forward then backward on c; compares dq, dk, dv with the reference. */
static inline double att_check_bwd(att_case *c, const char *label) {
    ompk_status st = att_fwd(c);
    cr_assert_eq(st, OMPK_OK, "%s: fwd failed: %s", label, ompk_last_error());
    st = att_bwd(c);
    cr_assert_eq(st, OMPK_OK, "%s: bwd failed: %s", label, ompk_last_error());
    ompk_tensor hq = att_host(&c->q, &c->tq), hk = att_host(&c->k, &c->tk);
    ompk_tensor hv = att_host(&c->v, &c->tv), hdo = att_host(&c->dout, &c->tdout);
    double *rq = malloc(sizeof(double) * (size_t)(c->dq.numel + 1));
    double *rk = malloc(sizeof(double) * (size_t)(c->dk.numel + 1));
    double *rv = malloc(sizeof(double) * (size_t)(c->dv.numel + 1));
    tu_buf_download(&c->out); /* the reference takes D from the stored out, as the kernel */
    ompk_tensor ho = att_host(&c->out, &c->tout);
    ompk_attention_ref_bwd(&hdo, &hq, &hk, &hv, &ho, c->scale, c->p.mask, rq, rk, rv);
    /* Kernels that round P and dS to bf16 get the band that rounding needs (tolerance.h). */
    const int64_t G = c->Hq / c->Hkv;
    const int bp = att_bf16_p(c);
    char what[200];
    snprintf(what, sizeof what, "%s dq", label);
    double w =
        att_worst(what, &c->dq, &c->tdq, rq, att_tol(c->dt, OMPK_TOL_ATT_DQ, G, bp, c->tol_mult));
    snprintf(what, sizeof what, "%s dk", label);
    double w2 =
        att_worst(what, &c->dk, &c->tdk, rk, att_tol(c->dt, OMPK_TOL_ATT_DKV, G, bp, c->tol_mult));
    snprintf(what, sizeof what, "%s dv", label);
    double w3 =
        att_worst(what, &c->dv, &c->tdv, rv, att_tol(c->dt, OMPK_TOL_ATT_DKV, G, bp, c->tol_mult));
    free(rq);
    free(rk);
    free(rv);
    w = w2 > w ? w2 : w;
    return w3 > w ? w3 : w;
}

/* Elements that are non-finite where the reference is finite or the other way round, and with
 * nan_exact (NaN inputs) whose NaN-ness differs from the reference's: the non-finite cases of
 * the emulation suites. Downloads b first. */
static inline int64_t att_nonfinite_mismatch(const char *what, tu_buf *b, const ompk_tensor *t,
                                             const double *ref, int nan_exact) {
    tu_buf_download(b);
    ompk_tensor h = att_host(b, t);
    int64_t n = ompk_tensor_numel(t), bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double g = ompk_host_get(&h, i), r = ref[i];
        if (isfinite(g) != isfinite(r) || (nan_exact && isnan(g) != isnan(r))) {
            if (bad++ == 0)
                fprintf(stderr, "%s: element %lld got %.9g want %.9g\n", what, (long long)i, g, r);
        }
    }
    return bad;
}

/* Elements that are neither NaN (the float math of an overflowing scale may give it) nor
 * within tol of the reference: a wrong finite value. Downloads b first. */
static inline int64_t att_nan_or_close(const char *what, tu_buf *b, const ompk_tensor *t,
                                       const double *ref, ompk_tol tol) {
    tu_buf_download(b);
    ompk_tensor h = att_host(b, t);
    int64_t n = ompk_tensor_numel(t), bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double g = ompk_host_get(&h, i), r = ref[i];
        int ok = isnan(g) || (isinf(r) ? g == r : fabs(g - r) <= tol.atol + tol.rtol * fabs(r));
        if (!ok && bad++ == 0)
            fprintf(stderr, "%s: element %lld got %.9g want %.9g\n", what, (long long)i, g, r);
    }
    return bad;
}

static inline const char *att_mask_name(ompk_attention_mask m) {
    return m == OMPK_ATTN_MASK_NONE ? "none" : m == OMPK_ATTN_MASK_CAUSAL_TOP_LEFT ? "tl" : "br";
}

/* The reference sweeps the forward and backward suites share; `check` is att_check_fwd or
 * att_check_bwd, and each suite passes its own shapes and seeds. */
typedef double (*att_check_fn)(att_case *c, const char *label);

/* The three masks, m = 0..2 */
static inline ompk_attention_mask att_mask(int m) {
    return m == 0   ? OMPK_ATTN_MASK_NONE
           : m == 1 ? OMPK_ATTN_MASK_CAUSAL_TOP_LEFT
                    : OMPK_ATTN_MASK_CAUSAL_BOTTOM_RIGHT;
}

static inline void att_expect(att_check_fn check, att_case *c, const char *label) {
    double w = check(c, label);
    cr_expect(w <= 1.0, "%s: worst ratio %g", label, w);
    att_case_free(c);
}

/* Every supported dh on every device at one shape, the odd-numbered dh on strided BSHD views. */
static inline void att_sweep_head_dims(att_check_fn check, ompk_dtype dt, int64_t Hq, int64_t Hkv,
                                       int64_t N, int64_t M, ompk_attention_mask mask,
                                       uint64_t seed0) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    const int64_t dhs[6] = {32, 64, 80, 96, 128, 256};
    for (int di = 0; di < nd; di++)
        for (int i = 0; i < 6; i++) {
            att_case c;
            att_case_new(&c, devs[di], dt, 1, Hq, Hkv, N, M, dhs[i], mask, seed0 + (uint64_t)i, 1.0,
                         i % 2);
            char label[128];
            snprintf(label, sizeof label, "%s %s dh=%lld", tu_device_name(devs[di]),
                     ompk_dtype_name(dt), (long long)dhs[i]);
            att_expect(check, &c, label);
        }
}

/* Each (N, M) pair with each mask on every device (dh 32, f32 and bf16 alternating). */
static inline void att_sweep_lengths(att_check_fn check, const int64_t (*nm)[2], size_t count,
                                     int64_t Hq, int64_t Hkv, uint64_t seed0) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++)
        for (size_t s = 0; s < count; s++)
            for (int m = 0; m < 3; m++) {
                ompk_dtype dt = (s + (size_t)m) % 2 ? OMPK_BF16 : OMPK_F32;
                att_case c;
                att_case_new(&c, devs[di], dt, 1, Hq, Hkv, nm[s][0], nm[s][1], 32, att_mask(m),
                             seed0 + (uint64_t)(s * 3 + (size_t)m), 1.0, 0);
                char label[160];
                snprintf(label, sizeof label, "%s %s N=%lld M=%lld mask=%s",
                         tu_device_name(devs[di]), ompk_dtype_name(dt), (long long)nm[s][0],
                         (long long)nm[s][1], att_mask_name(att_mask(m)));
                att_expect(check, &c, label);
            }
}

/* The emulated backward run(c) with one NaN in q, k or v (B1 H1 N40 M33 dh64, seeds seed0 + mask):
 * dq, dk, dv NaN exactly where the float64 math gives NaN. Unmasked for q and k; v also under
 * the causal masks, which the entry points run on the tensor-core kernels (a masked dS is a
 * select, and v enters no mma beside a masked pair). */
static inline void att_emu_bwd_nan(ompk_dtype dt, uint64_t seed0, int (*run)(att_case *)) {
    for (int m = 0; m < 3; m++)
        for (int which = 0; which < 3; which++) {
            if (m != 0 && which != 2) continue;
            att_case c;
            att_case_new(&c, ompk_device_host(), dt, 1, 1, 1, 40, 33, 64, att_mask(m),
                         seed0 + (uint64_t)m, 1.0, 0);
            tu_buf *in = which == 0 ? &c.q : which == 1 ? &c.k : &c.v;
            tu_buf_set(in, which == 0 ? 30 * 64 + 3 : which == 1 ? 20 * 64 + 7 : 20 * 64 + 5, NAN);
            cr_assert(run(&c), "an emulated team of 128 threads diverged");
            ompk_tensor hq = att_host(&c.q, &c.tq), hk = att_host(&c.k, &c.tk);
            ompk_tensor hv = att_host(&c.v, &c.tv), hdo = att_host(&c.dout, &c.tdout);
            ompk_tensor ho = att_host(&c.out, &c.tout);
            double *r[3];
            tu_buf *b[3] = {&c.dq, &c.dk, &c.dv};
            const ompk_tensor *t[3] = {&c.tdq, &c.tdk, &c.tdv};
            for (int i = 0; i < 3; i++) r[i] = malloc(sizeof(double) * (size_t)(b[i]->numel + 1));
            ompk_attention_ref_bwd(&hdo, &hq, &hk, &hv, &ho, c.scale, att_mask(m), r[0], r[1],
                                   r[2]);
            for (int i = 0; i < 3; i++) {
                char what[100];
                snprintf(what, sizeof what, "%s bwd NaN in %c mask=%s d%c",
                         dt == OMPK_BF16 ? "bf16" : "f32", "qkv"[which], att_mask_name(att_mask(m)),
                         "qkv"[i]);
                cr_expect_eq(att_nonfinite_mismatch(what, b[i], t[i], r[i], 1), 0, "%s", what);
                free(r[i]);
            }
            att_case_free(&c);
        }
}

/* The non-finite sweep of the tensor-core emulation suites (run: one kernel over c, 0 when no
 * team could form): NaN or inf in one q row (element 3 of row 30), NaN, inf or -inf in one k row
 * (element 7 of key 20; -inf as a score operand is the 3xTF32 split's hard case), NaN or inf in
 * v (element 5 of key 20), B1 H1 N40 M33 dh64, every mask (bottom-right: rows 0..6 see
 * nothing). out and lse are non-finite exactly where the float64 math makes them so (NaN exactly
 * where it gives NaN, for NaN inputs). v runs unmasked only (see the callers). */
static inline void att_emu_nonfinite(ompk_dtype dt, int (*run)(att_case *)) {
    const double vals[3] = {NAN, INFINITY, -INFINITY};
    for (int vi = 0; vi < 3; vi++)
        for (int m = 0; m < 3; m++)
            for (int which = 0; which < 3; which++) {
                if ((which == 2 && m != 0) || (vi == 2 && which != 1)) continue;
                att_case c;
                att_case_new(&c, ompk_device_host(), dt, 1, 1, 1, 40, 33, 64, att_mask(m),
                             (uint64_t)(40 + m), 1.0, 0);
                tu_buf *in = which == 0 ? &c.q : which == 1 ? &c.k : &c.v;
                tu_buf_set(in,
                           which == 0   ? 30 * 64 + 3
                           : which == 1 ? 20 * 64 + 7
                                        : 20 * 64 + 5,
                           vals[vi]);
                cr_assert(run(&c), "could not form a team of 128 host threads");
                ompk_tensor hq = att_host(&c.q, &c.tq), hk = att_host(&c.k, &c.tk);
                ompk_tensor hv = att_host(&c.v, &c.tv);
                double *ro = malloc(sizeof(double) * (size_t)(c.out.numel + 1));
                double *rl = malloc(sizeof(double) * (size_t)(c.lse.numel + 1));
                ompk_attention_ref_fwd(&hq, &hk, &hv, c.scale, att_mask(m), ro, rl);
                char what[100];
                snprintf(what, sizeof what, "%g in %c mask=%s", vals[vi], "qkv"[which],
                         att_mask_name(att_mask(m)));
                cr_expect_eq(att_nonfinite_mismatch(what, &c.out, &c.tout, ro, vi == 0), 0,
                             "%s: out", what);
                cr_expect_eq(att_nonfinite_mismatch(what, &c.lse, &c.tlse, rl, vi == 0), 0,
                             "%s: lse", what);
                free(ro);
                free(rl);
                att_case_free(&c);
            }
}

/* A finite scale (3e38) whose products with the scores overflow: out and lse are NaN or right,
 * never a wrong finite value (fully masked rows stay 0 / -inf). */
static inline void att_emu_huge_scale(ompk_dtype dt, int (*run)(att_case *)) {
    for (int m = 0; m < 3; m++) {
        att_case c;
        att_case_new(&c, ompk_device_host(), dt, 1, 1, 1, 40, 33, 64, att_mask(m),
                     (uint64_t)(60 + m), 1.0, 0);
        c.scale = (double)3e38f;
        cr_assert(run(&c), "could not form a team of 128 host threads");
        ompk_tensor hq = att_host(&c.q, &c.tq), hk = att_host(&c.k, &c.tk);
        ompk_tensor hv = att_host(&c.v, &c.tv);
        double *ro = malloc(sizeof(double) * (size_t)(c.out.numel + 1));
        double *rl = malloc(sizeof(double) * (size_t)(c.lse.numel + 1));
        ompk_attention_ref_fwd(&hq, &hk, &hv, c.scale, att_mask(m), ro, rl);
        char what[100];
        snprintf(what, sizeof what, "scale 3e38 mask=%s", att_mask_name(att_mask(m)));
        cr_expect_eq(att_nan_or_close(what, &c.out, &c.tout, ro,
                                      att_tol(dt, OMPK_TOL_ATT_OUT, 1, dt == OMPK_BF16, 1.0)),
                     0, "%s: out", what);
        cr_expect_eq(att_nan_or_close(what, &c.lse, &c.tlse, rl,
                                      att_tol(OMPK_F32, OMPK_TOL_ATT_LSE, 1, 0, 1.0)),
                     0, "%s: lse", what);
        free(ro);
        free(rl);
        att_case_free(&c);
    }
}

#endif
