/* The portable GPU backward on team-shared tiles
 * (src/target/attention/attention_portable_bwd_tiled.c) run on the host: the source is included
 * with OMPK_EMULATE, which runs each team's 128 threads as fibers (emu_team.h) through the same
 * team functions, barriers included. CI thereby checks the tiling (slices, partial dots, the lse
 * sweep, masks cutting tiles, the keys teams' walk over the group's heads) against the double
 * reference with the bands of test_attention_bwd. */
#define OMPK_EMULATE 1
#include "emu_team.h"

#include "attention_portable_bwd_tiled.c"
#include "emu_common.h"

#include <criterion/criterion.h>

#include "test_attention_common.h"

typedef struct {
    const ompk_attn_geom *g;
    const void *q, *k, *v, *dout, *out;
    float *dsum, *lw;
    void *dq, *dk, *dv;
    int64_t w;
} emu_args;

static attp_rows_smem emu_rows_sm;
static attp_keys_smem emu_keys_sm;

static void rows_thread(void *p) {
    const emu_args *a = p;
    attp_rows_team(a->g, a->dout, a->q, a->k, a->v, a->out, a->dsum, a->lw, a->dq, &emu_rows_sm,
                   a->w);
}

static void keys_thread(void *p) {
    const emu_args *a = p;
    attp_keys_team(a->g, a->dout, a->q, a->k, a->v, a->dsum, a->lw, a->dk, a->dv, &emu_keys_sm,
                   a->w);
}

/* Every work item of a kernel as one emulated team in turn; 0 when a team diverged. */
static int emu_grid(int64_t items, void (*fn)(void *), emu_args *a) {
    for (a->w = 0; a->w < items; a->w++)
        if (emu_team_run(ATTP_T, fn, a) != 0) return 0;
    return 1;
}

/* Forward on the host (out for D), then the rows kernel (D, lse, dq) and the keys kernel. */
static int emu_bwd(att_case *c) {
    cr_assert_eq(att_fwd(c), OMPK_OK, "%s", ompk_last_error());
    ompk_attn_geom g = att_case_geom(c);
    const int64_t rows = g.B * g.Hq * g.N;
    float *dsum = malloc(sizeof(float) * (size_t)(rows + 1));
    float *lw = malloc(sizeof(float) * (size_t)(rows + 1));
    emu_args a = {&g,   c->q.host, c->k.host,  c->v.host,  c->dout.host, c->out.host,
                  dsum, lw,        c->dq.host, c->dk.host, c->dv.host,   0};
    const int64_t qitems = g.B * g.Hq * ((g.N + ATTP_RB - 1) / ATTP_RB);
    const int64_t kitems = g.B * g.Hkv * ((g.M + ATTP_RB - 1) / ATTP_RB);
    const int ok = emu_grid(qitems, rows_thread, &a) && emu_grid(kitems, keys_thread, &a);
    free(dsum);
    free(lw);
    return ok;
}

static void check_bwd(ompk_dtype dt, int64_t B, int64_t Hq, int64_t Hkv, int64_t N, int64_t M,
                      int64_t dh, ompk_attention_mask mask, int bshd, double qk_std,
                      double tol_mult, uint64_t seed) {
    att_case c;
    att_case_new(&c, ompk_device_host(), dt, B, Hq, Hkv, N, M, dh, mask, seed, qk_std, bshd);
    c.tol_mult = tol_mult;
    cr_assert(emu_bwd(&c), "an emulated team of %d threads diverged", ATTP_T);
    ompk_tensor hq = att_host(&c.q, &c.tq), hk = att_host(&c.k, &c.tk), hv = att_host(&c.v, &c.tv);
    ompk_tensor hdo = att_host(&c.dout, &c.tdout), ho = att_host(&c.out, &c.tout);
    double *rq = malloc(sizeof(double) * (size_t)(c.dq.numel + 1));
    double *rk = malloc(sizeof(double) * (size_t)(c.dk.numel + 1));
    double *rv = malloc(sizeof(double) * (size_t)(c.dv.numel + 1));
    ompk_attention_ref_bwd(&hdo, &hq, &hk, &hv, &ho, c.scale, mask, rq, rk, rv);
    char what[160];
    snprintf(what, sizeof what, "emu %s bwd B%lld Hq%lld Hkv%lld N%lld M%lld dh%lld mask=%s",
             ompk_dtype_name(dt), (long long)B, (long long)Hq, (long long)Hkv, (long long)N,
             (long long)M, (long long)dh, att_mask_name(mask));
    /* the portable kernel's bands of test_attention_bwd (P and dS stay fp32) */
    const int64_t G = Hq / Hkv;
    double w1 = att_worst(what, &c.dq, &c.tdq, rq, att_tol(dt, OMPK_TOL_ATT_DQ, G, 0, tol_mult));
    double w2 = att_worst(what, &c.dk, &c.tdk, rk, att_tol(dt, OMPK_TOL_ATT_DKV, G, 0, tol_mult));
    double w3 = att_worst(what, &c.dv, &c.tdv, rv, att_tol(dt, OMPK_TOL_ATT_DKV, G, 0, tol_mult));
    cr_expect(w1 <= 1.0 && w2 <= 1.0 && w3 <= 1.0, "%s: worst ratio dq %g dk %g dv %g", what, w1,
              w2, w3);
    free(rq);
    free(rk);
    free(rv);
    att_case_free(&c);
}

/* Every head dim the kernels take, f32 and bf16, lengths no tile divides. */
Test(attention_portable_bwd_emu, head_dims) {
    const int64_t dhs[5] = {32, 64, 80, 96, 128};
    for (int i = 0; i < 5; i++)
        for (int t = 0; t < 2; t++)
            check_bwd(t ? OMPK_BF16 : OMPK_F32, 1, 1, 1, 70, 75, dhs[i], OMPK_ATTN_MASK_NONE, i % 2,
                      1.0, 1.0, 100 + (uint64_t)(2 * i + t));
}

/* GQA (a keys team walks 4 and 2 query heads), masks cutting tiles, N != M, N = 1 and M = 1,
 * keys no row sees (bottom-right with M < N: rows fully masked), BSHD views, B = 2. */
Test(attention_portable_bwd_emu, masks_gqa_odd_lengths) {
    for (int t = 0; t < 2; t++) {
        const ompk_dtype dt = t ? OMPK_BF16 : OMPK_F32;
        const uint64_t s = 120 + 10 * (uint64_t)t;
        check_bwd(dt, 1, 4, 1, 65, 130, 64, OMPK_ATTN_MASK_CAUSAL_TOP_LEFT, 0, 1.0, 1.0, s);
        check_bwd(dt, 1, 2, 2, 130, 65, 96, OMPK_ATTN_MASK_CAUSAL_BOTTOM_RIGHT, 1, 1.0, 1.0, s + 1);
        check_bwd(dt, 2, 2, 1, 17, 1, 32, OMPK_ATTN_MASK_NONE, 0, 1.0, 1.0, s + 2);
        check_bwd(dt, 1, 2, 1, 1, 40, 64, OMPK_ATTN_MASK_CAUSAL_TOP_LEFT, 1, 1.0, 1.0, s + 3);
        check_bwd(dt, 1, 2, 1, 100, 20, 64, OMPK_ATTN_MASK_CAUSAL_BOTTOM_RIGHT, 0, 1.0, 1.0, s + 4);
        check_bwd(dt, 1, 1, 1, 1, 1, 128, OMPK_ATTN_MASK_CAUSAL_TOP_LEFT, 0, 1.0, 1.0, s + 5);
        check_bwd(dt, 1, 2, 1, 40, 33, 80, OMPK_ATTN_MASK_CAUSAL_BOTTOM_RIGHT, 1, 1.0, 1.0, s + 6);
    }
}

/* Logits of std ~900 with test_attention_bwd's cases and 100x band (its large_logits says why),
 * f32 as there, bf16 too, and head dim 128; the rows kernel's own lse keeps p = exp(s - lse)
 * consistent with its scores. */
Test(attention_portable_bwd_emu, large_logits) {
    for (int m = 0; m < 3; m++) {
        check_bwd(OMPK_F32, 1, 2, 1, 40, 50, 64, att_mask(m), 0, 30.0, 100.0, 1500 + (uint64_t)m);
        check_bwd(OMPK_BF16, 1, 2, 1, 40, 50, 64, att_mask(m), 0, 30.0, 100.0, 1510 + (uint64_t)m);
    }
    check_bwd(OMPK_F32, 1, 1, 1, 65, 80, 128, OMPK_ATTN_MASK_CAUSAL_TOP_LEFT, 1, 30.0, 100.0, 1520);
}

/* NaN in q, k or v (att_emu_bwd_nan), and in dout: dq, dk, dv NaN exactly where the float64
 * math gives NaN. */
Test(attention_portable_bwd_emu, nan) {
    att_emu_bwd_nan(OMPK_F32, 150, emu_bwd);
    att_emu_bwd_nan(OMPK_BF16, 160, emu_bwd);
    for (int m = 0; m < 3; m++) {
        att_case c;
        att_case_new(&c, ompk_device_host(), OMPK_F32, 1, 2, 1, 40, 33, 64, att_mask(m),
                     170 + (uint64_t)m, 1.0, 0);
        tu_buf_set(&c.dout, 40 * 64 + 25 * 64 + 9, NAN); /* head 1, row 25 */
        cr_assert(emu_bwd(&c), "an emulated team diverged");
        ompk_tensor hq = att_host(&c.q, &c.tq), hk = att_host(&c.k, &c.tk);
        ompk_tensor hv = att_host(&c.v, &c.tv), hdo = att_host(&c.dout, &c.tdout);
        ompk_tensor ho = att_host(&c.out, &c.tout);
        double *r[3];
        tu_buf *b[3] = {&c.dq, &c.dk, &c.dv};
        const ompk_tensor *t[3] = {&c.tdq, &c.tdk, &c.tdv};
        for (int i = 0; i < 3; i++) r[i] = malloc(sizeof(double) * (size_t)(b[i]->numel + 1));
        ompk_attention_ref_bwd(&hdo, &hq, &hk, &hv, &ho, c.scale, att_mask(m), r[0], r[1], r[2]);
        for (int i = 0; i < 3; i++) {
            char what[100];
            snprintf(what, sizeof what, "NaN in dout mask=%s d%c", att_mask_name(att_mask(m)),
                     "qkv"[i]);
            cr_expect_eq(att_nonfinite_mismatch(what, b[i], t[i], r[i], 1), 0, "%s", what);
            free(r[i]);
        }
        att_case_free(&c);
    }
}

/* Two runs give the same bits (fixed summation order, no atomics). */
Test(attention_portable_bwd_emu, deterministic) {
    for (int t = 0; t < 2; t++) {
        att_case c;
        att_case_new(&c, ompk_device_host(), t ? OMPK_BF16 : OMPK_F32, 1, 4, 2, 45, 50, 64,
                     OMPK_ATTN_MASK_CAUSAL_BOTTOM_RIGHT, 180 + (uint64_t)t, 1.0, 0);
        tu_buf *b[3] = {&c.dq, &c.dk, &c.dv};
        size_t bytes[3];
        void *first[3];
        cr_assert(emu_bwd(&c));
        for (int i = 0; i < 3; i++) {
            bytes[i] = (size_t)b[i]->numel * (t ? 2 : 4);
            first[i] = malloc(bytes[i]);
            memcpy(first[i], b[i]->host, bytes[i]);
            tu_buf_fill_bytes(b[i], 0xA5);
        }
        cr_assert(emu_bwd(&c));
        for (int i = 0; i < 3; i++) {
            cr_expect(memcmp(first[i], b[i]->host, bytes[i]) == 0, "d%c differs between runs",
                      "qkv"[i]);
            free(first[i]);
        }
        att_case_free(&c);
    }
}
