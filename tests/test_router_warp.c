/* The GPU warp-per-token forward (k <= 32, N <= 256) run on the host: the kernel source is
 * included with OMPK_EMULATE, which turns the warp collectives (ballot, redux add, shuffles)
 * into exchanges through memory between the 32 lanes of an emulated team (emu_team.h: fibers on
 * one host thread, switching at every collective). So CI checks the warp
 * algorithm itself against the brute-force reference, not only the portable kernel; the GPU run
 * of test_router_fwd checks the real instructions. Classes 5 and 6 hold NaN and +inf, which the
 * warp kernels hand to the portable routine: the order is exact there too (NaN above +inf). */
#define OMPK_EMULATE 1
#include "emu_team.h"

#include "../src/target/router/router_topk.c"

#include <criterion/criterion.h>
#include <math.h>

#include "ref/router_ref.h"
#include "test_util.h"

static void gen(int cls, int64_t T, int64_t N, uint64_t seed, float *x, float *y) {
    tu_rng r = tu_rng_make(seed);
    for (int64_t e = 0; e < T * N; e++) {
        double a = tu_normal(&r), b = tu_normal(&r);
        switch (cls) {
        case 1: /* exact ties */
            a = floor(a * 2.0) / 2.0;
            b = floor(b * 2.0) / 2.0;
            break;
        case 2: /* -inf entries, a whole -inf token */
            if (tu_uniform(&r) < 0.25 || e / N == 0) a = -INFINITY;
            if (tu_uniform(&r) < 0.25 || e / N == 0) b = -INFINITY;
            break;
        case 3: /* ties by rounding */
            a = 1.0 + (double)(tu_next(&r) % 16) * 0x1p-22;
            b = 1024.0 + floor(b * 4.0) * 0x1p-10;
            break;
        case 4: /* all negative, with -0.0 and +0.0 mixed in sx */
            a = -fabs(a) - 1.0;
            b = -fabs(b);
            if (e % 5 == 0) a = (e % 10 == 0) ? -0.0 : 0.0;
            break;
        case 5: /* NaN in one token: the warp path hands it to the portable routine */
            if (e == N + 3 % N) a = NAN;
            break;
        case 6: /* per token: NaN on both axes; +inf with -inf (NaN sums); +inf ties; -inf */
            if (e % N == 7 % N && e / N % 4 == 0) a = b = NAN;
            if (e / N % 4 == 1) {
                if (e % N == 1 % N) a = INFINITY;
                if (e % N == N - 1) b = -INFINITY;
            }
            if (e / N % 4 == 2 && e % N % 3 == 0) a = b = INFINITY;
            if (e / N % 4 == 3 && e % N % 2 == 0) b = -INFINITY;
            break;
        default:
            break;
        }
        x[e] = (float)a;
        y[e] = (float)b;
    }
}

/* one lane of the emulated warp: the launch of check() below */
typedef struct {
    const float *x, *y;
    const uint16_t *bx, *by;
    float *sc;
    int32_t *ix;
    int64_t T, N, k;
    int ar;
} rt_lanes_args;

static void rt_lanes(void *p) {
    const rt_lanes_args *a = p;
    const float *x = a->x, *y = a->y;
    const uint16_t *bx = a->bx, *by = a->by;
    float *sc = a->sc;
    int32_t *ix = a->ix;
    const int64_t T = a->T, N = a->N, k = a->k;
    const int ar = a->ar, lane = emu_tid();
    int S, CS;
    rt_warp_shape((int)N, (int)k, &S, &CS);
    if (ar == 2)
        rt_pair_run(x, N, 1, y, N, 1, 0, (int)N, (int)k, lane, 0, 2, T, sc, k, 1, ix, k, 1, 0);
    else if (ar == 3)
        rt_pair_run(bx, N, 1, by, N, 1, 1, (int)N, (int)k, lane, 0, 2, T, sc, k, 1, ix, k, 1, 1);
    else if (S == 2 && CS == 1)
        rt_warp_run(x, N, 1, y, N, 1, 0, (int)N, (int)k, lane, 0, 1, T, sc, k, 1, ix, k, 1, 2, 1,
                    0);
    else if (S == 2)
        rt_warp_run(x, N, 1, y, N, 1, 0, (int)N, (int)k, lane, 0, 1, T, sc, k, 1, ix, k, 1, 2, 4,
                    0);
    else if (CS == 1 && ar)
        rt_warp_run(x, N, 1, y, N, 1, 0, (int)N, (int)k, lane, 0, 1, T, sc, k, 1, ix, k, 1, 8, 1,
                    1);
    else if (CS == 1)
        rt_warp_run(x, N, 1, y, N, 1, 0, (int)N, (int)k, lane, 0, 1, T, sc, k, 1, ix, k, 1, 8, 1,
                    0);
    else
        rt_warp_run(x, N, 1, y, N, 1, 0, (int)N, (int)k, lane, 0, 1, T, sc, k, 1, ix, k, 1, 8, 4,
                    0);
}

/* ar: the N > 64, k <= 11 kernel takes the axis ranks by arg-max rounds (1) or by the sort (0);
 * ar = 2: the two-tokens-per-warp kernel (the default for N <= 64, k <= 11), ar = 3:
 * the same on bf16 inputs (the inputs rounded to bf16 first), sorted as 32-bit keys */
static void check(int cls, int64_t T, int64_t N, int64_t k, uint64_t seed, int ar) {
    float *x = malloc(sizeof(float) * (size_t)(T * N)),
          *y = malloc(sizeof(float) * (size_t)(T * N));
    float *sc = malloc(sizeof(float) * (size_t)(T * k)),
          *rs = malloc(sizeof(float) * (size_t)(T * k));
    int32_t *ix = malloc(sizeof(int32_t) * (size_t)(T * k));
    int32_t *ri = malloc(sizeof(int32_t) * (size_t)(T * k));
    gen(cls, T, N, seed, x, y);
    uint16_t *bx = malloc(sizeof(uint16_t) * (size_t)(T * N)),
             *by = malloc(sizeof(uint16_t) * (size_t)(T * N));
    for (int64_t e = 0; e < T * N; e++) {
        bx[e] = ompk_f32_to_bf16(x[e]);
        by[e] = ompk_f32_to_bf16(y[e]);
        if (ar == 3) x[e] = ompk_bf16_to_f32(bx[e]), y[e] = ompk_bf16_to_f32(by[e]);
    }
    const int64_t sh[2] = {T, N};
    ompk_tensor hx = ompk_tensor_make(x, OMPK_F32, 2, sh, ompk_device_host());
    ompk_tensor hy = ompk_tensor_make(y, OMPK_F32, 2, sh, ompk_device_host());
    cr_assert_eq(ompk_ref_router_topk_fwd(&hx, &hy, k, rs, ri), OMPK_OK);
    rt_lanes_args la = {x, y, bx, by, sc, ix, T, N, k, ar};
    cr_assert_eq(emu_team_run(32, rt_lanes, &la), 0, "the 32 lanes of the warp diverged");
    for (int64_t e = 0; e < T * k; e++) {
        if (ix[e] != ri[e] || !(sc[e] == rs[e] || (isnan(sc[e]) && isnan(rs[e]))))
            cr_assert_fail("class %d N=%lld k=%lld: token %lld slot %lld: got (%.9g, %d), "
                           "expected (%.9g, %d)",
                           cls, (long long)N, (long long)k, (long long)(e / k), (long long)(e % k),
                           sc[e], ix[e], rs[e], ri[e]);
    }
    free(x), free(y), free(bx), free(by), free(sc), free(rs), free(ix), free(ri);
}

Test(router_warp, matches_reference) {
    const int64_t Ns[] = {1, 2, 7, 33, 48, 64, 100, 256};
    /* 11 and 12 straddle the switch from 1 to 4 candidates per lane */
    const int64_t ks[] = {1, 2, 8, 11, 12, 32};
    for (int cls = 0; cls < 7; cls++)
        for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++)
            for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
                const int64_t N = Ns[ni], k = ks[ki];
                if (k > N * N) continue;
                int S, CS;
                rt_warp_shape((int)N, (int)k, &S, &CS);
                check(cls, 2, N, k, (uint64_t)(cls * 1000 + N * 7 + k), 1);
                if (S == 8 && CS == 1) check(cls, 2, N, k, (uint64_t)(cls * 1000 + N * 7 + k), 0);
            }
}

/* Two tokens per warp, f32 and bf16 (32-bit keys): pairs of tokens in every data class (T = 5:
 * the last pair lacks its second token; the NaN token 1 shares its warp with token 0, which must
 * still be exact). */
Test(router_warp, pair_matches_reference) {
    const int64_t Ns[] = {1, 2, 7, 33, 48, 64};
    const int64_t ks[] = {1, 2, 3, 8, 11};
    for (int cls = 0; cls < 7; cls++)
        for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++)
            for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
                const int64_t N = Ns[ni], k = ks[ki];
                if (k > N * N) continue;
                cr_assert(rt_pair_eligible((int)N, (int)k));
                check(cls, 5, N, k, (uint64_t)(cls * 1000 + N * 7 + k + 5), 2);
                check(cls, 5, N, k, (uint64_t)(cls * 1000 + N * 7 + k + 6), 3);
            }
}
