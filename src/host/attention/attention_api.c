/* ompk_attention_fwd / ompk_attention_bwd: validation, routing, verify and trace around the
 * implementation lists of attention_impl.c. */
#include <math.h>
#include <string.h>

#include "attention_impl.h"
#include "attention_ref.h"
#include "check.h"
#include "error.h"
#include "ompk/attention.h"
#include "route.h"
#include "target/attention/attention_kernels.h"
#include "tolerance.h"
#include "verify.h"

ompk_attention_params ompk_attention_params_default(void) {
    ompk_attention_params p;
    p.scale = 0.f;
    p.mask = OMPK_ATTN_MASK_NONE;
    return p;
}

static int dh_supported(int64_t dh) {
    return dh == 32 || dh == 64 || dh == 80 || dh == 96 || dh == 128 || dh == 256;
}

/* Checks shared by forward and backward: q, k, v and the params. Returns 1 when the shapes of
 * q and k can be read. */
static int check_qkv(ompk_call *c, const ompk_tensor *q, const ompk_tensor *k, const ompk_tensor *v,
                     const ompk_attention_params *p) {
    ompk_call_require(c, p == NULL || ((unsigned)p->mask < (unsigned)OMPK_ATTN_MASK_COUNT_),
                      OMPK_ERR_INVALID_ARGUMENT, "params.mask %d is not a mask",
                      p ? (int)p->mask : 0);
    ompk_call_require(c, p == NULL || isfinite(p->scale), OMPK_ERR_INVALID_ARGUMENT,
                      "params.scale must be finite (0 = 1/sqrt(dh))");
    int okq = ompk_call_input(c, "q", q, 4, OMPK_DT_FLOAT);
    int okk = ompk_call_input(c, "k", k, 4, OMPK_DT_FLOAT);
    ompk_call_input(c, "v", v, 4, OMPK_DT_FLOAT);
    if (!okq || !okk || !ompk_call_ok(c)) return 0;
    const int64_t dh = q->shape[3], Hq = q->shape[1], Hkv = k->shape[1];
    ompk_call_require(c, dh_supported(dh), OMPK_ERR_INVALID_ARGUMENT,
                      "head dim %lld not supported (32, 64, 80, 96, 128 or 256)", (long long)dh);
    ompk_call_dim(c, "k", k, 0, q->shape[0]);
    ompk_call_dim(c, "k", k, 3, dh);
    ompk_call_require(c, Hkv >= 1 && Hq % Hkv == 0, OMPK_ERR_INVALID_ARGUMENT,
                      "query heads (%lld) must be a multiple of kv heads (%lld)", (long long)Hq,
                      (long long)Hkv);
    for (int d = 0; d < 4; d++) ompk_call_dim(c, "v", v, d, k->shape[d]);
    ompk_call_same_dtype(c, "q", q, "k", k);
    ompk_call_same_dtype(c, "q", q, "v", v);
    ompk_call_unit_stride(c, "q", q, 3);
    ompk_call_unit_stride(c, "k", k, 3);
    ompk_call_unit_stride(c, "v", v, 3);
    return ompk_call_ok(c);
}

/* t must look like q: same shape, same dtype, unit dh stride. */
static void check_like(ompk_call *c, const char *name, const ompk_tensor *t,
                       const ompk_tensor *like, const char *like_name) {
    for (int d = 0; d < 4; d++) ompk_call_dim(c, name, t, d, like->shape[d]);
    ompk_call_same_dtype(c, like_name, like, name, t);
    ompk_call_unit_stride(c, name, t, 3);
}

static void check_lse(ompk_call *c, const ompk_tensor *lse, const ompk_tensor *q) {
    for (int d = 0; d < 3; d++) ompk_call_dim(c, "lse", lse, d, q->shape[d]);
}

static void fill_geom(ompk_attn_geom *g, const ompk_tensor *q, const ompk_tensor *k,
                      const ompk_tensor *v, const ompk_tensor *out, const ompk_tensor *lse,
                      const ompk_attention_params *p) {
    g->B = q->shape[0];
    g->Hq = q->shape[1];
    g->N = q->shape[2];
    g->dh = q->shape[3];
    g->Hkv = k->shape[1];
    g->M = k->shape[2];
    for (int d = 0; d < 3; d++) {
        g->qs[d] = q->strides[d];
        g->ks[d] = k->strides[d];
        g->vs[d] = v->strides[d];
        g->os[d] = out->strides[d];
        g->ls[d] = lse ? lse->strides[d] : 0;
        g->dos[d] = g->dqs[d] = g->dks[d] = g->dvs[d] = 0;
    }
    g->scale = p->scale != 0.f ? p->scale : (float)(1.0 / sqrt((double)g->dh));
    g->mask = (int)p->mask;
    g->bf16 = q->dtype == OMPK_BF16;
}

/* The verify callbacks' view of a call. bf16_p: the kernel that ran rounds P (and dS) to bf16
 * before its second product. */
typedef struct att_verify_ctx {
    const ompk_attn_geom *g;
    int bf16_p;
} att_verify_ctx;

static int fwd_ref(const ompk_verify_io *io) {
    const att_verify_ctx *x = io->ctx;
    ompk_attention_ref_fwd(&io->h[0], &io->h[1], &io->h[2], x->g->scale,
                           (ompk_attention_mask)x->g->mask, io->ref[3], io->ref[4]);
    return 1;
}

/* Verify bands come from ompk_tol_attention, as the suites' do. */
static ompk_tol fwd_tol(const ompk_verify_io *io, int i) {
    const att_verify_ctx *x = io->ctx;
    return i == 3 ? ompk_tol_attention(io->h[3].dtype, OMPK_TOL_ATT_OUT, 1, x->bf16_p)
                  : ompk_tol_attention(OMPK_F32, OMPK_TOL_ATT_LSE, 1, 0);
}

static void fwd_verify(const ompk_tensor *q, const ompk_tensor *k, const ompk_tensor *v,
                       const ompk_tensor *out, const ompk_tensor *lse, const ompk_attn_geom *g,
                       int bf16_p) {
    att_verify_ctx x = {g, bf16_p};
    const ompk_verify_arg args[5] = {{"q", q, 1, 0, 0, NULL},
                                     {"k", k, 1, 0, 0, NULL},
                                     {"v", v, 1, 0, 0, NULL},
                                     {"out", out, 1, 1, 0, NULL},
                                     {"lse", lse, 1, 1, 0, NULL}};
    const ompk_verify_op op = {
        .fn = "attention_fwd", .args = args, .nargs = 5, .ctx = &x, .ref = fwd_ref, .tol = fwd_tol};
    ompk_verify_run(&op);
}

ompk_status ompk_attention_fwd(const ompk_tensor *q, const ompk_tensor *k, const ompk_tensor *v,
                               ompk_tensor *out, ompk_tensor *lse,
                               const ompk_attention_params *params) {
    ompk_call c;
    ompk_call_begin(&c, "ompk_attention_fwd");
    if (check_qkv(&c, q, k, v, params)) {
        if (ompk_call_output(&c, "out", out, 4, OMPK_DT_FLOAT)) check_like(&c, "out", out, q, "q");
        if (ompk_call_tensor(&c, "lse", lse, 3, OMPK_DT(OMPK_F32), 1, 1)) check_lse(&c, lse, q);
    }
    ompk_status st = ompk_call_end(&c);
    if (st != OMPK_OK) return st;
    const ompk_attention_params p = params ? *params : ompk_attention_params_default();
    ompk_attn_geom g;
    fill_geom(&g, q, k, v, out, lse, &p);
    if (g.B * g.Hq * g.N == 0) return OMPK_OK;

    const attention_fwd_call call = {
        ompk_exec_for(c.device),        &g, q->data, k->data, v->data, out->data,
        lse ? (float *)lse->data : NULL};
    const ompk_impl *ran = NULL;
    st = ompk_impl_run(OMPK_OP_ATTENTION_FWD, &call, c.device, c.fn, &ran);
    if (st != OMPK_OK) return st;
    const int bf16_p = attention_impl_bf16_p(ran, &g);

    if (ompk_verify_enabled() || ompk_trace_enabled()) fwd_verify(q, k, v, out, lse, &g, bf16_p);
    return OMPK_OK;
}

static int bwd_ref(const ompk_verify_io *io) {
    const att_verify_ctx *x = io->ctx;
    ompk_attention_ref_bwd(&io->h[0], &io->h[1], &io->h[2], &io->h[3], &io->h[7], x->g->scale,
                           (ompk_attention_mask)x->g->mask, io->ref[4], io->ref[5], io->ref[6]);
    return 1;
}

static ompk_tol bwd_tol(const ompk_verify_io *io, int i) {
    const att_verify_ctx *x = io->ctx;
    return ompk_tol_attention(io->h[i].dtype, i == 4 ? OMPK_TOL_ATT_DQ : OMPK_TOL_ATT_DKV,
                              x->g->Hq / x->g->Hkv, x->bf16_p);
}

static void bwd_verify(const ompk_tensor *dout, const ompk_tensor *q, const ompk_tensor *k,
                       const ompk_tensor *v, const ompk_tensor *dq, const ompk_tensor *dk,
                       const ompk_tensor *dv, const ompk_tensor *out, const ompk_attn_geom *g,
                       int bf16_p) {
    att_verify_ctx x = {g, bf16_p};
    const ompk_verify_arg args[8] = {{"dout", dout, 1, 0, 0, NULL}, {"q", q, 1, 0, 0, NULL},
                                     {"k", k, 1, 0, 0, NULL},       {"v", v, 1, 0, 0, NULL},
                                     {"dq", dq, 1, 1, 0, NULL},     {"dk", dk, 1, 1, 0, NULL},
                                     {"dv", dv, 1, 1, 0, NULL},     {"out", out, 1, 0, 0, NULL}};
    const ompk_verify_op op = {
        .fn = "attention_bwd", .args = args, .nargs = 8, .ctx = &x, .ref = bwd_ref, .tol = bwd_tol};
    ompk_verify_run(&op);
}

ompk_status ompk_attention_bwd(const ompk_tensor *dout, const ompk_tensor *q, const ompk_tensor *k,
                               const ompk_tensor *v, const ompk_tensor *out, const ompk_tensor *lse,
                               ompk_tensor *dq, ompk_tensor *dk, ompk_tensor *dv,
                               const ompk_attention_params *params) {
    ompk_call c;
    ompk_call_begin(&c, "ompk_attention_bwd");
    if (check_qkv(&c, q, k, v, params)) {
        if (ompk_call_input(&c, "dout", dout, 4, OMPK_DT_FLOAT))
            check_like(&c, "dout", dout, q, "q");
        if (ompk_call_input(&c, "out", out, 4, OMPK_DT_FLOAT)) check_like(&c, "out", out, q, "q");
        if (ompk_call_input(&c, "lse", lse, 3, OMPK_DT(OMPK_F32))) check_lse(&c, lse, q);
        if (ompk_call_output(&c, "dq", dq, 4, OMPK_DT_FLOAT)) check_like(&c, "dq", dq, q, "q");
        if (ompk_call_output(&c, "dk", dk, 4, OMPK_DT_FLOAT)) check_like(&c, "dk", dk, k, "k");
        if (ompk_call_output(&c, "dv", dv, 4, OMPK_DT_FLOAT)) check_like(&c, "dv", dv, k, "k");
    }
    ompk_status st = ompk_call_end(&c);
    if (st != OMPK_OK) return st;
    const ompk_attention_params p = params ? *params : ompk_attention_params_default();
    ompk_attn_geom g;
    fill_geom(&g, q, k, v, out, lse, &p);
    for (int d = 0; d < 3; d++) {
        g.dos[d] = dout->strides[d];
        g.dqs[d] = dq->strides[d];
        g.dks[d] = dk->strides[d];
        g.dvs[d] = dv->strides[d];
    }
    const int64_t rows = g.B * g.Hq * g.N;
    if (rows == 0 && ompk_tensor_numel(k) == 0) return OMPK_OK;

    const attention_bwd_call call = {
        ompk_exec_for(c.device),  &g,       dout->data, q->data, k->data, v->data, out->data,
        (const float *)lse->data, dq->data, dk->data,   dv->data};
    const ompk_impl *ran = NULL;
    st = ompk_impl_run(OMPK_OP_ATTENTION_BWD, &call, c.device, c.fn, &ran);
    if (st != OMPK_OK) return st;
    const int bf16_p = attention_impl_bf16_p(ran, &g);

    if (ompk_verify_enabled() || ompk_trace_enabled())
        bwd_verify(dout, q, k, v, dq, dk, dv, out, &g, bf16_p);
    return OMPK_OK;
}
