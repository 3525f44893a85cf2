/* The 3xTF32 GPU forward for f32 (src/target/attention/attention_f32tc.c) run on the host: the
 * source is included with OMPK_EMULATE, which makes each team 128 emulated threads (emu_team.h) and
 * turns mma.sync tf32 (operands read as their top 19 bits, as the tensor cores do) and the shuffles
 * into fragment exchanges through memory. CI thereby checks the kernel's own algorithm (operand
 * split, permuted fragments, tile loads, masks, online softmax) against the double reference with
 * the f32 tolerances of the other suites; the GPU run of test_attention_fwd checks the real
 * instructions. */
#define OMPK_EMULATE 1
#include "emu_team.h"

#include "attention_f32tc.c"
#include "emu_common.h"

#include <criterion/criterion.h>

#include "test_attention_common.h"

/* Shapes stay small: every emulated warp instruction is two barriers of 128 threads. */

typedef struct {
    const ompk_attn_geom *g;
    const float *q, *k, *v;
    float *out, *lse;
    int safe; /* the split for non-finite operands, as ompk_attn_fwd_f32tc chooses it */
} fwd_args;

static void fwd_thread(void *p) {
    const fwd_args *a = p;
#define EMU_FWD(D)                                                                                 \
    if (a->safe)                                                                                   \
        attt_fwd_team(a->g, a->q, a->k, a->v, a->out, a->lse, attt_emu_sk, attt_emu_sv, D, 1);     \
    else                                                                                           \
        attt_fwd_team(a->g, a->q, a->k, a->v, a->out, a->lse, attt_emu_sk, attt_emu_sv, D, 0);
    ATT_SWITCH_DH_TC(a->g->dh, EMU_FWD)
#undef EMU_FWD
}

/* whether any element of the buffers is not finite */
static int any_nonfinite(const tu_buf *const *b, int n) {
    for (int i = 0; i < n; i++)
        for (int64_t e = 0; e < b[i]->numel; e++)
            if (!isfinite(((const float *)b[i]->host)[e])) return 1;
    return 0;
}

/* Every team of the grid in turn, its threads as one emulated team of 128; 0 when a team
 * diverged (emu_team_run). */
static int emu_run(att_case *c) {
    ompk_attn_geom g;
    memset(&g, 0, sizeof g);
    g.B = c->B, g.Hq = c->Hq, g.Hkv = c->Hkv, g.N = c->N, g.M = c->M, g.dh = c->dh;
    const ompk_tensor *ts[5] = {&c->tq, &c->tk, &c->tv, &c->tout, &c->tlse};
    int64_t *ss[5] = {g.qs, g.ks, g.vs, g.os, g.ls};
    for (int i = 0; i < 5; i++)
        for (int d = 0; d < 3; d++) ss[i][d] = ts[i]->strides[d];
    g.scale = (float)c->scale;
    g.mask = (int)c->p.mask;
    g.bf16 = 0;
    const tu_buf *in[3] = {&c->q, &c->k, &c->v};
    fwd_args a = {&g,          c->q.host,   c->k.host,           c->v.host,
                  c->out.host, c->lse.host, any_nonfinite(in, 3)};
    const int64_t teams = g.B * g.Hq * ((g.N + ATTT_BQ - 1) / ATTT_BQ);
    for (int64_t t = 0; t < teams; t++) {
        ompk_emu_block = (int)t;
        if (emu_team_run(128, fwd_thread, &a) != 0) return 0;
    }
    return 1;
}

static void check(int64_t B, int64_t Hq, int64_t Hkv, int64_t N, int64_t M, int64_t dh,
                  ompk_attention_mask mask, int bshd, double qk_std, double tol_mult,
                  uint64_t seed) {
    att_case c;
    att_case_new(&c, ompk_device_host(), OMPK_F32, B, Hq, Hkv, N, M, dh, mask, seed, qk_std, bshd);
    cr_assert(emu_run(&c), "an emulated team of 128 threads diverged");
    ompk_tensor hq = att_host(&c.q, &c.tq), hk = att_host(&c.k, &c.tk), hv = att_host(&c.v, &c.tv);
    double *ro = malloc(sizeof(double) * (size_t)(c.out.numel + 1));
    double *rl = malloc(sizeof(double) * (size_t)(c.lse.numel + 1));
    ompk_attention_ref_fwd(&hq, &hk, &hv, c.scale, mask, ro, rl);
    char what[160];
    snprintf(what, sizeof what, "emu f32 B%lld Hq%lld Hkv%lld N%lld M%lld dh%lld mask=%s bshd=%d",
             (long long)B, (long long)Hq, (long long)Hkv, (long long)N, (long long)M, (long long)dh,
             att_mask_name(mask), bshd);
    /* the f32 bands of test_attention_fwd, unchanged */
    double w = att_worst(what, &c.out, &c.tout, ro, att_tol_m(OMPK_F32, 1.0, tol_mult));
    double wl = att_worst(what, &c.lse, &c.tlse, rl, att_tol_m(OMPK_F32, 1.0, tol_mult));
    cr_expect(w <= 1.0 && wl <= 1.0, "%s: worst ratio out %g lse %g", what, w, wl);
    free(ro);
    free(rl);
    att_case_free(&c);
}

/* NaN and +-inf in q, k or v (the sweep in test_attention_common.h): the emulated instructions
 * return the GPU's NaN, so NaN handling on bit patterns is checked as the GPU runs it. v runs
 * unmasked only: in a tile that a causal mask cuts, a masked P = 0 still meets it in the mma,
 * and the entry points send such calls to the portable kernel (tc_fwd_safe). */
Test(attention_f32tc_emu, nonfinite_rows) {
    att_emu_nonfinite(OMPK_F32, emu_run);
}

Test(attention_f32tc_emu, huge_scale) {
    att_emu_huge_scale(OMPK_F32, emu_run);
}

Test(attention_f32tc_emu, head_dims) {
    const int64_t dhs[5] = {32, 64, 80, 96, 128};
    for (int i = 0; i < 5; i++)
        check(1, 1, 1, 70, 75, dhs[i], OMPK_ATTN_MASK_NONE, 0, 1.0, 1.0, 10 + (uint64_t)i);
}

Test(attention_f32tc_emu, masks_gqa_odd_lengths) {
    check(1, 4, 1, 65, 130, 64, OMPK_ATTN_MASK_CAUSAL_TOP_LEFT, 0, 1.0, 1.0, 21);
    check(1, 2, 2, 130, 65, 96, OMPK_ATTN_MASK_CAUSAL_BOTTOM_RIGHT, 0, 1.0, 1.0, 22);
    check(2, 2, 1, 1, 17, 128, OMPK_ATTN_MASK_NONE, 1, 1.0, 1.0, 23);
    check(1, 2, 1, 17, 1, 32, OMPK_ATTN_MASK_CAUSAL_TOP_LEFT, 0, 1.0, 1.0, 24);
}

/* Rows with no visible key give out = 0 and lse = -inf; logits of std ~900 keep the 20x band
 * that test_attention_fwd gives every f32 kernel there. */
Test(attention_f32tc_emu, fully_masked_rows_and_large_logits) {
    check(1, 1, 1, 100, 20, 64, OMPK_ATTN_MASK_CAUSAL_BOTTOM_RIGHT, 0, 1.0, 1.0, 31);
    check(1, 1, 1, 65, 80, 128, OMPK_ATTN_MASK_CAUSAL_TOP_LEFT, 0, 30.0, 20.0, 32);
    check(1, 1, 1, 65, 80, 128, OMPK_ATTN_MASK_NONE, 0, 30.0, 20.0, 33);
}

/* The split itself: hi + lo reproduces x to 2^-20 of |x|, both halves are tf32 values, and lo
 * is nonzero with the sign of x for x != 0, so that against an infinite operand the three
 * products give sign * inf, never inf - inf or 0 * inf; inf and NaN keep hi. */
Test(attention_f32tc_emu, operand_split) {
    tu_rng r = tu_rng_make(5);
    for (int i = 0; i < 100000; i++) {
        const float x = (float)(tu_normal(&r) * pow(2.0, (double)(i % 41 - 20)));
        uint32_t hi, lo;
        attt_split(x, &hi, &lo);
        cr_assert_eq(hi & 0x1fffu, 0u);
        cr_assert_eq(lo & 0x1fffu, 0u);
        const double e = fabs((double)attt_float(hi) + (double)attt_float(lo) - (double)x);
        cr_assert(e <= ldexp(fabs((double)x), -20), "x %.9g: hi + lo off by %g", (double)x, e);
        cr_assert(x == 0.f || (attt_float(lo) != 0.f && (attt_float(lo) < 0.f) == (x < 0.f)),
                  "x %.9g: lo %g", (double)x, (double)attt_float(lo));
    }
    const float odd[4] = {INFINITY, -INFINITY, 1.0f, -0.5f};
    for (int i = 0; i < 4; i++) {
        uint32_t hi, lo;
        attt_split(odd[i], &hi, &lo);
        cr_assert(attt_float(hi) == odd[i] && attt_float(lo) != 0.f &&
                      (attt_float(lo) < 0.f) == (odd[i] < 0.f),
                  "x %g: hi %g lo %g", (double)odd[i], (double)attt_float(hi),
                  (double)attt_float(lo));
    }
    uint32_t hi, lo;
    attt_split(NAN, &hi, &lo);
    cr_assert(isnan(attt_float(hi)));
}

/* The split of all-finite calls: hi + lo reproduces x to 2^-22 of |x| (lo rounded), both
 * halves tf32 values, the same hi as attt_split. */
Test(attention_f32tc_emu, operand_split_finite) {
    tu_rng r = tu_rng_make(6);
    for (int i = 0; i < 100000; i++) {
        const float x = (float)(tu_normal(&r) * pow(2.0, (double)(i % 41 - 20)));
        uint32_t hi, lo, hs, ls;
        attt_split_finite(x, &hi, &lo);
        attt_split(x, &hs, &ls);
        cr_assert_eq(hi, hs);
        cr_assert_eq(lo & 0x1fffu, 0u);
        const double e = fabs((double)attt_float(hi) + (double)attt_float(lo) - (double)x);
        cr_assert(e <= ldexp(fabs((double)x), -22), "x %.9g: hi + lo off by %g", (double)x, e);
    }
}
