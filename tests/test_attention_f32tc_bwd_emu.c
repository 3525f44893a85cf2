/* The 3xTF32 GPU backward for f32 (src/target/attention/attention_f32tc_bwd.c) run on the host:
 * the source is included with OMPK_EMULATE, which makes each team 128 emulated threads
 * (emu_team.h) and turns mma.sync tf32 and the shuffles into fragment exchanges through memory.
 * CI thereby checks the kernels' own algorithm (operand split, permuted fragments, the key
 * teams' walk over query heads and tiles, masks, the pipelined tile loads) against the double
 * reference with the f32 bands of test_attention_bwd; the GPU run checks the real instructions. */
#define OMPK_EMULATE 1
#include "emu_team.h"

#include "attention_f32tc_bwd.c"
#include "emu_common.h"

#include <criterion/criterion.h>

#include "test_attention_common.h"

/* Shapes stay small: every emulated warp instruction is two barriers of 128 threads. */

typedef struct {
    const ompk_attn_geom *g;
    const float *q, *k, *v, *dout, *dsum;
    float *lw, *dq, *dk, *dv;
    int safe; /* the split for non-finite operands, as ompk_attn_bwd_f32tc chooses it */
} emu_args;

/* a team function of head dim D with the split the call's operands ask for */
#define EMU_CALL(FN, D, ...)                                                                       \
    if (a->safe)                                                                                   \
        FN(__VA_ARGS__, D, 1);                                                                     \
    else                                                                                           \
        FN(__VA_ARGS__, D, 0)

static void lse_thread(void *p) {
    const emu_args *a = p;
#define EMU_LSE(D) EMU_CALL(attb_lse_team, D, a->g, a->q, a->k, a->lw, attb_emu_tiles)
    ATT_SWITCH_DH_TC(a->g->dh, EMU_LSE)
#undef EMU_LSE
}

static void dv_thread(void *p) {
    const emu_args *a = p;
#define EMU_DV(D)                                                                                  \
    EMU_CALL(attb_dv_team, D, a->g, a->q, a->k, a->dout, a->lw, a->dsum, a->dv, attb_emu_tiles,    \
             attb_emu_rows)
    ATT_SWITCH_DH_TC(a->g->dh, EMU_DV)
#undef EMU_DV
}

static void dk_thread(void *p) {
    const emu_args *a = p;
#define EMU_DK(D)                                                                                  \
    EMU_CALL(attb_dk_team, D, a->g, a->q, a->k, a->v, a->dout, a->lw, a->dsum, a->dk,              \
             attb_emu_tiles, attb_emu_rows)
    ATT_SWITCH_DH_TC(a->g->dh, EMU_DK)
#undef EMU_DK
}

static void dq_thread(void *p) {
    const emu_args *a = p;
#define EMU_DQ(D)                                                                                  \
    EMU_CALL(attb_dq_team, D, a->g, a->q, a->k, a->v, a->dout, a->lw, a->dsum, a->dq,              \
             attb_emu_tiles)
    ATT_SWITCH_DH_TC(a->g->dh, EMU_DQ)
#undef EMU_DQ
}

/* whether any element of the buffers is not finite */
static int any_nonfinite(const tu_buf *const *b, int n) {
    for (int i = 0; i < n; i++)
        for (int64_t e = 0; e < b[i]->numel; e++)
            if (!isfinite(((const float *)b[i]->host)[e])) return 1;
    return 0;
}

/* Every team of a kernel's grid in turn; 0 when a team diverged. */
static int emu_grid(int64_t teams, void (*fn)(void *), void *a) {
    for (int64_t t = 0; t < teams; t++) {
        ompk_emu_block = (int)t;
        if (emu_team_run(128, fn, a) != 0) return 0;
    }
    return 1;
}

/* Forward on the host (the portable kernel gives out and lse: the backward recomputes lse from
 * its own scores), D = rowsum(dout * out), then the emulated lse, dV, dK and dQ grids. */
static int emu_bwd(att_case *c) {
    cr_assert_eq(att_fwd(c), OMPK_OK, "%s", ompk_last_error());
    ompk_attn_geom g = att_case_geom(c);
    g.bf16 = 0;
    const tu_buf *in[4] = {&c->q, &c->k, &c->v, &c->dout};
    const int safe = any_nonfinite(in, 4);
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
    float *lw = malloc(sizeof(float) * (size_t)(rows + 1));
    emu_args a = {&g, c->q.host,  c->k.host,  c->v.host,  c->dout.host, dsum,
                  lw, c->dq.host, c->dk.host, c->dv.host, safe};
    const int64_t kteams = g.B * g.Hkv * ((g.M + ATTB_ROWS - 1) / ATTB_ROWS);
    const int64_t qteams = g.B * g.Hq * ((g.N + ATTB_ROWS - 1) / ATTB_ROWS);
    const int ok = emu_grid(qteams, lse_thread, &a) && emu_grid(kteams, dv_thread, &a) &&
                   emu_grid(kteams, dk_thread, &a) && emu_grid(qteams, dq_thread, &a);
    free(dsum);
    free(lw);
    return ok;
}

static void check_bwd(int64_t B, int64_t Hq, int64_t Hkv, int64_t N, int64_t M, int64_t dh,
                      ompk_attention_mask mask, int bshd, double qk_std, double tol_mult,
                      uint64_t seed) {
    att_case c;
    att_case_new(&c, ompk_device_host(), OMPK_F32, B, Hq, Hkv, N, M, dh, mask, seed, qk_std, bshd);
    cr_assert(emu_bwd(&c), "an emulated team of 128 threads diverged");
    ompk_tensor hq = att_host(&c.q, &c.tq), hk = att_host(&c.k, &c.tk), hv = att_host(&c.v, &c.tv);
    ompk_tensor hdo = att_host(&c.dout, &c.tdout), ho = att_host(&c.out, &c.tout);
    double *rq = malloc(sizeof(double) * (size_t)(c.dq.numel + 1));
    double *rk = malloc(sizeof(double) * (size_t)(c.dk.numel + 1));
    double *rv = malloc(sizeof(double) * (size_t)(c.dv.numel + 1));
    ompk_attention_ref_bwd(&hdo, &hq, &hk, &hv, &ho, c.scale, mask, rq, rk, rv);
    char what[160];
    snprintf(what, sizeof what, "emu f32 bwd B%lld Hq%lld Hkv%lld N%lld M%lld dh%lld mask=%s",
             (long long)B, (long long)Hq, (long long)Hkv, (long long)N, (long long)M, (long long)dh,
             att_mask_name(mask));
    /* the f32 bands of test_attention_bwd, unchanged */
    const int64_t G = Hq / Hkv;
    double w1 =
        att_worst(what, &c.dq, &c.tdq, rq, att_tol(OMPK_F32, OMPK_TOL_ATT_DQ, G, 0, tol_mult));
    double w2 =
        att_worst(what, &c.dk, &c.tdk, rk, att_tol(OMPK_F32, OMPK_TOL_ATT_DKV, G, 0, tol_mult));
    double w3 =
        att_worst(what, &c.dv, &c.tdv, rv, att_tol(OMPK_F32, OMPK_TOL_ATT_DKV, G, 0, tol_mult));
    cr_expect(w1 <= 1.0 && w2 <= 1.0 && w3 <= 1.0, "%s: worst ratio dq %g dk %g dv %g", what, w1,
              w2, w3);
    free(rq);
    free(rk);
    free(rv);
    att_case_free(&c);
}

Test(attention_f32tc_bwd_emu, head_dims) {
    const int64_t dhs[5] = {32, 64, 80, 96, 128};
    for (int i = 0; i < 5; i++)
        check_bwd(1, 1, 1, 70, 75, dhs[i], OMPK_ATTN_MASK_NONE, 0, 1.0, 1.0, 60 + (uint64_t)i);
}

/* GQA (a key team walks 4 and 2 query heads), masks cutting tiles, N != M, N = 1 and M = 1,
 * a key team whose first key no row sees (bottom-right, M < N rows fully masked), BSHD views. */
Test(attention_f32tc_bwd_emu, masks_gqa_odd_lengths) {
    check_bwd(1, 4, 1, 65, 130, 64, OMPK_ATTN_MASK_CAUSAL_TOP_LEFT, 0, 1.0, 1.0, 71);
    check_bwd(1, 2, 2, 130, 65, 96, OMPK_ATTN_MASK_CAUSAL_BOTTOM_RIGHT, 1, 1.0, 1.0, 72);
    check_bwd(2, 2, 1, 17, 1, 32, OMPK_ATTN_MASK_NONE, 0, 1.0, 1.0, 73);
    check_bwd(1, 2, 1, 1, 40, 64, OMPK_ATTN_MASK_CAUSAL_TOP_LEFT, 1, 1.0, 1.0, 74);
    check_bwd(1, 2, 1, 100, 20, 64, OMPK_ATTN_MASK_CAUSAL_BOTTOM_RIGHT, 0, 1.0, 1.0, 75);
}

/* Logits of std ~900 keep the 20x band test_attention_bwd gives every f32 kernel there, with
 * the host forward's lse: the backward's own (attb_lse_team) keeps p = exp(s - lse) consistent
 * with its 3xTF32 scores. */
Test(attention_f32tc_bwd_emu, large_logits) {
    check_bwd(1, 1, 1, 65, 80, 128, OMPK_ATTN_MASK_CAUSAL_TOP_LEFT, 0, 30.0, 20.0, 76);
}

/* NaN in q, k or v through the emulated backward (att_emu_bwd_nan) */
Test(attention_f32tc_bwd_emu, nan) {
    att_emu_bwd_nan(OMPK_F32, 90, emu_bwd);
}
