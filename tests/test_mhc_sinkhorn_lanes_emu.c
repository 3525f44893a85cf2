/* The GPU Sinkhorn backward with a token's rows over G lanes (src/target/mhc/mhc_sinkhorn_lanes.h)
 * run on the host: with OMPK_EMULATE a warp is 32 emulated threads (emu_team.h: fibers on one
 * host thread) and the butterfly shuffles exchange values through memory, so CI checks the kernel's
 * own algorithm (row/lane layout, column sums over the group, padding rows and tokens, the state
 * workspace walked in reverse with one step of prefetch) against the double reference for every n;
 * the GPU run of test_mhc_sinkhorn checks the real kernel. */
#define OMPK_EMULATE 1
#include "emu_team.h"

#include "mhc_sinkhorn_lanes.h"
#include "emu_common.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

#include "mhc_ref_pre.h"
#include "test_util.h"
#include "tolerance.h"

/* one lane of the emulated warp w (run_lanes below) */
typedef struct {
    int n, repeat;
    int64_t T, w;
    float eps;
    const float *lg, *dc;
    float *out, *st;
} lanes_args;

static void lane(void *p) {
    const lanes_args *a = p;
    const int n = a->n, G = SKL_G(n), per = 32 / G;
    const int tid = emu_tid(), i = tid % G;
    const int64_t T = a->T, u = a->w * per + tid / G, sstride = T * n * n;
    const int ok = u < T;
    const int64_t uu = ok ? u : 0;
    const int row = ok && i < n;
    const float *lp = a->lg + uu * n * n, *dp = a->dc + uu * n * n;
    float *op = a->out + uu * n * n, *sp = a->st + uu * n * n + i * n;
    const int repeat = a->repeat;
    const float eps = a->eps;
    switch (n) {
#define EMU_CASE(N_)                                                                               \
    case N_:                                                                                       \
        skl_token(N_, SKL_G(N_), i, row, lp, N_, 1, dp, N_, 1, op, N_, 1, repeat, eps, sp,         \
                  sstride);                                                                        \
        break;
        EMU_CASE(1)
        EMU_CASE(2)
        EMU_CASE(3)
        EMU_CASE(4)
        EMU_CASE(5)
        EMU_CASE(6)
        EMU_CASE(7)
        EMU_CASE(8)
#undef EMU_CASE
    }
}

/* lanes' work for T tokens (logits/dcomb/dlogits [T][n][n] contiguous), one emulated warp at a
 * time, as the GPU kernel lays them out */
static void run_lanes(int n, int64_t T, int repeat, float eps, const float *lg, const float *dc,
                      float *out, float *st) {
    const int per = 32 / SKL_G(n);
    for (int64_t w = 0; w * per < T; w++) {
        lanes_args a = {n, repeat, T, w, eps, lg, dc, out, st};
        cr_assert_eq(emu_team_run(32, lane, &a), 0, "n=%d warp %lld: the lanes diverged", n,
                     (long long)w);
    }
}

/* T tokens of logits scale * N(0,1) + peak * I, against the reference with the bound
 * test_mhc_sinkhorn uses for dlogits (f32 tolerance scaled by the largest |dcomb| or |dlogit|) */
static void check(int n, int64_t T, int repeat, double scale, double peak, uint64_t seed) {
    const int64_t N = T * n * n;
    float *lg = malloc(sizeof(float) * N), *dc = malloc(sizeof(float) * N);
    float *out = malloc(sizeof(float) * N), *st = malloc(sizeof(float) * N * 2 * repeat);
    double *dl = malloc(sizeof(double) * N), *dlg = malloc(sizeof(double) * N);
    double *ddc = malloc(sizeof(double) * N);
    tu_rng r = tu_rng_make(seed);
    double gmax = 0;
    for (int64_t e = 0; e < N; e++) {
        const int64_t k = e % (n * n);
        lg[e] = (float)(scale * tu_normal(&r) + (k / n == k % n ? peak : 0));
        dc[e] = (float)tu_normal(&r);
        out[e] = NAN;
        dlg[e] = lg[e], ddc[e] = dc[e];
        gmax = fabs(ddc[e]) > gmax ? fabs(ddc[e]) : gmax;
    }
    run_lanes(n, T, repeat, 1e-6f, lg, dc, out, st);
    ompk_mhc_ref_sinkhorn_bwd(T, n, repeat, 1e-6, dlg, ddc, dl);
    for (int64_t e = 0; e < N; e++) gmax = fabs(dl[e]) > gmax ? fabs(dl[e]) : gmax;
    const ompk_tol tol = ompk_tol_for(OMPK_F32, gmax > 0 ? gmax : 1);
    double worst = 0;
    for (int64_t e = 0; e < N; e++) {
        cr_assert(isfinite(out[e]), "n=%d token %lld: non-finite dlogit", n,
                  (long long)(e / n / n));
        const double err = fabs(out[e] - dl[e]) / (tol.atol + tol.rtol * fabs(dl[e]));
        worst = err > worst ? err : worst;
    }
    cr_expect(worst <= 1, "n=%d T=%lld repeat=%d scale=%g peak=%g: off by %g of the bound", n,
              (long long)T, repeat, scale, peak, worst);
    free(lg), free(dc), free(out), free(st), free(dl), free(dlg), free(ddc);
}

Test(mhc_sinkhorn_lanes_emu, matches_reference_every_n) {
    /* 11 tokens: the last warp's groups are partly missing tokens for every G */
    for (int n = 1; n <= 8; n++) {
        check(n, 11, 20, 1.5, 0, 100 + (uint64_t)n);
        check(n, 11, 1, 1.5, 0, 200 + (uint64_t)n);
        check(n, 11, 2, 1.5, 0, 300 + (uint64_t)n);
    }
}

Test(mhc_sinkhorn_lanes_emu, peaked_and_huge_logits) {
    for (int n = 2; n <= 8; n += 2) {
        check(n, 9, 20, 0.3, 8.0, 400 + (uint64_t)n);
        check(n, 9, 20, 1e4, 0, 500 + (uint64_t)n);
    }
}
