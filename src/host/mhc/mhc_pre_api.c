/* ompk_mhc_pre_fwd / ompk_mhc_pre_bwd / ompk_mhc_params_default: validation, workspace,
 * routing, verify and trace around the kernels. */
#include <math.h>
#include <string.h>

#include "check.h"
#include "error.h"
#include "mhc_impl.h"
#include "mhc_ref_pre.h"
#include "ompk/mhc.h"
#include "route.h"
#include "target/mhc/mhc_kern.h"
#include "tolerance.h"
#include "verify.h"

ompk_mhc_params ompk_mhc_params_default(void) {
    ompk_mhc_params p;
    p.norm_eps = 1e-6f;
    p.hc_eps = 1e-6f;
    p.post_mult = 2.0f;
    p.sinkhorn_repeat = 20;
    p.sinkhorn_eps = 1e-6f;
    p.fuse_sinkhorn = 1;
    return p;
}

static void check_params(ompk_call *c, const ompk_mhc_params *p) {
    ompk_call_require(c, isfinite(p->norm_eps) && p->norm_eps >= 0, OMPK_ERR_INVALID_ARGUMENT,
                      "norm_eps must be finite and >= 0");
    ompk_call_require(c, isfinite(p->hc_eps) && p->hc_eps >= 0 && p->hc_eps < 1,
                      OMPK_ERR_INVALID_ARGUMENT, "hc_eps must be in [0, 1)");
    ompk_call_require(c, isfinite(p->post_mult) && p->post_mult != 0, OMPK_ERR_INVALID_ARGUMENT,
                      "post_mult must be finite and non-zero");
    ompk_call_require(c, p->sinkhorn_repeat >= 1 && p->sinkhorn_repeat <= 1000,
                      OMPK_ERR_INVALID_ARGUMENT, "sinkhorn_repeat = %d, must be 1..1000",
                      p->sinkhorn_repeat);
    ompk_call_require(c, isfinite(p->sinkhorn_eps) && p->sinkhorn_eps >= 0,
                      OMPK_ERR_INVALID_ARGUMENT, "sinkhorn_eps must be finite and >= 0");
}

static void dims(ompk_call *c, const char *name, const ompk_tensor *t, int nd,
                 const int64_t *shape) {
    for (int d = 0; d < nd; d++) ompk_call_dim(c, name, t, d, shape[d]);
}

/* The sizes of a pre call: x [B,S,n,D], T = B*S tokens, K = n*D, M = 2n + n^2. */
typedef struct pre_dims {
    int64_t B, S, n, D, T, K, M;
} pre_dims;

/* The inputs pre forward and pre backward share: x [B,S,n,D], phi [M,K], gamma [K] or NULL,
 * alpha [3]; x_out: x is written by the call (a post forward in front of the pre) rather than
 * read. Fills the dimensions (all 0 unless x passed its checks, so that no product is
 * formed from an unchecked n; with 1 <= n <= 8, D >= 1 and x within the size policy, none of
 * them can overflow). */
static void check_pre_inputs(ompk_call *c, const ompk_tensor *x, const ompk_tensor *phi,
                             const ompk_tensor *gamma, const ompk_tensor *alpha, int x_out,
                             pre_dims *z) {
    memset(z, 0, sizeof *z);
    /* x_out: registered and checked as an output by the post forward's checks already */
    if (x_out ? x != NULL && ompk_call_ok(c) : ompk_call_input(c, "x", x, 4, OMPK_DT_FLOAT)) {
        const int64_t n = x->shape[2], D = x->shape[3];
        ompk_call_require(c, n >= 1 && n <= 8, OMPK_ERR_INVALID_ARGUMENT,
                          "n = %lld streams, must be 1..8", (long long)n);
        ompk_call_require(c, D >= 1, OMPK_ERR_INVALID_ARGUMENT, "D must be >= 1");
        ompk_call_unit_stride(c, x_out ? "x_out" : "x", x, 3);
        if (ompk_call_ok(c)) {
            z->B = x->shape[0], z->S = x->shape[1], z->n = n, z->D = D;
            z->T = z->B * z->S, z->K = n * D, z->M = 2 * n + n * n;
        }
    }
    const int64_t K = z->K, M = z->M;
    ompk_call_input(c, "phi", phi, 2, OMPK_DT(OMPK_F32));
    dims(c, "phi", phi, 2, (int64_t[]){M, K});
    ompk_call_unit_stride(c, "phi", phi, 1);
    ompk_call_tensor(c, "gamma", gamma, 1, OMPK_DT(OMPK_F32), 0, 1);
    if (gamma) {
        ompk_call_dim(c, "gamma", gamma, 0, K);
        ompk_call_unit_stride(c, "gamma", gamma, 0);
    }
    ompk_call_input(c, "alpha", alpha, 1, OMPK_DT(OMPK_F32));
    ompk_call_dim(c, "alpha", alpha, 0, 3);
}

/* ---- verify / trace ------------------------------------------------------------------------ */

/* Rows [r0, r1) of a 2-D host view and its reference, reported as one section. */
static void report_rows(const char *fn, const char *out, const char *sec, const ompk_tensor *h,
                        const double *ref, int64_t r0, int64_t r1) {
    ompk_tensor sub = *h;
    sub.shape[0] = r1 - r0;
    sub.data = (char *)h->data + r0 * h->strides[0] * (h->dtype == OMPK_BF16 ? 2 : 4);
    ompk_verify_report_scaled(fn, out, sec, &sub, ref + r0 * h->shape[1], 0, -1);
}

/* T = B*S tokens, n streams and D of the x view (args[0] of both pre calls). */
static void pre_sizes(const ompk_verify_io *io, int64_t *T, int64_t *n, int64_t *D) {
    const ompk_tensor *x = &io->h[0];
    *T = x->shape[0] * x->shape[1], *n = x->shape[2], *D = x->shape[3];
}

static int pre_fwd_ref(const ompk_verify_io *io) {
    int64_t T, n, D;
    pre_sizes(io, &T, &n, &D);
    double *const *d = io->d, *const *r = io->ref;
    ompk_mhc_ref_pre_fwd(T, (int)n, D, d[0], d[1], d[2], d[3], d[4], io->ctx, r[5], r[6], r[7],
                         r[8], r[9], r[10], r[11]);
    return 1;
}

/* Each output in its sections (pre / post / res: the three groups of h_mix's M = 2n + n^2
 * columns), the band scaled by the section's largest reference value. */
static void pre_fwd_report(const ompk_verify_io *io, int i) {
    static const char *sec[12] = {[6] = "post", [7] = "res", [8] = "res", [11] = "pre"};
    int64_t T, n, D;
    pre_sizes(io, &T, &n, &D);
    const char *fn = io->fn, *name = io->args[i].name;
    if (i == 9) {
        ompk_verify_report_scaled(fn, name, "pre", &io->h[i], io->ref[i], 0, n);
        ompk_verify_report_scaled(fn, name, "post", &io->h[i], io->ref[i], n, 2 * n);
        ompk_verify_report_scaled(fn, name, "res", &io->h[i], io->ref[i], 2 * n, 2 * n + n * n);
    } else {
        ompk_verify_report_scaled(fn, name, sec[i], &io->h[i], io->ref[i], 0, -1);
    }
}

void ompk_mhc_pre_fwd_check(ompk_call *c, const ompk_mhc_pre_fwd_args *g, const ompk_mhc_params *p,
                            int x_out) {
    const ompk_tensor *x = g->x, *bias = g->bias, *h_in = g->h_in, *h_post = g->h_post;
    const ompk_tensor *res_logits = g->res_logits, *comb = g->comb, *h_mix = g->h_mix;
    const ompk_tensor *inv_rms = g->inv_rms, *h_pre = g->h_pre;
    check_params(c, p);
    pre_dims z;
    check_pre_inputs(c, x, g->phi, g->gamma, g->alpha, x_out, &z);
    const int64_t B = z.B, S = z.S, n = z.n, D = z.D, T = z.T, M = z.M;
    ompk_call_input(c, "bias", bias, 1, OMPK_DT(OMPK_F32));
    ompk_call_dim(c, "bias", bias, 0, M);
    ompk_call_output(c, "h_in", h_in, 3, OMPK_DT_FLOAT);
    dims(c, "h_in", h_in, 3, (int64_t[]){B, S, D});
    ompk_call_same_dtype(c, x_out ? "x_out" : "x", x, "h_in", h_in);
    ompk_call_unit_stride(c, "h_in", h_in, 2);
    ompk_call_output(c, "h_post", h_post, 3, OMPK_DT(OMPK_F32));
    dims(c, "h_post", h_post, 3, (int64_t[]){B, S, n});
    if (p->fuse_sinkhorn) {
        ompk_call_output(c, "comb", comb, 4, OMPK_DT(OMPK_F32));
        ompk_call_tensor(c, "res_logits", res_logits, 4, OMPK_DT(OMPK_F32), 1, 1);
    } else {
        ompk_call_require(c, comb == NULL, OMPK_ERR_INVALID_ARGUMENT,
                          "comb must be NULL when Sinkhorn is not fused");
        ompk_call_output(c, "res_logits", res_logits, 4, OMPK_DT(OMPK_F32));
    }
    dims(c, "comb", comb, 4, (int64_t[]){B, S, n, n});
    dims(c, "res_logits", res_logits, 4, (int64_t[]){B, S, n, n});
    ompk_call_tensor(c, "h_mix", h_mix, 2, OMPK_DT(OMPK_F32), 1, 1);
    dims(c, "h_mix", h_mix, 2, (int64_t[]){T, M});
    ompk_call_tensor(c, "inv_rms", inv_rms, 1, OMPK_DT(OMPK_F32), 1, 1);
    dims(c, "inv_rms", inv_rms, 1, (int64_t[]){T});
    ompk_call_tensor(c, "h_pre", h_pre, 2, OMPK_DT(OMPK_F32), 1, 1);
    dims(c, "h_pre", h_pre, 2, (int64_t[]){T, n});
}

void ompk_mhc_pre_fwd_build(const ompk_mhc_pre_fwd_args *g, const ompk_mhc_params *params,
                            mhc_pre_fwd_args *out) {
    const ompk_mhc_params p = *params;
    const ompk_tensor *x = g->x, *phi = g->phi, *gamma = g->gamma, *alpha = g->alpha;
    const ompk_tensor *bias = g->bias, *h_in = g->h_in, *h_post = g->h_post;
    const ompk_tensor *res_logits = g->res_logits, *comb = g->comb, *h_mix = g->h_mix;
    const ompk_tensor *inv_rms = g->inv_rms, *h_pre = g->h_pre;
    const int64_t B = x->shape[0], S = x->shape[1], n = x->shape[2], D = x->shape[3];
    mhc_pre_fwd_args a;
    memset(&a, 0, sizeof a);
    a.x = x->data;
    a.B = B, a.S = S, a.D = D, a.n = (int)n, a.bf16 = x->dtype == OMPK_BF16;
    for (int d = 0; d < 4; d++) a.sx[d] = x->strides[d];
    a.phi = (const float *)phi->data, a.sphi = phi->strides[0];
    a.gamma = gamma ? (const float *)gamma->data : NULL;
    a.alpha = (const float *)alpha->data, a.salpha = alpha->strides[0];
    a.bias = (const float *)bias->data, a.sbias = bias->strides[0];
    a.h_in = h_in->data;
    for (int d = 0; d < 3; d++) a.shin[d] = h_in->strides[d], a.shpost[d] = h_post->strides[d];
    a.h_post = (float *)h_post->data;
    if (res_logits) {
        a.logits = (float *)res_logits->data;
        for (int d = 0; d < 4; d++) a.slog[d] = res_logits->strides[d];
    }
    if (comb) {
        a.comb = (float *)comb->data;
        for (int d = 0; d < 4; d++) a.scomb[d] = comb->strides[d];
    }
    if (h_mix)
        a.h_mix = (float *)h_mix->data, a.shmix[0] = h_mix->strides[0],
        a.shmix[1] = h_mix->strides[1];
    if (inv_rms) a.inv_rms = (float *)inv_rms->data, a.sinv = inv_rms->strides[0];
    if (h_pre)
        a.h_pre = (float *)h_pre->data, a.shpre[0] = h_pre->strides[0],
        a.shpre[1] = h_pre->strides[1];
    a.norm_eps = p.norm_eps, a.hc_eps = p.hc_eps, a.post_mult = p.post_mult;
    a.sk_eps = p.sinkhorn_eps, a.repeat = p.sinkhorn_repeat;
    *out = a;
}

void ompk_mhc_pre_fwd_verify(const ompk_mhc_pre_fwd_args *g, const ompk_mhc_params *params) {
    const ompk_mhc_params p = *params;
    const ompk_tensor *x = g->x, *phi = g->phi, *gamma = g->gamma, *alpha = g->alpha;
    const ompk_tensor *bias = g->bias, *h_in = g->h_in, *h_post = g->h_post;
    const ompk_tensor *res_logits = g->res_logits, *comb = g->comb, *h_mix = g->h_mix;
    const ompk_tensor *inv_rms = g->inv_rms, *h_pre = g->h_pre;
    const int64_t n = x->shape[2], T = x->shape[0] * x->shape[1], M = 2 * n + n * n;
    /* the reference always forms res_logits, h_mix, inv_rms and h_pre; comb only if asked */
    const ompk_verify_arg args[12] = {{"x", x, 1, 0, 0, NULL},
                                      {"phi", phi, 1, 0, 0, NULL},
                                      {"gamma", gamma, 1, 0, 0, NULL},
                                      {"alpha", alpha, 1, 0, 0, NULL},
                                      {"bias", bias, 1, 0, 0, NULL},
                                      {"h_in", h_in, 1, 1, 0, NULL},
                                      {"h_post", h_post, 1, 1, 0, NULL},
                                      {"res_logits", res_logits, 1, 1, T * n * n, NULL},
                                      {"comb", comb, 1, 1, 0, NULL},
                                      {"h_mix", h_mix, 1, 1, T * M, NULL},
                                      {"inv_rms", inv_rms, 1, 1, T, NULL},
                                      {"h_pre", h_pre, 1, 1, T * n, NULL}};
    const ompk_verify_op op = {.fn = "mhc_pre_fwd",
                               .args = args,
                               .nargs = 12,
                               .gather = 1,
                               .ctx = &p,
                               .ref = pre_fwd_ref,
                               .report = pre_fwd_report};
    ompk_verify_run(&op);
}

static ompk_status pre_fwd(const ompk_mhc_pre_fwd_args *g, const ompk_mhc_params *params) {
    ompk_call c;
    ompk_call_begin(&c, "ompk_mhc_pre_fwd");
    const ompk_mhc_params p = params ? *params : ompk_mhc_params_default();
    ompk_mhc_pre_fwd_check(&c, g, &p, 0);
    ompk_status st = ompk_call_end(&c);
    if (st != OMPK_OK) return st;
    mhc_pre_fwd_args a;
    ompk_mhc_pre_fwd_build(g, &p, &a);
    if (a.B * a.S == 0) return OMPK_OK;
    const mhc_pre_fwd_call call = {ompk_exec_for(c.device), &a, NULL};
    st = ompk_impl_run(OMPK_OP_MHC_PRE_FWD, &call, c.device, c.fn, NULL);
    if (st != OMPK_OK) return st;
    if (ompk_verify_enabled() || ompk_trace_enabled()) ompk_mhc_pre_fwd_verify(g, &p);
    return OMPK_OK;
}

static int pre_bwd_ref(const ompk_verify_io *io) {
    int64_t T, n, D;
    pre_sizes(io, &T, &n, &D);
    double *const *d = io->d, *const *r = io->ref;
    ompk_mhc_ref_pre_bwd(T, (int)n, D, d[0], d[1], d[2], d[3], io->ctx, d[4], d[5], d[6], d[7],
                         d[8], d[9], d[10], d[11], r[12], r[13], r[14], r[15], r[16]);
    return 1;
}

/* dphi by its row groups, dalpha by element and dbias by its column groups: pre, post, res. */
static void pre_bwd_report(const ompk_verify_io *io, int i) {
    static const char *grp[3] = {"pre", "post", "res"};
    int64_t T, n, D;
    pre_sizes(io, &T, &n, &D);
    const int64_t lo[3] = {0, n, 2 * n}, hi[3] = {n, 2 * n, 2 * n + n * n};
    const char *fn = io->fn, *name = io->args[i].name;
    const ompk_tensor *h = &io->h[i];
    const double *ref = io->ref[i];
    for (int g = 0; g < 3; g++) {
        if (i == 13) report_rows(fn, name, grp[g], h, ref, lo[g], hi[g]);
        if (i == 14) ompk_verify_report_scaled(fn, name, grp[g], h, ref, g, g + 1);
        if (i == 15) ompk_verify_report_scaled(fn, name, grp[g], h, ref, lo[g], hi[g]);
    }
    if (i == 12 || i == 16) ompk_verify_report_scaled(fn, name, NULL, h, ref, 0, -1);
}

/* With no tokens the weight gradients are empty sums: zero them row by row (each row is
 * contiguous) instead of running the kernels, whose token pointers may be NULL then. */
static ompk_status zero_weight_grads(ompk_device dev, const mhc_pre_bwd_args *a, int64_t M,
                                     int64_t K) {
    ompk_status st = OMPK_OK;
    for (int64_t r = 0; r < M && st == OMPK_OK; r++)
        st = ompk_memset(a->dphi + r * a->sdphi, dev, 0, sizeof(float) * (size_t)K);
    for (int64_t r = 0; r < M && st == OMPK_OK; r++)
        st = ompk_memset(a->dbias + r * a->sdbias, dev, 0, sizeof(float));
    for (int64_t r = 0; r < 3 && st == OMPK_OK; r++)
        st = ompk_memset(a->dalpha + r * a->sdalpha, dev, 0, sizeof(float));
    if (a->dgamma && st == OMPK_OK) st = ompk_memset(a->dgamma, dev, 0, sizeof(float) * (size_t)K);
    return st;
}

static ompk_status pre_bwd(const ompk_tensor *x, const ompk_tensor *phi, const ompk_tensor *gamma,
                           const ompk_tensor *alpha, const ompk_mhc_params *params,
                           const ompk_tensor *dh_in, const ompk_tensor *dh_post,
                           const ompk_tensor *dh_res, const ompk_tensor *grad_x_post,
                           const ompk_tensor *h_mix, const ompk_tensor *inv_rms,
                           const ompk_tensor *h_pre, const ompk_tensor *h_post, ompk_tensor *dx,
                           ompk_tensor *dphi, ompk_tensor *dalpha, ompk_tensor *dbias,
                           ompk_tensor *dgamma) {
    ompk_call c;
    ompk_call_begin(&c, "ompk_mhc_pre_bwd");
    const ompk_mhc_params p = params ? *params : ompk_mhc_params_default();
    check_params(&c, &p);
    pre_dims z;
    check_pre_inputs(&c, x, phi, gamma, alpha, 0, &z);
    const int64_t B = z.B, S = z.S, n = z.n, D = z.D, T = z.T, K = z.K, M = z.M;
    ompk_call_input(&c, "dh_in", dh_in, 3, OMPK_DT_FLOAT);
    dims(&c, "dh_in", dh_in, 3, (int64_t[]){B, S, D});
    ompk_call_unit_stride(&c, "dh_in", dh_in, 2);
    ompk_call_input(&c, "dh_post", dh_post, 3, OMPK_DT(OMPK_F32));
    dims(&c, "dh_post", dh_post, 3, (int64_t[]){B, S, n});
    ompk_call_input(&c, "dh_res", dh_res, 4, OMPK_DT(OMPK_F32));
    dims(&c, "dh_res", dh_res, 4, (int64_t[]){B, S, n, n});
    if (ompk_call_tensor(&c, "grad_x_post", grad_x_post, 4, OMPK_DT_FLOAT, 0, 1)) {
        dims(&c, "grad_x_post", grad_x_post, 4, (int64_t[]){B, S, n, D});
        ompk_call_unit_stride(&c, "grad_x_post", grad_x_post, 3);
    }
    ompk_call_input(&c, "h_mix", h_mix, 2, OMPK_DT(OMPK_F32));
    dims(&c, "h_mix", h_mix, 2, (int64_t[]){T, M});
    ompk_call_input(&c, "inv_rms", inv_rms, 1, OMPK_DT(OMPK_F32));
    dims(&c, "inv_rms", inv_rms, 1, (int64_t[]){T});
    ompk_call_input(&c, "h_pre", h_pre, 2, OMPK_DT(OMPK_F32));
    dims(&c, "h_pre", h_pre, 2, (int64_t[]){T, n});
    ompk_call_input(&c, "h_post", h_post, 3, OMPK_DT(OMPK_F32));
    dims(&c, "h_post", h_post, 3, (int64_t[]){B, S, n});
    ompk_call_output(&c, "dx", dx, 4, OMPK_DT_FLOAT);
    dims(&c, "dx", dx, 4, (int64_t[]){B, S, n, D});
    ompk_call_same_dtype(&c, "x", x, "dx", dx);
    ompk_call_unit_stride(&c, "dx", dx, 3);
    ompk_call_output(&c, "dphi", dphi, 2, OMPK_DT(OMPK_F32));
    dims(&c, "dphi", dphi, 2, (int64_t[]){M, K});
    ompk_call_unit_stride(&c, "dphi", dphi, 1);
    ompk_call_output(&c, "dalpha", dalpha, 1, OMPK_DT(OMPK_F32));
    ompk_call_dim(&c, "dalpha", dalpha, 0, 3);
    ompk_call_output(&c, "dbias", dbias, 1, OMPK_DT(OMPK_F32));
    ompk_call_dim(&c, "dbias", dbias, 0, M);
    if (gamma) {
        ompk_call_output(&c, "dgamma", dgamma, 1, OMPK_DT(OMPK_F32));
        ompk_call_dim(&c, "dgamma", dgamma, 0, K);
        ompk_call_unit_stride(&c, "dgamma", dgamma, 0);
    } else {
        ompk_call_require(&c, dgamma == NULL, OMPK_ERR_INVALID_ARGUMENT,
                          "dgamma must be NULL when gamma is");
    }
    ompk_status st = ompk_call_end(&c);
    if (st != OMPK_OK) return st;

    mhc_pre_bwd_args a;
    memset(&a, 0, sizeof a);
    a.x = x->data, a.dh_in = dh_in->data, a.gxp = grad_x_post ? grad_x_post->data : NULL;
    a.B = B, a.S = S, a.D = D, a.n = (int)n;
    a.bf16 = x->dtype == OMPK_BF16, a.dh_bf16 = dh_in->dtype == OMPK_BF16;
    a.gxp_bf16 = grad_x_post && grad_x_post->dtype == OMPK_BF16;
    for (int d = 0; d < 4; d++) {
        a.sx[d] = x->strides[d], a.sdres[d] = dh_res->strides[d], a.sdx[d] = dx->strides[d];
        if (grad_x_post) a.sgxp[d] = grad_x_post->strides[d];
    }
    for (int d = 0; d < 3; d++) {
        a.sdh[d] = dh_in->strides[d], a.sdpost[d] = dh_post->strides[d];
        a.shpost[d] = h_post->strides[d];
    }
    a.phi = (const float *)phi->data, a.sphi = phi->strides[0];
    a.gamma = gamma ? (const float *)gamma->data : NULL;
    a.alpha = (const float *)alpha->data, a.salpha = alpha->strides[0];
    a.dh_post = (const float *)dh_post->data, a.dh_res = (const float *)dh_res->data;
    a.h_mix = (const float *)h_mix->data, a.shmix[0] = h_mix->strides[0];
    a.shmix[1] = h_mix->strides[1];
    a.inv_rms = (const float *)inv_rms->data, a.sinv = inv_rms->strides[0];
    a.h_pre = (const float *)h_pre->data, a.shpre[0] = h_pre->strides[0];
    a.shpre[1] = h_pre->strides[1];
    a.h_post = (const float *)h_post->data;
    a.hc_eps = p.hc_eps, a.post_mult = p.post_mult;
    a.dx = dx->data;
    a.dphi = (float *)dphi->data, a.sdphi = dphi->strides[0];
    a.dalpha = (float *)dalpha->data, a.sdalpha = dalpha->strides[0];
    a.dbias = (float *)dbias->data, a.sdbias = dbias->strides[0];
    a.dgamma = dgamma ? (float *)dgamma->data : NULL;

    if (T == 0) return zero_weight_grads(c.device, &a, M, K);

    const mhc_pre_bwd_call call = {ompk_exec_for(c.device), &a};
    st = ompk_impl_run(OMPK_OP_MHC_PRE_BWD, &call, c.device, c.fn, NULL);
    if (st != OMPK_OK) return st;

    if (ompk_verify_enabled() || ompk_trace_enabled()) {
        const ompk_verify_arg args[17] = {
            {"x", x, 1, 0, 0, NULL},           {"phi", phi, 1, 0, 0, NULL},
            {"gamma", gamma, 1, 0, 0, NULL},   {"alpha", alpha, 1, 0, 0, NULL},
            {"dh_in", dh_in, 1, 0, 0, NULL},   {"dh_post", dh_post, 1, 0, 0, NULL},
            {"dh_res", dh_res, 1, 0, 0, NULL}, {"grad_x_post", grad_x_post, 1, 0, 0, NULL},
            {"h_mix", h_mix, 1, 0, 0, NULL},   {"inv_rms", inv_rms, 1, 0, 0, NULL},
            {"h_pre", h_pre, 1, 0, 0, NULL},   {"h_post", h_post, 1, 0, 0, NULL},
            {"dx", dx, 1, 1, 0, NULL},         {"dphi", dphi, 1, 1, 0, NULL},
            {"dalpha", dalpha, 1, 1, 0, NULL}, {"dbias", dbias, 1, 1, 0, NULL},
            {"dgamma", dgamma, 1, 1, 0, NULL}};
        const ompk_verify_op op = {.fn = "mhc_pre_bwd",
                                   .args = args,
                                   .nargs = 17,
                                   .gather = 1,
                                   .ctx = &p,
                                   .ref = pre_bwd_ref,
                                   .report = pre_bwd_report};
        ompk_verify_run(&op);
    }
    return OMPK_OK;
}

ompk_status ompk_mhc_pre_fwd(const ompk_mhc_pre_fwd_args *a, const ompk_mhc_params *params) {
    if (!a) return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, "ompk_mhc_pre_fwd", "args is NULL");
    return pre_fwd(a, params);
}

ompk_status ompk_mhc_pre_bwd(const ompk_mhc_pre_bwd_args *a, const ompk_mhc_params *params) {
    if (!a) return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, "ompk_mhc_pre_bwd", "args is NULL");
    return pre_bwd(a->x, a->phi, a->gamma, a->alpha, params, a->dh_in, a->dh_post, a->dh_res,
                   a->grad_x_post, a->h_mix, a->inv_rms, a->h_pre, a->h_post, a->dx, a->dphi,
                   a->dalpha, a->dbias, a->dgamma);
}
