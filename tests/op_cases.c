/* The op descriptors of op_cases.h: one table entry per public call that takes tensors. Sizes
 * are small so that the valid call of every case runs in milliseconds on the CI machine. */
#include "op_cases.h"

#include <stdlib.h>
#include <string.h>

#define OUT 1, 0, 0
#define IN 0, 0, 0
#define OPT_IN 0, 1, 0
#define OPT_OUT 1, 1, 0
#define HOST_OUT 1, 0, 1
#define F32 OMPK_F32, 0, 0

/* ---- router ---------------------------------------------------------------------------------- */
#if OMPK_HAVE_ROUTER
static ompk_status router_fwd(tu_op_case *c, ompk_tensor *const *t) {
    return ompk_router_topk_fwd(t[0], t[1], c->sym['K'], t[2], t[3]);
}
static ompk_status router_bwd(tu_op_case *c, ompk_tensor *const *t) {
    return ompk_router_topk_bwd(t[0], t[1], c->sym['N'], t[2], t[3]);
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
static ompk_status sk_fwd(tu_op_case *c, ompk_tensor *const *t) {
    (void)c;
    ompk_mhc_params p = ompk_mhc_params_default();
    p.sinkhorn_repeat = 5;
    return ompk_mhc_sinkhorn_fwd(t[0], t[1], &p);
}
static ompk_status sk_bwd(tu_op_case *c, ompk_tensor *const *t) {
    (void)c;
    ompk_mhc_params p = ompk_mhc_params_default();
    p.sinkhorn_repeat = 5;
    return ompk_mhc_sinkhorn_bwd(t[0], t[1], t[2], &p);
}
static ompk_status pre_fwd(tu_op_case *c, ompk_tensor *const *t) {
    (void)c;
    const ompk_mhc_pre_fwd_args a = {t[0], t[1], t[2], t[3], t[4],  t[5],
                                     t[6], t[7], t[8], t[9], t[10], t[11]};
    return ompk_mhc_pre_fwd(&a, NULL);
}
static ompk_status pre_bwd(tu_op_case *c, ompk_tensor *const *t) {
    (void)c;
    const ompk_mhc_pre_bwd_args a = {t[0], t[1],  t[2],  t[3],  t[4],  t[5],  t[6],  t[7], t[8],
                                     t[9], t[10], t[11], t[12], t[13], t[14], t[15], t[16]};
    return ompk_mhc_pre_bwd(&a, NULL);
}
#endif

/* ---- attention ------------------------------------------------------------------------------- */
#if OMPK_HAVE_ATTENTION
static ompk_status att_fwd(tu_op_case *c, ompk_tensor *const *t) {
    (void)c;
    const ompk_attention_params p = ompk_attention_params_default();
    return ompk_attention_fwd(t[0], t[1], t[2], t[3], t[4], &p);
}
static ompk_status att_bwd(tu_op_case *c, ompk_tensor *const *t) {
    (void)c;
    const ompk_attention_params p = ompk_attention_params_default();
    return ompk_attention_bwd(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], &p);
}
#endif

/* ---- MoE: a bf16 layer with LoRA rank R, weights and adapters from the case's host data ---- */
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
    cfg.max_tokens = T, cfg.format = OMPK_MOE_BF16, cfg.threads = 2, cfg.cache_depth = 2;
    cfg.lora_max_rank = (int)R;
    if (ompk_moe_create(&cfg, &s->m) != OMPK_OK) return 0;
    tu_rng r = tu_rng_make(5);
    const int64_t ws[3][3] = {{E, I, H}, {E, I, H}, {E, H, I}};
    for (int p = 0; p < 3; p++) {
        s->w[p] = tu_buf_new(ompk_device_host(), OMPK_F32, E * H * I);
        tu_buf_randn(&s->w[p], &r, 0.1);
        s->tw[p] = tu_view(&s->w[p], 3, ws[p]);
    }
    if (ompk_moe_load_weights(s->m, &s->tw[0], &s->tw[1], &s->tw[2]) != OMPK_OK) return 0;
    const int64_t in[3] = {H, H, I}, out[3] = {I, I, H};
    for (int p = 0; p < 3; p++) {
        const int64_t sa[3] = {E, R, in[p]}, sb[3] = {E, out[p], R};
        s->la[2 * p] = tu_buf_new(ompk_device_host(), OMPK_F32, E * R * in[p]);
        s->la[2 * p + 1] = tu_buf_new(ompk_device_host(), OMPK_F32, E * R * out[p]);
        tu_buf_randn(&s->la[2 * p], &r, 0.1);
        tu_buf_randn(&s->la[2 * p + 1], &r, 0.1);
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
    if (push) {
        /* the saved forward the backward's bad calls must leave on the stack */
        tu_buf x = tu_buf_new(c->dev, OMPK_F32, T * H), y = tu_buf_new(c->dev, OMPK_F32, T * H);
        tu_buf ids = tu_buf_new(c->dev, OMPK_I32, T * k), w = tu_buf_new(c->dev, OMPK_F32, T * k);
        tu_buf_randn(&x, &r, 1.0);
        tu_buf_randn(&w, &r, 0.5);
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
    for (int p = 0; p < 6; p++) tu_buf_free(&s->la[p]);
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
static ompk_status moe_bwd(tu_op_case *c, ompk_tensor *const *t) {
    ompk_moe_grads g;
    memset(&g, 0, sizeof g);
    g.dx = t[1], g.dw = t[2];
    g.gate_da = t[3], g.gate_db = t[4], g.up_da = t[5], g.up_db = t[6];
    g.down_da = t[7], g.down_db = t[8];
    g.gate_dw = t[9], g.up_dw = t[10], g.down_dw = t[11];
    return ompk_moe_bwd(((moe_state *)c->state)->m, t[0], &g);
}
#endif

#if OMPK_HAVE_MOE
/* the forward calls' arguments, symbols and bound symbols */
#define MOE_FWD_ARGS                                                                               \
    4,                                                                                             \
        {{"x", IN, "TH", F32},                                                                     \
         {"expert_ids", IN, "Tk", OMPK_I32, -1, 6},                                                \
         {"weights", IN, "Tk", F32},                                                               \
         {"y", OUT, "TH", F32}},                                                                   \
        "E6 H40 I24 T5 k2 R4", "EHIk"
#endif

static const tu_op_spec ops[] = {
#if OMPK_HAVE_ROUTER
    {"ompk_router_topk_fwd",
     4,
     {{"sx", IN, "TN", F32},
      {"sy", IN, "TN", F32},
      {"scores", OUT, "TK", F32},
      {"indices", OUT, "TK", OMPK_I32, 0, 0}},
     "T3 N5 K4",
     "K",
     NULL,
     router_fwd,
     NULL,
     NULL,
     0},
    {"ompk_router_topk_bwd",
     4,
     {{"dscores", IN, "TK", F32},
      {"indices", IN, "TK", OMPK_I32, -1, 25},
      {"dsx", OUT, "TN", F32},
      {"dsy", OUT, "TN", F32}},
     "T3 N5 K4",
     "N",
     NULL,
     router_bwd,
     NULL,
     NULL,
     1},
#endif
#if OMPK_HAVE_MHC
    {"ompk_mhc_post_fwd",
     5,
     {{"x", IN, "BSnD", F32},
      {"comb", IN, "BSnn", F32},
      {"post", IN, "BSn", F32},
      {"f", IN, "BSD", F32},
      {"out", OUT, "BSnD", F32}},
     "B2 S3 n4 D16",
     "",
     NULL,
     post_fwd,
     NULL,
     NULL,
     0},
    {"ompk_mhc_post_bwd",
     9,
     {{"x", IN, "BSnD", F32},
      {"comb", IN, "BSnn", F32},
      {"post", IN, "BSn", F32},
      {"f", IN, "BSD", F32},
      {"dout", IN, "BSnD", F32},
      {"dx", OUT, "BSnD", F32},
      {"df", OUT, "BSD", F32},
      {"dpost", OUT, "BSn", F32},
      {"dcomb", OUT, "BSnn", F32}},
     "B2 S3 n4 D16",
     "",
     NULL,
     post_bwd,
     NULL,
     NULL,
     0},
    {"ompk_mhc_sinkhorn_fwd",
     2,
     {{"logits", IN, "BSnn", F32}, {"comb", OUT, "BSnn", F32}},
     "B2 S3 n4",
     "",
     NULL,
     sk_fwd,
     NULL,
     NULL,
     0},
    {"ompk_mhc_sinkhorn_bwd",
     3,
     {{"logits", IN, "BSnn", F32}, {"dcomb", IN, "BSnn", F32}, {"dlogits", OUT, "BSnn", F32}},
     "B2 S3 n4",
     "",
     NULL,
     sk_bwd,
     NULL,
     NULL,
     0},
    {"ompk_mhc_pre_fwd",
     12,
     {{"x", IN, "BSnD", F32},
      {"phi", IN, "MK", F32},
      {"gamma", OPT_IN, "K", F32},
      {"alpha", IN, "a", F32},
      {"bias", IN, "M", F32},
      {"h_in", OUT, "BSD", F32},
      {"h_post", OUT, "BSn", F32},
      {"res_logits", OPT_OUT, "BSnn", F32},
      {"comb", OUT, "BSnn", F32},
      {"h_mix", OPT_OUT, "TM", F32},
      {"inv_rms", OPT_OUT, "T", F32},
      {"h_pre", OPT_OUT, "Tn", F32}},
     "B2 S3 n4 D16 T6 M24 K64 a3",
     "TMKa",
     NULL,
     pre_fwd,
     NULL,
     NULL,
     0},
    {"ompk_mhc_pre_bwd",
     17,
     {{"x", IN, "BSnD", F32},
      {"phi", IN, "MK", F32},
      {"gamma", IN, "K", F32},
      {"alpha", IN, "a", F32},
      {"dh_in", IN, "BSD", F32},
      {"dh_post", IN, "BSn", F32},
      {"dh_res", IN, "BSnn", F32},
      {"grad_x_post", OPT_IN, "BSnD", F32},
      {"h_mix", IN, "TM", F32},
      {"inv_rms", IN, "T", F32},
      {"h_pre", IN, "Tn", F32},
      {"h_post", IN, "BSn", F32},
      {"dx", OUT, "BSnD", F32},
      {"dphi", OUT, "MK", F32},
      {"dalpha", OUT, "a", F32},
      {"dbias", OUT, "M", F32},
      {"dgamma", OUT, "K", F32}},
     "B2 S3 n4 D16 T6 M24 K64 a3",
     "TMKa",
     NULL,
     pre_bwd,
     NULL,
     NULL,
     0},
#endif
#if OMPK_HAVE_ATTENTION
    {"ompk_attention_fwd",
     5,
     {{"q", IN, "BHMD", F32},
      {"k", IN, "BGND", F32},
      {"v", IN, "BGND", F32},
      {"out", OUT, "BHMD", F32},
      {"lse", OPT_OUT, "BHM", F32}},
     "B2 H4 G2 M5 N7 D32",
     "D",
     NULL,
     att_fwd,
     NULL,
     NULL,
     0},
    {"ompk_attention_bwd",
     9,
     {{"dout", IN, "BHMD", F32},
      {"q", IN, "BHMD", F32},
      {"k", IN, "BGND", F32},
      {"v", IN, "BGND", F32},
      {"out", IN, "BHMD", F32},
      {"lse", IN, "BHM", F32},
      {"dq", OUT, "BHMD", F32},
      {"dk", OUT, "BGND", F32},
      {"dv", OUT, "BGND", F32}},
     "B2 H4 G2 M5 N7 D32",
     "D",
     NULL,
     att_bwd,
     NULL,
     NULL,
     0},
#endif
#if OMPK_HAVE_MOE
    {"ompk_moe_fwd", MOE_FWD_ARGS, moe_setup, moe_fwd, moe_same, moe_teardown, 0},
    {"ompk_moe_fwd_train", MOE_FWD_ARGS, moe_setup, moe_fwd_train, moe_same, moe_teardown, 0},
    {"ompk_moe_bwd",
     12,
     {{"dy", IN, "TH", F32},
      {"dx", OUT, "TH", F32},
      {"dw", OPT_OUT, "Tk", F32},
      {"gate_da", 1, 1, 1, "ERH", F32},
      {"gate_db", 1, 1, 1, "EIR", F32},
      {"up_da", 1, 1, 1, "ERH", F32},
      {"up_db", 1, 1, 1, "EIR", F32},
      {"down_da", 1, 1, 1, "ERI", F32},
      {"down_db", 1, 1, 1, "EHR", F32},
      {"gate_dw", 1, 1, 1, "EIH", F32},
      {"up_dw", 1, 1, 1, "EIH", F32},
      {"down_dw", 1, 1, 1, "EHI", F32}},
     "E6 H40 I24 T5 k2 R4",
     "EHIkRT",
     moe_setup_saved,
     moe_bwd,
     moe_same,
     moe_teardown,
     0},
#endif
};

int tu_op_count(void) {
    return (int)(sizeof ops / sizeof ops[0]);
}

const tu_op_spec *tu_op_get(int i) {
    return i >= 0 && i < tu_op_count() ? &ops[i] : NULL;
}

static void parse_syms(const char *s, int64_t *sym) {
    while (*s) {
        while (*s == ' ') s++;
        if (!*s) break;
        const unsigned char name = (unsigned char)*s++;
        sym[name & 127] = strtoll(s, (char **)&s, 10);
    }
}

int tu_op_dim_shared(const tu_op_spec *op, int arg, int dim) {
    const char sy = op->args[arg].dims[dim];
    if (strchr(op->bound, sy)) return 1;
    for (int j = 0; j < op->nargs; j++)
        if (j != arg && strchr(op->args[j].dims, sy)) return 1;
    /* the same symbol twice in one argument ([.., n, n]) */
    return strchr(op->args[arg].dims, sy) != strrchr(op->args[arg].dims, sy);
}

int tu_op_case_new(const tu_op_spec *op, ompk_device dev, tu_op_case *c) {
    memset(c, 0, sizeof *c);
    c->op = op;
    c->dev = dev;
    parse_syms(op->syms, c->sym);
    tu_rng r = tu_rng_make(17);
    for (int i = 0; i < op->nargs; i++) {
        const tu_op_arg *a = &op->args[i];
        const int nd = (int)strlen(a->dims);
        int64_t shape[OMPK_MAX_NDIM], n = 1;
        for (int d = 0; d < nd; d++) n *= shape[d] = c->sym[(unsigned char)a->dims[d] & 127];
        c->buf[i] = tu_buf_new(a->host ? ompk_device_host() : dev, a->dtype, n);
        if (a->out) {
            tu_buf_fill_bytes(&c->buf[i], 0xA5);
        } else if (a->index_hi > 0) {
            const int64_t span = a->index_hi - a->index_lo;
            for (int64_t e = 0; e < n; e++)
                tu_buf_set(&c->buf[i], e, (double)(a->index_lo + (e * 7 + 3) % span));
            tu_buf_upload(&c->buf[i]);
        } else {
            tu_buf_randn(&c->buf[i], &r, 0.5);
        }
        c->t[i] = tu_view(&c->buf[i], nd, shape);
    }
    return op->setup ? op->setup(c) : 1;
}

void tu_op_case_free(tu_op_case *c) {
    if (c->op->teardown) c->op->teardown(c);
    for (int i = 0; i < c->op->nargs; i++) tu_buf_free(&c->buf[i]);
}

int tu_op_outputs_poisoned(tu_op_case *c) {
    for (int i = 0; i < c->op->nargs; i++) {
        if (!c->op->args[i].out) continue;
        tu_buf_download(&c->buf[i]);
        if (!tu_buf_all_bytes(&c->buf[i], 0xA5)) return 0;
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
        if (c->op->args[i].out) tu_buf_fill_bytes(&c->buf[i], 0xA5);
}
