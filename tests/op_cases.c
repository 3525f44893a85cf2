/* The op descriptors of op_cases.h: one table entry per public call that takes tensors. The
 * default sizes are small so that the valid call of every case runs in milliseconds on the CI
 * machine; the sets of the reference driver add the shapes the family suites sweep (every n, D
 * not a multiple of any tile or vector width, the tensor-core shapes). */
#include "op_cases.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OUT 1, 0, 0
#define IN 0, 0, 0
#define OPT_IN 0, 1, 0
#define OPT_OUT 1, 1, 0
#define HOST_OUT 1, 1, 1
/* dtype, index range, dtype group, scale of the random data */
#define F32 OMPK_F32, 0, NULL, 0, 0
#define F32S(scale) OMPK_F32, 0, NULL, 0, scale
#define GRP(g, scale) OMPK_F32, 0, NULL, g, scale
#define IDX(lo, hi) OMPK_I32, lo, hi, 0, 0

/* N(0, scale^2) data and upload: Box-Muller with both of its values (half the work of
 * tu_buf_randn, which the large shapes of the reference driver feel) */
static void fill_randn(tu_buf *b, tu_rng *r, double scale) {
    for (int64_t i = 0; i < b->numel; i += 2) {
        double u1 = tu_uniform(r);
        const double u2 = tu_uniform(r);
        if (u1 < 1e-300) u1 = 1e-300;
        const double m = scale * sqrt(-2.0 * log(u1)), a = 6.283185307179586 * u2;
        tu_buf_set(b, i, m * cos(a));
        if (i + 1 < b->numel) tu_buf_set(b, i + 1, m * sin(a));
    }
    tu_buf_upload(b);
}

/* ---- router ---------------------------------------------------------------------------------- */
#if OMPK_HAVE_ROUTER
static ompk_status router_fwd(tu_op_case *c, ompk_tensor *const *t) {
    return ompk_router_topk_fwd(t[0], t[1], c->sym['K'], t[2], t[3]);
}
static ompk_status router_bwd(tu_op_case *c, ompk_tensor *const *t) {
    return ompk_router_topk_bwd(t[0], t[1], c->sym['N'], t[2], t[3]);
}
/* k slots of the N^2 pairs */
static int router_valid(const int64_t *sym) {
    return sym['K'] <= sym['N'] * sym['N'];
}
#endif

/* ---- mHC ------------------------------------------------------------------------------------- */
#if OMPK_HAVE_MHC
static ompk_status post_fwd(tu_op_case *c, ompk_tensor *const *t) {
    (void)c;
    return ompk_mhc_post_fwd(t[0], t[1], t[2], t[3], t[4]);
}
static ompk_status post_bwd(tu_op_case *c, ompk_tensor *const *t) {
    (void)c;
    return ompk_mhc_post_bwd(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8]);
}
/* r: Sinkhorn's repeat count */
static ompk_status sk_fwd(tu_op_case *c, ompk_tensor *const *t) {
    ompk_mhc_params p = ompk_mhc_params_default();
    p.sinkhorn_repeat = (int)c->sym['r'];
    return ompk_mhc_sinkhorn_fwd(t[0], t[1], &p);
}
static ompk_status sk_bwd(tu_op_case *c, ompk_tensor *const *t) {
    ompk_mhc_params p = ompk_mhc_params_default();
    p.sinkhorn_repeat = (int)c->sym['r'];
    return ompk_mhc_sinkhorn_bwd(t[0], t[1], t[2], &p);
}
/* g: gamma passed (and dgamma), u: Sinkhorn fused (comb written), p: grad_x_post passed */
static ompk_mhc_params pre_params(const tu_op_case *c) {
    ompk_mhc_params p = ompk_mhc_params_default();
    p.fuse_sinkhorn = (int)c->sym['u'];
    return p;
}
static ompk_status pre_fwd(tu_op_case *c, ompk_tensor *const *t) {
    const ompk_mhc_params p = pre_params(c);
    const ompk_mhc_pre_fwd_args a = {t[0], t[1], c->sym['g'] ? t[2] : NULL,     t[3], t[4],  t[5],
                                     t[6], t[7], p.fuse_sinkhorn ? t[8] : NULL, t[9], t[10], t[11]};
    return ompk_mhc_pre_fwd(&a, &p);
}
static ompk_status pre_bwd(tu_op_case *c, ompk_tensor *const *t) {
    const ompk_mhc_params p = pre_params(c);
    const int g = (int)c->sym['g'];
    const ompk_mhc_pre_bwd_args a = {
        t[0], t[1],  g ? t[2] : NULL, t[3],  t[4],  t[5],  t[6],  c->sym['p'] ? t[7] : NULL, t[8],
        t[9], t[10], t[11],           t[12], t[13], t[14], t[15], g ? t[16] : NULL};
    return ompk_mhc_pre_bwd(&a, &p);
}
/* T = B*S tokens, K = n*D, M = 2n + n^2 */
static void pre_derive(int64_t *sym) {
    const int64_t n = sym['n'];
    sym['T'] = sym['B'] * sym['S'];
    sym['K'] = n * sym['D'];
    sym['M'] = 2 * n + n * n;
}
/* phi ~ N(0, 1/K), gamma ~ 1 + 0.2 N(0,1), alpha (0.8, 1.1, 1.3), bias ~ 0.3 N(0,1): sigmoid and
 * Sinkhorn arguments of order one, as a trained layer's (phi, gamma, alpha from arg `at` on, the
 * forwards' bias after them) */
static void pre_fill(tu_op_case *c, int at, int bias) {
    tu_buf *phi = &c->buf[at], *gamma = &c->buf[at + 1], *alpha = &c->buf[at + 2];
    fill_randn(phi, &c->rng, 1.0 / sqrt((double)c->sym['K']));
    for (int64_t k = 0; k < gamma->numel; k++) tu_buf_set(gamma, k, 1.0 + 0.2 * tu_normal(&c->rng));
    tu_buf_upload(gamma);
    const double al[3] = {0.8, 1.1, 1.3};
    for (int i = 0; i < 3; i++) tu_buf_set(alpha, i, al[i]);
    tu_buf_upload(alpha);
    if (bias) fill_randn(&c->buf[at + 3], &c->rng, 0.3);
}
static void pre_fwd_fill(tu_op_case *c) {
    pre_fill(c, 1, 1);
}
static void pre_bwd_fill(tu_op_case *c) {
    pre_fill(c, 1, 0);
}
/* post(l) + pre(l+1): the post's x, comb, post, f and x_out (args 0..4), then the pre forward's
 * arguments less its x (which is x_out) */
static ompk_status post_pre_fwd(tu_op_case *c, ompk_tensor *const *t) {
    const ompk_mhc_params p = pre_params(c);
    const ompk_mhc_pre_fwd_args pre = {
        NULL,  t[5],  c->sym['g'] ? t[6] : NULL,      t[7],  t[8],  t[9],
        t[10], t[11], p.fuse_sinkhorn ? t[12] : NULL, t[13], t[14], t[15]};
    const ompk_mhc_post_pre_fwd_args a = {t[0], t[1], t[2], t[3], t[4], pre};
    return ompk_mhc_post_pre_fwd(&a, &p);
}
static void post_pre_fill(tu_op_case *c) {
    pre_fill(c, 5, 1);
}
/* The backward's saved tensors (h_mix, inv_rms, h_pre, h_post: args 8..11) from the forward on
 * the case's x, phi, gamma, alpha and a random bias. */
static int pre_bwd_prepare(tu_op_case *c) {
    const int64_t B = c->sym['B'], S = c->sym['S'], n = c->sym['n'], D = c->sym['D'],
                  M = c->sym['M'];
    const ompk_device dev = c->dev;
    tu_buf bias = tu_buf_new(dev, OMPK_F32, M), h_in = tu_buf_new(dev, c->buf[0].dtype, B * S * D);
    tu_buf logits = tu_buf_new(dev, OMPK_F32, B * S * n * n);
    fill_randn(&bias, &c->rng, 0.3);
    const int64_t sb[1] = {M}, sh[3] = {B, S, D}, sl[4] = {B, S, n, n};
    ompk_tensor tb = tu_view(&bias, 1, sb), th = tu_view(&h_in, 3, sh),
                tl = tu_view(&logits, 4, sl);
    ompk_mhc_params p = pre_params(c);
    p.fuse_sinkhorn = 0; /* the backward takes res_logits' gradient, not comb */
    const ompk_mhc_pre_fwd_args a = {&c->t[0],  &c->t[1], c->sym['g'] ? &c->t[2] : NULL,
                                     &c->t[3],  &tb,      &th,
                                     &c->t[11], &tl,      NULL,
                                     &c->t[8],  &c->t[9], &c->t[10]};
    const ompk_status st = ompk_mhc_pre_fwd(&a, &p);
    tu_buf_free(&bias), tu_buf_free(&h_in), tu_buf_free(&logits);
    return st == OMPK_OK;
}
#endif

/* ---- attention ------------------------------------------------------------------------------- */
#if OMPK_HAVE_ATTENTION
/* m: the mask (0 none, 1 causal top-left, 2 causal bottom-right) */
static ompk_attention_params att_params(const tu_op_case *c) {
    ompk_attention_params p = ompk_attention_params_default();
    p.mask = (ompk_attention_mask)c->sym['m'];
    return p;
}
static ompk_status att_fwd(tu_op_case *c, ompk_tensor *const *t) {
    const ompk_attention_params p = att_params(c);
    return ompk_attention_fwd(t[0], t[1], t[2], t[3], t[4], &p);
}
static ompk_status att_bwd(tu_op_case *c, ompk_tensor *const *t) {
    const ompk_attention_params p = att_params(c);
    return ompk_attention_bwd(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], &p);
}
/* H query heads in groups of H/G per kv head */
static int att_valid(const int64_t *sym) {
    return sym['G'] >= 1 && sym['H'] % sym['G'] == 0;
}
/* out and lse (args 4, 5) from the forward on the case's q, k, v */
static int att_bwd_prepare(tu_op_case *c) {
    const ompk_attention_params p = att_params(c);
    return ompk_attention_fwd(&c->t[1], &c->t[2], &c->t[3], &c->t[4], &c->t[5], &p) == OMPK_OK;
}
#endif

/* ---- MoE: a layer of format f with LoRA rank R (none at R0), weights and adapters from the
 * case's host data ----------------------------------------------------------------------------- */
#if OMPK_HAVE_MOE
typedef struct moe_state {
    ompk_moe *m;
    tu_buf w[3], la[6];
    ompk_tensor tw[3], tla[6];
    int64_t entries; /* cache entries the case expects */
} moe_state;

static int moe_entries(const moe_state *s) {
    ompk_moe_info info;
    return ompk_moe_get_info(s->m, &info) == OMPK_OK ? (int)info.cache_entries : -1;
}

/* x [T,H], ids [T,k], w [T,k] of the case (args 0..2 of the forward calls) */
static int moe_setup_push(tu_op_case *c, int push) {
    moe_state *s = calloc(1, sizeof *s);
    if (!s) return 0;
    c->state = s;
    const int64_t E = c->sym['E'], H = c->sym['H'], I = c->sym['I'], T = c->sym['T'],
                  R = c->sym['R'], k = c->sym['k'];
    ompk_moe_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.experts = E, cfg.hidden = H, cfg.intermediate = I, cfg.top_k = (int)k;
    cfg.max_tokens = T, cfg.format = (ompk_moe_format)c->sym['f'], cfg.threads = 2;
    cfg.cache_depth = 2, cfg.lora_max_rank = (int)R;
    if (ompk_moe_create(&cfg, &s->m) != OMPK_OK) return 0;
    tu_rng r = tu_rng_make(5);
    const int64_t ws[3][3] = {{E, I, H}, {E, I, H}, {E, H, I}};
    for (int p = 0; p < 3; p++) {
        s->w[p] = tu_buf_new(ompk_device_host(), OMPK_F32, E * H * I);
        fill_randn(&s->w[p], &r, 0.1);
        s->tw[p] = tu_view(&s->w[p], 3, ws[p]);
    }
    if (ompk_moe_load_weights(s->m, &s->tw[0], &s->tw[1], &s->tw[2]) != OMPK_OK) return 0;
    if (R > 0) {
        const int64_t in[3] = {H, H, I}, out[3] = {I, I, H};
        for (int p = 0; p < 3; p++) {
            const int64_t sa[3] = {E, R, in[p]}, sb[3] = {E, out[p], R};
            s->la[2 * p] = tu_buf_new(ompk_device_host(), OMPK_F32, E * R * in[p]);
            s->la[2 * p + 1] = tu_buf_new(ompk_device_host(), OMPK_F32, E * R * out[p]);
            fill_randn(&s->la[2 * p], &r, 0.1);
            fill_randn(&s->la[2 * p + 1], &r, 0.1);
            s->tla[2 * p] = tu_view(&s->la[2 * p], 3, sa);
            s->tla[2 * p + 1] = tu_view(&s->la[2 * p + 1], 3, sb);
        }
        ompk_moe_lora lora;
        memset(&lora, 0, sizeof lora);
        lora.rank = (int)R;
        lora.alpha = (float)R;
        lora.gate_a = &s->tla[0], lora.gate_b = &s->tla[1];
        lora.up_a = &s->tla[2], lora.up_b = &s->tla[3];
        lora.down_a = &s->tla[4], lora.down_b = &s->tla[5];
        if (ompk_moe_set_lora(s->m, &lora) != OMPK_OK) return 0;
    }
    if (push) {
        /* the saved forward the backward consumes (and its bad calls must leave on the stack) */
        tu_buf x = tu_buf_new(c->dev, OMPK_F32, T * H), y = tu_buf_new(c->dev, OMPK_F32, T * H);
        tu_buf ids = tu_buf_new(c->dev, OMPK_I32, T * k), w = tu_buf_new(c->dev, OMPK_F32, T * k);
        fill_randn(&x, &r, 1.0);
        fill_randn(&w, &r, 0.5);
        for (int64_t i = 0; i < T * k; i++) tu_buf_set(&ids, i, (double)((i * 3 + i / k) % E));
        tu_buf_upload(&ids);
        const int64_t sx[2] = {T, H}, si[2] = {T, k};
        ompk_tensor tx = tu_view(&x, 2, sx), ty = tu_view(&y, 2, sx), ti = tu_view(&ids, 2, si),
                    tw = tu_view(&w, 2, si);
        const ompk_status st = ompk_moe_fwd_train(s->m, &tx, &ti, &tw, &ty, OMPK_MOE_CACHE_PUSH);
        tu_buf_free(&x), tu_buf_free(&y), tu_buf_free(&ids), tu_buf_free(&w);
        if (st != OMPK_OK) return 0;
        s->entries = 1;
    }
    return moe_entries(s) == s->entries;
}
static int moe_setup(tu_op_case *c) {
    return moe_setup_push(c, 0);
}
static int moe_setup_saved(tu_op_case *c) {
    return moe_setup_push(c, 1);
}
static int moe_same(tu_op_case *c) {
    const moe_state *s = c->state;
    return moe_entries(s) == s->entries;
}
static void moe_teardown(tu_op_case *c) {
    moe_state *s = c->state;
    if (!s) return;
    ompk_moe_destroy(s->m);
    for (int p = 0; p < 3; p++) tu_buf_free(&s->w[p]);
    for (int p = 0; p < 6; p++) tu_buf_free(&s->la[p]); /* zeroed when there is no adapter */
    free(s);
    c->state = NULL;
}
static ompk_status moe_fwd(tu_op_case *c, ompk_tensor *const *t) {
    return ompk_moe_fwd(((moe_state *)c->state)->m, t[0], t[1], t[2], t[3]);
}
static ompk_status moe_fwd_train(tu_op_case *c, ompk_tensor *const *t) {
    return ompk_moe_fwd_train(((moe_state *)c->state)->m, t[0], t[1], t[2], t[3],
                              OMPK_MOE_CACHE_PUSH);
}
/* LoRA gradients only with an adapter, base-weight gradients only on a bf16 base (the contract) */
static ompk_status moe_bwd(tu_op_case *c, ompk_tensor *const *t) {
    const int lora = c->sym['R'] > 0, full = c->sym['f'] == OMPK_MOE_BF16;
    ompk_moe_grads g;
    memset(&g, 0, sizeof g);
    g.dx = t[1], g.dw = t[2];
    if (lora) {
        g.gate_da = t[3], g.gate_db = t[4], g.up_da = t[5], g.up_db = t[6];
        g.down_da = t[7], g.down_db = t[8];
    }
    if (full) g.gate_dw = t[9], g.up_dw = t[10], g.down_dw = t[11];
    return ompk_moe_bwd(((moe_state *)c->state)->m, t[0], &g);
}
/* the int4 formats pack two codes a byte along H and I */
static ompk_status moe_combine_call(tu_op_case *c, ompk_tensor *const *t) {
    return ompk_moe_combine(((moe_state *)c->state)->m, t[0], t[1], t[2], t[3],
                            OMPK_MOE_COMBINE_FWD);
}
/* expert ids of the combine: any value >= -1 is valid (only the order matters), so they are
 * plain integer data here, filled in [-1, E) */
static void moe_combine_fill(tu_op_case *c) {
    tu_buf *ids = &c->buf[1];
    for (int64_t i = 0; i < ids->numel; i++)
        tu_buf_set(ids, i,
                   (double)((int64_t)(tu_uniform(&c->rng) * (double)(c->sym['E'] + 1)) - 1));
    tu_buf_upload(ids);
}
static int moe_valid(const int64_t *sym) {
    return sym['f'] < OMPK_MOE_INT4 || (sym['H'] % 2 == 0 && sym['I'] % 2 == 0);
}

/* the forward calls' arguments, symbols and bound symbols */
#define MOE_FWD_ARGS                                                                               \
    .nargs = 4,                                                                                    \
    .args = {{"x", IN, "TH", GRP(1, 1.0)},                                                         \
             {"expert_ids", IN, "Tk", IDX(-1, "E")},                                               \
             {"weights", IN, "Tk", F32},                                                           \
             {"y", OUT, "TH", GRP(2, 0)}},                                                         \
    .syms = "E6 H40 I24 T5 k2 R4 f0", .bound = "EHIk"
#endif

static const tu_op_spec ops[] = {
#if OMPK_HAVE_ROUTER
    {.name = "ompk_router_topk_fwd",
     .variant = "router_fwd",
     .nargs = 4,
     .args = {{"sx", IN, "TN", GRP(1, 1.0)},
              {"sy", IN, "TN", GRP(1, 1.0)},
              {"scores", OUT, "TK", F32},
              {"indices", OUT, "TK", OMPK_I32, 0, NULL, 0, 0}},
     .syms = "T3 N5 K4",
     .bound = "K",
     .call = router_fwd,
     /* every N with k in 1, 2, 8, 33 and N^2 (the whole order) */
     .sets = {"T3 N5 K4", "T5 N1,2,7,48,64 K1,2,8,33", "T5 N2 K4", "T5 N7 K49", "T5 N48 K2304",
              "T5 N64 K4096", "T3 N100,256 K1,2,8,33", "T3 N100 K10000", "T3 N256 K65536"},
     .valid = router_valid},
    {.name = "ompk_router_topk_bwd",
     .variant = "router_bwd",
     .nargs = 4,
     .args = {{"dscores", IN, "TK", GRP(1, 1.0)},
              {"indices", IN, "TK", IDX(-1, "NN")},
              {"dsx", OUT, "TN", GRP(2, 0)},
              {"dsy", OUT, "TN", GRP(2, 0)}},
     .syms = "T3 N5 K4",
     .bound = "N",
     .call = router_bwd,
     .index_zeroes = 1,
     /* every mix of dscores' and the outputs' dtypes at each shape */
     .sets = {"T3 N5 K4", "mix: T5 N1 K1", "mix: T5 N2 K4", "mix: T4 N7 K8", "mix: T3 N48 K33",
              "mix: T9 N64 K8", "mix: T3 N100 K33", "mix: T2 N256 K1024"},
     .valid = router_valid},
#endif
#if OMPK_HAVE_MHC
    {.name = "ompk_mhc_post_fwd",
     .variant = "mhc_post_fwd",
     .nargs = 5,
     .args = {{"x", IN, "BSnD", GRP(1, 1.0)},
              {"comb", IN, "BSnn", F32},
              {"post", IN, "BSn", F32S(1.0)},
              {"f", IN, "BSD", GRP(1, 1.0)},
              {"out", OUT, "BSnD", GRP(1, 0)}},
     .syms = "B2 S3 n4 D16",
     .bound = "",
     .call = post_fwd,
     /* every n with D below, at and past the vector widths */
     .sets = {"B2 S3 n4 D16", "B2 S3 n1-8 D1,7,8,24,130,1000"}},
    {.name = "ompk_mhc_post_bwd",
     .variant = "mhc_post_bwd",
     .nargs = 9,
     .args = {{"x", IN, "BSnD", GRP(1, 1.0)},
              {"comb", IN, "BSnn", F32},
              {"post", IN, "BSn", F32S(1.0)},
              {"f", IN, "BSD", GRP(1, 1.0)},
              {"dout", IN, "BSnD", GRP(1, 1.0)},
              {"dx", OUT, "BSnD", GRP(1, 0)},
              {"df", OUT, "BSD", GRP(1, 0)},
              {"dpost", OUT, "BSn", F32},
              {"dcomb", OUT, "BSnn", F32}},
     .syms = "B2 S3 n4 D16",
     .bound = "",
     .call = post_bwd,
     .sets = {"B2 S3 n4 D16", "B2 S3 n1-8 D1,7,8,24,130,1000", "bf16: B3 S41 n4 D4096"}},
    {.name = "ompk_mhc_sinkhorn_fwd",
     .variant = "mhc_sinkhorn_fwd",
     .nargs = 2,
     .args = {{"logits", IN, "BSnn", F32S(1.5)}, {"comb", OUT, "BSnn", F32}},
     .syms = "B2 S3 n4 r5",
     .bound = "",
     .call = sk_fwd,
     .sets = {"B2 S3 n4 r5", "B3 S5 n1-8 r1,2,7,20"}},
    {.name = "ompk_mhc_sinkhorn_bwd",
     .variant = "mhc_sinkhorn_bwd",
     .nargs = 3,
     .args = {{"logits", IN, "BSnn", F32S(1.5)},
              {"dcomb", IN, "BSnn", F32S(1.0)},
              {"dlogits", OUT, "BSnn", F32}},
     .syms = "B2 S3 n4 r5",
     .bound = "",
     .call = sk_bwd,
     .sets = {"B2 S3 n4 r5", "B3 S5 n1-8 r1,2,7,20"}},
    {.name = "ompk_mhc_pre_fwd",
     .variant = "mhc_pre_fwd",
     .nargs = 12,
     .args = {{"x", IN, "BSnD", GRP(1, 1.0)},
              {"phi", IN, "MK", F32},
              {"gamma", OPT_IN, "K", F32},
              {"alpha", IN, "a", F32},
              {"bias", IN, "M", F32},
              {"h_in", OUT, "BSD", GRP(1, 0)},
              {"h_post", OUT, "BSn", F32},
              {"res_logits", OPT_OUT, "BSnn", F32},
              {"comb", OUT, "BSnn", F32},
              {"h_mix", OPT_OUT, "TM", F32},
              {"inv_rms", OPT_OUT, "T", F32},
              {"h_pre", OPT_OUT, "Tn", F32}},
     .syms = "B2 S3 n4 D16 T6 M24 K64 a3 g1 u1",
     .bound = "TMKa",
     .call = pre_fwd,
     /* every n, with and without gamma and the fused Sinkhorn (D not a multiple of any tile:
      * test_mhc_pre's regression test); many tokens at a model's D */
     .sets = {"B2 S3 n4 D16 g1 u1", "B2 S3 n1-8 D1,7,24,130 g0,1 u0,1", "bf16: B3 S37 n4 D4096"},
     .derive = pre_derive,
     .fill = pre_fwd_fill},
    {.name = "ompk_mhc_post_pre_fwd",
     .variant = "mhc_pre_fwd",
     .nargs = 16,
     .args = {{"x", IN, "BSnD", GRP(1, 1.0)},
              {"comb", IN, "BSnn", F32},
              {"post", IN, "BSn", F32S(1.0)},
              {"f", IN, "BSD", GRP(1, 1.0)},
              {"x_out", OUT, "BSnD", GRP(1, 0)},
              {"phi", IN, "MK", F32},
              {"gamma", OPT_IN, "K", F32},
              {"alpha", IN, "a", F32},
              {"bias", IN, "M", F32},
              {"h_in", OUT, "BSD", GRP(1, 0)},
              {"h_post", OUT, "BSn", F32},
              {"res_logits", OPT_OUT, "BSnn", F32},
              {"comb_next", OUT, "BSnn", F32},
              {"h_mix", OPT_OUT, "TM", F32},
              {"inv_rms", OPT_OUT, "T", F32},
              {"h_pre", OPT_OUT, "Tn", F32}},
     .syms = "B2 S3 n4 D16 T6 M24 K64 a3 g1 u1",
     .bound = "TMKa",
     .call = post_pre_fwd,
     /* the pre forward's implementations by name (decode takes the post inside its region, the
      * others run after the post kernel): every n at decode sizes, T = 1 and 64 (the decode
      * kernel's most), and past it, where every entry runs the two kernels */
     .sets = {"B2 S3 n4 D16 g1 u1", "B2 S3 n1-8 D1,7,130 g0,1 u0,1", "B1 S1,64 n4 D24,1024 g1 u1",
              "B5 S13 n4 D24 g1 u1", "bf16: B3 S37 n4 D1024"},
     .derive = pre_derive,
     .fill = post_pre_fill},
    {.name = "ompk_mhc_pre_bwd",
     .variant = "mhc_pre_bwd",
     .nargs = 17,
     .args = {{"x", IN, "BSnD", GRP(1, 1.0)},
              {"phi", IN, "MK", F32},
              {"gamma", IN, "K", F32},
              {"alpha", IN, "a", F32},
              {"dh_in", IN, "BSD", GRP(2, 1.0)},
              {"dh_post", IN, "BSn", F32S(1.0)},
              {"dh_res", IN, "BSnn", F32S(1.0)},
              {"grad_x_post", OPT_IN, "BSnD", GRP(3, 1.0)},
              {"h_mix", IN, "TM", F32},
              {"inv_rms", IN, "T", F32},
              {"h_pre", IN, "Tn", F32},
              {"h_post", IN, "BSn", F32},
              {"dx", OUT, "BSnD", GRP(1, 0)},
              {"dphi", OUT, "MK", F32},
              {"dalpha", OUT, "a", F32},
              {"dbias", OUT, "M", F32},
              {"dgamma", OUT, "K", F32}},
     .syms = "B2 S3 n4 D16 T6 M24 K64 a3 g1 p1",
     .bound = "TMKa",
     .call = pre_bwd,
     /* as the forward, with and without grad_x_post; the tensor-core stage 4's shapes (every n it
      * serves, token tails inside a tile and across batches, many token blocks) */
     .sets = {"B2 S3 n4 D16 g1 p1", "B2 S3 n1-8 D1,7,24,130 g0,1 p0,1",
              "bf16: B3 S37 n4 D4096 p0,1", "bf16: B2 S300 n4 D256 g0 p0",
              "bf16: B4 S1030 n4 D128 p0", "bf16: B1 S70 n1 D128", "bf16: B2 S33 n2 D64 g0",
              "bf16: B1 S45 n3 D128 p0", "bf16: B1 S45 n5 D64 p0", "bf16: B2 S19 n6 D32 g0",
              "bf16: B1 S37 n7 D64", "bf16: B2 S21 n8 D48 p0,1"},
     .derive = pre_derive,
     .fill = pre_bwd_fill,
     .prepare = pre_bwd_prepare},
#endif
#if OMPK_HAVE_ATTENTION
    {.name = "ompk_attention_fwd",
     .variant = "attention_fwd",
     .nargs = 5,
     .args = {{"q", IN, "BHMD", GRP(1, 1.0)},
              {"k", IN, "BGND", GRP(1, 1.0)},
              {"v", IN, "BGND", GRP(1, 1.0)},
              {"out", OUT, "BHMD", GRP(1, 0)},
              {"lse", OPT_OUT, "BHM", F32}},
     .syms = "B2 H4 G2 M5 N7 D32 m0",
     .bound = "D",
     .call = att_fwd,
     /* every mask with GQA groups 1, 4, 8 at lengths of no tile's multiple; every head dim;
      * decode-sized queries against keys the GPU's split-KV forward cuts into several splits */
     .sets = {"B2 H4 G2 M5 N7 D32 m0-2", "B2 G2 H2,8,16 M37 N45 D64 m0-2",
              "B1 H2 G1 M70 N70 D32,64,80,96,128,256 m1", "B1 G2 H8 M1,3,16 N600 D64,128 m0-2"},
     .valid = att_valid},
    {.name = "ompk_attention_bwd",
     .variant = "attention_bwd",
     .nargs = 9,
     .args = {{"dout", IN, "BHMD", GRP(1, 1.0)},
              {"q", IN, "BHMD", GRP(1, 1.0)},
              {"k", IN, "BGND", GRP(1, 1.0)},
              {"v", IN, "BGND", GRP(1, 1.0)},
              {"out", IN, "BHMD", GRP(1, 0)},
              {"lse", IN, "BHM", F32},
              {"dq", OUT, "BHMD", GRP(1, 0)},
              {"dk", OUT, "BGND", GRP(1, 0)},
              {"dv", OUT, "BGND", GRP(1, 0)}},
     .syms = "B2 H4 G2 M5 N7 D32 m0",
     .bound = "D",
     .call = att_bwd,
     .sets = {"B2 H4 G2 M5 N7 D32 m0-2", "B2 G2 H2,8,16 M37 N45 D64 m0-2"},
     .valid = att_valid,
     .prepare = att_bwd_prepare},
#endif
#if OMPK_HAVE_MOE
    {.name = "ompk_moe_fwd",
     .variant = "moe",
     MOE_FWD_ARGS,
     .setup = moe_setup,
     .call = moe_fwd,
     .state_same = moe_same,
     .teardown = moe_teardown,
     .host_only = 1,
     /* every format; expert rows past the 32-row blocks, H and I not multiples of any k-tile */
     .sets = {"E6 H40 I24 T5 k2 R4 f0", "E5 H72 I100 T37 k3 R0,8 f0,1",
              "E5 H136 I100 T37 k3 R8 f2,3"},
     .valid = moe_valid},
    {.name = "ompk_moe_fwd_train",
     .variant = "moe",
     MOE_FWD_ARGS,
     .setup = moe_setup,
     .call = moe_fwd_train,
     .state_same = moe_same,
     .teardown = moe_teardown,
     .host_only = 1,
     /* with a LoRA adapter the forward above runs the training path too, less the cache push */
     .sets = {"E6 H40 I24 T5 k2 R4 f0", "E5 H72 I100 T37 k3 R0,8 f0,1"},
     .valid = moe_valid},
    {.name = "ompk_moe_combine",
     .variant = "moe",
     .nargs = 4,
     .args = {{"z", IN, "TkH", F32},
              {"expert_ids", IN, "Tk", OMPK_I32, 0, NULL, 0, 0},
              {"weights", IN, "Tk", F32},
              {"y", OUT, "TH", GRP(1, 0)}},
     .syms = "E6 H40 I24 T5 k2 R0 f0 o0",
     .bound = "EHI",
     .setup = moe_setup,
     .call = moe_combine_call,
     .state_same = moe_same,
     .teardown = moe_teardown,
     .host_only = 1,
     .host_tensors = 1,
     .sets = {"E6 H40 T5 k2", "E5 H72 T37 k3,8"},
     .fill = moe_combine_fill},
    {.name = "ompk_moe_bwd",
     .variant = "moe",
     .nargs = 12,
     .args = {{"dy", IN, "TH", GRP(1, 1.0)},
              {"dx", OUT, "TH", F32},
              {"dw", OPT_OUT, "Tk", F32},
              {"gate_da", HOST_OUT, "ERH", F32},
              {"gate_db", HOST_OUT, "EIR", F32},
              {"up_da", HOST_OUT, "ERH", F32},
              {"up_db", HOST_OUT, "EIR", F32},
              {"down_da", HOST_OUT, "ERI", F32},
              {"down_db", HOST_OUT, "EHR", F32},
              {"gate_dw", HOST_OUT, "EIH", F32},
              {"up_dw", HOST_OUT, "EIH", F32},
              {"down_dw", HOST_OUT, "EHI", F32}},
     .syms = "E6 H40 I24 T5 k2 R4 f0",
     .bound = "EHIkRT",
     .setup = moe_setup_saved,
     .call = moe_bwd,
     .state_same = moe_same,
     .teardown = moe_teardown,
     .host_only = 1,
     .sets = {"E6 H40 I24 T5 k2 R4 f0,1,2,3", "E5 H72 I100 T37 k3 R0,8 f0,1"}},
#endif
};

int tu_op_count(void) {
    return (int)(sizeof ops / sizeof ops[0]);
}

const tu_op_spec *tu_op_get(int i) {
    return i >= 0 && i < tu_op_count() ? &ops[i] : NULL;
}

/* "B2 S3 n4": each symbol's size into sym */
static void parse_syms(const char *s, int64_t *sym) {
    while (*s) {
        while (*s == ' ') s++;
        if (!*s) break;
        const unsigned char name = (unsigned char)*s++;
        sym[name & 127] = strtoll(s, (char **)&s, 10);
    }
}

void tu_op_syms(const tu_op_spec *op, const char *shape, int64_t *sym) {
    memset(sym, 0, 128 * sizeof *sym);
    parse_syms(op->syms, sym);
    if (shape) parse_syms(shape, sym);
    if (op->derive) op->derive(sym);
}

/* A set's tokens: a symbol and its values ("n1-8" or "D1,7,130"). */
typedef struct set_tok {
    char name;
    int64_t v[64];
    int nv;
} set_tok;

static int parse_set(const char *s, set_tok *tok, int max) {
    int nt = 0;
    while (*s) {
        while (*s == ' ') s++;
        if (!*s || nt == max) break;
        set_tok *t = &tok[nt++];
        t->name = *s++;
        t->nv = 0;
        for (;;) {
            char *end;
            const int64_t lo = strtoll(s, &end, 10);
            int64_t hi = lo;
            s = end;
            if (*s == '-') hi = strtoll(s + 1, &end, 10), s = end;
            for (int64_t v = lo; v <= hi && t->nv < 64; v++) t->v[t->nv++] = v;
            if (*s != ',') break;
            s++;
        }
    }
    return nt;
}

int tu_op_set_count(const char *set) {
    set_tok tok[16];
    const int nt = parse_set(set, tok, 16);
    int n = 1;
    for (int i = 0; i < nt; i++) n *= tok[i].nv;
    return n;
}

void tu_op_set_shape(const char *set, int i, char *out, size_t len) {
    set_tok tok[16];
    const int nt = parse_set(set, tok, 16);
    size_t used = 0;
    out[0] = '\0';
    for (int k = nt - 1; k >= 0; k--) { /* the first symbol varies slowest */
        const int64_t v = tok[k].v[i % tok[k].nv];
        i /= tok[k].nv;
        char one[32];
        snprintf(one, sizeof one, "%c%lld ", tok[k].name, (long long)v);
        const size_t l = strlen(one);
        if (used + l < len) memmove(out + l, out, used + 1), memcpy(out, one, l), used += l;
    }
    if (used) out[used - 1] = '\0';
}

int tu_op_groups(const tu_op_spec *op) {
    int g = 0;
    for (int i = 0; i < op->nargs; i++)
        if (op->args[i].group > g) g = op->args[i].group;
    return g;
}

int tu_op_dim_shared(const tu_op_spec *op, int arg, int dim) {
    const char sy = op->args[arg].dims[dim];
    if (strchr(op->bound, sy)) return 1;
    for (int j = 0; j < op->nargs; j++)
        if (j != arg && strchr(op->args[j].dims, sy)) return 1;
    /* the same symbol twice in one argument ([.., n, n]) */
    return strchr(op->args[arg].dims, sy) != strrchr(op->args[arg].dims, sy);
}

/* Index data: uniform in [max(lo, 0), hi), and where lo is negative (a padding value) a fifth of
 * the elements lo. */
static void fill_index(tu_buf *b, tu_rng *r, int64_t lo, int64_t hi) {
    const int64_t base = lo < 0 ? 0 : lo;
    for (int64_t e = 0; e < b->numel; e++) {
        const int pad = lo < 0 && tu_uniform(r) < 0.2;
        tu_buf_set(b, e, (double)(pad ? lo : base + (int64_t)(tu_next(r) % (uint64_t)(hi - base))));
    }
    tu_buf_upload(b);
}

int tu_op_case_make(const tu_op_spec *op, ompk_device dev, const tu_op_opts *opts, tu_op_case *c) {
    memset(c, 0, sizeof *c);
    c->op = op;
    c->dev = dev;
    tu_op_syms(op, opts ? opts->syms : NULL, c->sym);
    c->rng = tu_rng_make(opts ? opts->seed : 17);
    c->poison = opts ? opts->poison : 0xA5;
    for (int i = 0; i < op->nargs; i++) {
        const tu_op_arg *a = &op->args[i];
        const int nd = (int)strlen(a->dims);
        int64_t shape[OMPK_MAX_NDIM], n = 1;
        for (int d = 0; d < nd; d++) n *= shape[d] = c->sym[(unsigned char)a->dims[d] & 127];
        const ompk_dtype dt =
            opts && a->group && opts->dtype[a->group] ? opts->dtype[a->group] : a->dtype;
        c->buf[i] = tu_buf_new(a->host ? ompk_device_host() : dev, dt, n);
        if (a->out) {
            tu_buf_fill_bytes(&c->buf[i], c->poison);
        } else if (a->index_hi) {
            c->index_hi[i] = 1;
            for (const char *s = a->index_hi; *s; s++) c->index_hi[i] *= c->sym[(unsigned char)*s];
            fill_index(&c->buf[i], &c->rng, a->index_lo, c->index_hi[i]);
        } else {
            fill_randn(&c->buf[i], &c->rng, a->scale > 0 ? a->scale : 0.5);
        }
        c->t[i] = tu_view(&c->buf[i], nd, shape);
    }
    if (op->fill) op->fill(c);
    if (op->setup && !op->setup(c)) return 0;
    return op->prepare ? op->prepare(c) : 1;
}

int tu_op_case_new(const tu_op_spec *op, ompk_device dev, tu_op_case *c) {
    return tu_op_case_make(op, dev, NULL, c);
}

void tu_op_case_free(tu_op_case *c) {
    if (c->op->teardown) c->op->teardown(c);
    for (int i = 0; i < c->op->nargs; i++) tu_buf_free(&c->buf[i]);
}

int tu_op_outputs_poisoned(tu_op_case *c) {
    for (int i = 0; i < c->op->nargs; i++) {
        if (!c->op->args[i].out) continue;
        tu_buf_download(&c->buf[i]);
        if (!tu_buf_all_bytes(&c->buf[i], c->poison)) return 0;
    }
    return 1;
}

int tu_op_outputs_zero(tu_op_case *c) {
    for (int i = 0; i < c->op->nargs; i++) {
        if (!c->op->args[i].out) continue;
        tu_buf_download(&c->buf[i]);
        if (!tu_buf_all_bytes(&c->buf[i], 0)) return 0;
    }
    return 1;
}

void tu_op_poison(tu_op_case *c) {
    for (int i = 0; i < c->op->nargs; i++)
        if (c->op->args[i].out) tu_buf_fill_bytes(&c->buf[i], c->poison);
}
