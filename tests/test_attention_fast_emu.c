/* The tensor-core GPU forward (src/target/attention/attention_fast.c) run on the host: the source
 * is included with OMPK_EMULATE, which makes each team 128 emulated threads (emu_team.h) and turns
 * mma.sync, ldmatrix.trans and the shuffles into fragment exchanges through memory. CI thereby
 * checks the kernel's own algorithm (fragment layouts, tile loads, masks, online softmax, bf16 P)
 * against the double reference; the GPU run of test_attention_fwd checks the real instructions. */
#define OMPK_EMULATE 1
#include "emu_team.h"

#include "attention_fast.c"
#include "emu_common.h"

#include <criterion/criterion.h>

#include "test_attention_common.h"

/* Shapes stay small: every emulated warp instruction is two barriers of 128 threads. */

typedef struct {
    const ompk_attn_geom *g;
    const uint16_t *q, *k, *v, *dout;
    uint16_t *out, *dq, *dk, *dv;
    float *lse;
    const float *dsum;
} emu_args;

static void fwd_thread(void *p) {
    const emu_args *a = p;
#define EMU_FWD(D)                                                                                 \
    attf_fwd_team(a->g, a->q, a->k, a->v, a->out, a->lse, attf_emu_sk, attf_emu_sv, D)
    ATT_SWITCH_DH_TC(a->g->dh, EMU_FWD)
#undef EMU_FWD
}

/* The forward's geometry of a case (bf16). */
static ompk_attn_geom fwd_geom(const att_case *c) {
    ompk_attn_geom g = att_case_geom(c);
    g.bf16 = 1;
    return g;
}

/* Every team of the grid in turn, its threads as one emulated team of 128; 0 when a team
 * diverged (emu_team_run). */
static int emu_run(att_case *c) {
    const ompk_attn_geom g = fwd_geom(c);
    emu_args a;
    memset(&a, 0, sizeof a);
    a.g = &g, a.q = c->q.host, a.k = c->k.host, a.v = c->v.host;
    a.out = c->out.host, a.lse = c->lse.host;
    const int64_t teams = g.B * g.Hq * ((g.N + ATTF_BQ - 1) / ATTF_BQ);
    for (int64_t t = 0; t < teams; t++) {
        ompk_emu_block = (int)t;
        if (emu_team_run(128, fwd_thread, &a) != 0) return 0;
    }
    return 1;
}

/* The split-KV forward: every team of (b, kv head, row block, split) emulated, then the merge
 * of the splits element by element on the host, as the GPU's combine loop runs it. */
static emu_args dec_args;
static float *dec_ws;
static int64_t dec_S, dec_chunk;

static void dec_thread(void *p) {
    const emu_args *a = p;
#define EMU_DEC(D)                                                                                 \
    attf_dec_team(a->g, a->q, a->k, a->v, dec_ws, dec_S, dec_chunk, attf_emu_sk, attf_emu_sv, D,   \
                  attf_dec_warps(a->g))
    ATT_SWITCH_DH_TC(a->g->dh, EMU_DEC)
#undef EMU_DEC
}

static int emu_run_dec(att_case *c) {
    const ompk_attn_geom g = fwd_geom(c);
    memset(&dec_args, 0, sizeof dec_args);
    dec_args.g = &g, dec_args.q = c->q.host, dec_args.k = c->k.host, dec_args.v = c->v.host;
    dec_S = attf_dec_splits(&g, &dec_chunk);
    const int64_t rows = g.B * g.Hq * g.N, R = (g.Hq / g.Hkv) * g.N;
    dec_ws = malloc(sizeof(float) * (size_t)(rows * dec_S * (g.dh + 2) + 1));
    cr_assert(dec_ws);
    const int64_t rpt = 16 * attf_dec_warps(&g),
                  teams = g.B * g.Hkv * ((R + rpt - 1) / rpt) * dec_S;
    int ok = 1;
    for (int64_t t = 0; t < teams && ok; t++) {
        ompk_emu_block = (int)t;
        ok = emu_team_run(32 * attf_dec_warps(&g), dec_thread, &dec_args) == 0;
    }
    for (int64_t t = 0; t < rows * g.dh && ok; t++)
        attf_dec_merge(&g, dec_ws, dec_S, t, c->out.host, c->lse.host);
    free(dec_ws);
    return ok;
}

static void check_with(int (*run)(att_case *), int64_t B, int64_t Hq, int64_t Hkv, int64_t N,
                       int64_t M, int64_t dh, ompk_attention_mask mask, int bshd, double qk_std,
                       uint64_t seed) {
    att_case c;
    att_case_new(&c, ompk_device_host(), OMPK_BF16, B, Hq, Hkv, N, M, dh, mask, seed, qk_std, bshd);
    cr_assert(run(&c), "an emulated team of 128 threads diverged");
    ompk_tensor hq = att_host(&c.q, &c.tq), hk = att_host(&c.k, &c.tk), hv = att_host(&c.v, &c.tv);
    double *ro = malloc(sizeof(double) * (size_t)(c.out.numel + 1));
    double *rl = malloc(sizeof(double) * (size_t)(c.lse.numel + 1));
    ompk_attention_ref_fwd(&hq, &hk, &hv, c.scale, mask, ro, rl);
    char what[160];
    snprintf(what, sizeof what, "emu B%lld Hq%lld Hkv%lld N%lld M%lld dh%lld mask=%s bshd=%d",
             (long long)B, (long long)Hq, (long long)Hkv, (long long)N, (long long)M, (long long)dh,
             att_mask_name(mask), bshd);
    /* P is rounded to bf16 before P*V (1.5x band, as in the other suites) */
    double w =
        att_worst(what, &c.out, &c.tout, ro, att_tol(OMPK_BF16, OMPK_TOL_ATT_OUT, 1, 1, 1.0));
    double wl =
        att_worst(what, &c.lse, &c.tlse, rl, att_tol(OMPK_F32, OMPK_TOL_ATT_LSE, 1, 0, 1.0));
    cr_expect(w <= 1.0 && wl <= 1.0, "%s: worst ratio out %g lse %g", what, w, wl);
    free(ro);
    free(rl);
    att_case_free(&c);
}

/* NaN and +-inf in q, k or v (the sweep in test_attention_common.h): the emulated instructions
 * return the GPU's NaN, so NaN handling on bit patterns is checked as the GPU runs it. v runs
 * unmasked only: in a tile that a causal mask cuts, a masked P = 0 still meets it in the mma,
 * and the entry points send such calls to the portable kernel (tc_fwd_safe). */
static void check(int64_t B, int64_t Hq, int64_t Hkv, int64_t N, int64_t M, int64_t dh,
                  ompk_attention_mask mask, int bshd, double qk_std, uint64_t seed) {
    check_with(emu_run, B, Hq, Hkv, N, M, dh, mask, bshd, qk_std, seed);
}

Test(attention_fast_emu, nonfinite_rows) {
    att_emu_nonfinite(OMPK_BF16, emu_run);
}

Test(attention_fast_emu, huge_scale) {
    att_emu_huge_scale(OMPK_BF16, emu_run);
}

Test(attention_fast_emu, head_dims) {
    const int64_t dhs[5] = {32, 64, 80, 96, 128};
    for (int i = 0; i < 5; i++) check(1, 1, 1, 70, 75, dhs[i], OMPK_ATTN_MASK_NONE, 0, 1.0, 10 + i);
}

Test(attention_fast_emu, masks_gqa_odd_lengths) {
    check(1, 4, 1, 65, 130, 64, OMPK_ATTN_MASK_CAUSAL_TOP_LEFT, 0, 1.0, 21);
    check(1, 2, 2, 130, 65, 96, OMPK_ATTN_MASK_CAUSAL_BOTTOM_RIGHT, 0, 1.0, 22);
    check(2, 2, 1, 1, 17, 128, OMPK_ATTN_MASK_NONE, 1, 1.0, 23);
    check(1, 2, 1, 17, 1, 32, OMPK_ATTN_MASK_CAUSAL_TOP_LEFT, 0, 1.0, 24);
}

Test(attention_fast_emu, fully_masked_rows_and_large_logits) {
    check(1, 1, 1, 100, 20, 64, OMPK_ATTN_MASK_CAUSAL_BOTTOM_RIGHT, 0, 1.0, 31);
    check(1, 1, 1, 64, 64, 128, OMPK_ATTN_MASK_CAUSAL_TOP_LEFT, 0, 30.0, 32);
}

/* the split-KV forward: one-warp (up to 16 rows per kv head) and four-warp teams, several
 * splits (M > 256), a split past a causal limit, GQA groups of more than one row block, N = 1,
 * fully masked rows, large logits, non-finite inputs */
Test(attention_fast_emu, splitkv_shapes) {
    const int64_t dhs[5] = {32, 64, 80, 96, 128};
    for (int i = 0; i < 5; i++)
        check_with(emu_run_dec, 1, 2, 1, 3, 300 + 37 * i, dhs[i], OMPK_ATTN_MASK_NONE, i & 1, 1.0,
                   40 + i);
    check_with(emu_run_dec, 1, 16, 1, 5, 700, 64, OMPK_ATTN_MASK_CAUSAL_BOTTOM_RIGHT, 0, 1.0, 46);
    check_with(emu_run_dec, 2, 4, 2, 1, 530, 128, OMPK_ATTN_MASK_NONE, 1, 1.0, 47);
    check_with(emu_run_dec, 1, 2, 1, 16, 600, 64, OMPK_ATTN_MASK_CAUSAL_TOP_LEFT, 0, 1.0, 48);
    check_with(emu_run_dec, 1, 8, 1, 3, 1200, 64, OMPK_ATTN_MASK_CAUSAL_BOTTOM_RIGHT, 1, 1.0, 51);
    check_with(emu_run_dec, 1, 1, 1, 12, 5, 32, OMPK_ATTN_MASK_CAUSAL_BOTTOM_RIGHT, 0, 1.0, 49);
    check_with(emu_run_dec, 1, 2, 1, 4, 520, 128, OMPK_ATTN_MASK_NONE, 0, 30.0, 50);
}

Test(attention_fast_emu, splitkv_nonfinite) {
    att_emu_nonfinite(OMPK_BF16, emu_run_dec);
}

/* ---- backward ------------------------------------------------------------------------- */

static float emu_sl[ATTF_BQB], emu_sd[ATTF_BQB];
static int emu_slim[ATTF_BQB];

static void dkdv_thread(void *p) {
    const emu_args *a = p;
#define EMU_DKDV(D)                                                                                \
    attf_dkdv_team(a->g, a->q, a->k, a->v, a->dout, a->lse, a->dsum, a->dk, a->dv, attf_emu_sk,    \
                   attf_emu_sv, emu_sl, emu_sd, emu_slim, D)
    ATT_SWITCH_DH_TC(a->g->dh, EMU_DKDV)
#undef EMU_DKDV
}

static void dq_thread(void *p) {
    const emu_args *a = p;
#define EMU_DQ(D)                                                                                  \
    attf_dq_team(a->g, a->q, a->k, a->v, a->dout, a->lse, a->dsum, a->dq, attf_emu_sk,             \
                 attf_emu_sv, D)
    ATT_SWITCH_DH_TC(a->g->dh, EMU_DQ)
#undef EMU_DQ
}

/* Forward on the host (portable kernel), D = rowsum(dout * out), then the emulated dK/dV and
 * dQ teams. */
static int emu_bwd(att_case *c) {
    cr_assert_eq(att_fwd(c), OMPK_OK, "%s", ompk_last_error());
    ompk_attn_geom g = att_case_geom(c);
    g.bf16 = 1;
    const int64_t rows = g.B * g.Hq * g.N;
    float *dsum = malloc(sizeof(float) * (size_t)(rows + 1));
    ompk_tensor ho = att_host(&c->out, &c->tout), hd = att_host(&c->dout, &c->tdout);
    for (int64_t r = 0; r < rows; r++) {
        float acc = 0.f;
        for (int64_t d = 0; d < g.dh; d++)
            acc +=
                (float)ompk_host_get(&ho, r * g.dh + d) * (float)ompk_host_get(&hd, r * g.dh + d);
        dsum[r] = acc;
    }
    emu_args a;
    memset(&a, 0, sizeof a);
    a.g = &g, a.q = c->q.host, a.k = c->k.host, a.v = c->v.host, a.dout = c->dout.host;
    a.dq = c->dq.host, a.dk = c->dk.host, a.dv = c->dv.host, a.lse = c->lse.host, a.dsum = dsum;
    int ok = 1;
    const int64_t kteams = g.B * g.Hkv * ((g.M + ATTF_BK - 1) / ATTF_BK);
    for (int64_t t = 0; t < kteams && ok; t++) {
        ompk_emu_block = (int)t;
        ok = emu_team_run(128, dkdv_thread, &a) == 0;
    }
    const int64_t qteams = g.B * g.Hq * ((g.N + ATTF_BQ - 1) / ATTF_BQ);
    for (int64_t t = 0; t < qteams && ok; t++) {
        ompk_emu_block = (int)t;
        ok = emu_team_run(128, dq_thread, &a) == 0;
    }
    free(dsum);
    return ok;
}

static void check_bwd(int64_t B, int64_t Hq, int64_t Hkv, int64_t N, int64_t M, int64_t dh,
                      ompk_attention_mask mask, int bshd, uint64_t seed) {
    att_case c;
    att_case_new(&c, ompk_device_host(), OMPK_BF16, B, Hq, Hkv, N, M, dh, mask, seed, 1.0, bshd);
    cr_assert(emu_bwd(&c), "an emulated team of 128 threads diverged");
    ompk_tensor hq = att_host(&c.q, &c.tq), hk = att_host(&c.k, &c.tk), hv = att_host(&c.v, &c.tv);
    ompk_tensor hdo = att_host(&c.dout, &c.tdout), ho = att_host(&c.out, &c.tout);
    double *rq = malloc(sizeof(double) * (size_t)(c.dq.numel + 1));
    double *rk = malloc(sizeof(double) * (size_t)(c.dk.numel + 1));
    double *rv = malloc(sizeof(double) * (size_t)(c.dv.numel + 1));
    ompk_attention_ref_bwd(&hdo, &hq, &hk, &hv, &ho, c.scale, mask, rq, rk, rv);
    char what[160];
    snprintf(what, sizeof what, "emu bwd B%lld Hq%lld Hkv%lld N%lld M%lld dh%lld mask=%s",
             (long long)B, (long long)Hq, (long long)Hkv, (long long)N, (long long)M, (long long)dh,
             att_mask_name(mask));
    /* P and dS enter the tensor cores as bf16 (FlashAttention-2's choice) */
    const int64_t G = Hq / Hkv;
    double w1 = att_worst(what, &c.dq, &c.tdq, rq, att_tol(OMPK_BF16, OMPK_TOL_ATT_DQ, G, 1, 1.0));
    double w2 = att_worst(what, &c.dk, &c.tdk, rk, att_tol(OMPK_BF16, OMPK_TOL_ATT_DKV, G, 1, 1.0));
    double w3 = att_worst(what, &c.dv, &c.tdv, rv, att_tol(OMPK_BF16, OMPK_TOL_ATT_DKV, G, 1, 1.0));
    cr_expect(w1 <= 1.0 && w2 <= 1.0 && w3 <= 1.0, "%s: worst ratio dq %g dk %g dv %g", what, w1,
              w2, w3);
    free(rq);
    free(rk);
    free(rv);
    att_case_free(&c);
}

Test(attention_fast_emu, backward_head_dims) {
    const int64_t dhs[5] = {32, 64, 80, 96, 128};
    for (int i = 0; i < 5; i++)
        check_bwd(1, 1, 1, 70, 75, dhs[i], OMPK_ATTN_MASK_NONE, 0, 40 + (uint64_t)i);
}

Test(attention_fast_emu, backward_masks_gqa_fully_masked) {
    check_bwd(1, 4, 1, 65, 130, 64, OMPK_ATTN_MASK_CAUSAL_TOP_LEFT, 0, 51);
    check_bwd(1, 2, 2, 130, 65, 96, OMPK_ATTN_MASK_CAUSAL_BOTTOM_RIGHT, 1, 52);
    check_bwd(2, 2, 1, 17, 1, 32, OMPK_ATTN_MASK_NONE, 0, 53);
    check_bwd(1, 2, 1, 100, 20, 64, OMPK_ATTN_MASK_CAUSAL_BOTTOM_RIGHT, 0, 54);
}

/* NaN in q, k or v through the emulated backward (att_emu_bwd_nan) */
Test(attention_fast_emu, backward_nan) {
    att_emu_bwd_nan(OMPK_BF16, 80, emu_bwd);
}
