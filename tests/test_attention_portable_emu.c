/* The portable GPU forward on team-shared tiles (src/target/attention/attention_portable_tiled.c)
 * run on the host, two ways: its team function included with OMPK_EMULATE, each team's 128
 * threads run as fibers (emu_team.h), so CI checks the tiles, the shared max, the masks and the
 * online softmax against the double reference; and the library's ompk_attn_fwd_tiled itself
 * with if(target: 0), which runs the target region, the team-shared arrays and the parallel
 * region on the host's threads. Tolerances are those of test_attention_fwd for the portable
 * kernels (no bf16 rounding of P). */
#define OMPK_EMULATE 1
#include "emu_team.h"

#include "attention_portable_tiled.c"

#include <criterion/criterion.h>
#include <omp.h>

#include "test_attention_common.h"

static ATTP_ALIGN float emu_sqk[ATTP_SQK], emu_sp[ATTP_SP], emu_sr[ATTP_SR];

typedef struct {
    const ompk_attn_geom *g;
    const void *q, *k, *v;
    void *out;
    float *lse;
    int64_t w;
} item_args;

static void item_thread(void *p) {
    const item_args *a = p;
#define EMU_ITEM(D)                                                                                \
    if (a->g->bf16)                                                                                \
        attp_fwd_item(a->g, a->q, a->k, a->v, a->out, a->lse, emu_sqk, emu_sp, emu_sr, a->w, D,    \
                      1);                                                                          \
    else                                                                                           \
        attp_fwd_item(a->g, a->q, a->k, a->v, a->out, a->lse, emu_sqk, emu_sp, emu_sr, a->w, D, 0);
    switch ((a->g->dh + 31) / 32 * 32) {
    case 32:
        EMU_ITEM(32);
        break;
    case 64:
        EMU_ITEM(64);
        break;
    case 96:
        EMU_ITEM(96);
        break;
    default:
        EMU_ITEM(128);
        break;
    }
#undef EMU_ITEM
}

/* Every work item in turn, as one emulated team of 128; 0 when a team diverged. */
static int emu_run(att_case *c) {
    const ompk_attn_geom g = att_case_geom(c);
    const int64_t items = g.B * g.Hq * ((g.N + ATTP_BQ - 1) / ATTP_BQ);
    for (int64_t w = 0; w < items; w++) {
        item_args a = {&g, c->q.host, c->k.host, c->v.host, c->out.host, c->lse.host, w};
        if (emu_team_run(ATTP_T, item_thread, &a) != 0) return 0;
    }
    return 1;
}

/* The library's entry with if(target: 0): the real OpenMP constructs on the host. */
static int omp_run(att_case *c) {
    const ompk_attn_geom g = att_case_geom(c);
    cr_assert(ompk_attn_fwd_tiled_ok(&g));
    const ompk_exec ex = {0, omp_get_initial_device()};
    ompk_attn_fwd_tiled(ex, &g, c->q.host, c->k.host, c->v.host, c->out.host, c->lse.host);
    return 1;
}

static void check_with(int (*run)(att_case *), ompk_dtype dt, int64_t B, int64_t Hq, int64_t Hkv,
                       int64_t N, int64_t M, int64_t dh, ompk_attention_mask mask, int bshd,
                       double qk_std, double tol_mult, uint64_t seed) {
    att_case c;
    att_case_new(&c, ompk_device_host(), dt, B, Hq, Hkv, N, M, dh, mask, seed, qk_std, bshd);
    cr_assert(run(&c), "an emulated team of 128 threads diverged");
    ompk_tensor hq = att_host(&c.q, &c.tq), hk = att_host(&c.k, &c.tk), hv = att_host(&c.v, &c.tv);
    double *ro = malloc(sizeof(double) * (size_t)(c.out.numel + 1));
    double *rl = malloc(sizeof(double) * (size_t)(c.lse.numel + 1));
    ompk_attention_ref_fwd(&hq, &hk, &hv, c.scale, mask, ro, rl);
    char what[160];
    snprintf(what, sizeof what, "%s %s B%lld Hq%lld Hkv%lld N%lld M%lld dh%lld mask=%s bshd=%d",
             run == emu_run ? "emu" : "omp", ompk_dtype_name(dt), (long long)B, (long long)Hq,
             (long long)Hkv, (long long)N, (long long)M, (long long)dh, att_mask_name(mask), bshd);
    const int64_t G = Hq / Hkv;
    double w = att_worst(what, &c.out, &c.tout, ro, att_tol(dt, OMPK_TOL_ATT_OUT, G, 0, tol_mult));
    double wl =
        att_worst(what, &c.lse, &c.tlse, rl, att_tol(OMPK_F32, OMPK_TOL_ATT_LSE, G, 0, tol_mult));
    cr_expect(w <= 1.0 && wl <= 1.0, "%s: worst ratio out %g lse %g", what, w, wl);
    free(ro);
    free(rl);
    att_case_free(&c);
}

static void check(ompk_dtype dt, int64_t B, int64_t Hq, int64_t Hkv, int64_t N, int64_t M,
                  int64_t dh, ompk_attention_mask mask, int bshd, double qk_std, double tol_mult,
                  uint64_t seed) {
    check_with(emu_run, dt, B, Hq, Hkv, N, M, dh, mask, bshd, qk_std, tol_mult, seed);
}

Test(attention_portable_emu, head_dims) {
    const int64_t dhs[5] = {32, 64, 80, 96, 128};
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < 5; i++)
            check(t ? OMPK_BF16 : OMPK_F32, 1, 1, 1, 70, 75, dhs[i], OMPK_ATTN_MASK_NONE, i % 2,
                  1.0, 1.0, 10 + (uint64_t)(5 * t + i));
}

Test(attention_portable_emu, masks_gqa_odd_lengths) {
    for (int t = 0; t < 2; t++) {
        const ompk_dtype dt = t ? OMPK_BF16 : OMPK_F32;
        const uint64_t s = 20 + 10 * (uint64_t)t;
        check(dt, 1, 4, 1, 65, 130, 64, OMPK_ATTN_MASK_CAUSAL_TOP_LEFT, 0, 1.0, 1.0, s);
        check(dt, 1, 2, 2, 130, 65, 96, OMPK_ATTN_MASK_CAUSAL_BOTTOM_RIGHT, 0, 1.0, 1.0, s + 1);
        check(dt, 2, 2, 1, 1, 17, 128, OMPK_ATTN_MASK_NONE, 1, 1.0, 1.0, s + 2);
        check(dt, 1, 2, 1, 17, 1, 32, OMPK_ATTN_MASK_CAUSAL_TOP_LEFT, 0, 1.0, 1.0, s + 3);
        check(dt, 1, 1, 1, 1, 1, 80, OMPK_ATTN_MASK_CAUSAL_BOTTOM_RIGHT, 0, 1.0, 1.0, s + 4);
        check(dt, 1, 2, 1, 100, 140, 64, OMPK_ATTN_MASK_CAUSAL_BOTTOM_RIGHT, 1, 1.0, 1.0, s + 5);
        /* dh 70: rows not on 4-element boundaries, so the tiles load element by element */
        check(dt, 1, 2, 1, 67, 70, 70, OMPK_ATTN_MASK_CAUSAL_TOP_LEFT, 1, 1.0, 1.0, s + 6);
    }
}

/* Rows with no visible key give out = 0 and lse = -inf; logits of std ~900 keep the 20x band
 * that test_attention_fwd gives every f32 kernel there. */
Test(attention_portable_emu, fully_masked_rows_and_large_logits) {
    check(OMPK_F32, 1, 1, 1, 100, 20, 64, OMPK_ATTN_MASK_CAUSAL_BOTTOM_RIGHT, 0, 1.0, 1.0, 41);
    check(OMPK_F32, 1, 1, 1, 65, 80, 128, OMPK_ATTN_MASK_CAUSAL_TOP_LEFT, 0, 30.0, 20.0, 42);
    check(OMPK_F32, 1, 1, 1, 65, 80, 128, OMPK_ATTN_MASK_NONE, 0, 30.0, 20.0, 43);
    check(OMPK_BF16, 1, 1, 1, 100, 20, 64, OMPK_ATTN_MASK_CAUSAL_BOTTOM_RIGHT, 0, 1.0, 1.0, 44);
}

/* NaN and +-inf in q, k or v (the sweep in test_attention_common.h): out and lse non-finite
 * exactly where the float64 math makes them so. */
Test(attention_portable_emu, nonfinite_rows) {
    att_emu_nonfinite(OMPK_F32, emu_run);
    att_emu_nonfinite(OMPK_BF16, emu_run);
}

/* NaN in v under the causal masks: a masked pair adds exactly 0, so only the rows that see the
 * key turn NaN (the sweep above runs v unmasked). */
Test(attention_portable_emu, masked_nan_in_v) {
    for (int m = 1; m < 3; m++) {
        att_case c;
        att_case_new(&c, ompk_device_host(), OMPK_F32, 1, 1, 1, 40, 33, 64, att_mask(m),
                     (uint64_t)(50 + m), 1.0, 0);
        tu_buf_set(&c.v, 20 * 64 + 5, NAN);
        cr_assert(emu_run(&c));
        ompk_tensor hq = att_host(&c.q, &c.tq), hk = att_host(&c.k, &c.tk);
        ompk_tensor hv = att_host(&c.v, &c.tv);
        double *ro = malloc(sizeof(double) * (size_t)(c.out.numel + 1));
        double *rl = malloc(sizeof(double) * (size_t)(c.lse.numel + 1));
        ompk_attention_ref_fwd(&hq, &hk, &hv, c.scale, att_mask(m), ro, rl);
        cr_expect_eq(att_nonfinite_mismatch("masked NaN in v", &c.out, &c.tout, ro, 1), 0,
                     "mask=%s", att_mask_name(att_mask(m)));
        free(ro);
        free(rl);
        att_case_free(&c);
    }
}

Test(attention_portable_emu, huge_scale) {
    att_emu_huge_scale(OMPK_F32, emu_run);
}

/* The real constructs: results within the bands, and the same bits on a second run. */
Test(attention_portable_emu, openmp_host_run) {
    check_with(omp_run, OMPK_F32, 1, 2, 1, 70, 75, 64, OMPK_ATTN_MASK_CAUSAL_BOTTOM_RIGHT, 1, 1.0,
               1.0, 61);
    check_with(omp_run, OMPK_BF16, 1, 1, 1, 65, 66, 128, OMPK_ATTN_MASK_NONE, 0, 1.0, 1.0, 62);
    att_case c;
    att_case_new(&c, ompk_device_host(), OMPK_F32, 1, 1, 1, 70, 75, 80, OMPK_ATTN_MASK_NONE, 63,
                 1.0, 0);
    omp_run(&c);
    float *first = malloc(sizeof(float) * (size_t)c.out.numel);
    memcpy(first, c.out.host, sizeof(float) * (size_t)c.out.numel);
    omp_run(&c);
    cr_expect(memcmp(first, c.out.host, sizeof(float) * (size_t)c.out.numel) == 0,
              "two runs differ");
    free(first);
    att_case_free(&c);
}
