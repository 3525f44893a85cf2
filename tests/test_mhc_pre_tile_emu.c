/* The portable GEMM of the mHC pre forward on team-shared tiles (src/target/mhc/mhc_pre_tile.h)
 * run on the host: with OMPK_EMULATE a team is PTL_T emulated threads (emu_team.h: fibers on one
 * host thread), so CI checks the team function itself (the loader and compute roles, the shared
 * tiles, the two barriers a step, chunk and token tails, strides, unaligned rows): bit for bit
 * against pre_tile_rows (the path of a team with fewer threads, the same sums in the same order)
 * and the host's pre_tile_pair, and, summed over the chunks, against a double reference. NaN and
 * inf in x reach exactly the partial rows of their token and chunk. */
#define OMPK_EMULATE 1
#include "emu_team.h"

#include "mhc_pre_tile.h"
#include "emu_common.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"

static float emu_xs[PTL_XS] __attribute__((aligned(16)));
static float emu_ws[PTL_KB * PTL_WG(8)] __attribute__((aligned(16)));

typedef struct {
    int n;
    const pre_tile_geom *g;
    const char *x;
    const float *wg;
    float *part;
    int64_t w;
} tile_args;

static void tile_team(void *p) {
    const tile_args *a = p;
#define EMU_TEAM(N) pre_tile_team(N, a->g, a->x, a->wg, a->part, a->w, emu_xs, emu_ws)
    MHC_SWITCH_N(a->n, EMU_TEAM)
#undef EMU_TEAM
}

static void tile_rows(int n, const pre_tile_geom *g, const char *x, const float *wg, float *part,
                      int64_t w) {
#define EMU_ROWS(N) pre_tile_rows(N, g, x, wg, part, w)
    MHC_SWITCH_N(n, EMU_ROWS)
#undef EMU_ROWS
}

static void tile_pairs(int n, const pre_tile_geom *g, const char *x, const float *wg, float *part,
                       int64_t w) {
#define EMU_PAIRS(N)                                                                               \
    for (int r = 0; r < PTL_TB; r += 2) pre_tile_pair(N, g, x, wg, part, w, r);
    MHC_SWITCH_N(n, EMU_PAIRS)
#undef EMU_PAIRS
}

typedef struct {
    int64_t B, S, D, CD, pad; /* pad: extra elements a row (rows not on 8: element loads) */
    int n, bf16;
    float bad; /* NaN or inf placed at x[bad_t][bad_i][bad_d], 0 = none */
    int64_t bad_t, bad_d;
    int bad_i;
} tile_case;

static double x_at(const tile_case *c, const void *x, const pre_tile_geom *g, int64_t t, int i,
                   int64_t d) {
    const int64_t e = (t / c->S) * g->sx0 + (t % c->S) * g->sx1 + i * g->sx2 + d;
    return c->bf16 ? (double)ompk_bf16_to_f32(((const uint16_t *)x)[e]) : ((const float *)x)[e];
}

static void check(const tile_case *c, uint64_t seed) {
    emu_seed(seed);
    const int n = c->n, M = 2 * n + n * n, MP = M + 1, WG = PTL_WG(n);
    const int64_t T = c->B * c->S, D = c->D, K = n * D, esz = c->bf16 ? 2 : 4;
    pre_tile_geom g;
    g.sx2 = D + c->pad, g.sx1 = n * g.sx2 + c->pad, g.sx0 = c->S * g.sx1;
    g.S = c->S, g.T = T, g.D = D, g.CD = c->CD, g.NCD = (D + c->CD - 1) / c->CD;
    g.NTL = (T + PTL_TB - 1) / PTL_TB, g.bf16 = c->bf16;
    g.vec = g.sx2 % 8 == 0 && g.sx1 % 8 == 0 && g.sx0 % 8 == 0; /* pre_vec_ok's rule */
    const int64_t NC = g.NCD * n, items = NC * g.NTL, nx = c->B * g.sx0;
    char *x = aligned_alloc(16, (size_t)((nx * esz + 15) / 16 * 16));
    for (int64_t e = 0; e < nx; e++) {
        const float v = (float)(2.0 * emu_rnd());
        if (c->bf16)
            ((uint16_t *)x)[e] = ompk_f32_to_bf16(v);
        else
            ((float *)x)[e] = v;
    }
    if (c->bad != 0.f) {
        const int64_t t = c->bad_t,
                      e = (t / c->S) * g.sx0 + (t % c->S) * g.sx1 + c->bad_i * g.sx2 + c->bad_d;
        if (c->bf16)
            ((uint16_t *)x)[e] = ompk_f32_to_bf16(c->bad);
        else
            ((float *)x)[e] = c->bad;
    }
    float *wg = aligned_alloc(16, sizeof(float) * (size_t)(K * WG));
    for (int64_t k = 0; k < K; k++)
        for (int q = 0; q < WG; q++)
            wg[k * WG + q] = pre_tile_col(n, q) >= 0 ? (float)(emu_rnd() / sqrt((double)K)) : 0.f;
    const size_t np = (size_t)(NC * T * MP);
    float *pt = malloc(sizeof(float) * np), *pr = malloc(sizeof(float) * np);
    float *pp = malloc(sizeof(float) * np);
    for (size_t e = 0; e < np; e++) pt[e] = pr[e] = pp[e] = -7.f; /* every entry must be written */
    for (int64_t w = 0; w < items; w++) {
        tile_args a = {n, &g, x, wg, pt, w};
        cr_assert_eq(emu_team_run(PTL_T, tile_team, &a), 0, "an emulated team diverged");
        tile_rows(n, &g, x, wg, pr, w);
        tile_pairs(n, &g, x, wg, pp, w);
    }
    char what[160];
    snprintf(what, sizeof what, "n%d %s B%lld S%lld D%lld CD%lld pad%lld bad %g", n,
             c->bf16 ? "bf16" : "f32", (long long)c->B, (long long)c->S, (long long)D,
             (long long)c->CD, (long long)c->pad, (double)c->bad);
    cr_expect(memcmp(pt, pr, sizeof(float) * np) == 0, "team != rows bit for bit: %s", what);
    cr_expect(memcmp(pp, pr, sizeof(float) * np) == 0, "host pairs != rows bit for bit: %s", what);
    /* the chunks' partials summed against a double reference */
    for (int64_t t = 0; t < T; t++)
        for (int m = 0; m <= M; m++) {
            double ref = 0.0, mag = 0.0, got = 0.0;
            int hit = 0; /* whether a non-finite x feeds this output */
            for (int64_t c2 = 0; c2 < NC; c2++) got += pt[(c2 * T + t) * MP + m];
            for (int i = 0; i < n; i++)
                for (int64_t d = 0; d < D; d++) {
                    const double xv = x_at(c, x, &g, t, i, d);
                    double wv = xv;
                    if (m < M) {
                        int q = 0;
                        while (pre_tile_col(n, q) != m) q++;
                        wv = wg[(i * D + d) * WG + q];
                    }
                    if (!isfinite(xv)) {
                        hit = 1;
                        continue;
                    }
                    ref += xv * wv, mag += fabs(xv * wv);
                }
            if (hit) {
                cr_expect(isnan(c->bad) ? isnan(got) : !isfinite(got), "t %lld m %d: %g (%s)",
                          (long long)t, m, got, what);
                continue;
            }
            cr_expect(isfinite(got) && fabs(got - ref) <= 1e-5 * mag + 1e-6,
                      "t %lld m %d: %.9g vs %.9g (%s)", (long long)t, m, got, ref, what);
        }
    free(x);
    free(wg);
    free(pt);
    free(pr);
    free(pp);
}

Test(mhc_pre_tile_emu, every_n_bf16_and_f32) {
    for (int n = 1; n <= 8; n++)
        for (int bf = 0; bf < 2; bf++) {
            const tile_case c = {1, 130, 40 + 8 * n, 32, 0, n, bf, 0.f, 0, 0, 0};
            check(&c, (uint64_t)(10 * n + bf));
        }
}

/* chunk tails (D not a multiple of CD or of 32), token tails, several batches, padded strides */
Test(mhc_pre_tile_emu, tails_and_strides) {
    const tile_case cs[] = {
        {2, 70, 100, 64, 8, 4, 1, 0.f, 0, 0, 0},   /* D tail inside a step; aligned padding */
        {1, 129, 96, 64, 0, 3, 0, 0.f, 0, 0, 0},   /* one token past a tile */
        {3, 5, 33, 32, 3, 2, 1, 0.f, 0, 0, 0},     /* odd strides: element loads */
        {1, 1, 8, 32, 0, 8, 0, 0.f, 0, 0, 0},      /* one token, D below a step */
        {1, 256, 64, 32, 5, 4, 0, 0.f, 0, 0, 0},   /* two full tiles, f32 element loads */
        {2, 100, 200, 96, 16, 6, 1, 0.f, 0, 0, 0}, /* chunks of three steps */
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) check(&cs[i], 100 + i);
}

/* A NaN or inf in x gives NaN (inf) in the partial rows of its token and chunk only. */
Test(mhc_pre_tile_emu, nonfinite_x) {
    const tile_case cs[] = {
        {1, 130, 100, 64, 0, 4, 1, NAN, 129, 70, 2},
        {1, 40, 64, 32, 0, 2, 0, NAN, 3, 0, 0},
        {1, 40, 64, 32, 0, 1, 0, INFINITY, 17, 63, 0},
        {1, 40, 64, 32, 3, 3, 1, -INFINITY, 39, 31, 2},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) check(&cs[i], 200 + i);
}
