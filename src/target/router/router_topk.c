/* Product-key router (docs/KERNELS.md 4), one OpenMP source for GPU and host: one thread per
 * token.
 *
 * Forward, per token, exact:
 *  1. The top L = min(k+1, N) of sx and of sy, each sorted best-first (value descending, ties to
 *     the lower index): ranks a (for sx) and b (for sy).
 *  2. Rounding is monotone, so fp32 sx[i'] + sy[j'] >= sx[i] + sy[j] whenever the pair (i',j')
 *     precedes (i,j) in both rank orders; (a+1)(b+1) pairs dominate the pair at ranks (a,b). Hence
 *     the k-th largest sum tau over all N^2 pairs equals the k-th largest over the candidates with
 *     (a+1)(b+1) <= k, and every pair with a sum above tau is a candidate. A min-heap of size k
 *     over the candidates (rows and columns cut off as soon as a sum falls below the heap's worst)
 *     gives them all.
 *  3. Pairs whose sum equals tau need not be candidates: a pair with a slightly larger sx can
 *     round to the same sum at a higher flattened index. So the heap is trusted only when the
 *     pairs with sum >= tau are exactly k (counted on the rank grid); otherwise its tau-slots are
 *     refilled by scanning all pairs in flattened order for sums equal to tau (heavy ties only).
 *  4. A token holding NaN or +inf (a NaN sum ranks first, and +inf + -inf is NaN, so step 2's
 *     dominance fails) is ranked over all N^2 pairs in the contract's total order instead.
 *
 * Backward: index validation first (a min-reduction over slots), then outputs zeroed and each
 * token's contributions added in slot order, so the result does not depend on the device or on
 * the thread count. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "router_topk.h"
#include "scratch.h"

/* Per-thread capacity of the on-stack lists; larger k use a workspace on the call's device (the
 * axis lists) and the output rows themselves (the heap). */
#define RT_LOCAL_K 64
#define RT_LOCAL_L (RT_LOCAL_K + 1)
#define RT_WS_MAX_BYTES ((int64_t)64 << 20)

/* The contract's total order of sums as an unsigned key: NaN above +inf, then the floats
 * descending, -0 folded onto +0 (equal sums, ordered by index like any tie). */
static inline uint32_t rt_tkey(float v) {
    ompk_f32_bits b;
    b.f = v == 0.0f ? 0.0f : v;
    if (v != v) return 0xffffffffu;
    return (b.u & 0x80000000u) ? ~b.u : (b.u | 0x80000000u);
}

/* tot = 0: float comparison (tokens without NaN and +inf); tot = 1: the key order. A constant
 * at every call site, so each use compiles to one of the two. */
static inline int rt_better(float a, int32_t ia, float b, int32_t ib, int tot) {
    if (tot) {
        const uint32_t ka = rt_tkey(a), kb = rt_tkey(b);
        return ka > kb || (ka == kb && ia < ib);
    }
    return a > b || (a == b && ia < ib);
}

/* Heaps keep the worst element at the root, so the root is the admission threshold. */
static inline void rt_sift_down(float *v, int32_t *id, int64_t vs, int64_t is, int64_t n, int64_t p,
                                int tot) {
    const float pv = v[p * vs];
    const int32_t pi = id[p * is];
    for (;;) {
        int64_t c = 2 * p + 1;
        if (c >= n) break;
        if (c + 1 < n && rt_better(v[c * vs], id[c * is], v[(c + 1) * vs], id[(c + 1) * is], tot))
            c++;
        if (!rt_better(pv, pi, v[c * vs], id[c * is], tot)) break;
        v[p * vs] = v[c * vs];
        id[p * is] = id[c * is];
        p = c;
    }
    v[p * vs] = pv;
    id[p * is] = pi;
}

static inline void rt_sift_up(float *v, int32_t *id, int64_t vs, int64_t is, int64_t c, int tot) {
    const float cv = v[c * vs];
    const int32_t ci = id[c * is];
    while (c > 0) {
        const int64_t p = (c - 1) / 2;
        if (!rt_better(v[p * vs], id[p * is], cv, ci, tot)) break;
        v[c * vs] = v[p * vs];
        id[c * is] = id[p * is];
        c = p;
    }
    v[c * vs] = cv;
    id[c * is] = ci;
}

static inline void rt_offer(float *v, int32_t *id, int64_t vs, int64_t is, int64_t cap, int64_t *n,
                            float s, int32_t i, int tot) {
    if (*n < cap) {
        v[*n * vs] = s;
        id[*n * is] = i;
        rt_sift_up(v, id, vs, is, *n, tot);
        (*n)++;
    } else if (rt_better(s, i, v[0], id[0], tot)) {
        v[0] = s;
        id[0] = i;
        rt_sift_down(v, id, vs, is, cap, 0, tot);
    }
}

/* In place: heap of n -> sorted best-first. */
static inline void rt_heap_sort(float *v, int32_t *id, int64_t vs, int64_t is, int64_t n, int tot) {
    for (int64_t e = n - 1; e > 0; e--) {
        const float tv = v[0];
        const int32_t ti = id[0];
        v[0] = v[e * vs];
        id[0] = id[e * is];
        v[e * vs] = tv;
        id[e * is] = ti;
        rt_sift_down(v, id, vs, is, e, 0, tot);
    }
}

static inline void rt_axis_top(const void *p, int64_t off, int64_t st, int64_t N, int bf16,
                               int64_t L, float *v, int32_t *id) {
    int64_t n = 0;
    for (int64_t i = 0; i < N; i++)
        rt_offer(v, id, 1, 1, L, &n, ompk_load_f(p, off + i * st, bf16), (int32_t)i, 0);
    rt_heap_sort(v, id, 1, 1, L, 0);
}

/* Small capacities (the on-stack lists, k <= 64) keep a sorted best-first array instead of a
 * heap: an insertion moves a few neighbours with predictable branches, where a heap pays
 * unpredictable sift branches for every insertion and again for the final sort. */
static inline void rt_list_offer(float *v, int32_t *id, int64_t cap, int64_t *n, float s, int32_t i,
                                 int tot) {
    int64_t p = *n;
    if (p == cap) {
        if (!rt_better(s, i, v[cap - 1], id[cap - 1], tot)) return;
        p = cap - 1;
    } else {
        (*n)++;
    }
    while (p > 0 && rt_better(s, i, v[p - 1], id[p - 1], tot)) {
        v[p] = v[p - 1];
        id[p] = id[p - 1];
        p--;
    }
    v[p] = s;
    id[p] = i;
}

static inline void rt_axis_list(const void *p, int64_t off, int64_t st, int64_t N, int bf16,
                                int64_t L, float *v, int32_t *id) {
    int64_t n = 0;
    for (int64_t i = 0; i < N; i++)
        rt_list_offer(v, id, L, &n, ompk_load_f(p, off + i * st, bf16), (int32_t)i, 0);
}

/* 1 when exactly k pairs have sum >= tau, i.e. the heap holds the whole answer. Counted on the
 * L x L rank grid; when a count could continue past the grid (L < N) the answer is "unknown" (0).
 */
static inline int rt_exact_count(const float *xv, const float *yv, int64_t N, int64_t k, int64_t L,
                                 float tau) {
    int64_t cnt = 0;
    for (int64_t a = 0; a < L; a++) {
        int64_t rc = 0;
        while (rc < L && xv[a] + yv[rc] >= tau) rc++;
        if (rc == 0) return cnt == k;
        if (L < N && (rc == L || a == L - 1)) return 0;
        cnt += rc;
        if (cnt > k) return 0;
    }
    return cnt == k;
}

/* 1 when the token holds a NaN or +inf: then a sum can be NaN (+inf + -inf), which ranks first
 * though neither of its terms does, so the rank-grid pruning below does not apply. */
static inline int rt_token_bad(const void *sx, int64_t xo, int64_t xs, const void *sy, int64_t yo,
                               int64_t ys, int bf16, int64_t N) {
    int bad = 0;
    for (int64_t i = 0; i < N; i++) {
        const float x = ompk_load_f(sx, xo + i * xs, bf16), y = ompk_load_f(sy, yo + i * ys, bf16);
        bad |= (!(x < __builtin_inff()) && x != -__builtin_inff()) |
               (!(y < __builtin_inff()) && y != -__builtin_inff());
    }
    return bad;
}

/* Such a token offers every pair, compared in the key order (O(N^2), non-finite inputs only). */
static void rt_token_all(const void *sx, int64_t xo, int64_t xs, const void *sy, int64_t yo,
                         int64_t ys, int bf16, int64_t N, int64_t k, float *hv, int32_t *hi,
                         int64_t hvs, int64_t his, int lists) {
    int64_t n = 0;
    for (int64_t i = 0; i < N; i++) {
        const float x = ompk_load_f(sx, xo + i * xs, bf16);
        for (int64_t j = 0; j < N; j++) {
            const float s = x + ompk_load_f(sy, yo + j * ys, bf16);
            const int32_t p = (int32_t)(i * N + j);
            if (lists)
                rt_list_offer(hv, hi, k, &n, s, p, 1);
            else
                rt_offer(hv, hi, hvs, his, k, &n, s, p, 1);
        }
    }
    if (!lists) rt_heap_sort(hv, hi, hvs, his, k, 1);
}

static void rt_token(const void *sx, int64_t xo, int64_t xs, const void *sy, int64_t yo, int64_t ys,
                     int bf16, int64_t N, int64_t k, int64_t L, float *xv, int32_t *xi, float *yv,
                     int32_t *yi, float *hv, int32_t *hi, int64_t hvs, int64_t his, int lists) {
    if (rt_token_bad(sx, xo, xs, sy, yo, ys, bf16, N)) {
        rt_token_all(sx, xo, xs, sy, yo, ys, bf16, N, k, hv, hi, hvs, his, lists);
        return;
    }
    if (lists) {
        rt_axis_list(sx, xo, xs, N, bf16, L, xv, xi);
        rt_axis_list(sy, yo, ys, N, bf16, L, yv, yi);
    } else {
        rt_axis_top(sx, xo, xs, N, bf16, L, xv, xi);
        rt_axis_top(sy, yo, ys, N, bf16, L, yv, yi);
    }

    int64_t n = 0;
    for (int64_t a = 0; a < L; a++) {
        int64_t bmax = k / (a + 1);
        if (bmax > L) bmax = L;
        if (bmax == 0) break;
        const float x = xv[a];
        const int32_t row = xi[a] * (int32_t)N;
        int64_t b = 0;
        for (; b < bmax; b++) {
            const float s = x + yv[b];
            /* sums fall along a row (and down the first column): nothing further can enter */
            if (n == k && s < (lists ? hv[k - 1] : hv[0])) break;
            if (lists)
                rt_list_offer(hv, hi, k, &n, s, row + yi[b], 0);
            else
                rt_offer(hv, hi, hvs, his, k, &n, s, row + yi[b], 0);
        }
        if (b == 0) break;
    }
    if (!lists) rt_heap_sort(hv, hi, hvs, his, k, 0);

    const float tau = hv[(k - 1) * hvs];
    if (rt_exact_count(xv, yv, N, k, L, tau)) return;

    /* Ties at tau: keep the pairs above tau (all candidates), refill the rest with the lowest
     * flattened indices whose sum is tau, which the scan meets in sorted order. */
    int64_t w = 0;
    while (w < k && hv[w * hvs] > tau) w++;
    const float ymax = yv[0];
    for (int64_t i = 0; i < N && w < k; i++) {
        const float x = ompk_load_f(sx, xo + i * xs, bf16);
        if (!(x + ymax >= tau)) continue;
        for (int64_t j = 0; j < N && w < k; j++) {
            const float s = x + ompk_load_f(sy, yo + j * ys, bf16);
            if (s == tau) {
                hv[w * hvs] = s;
                hi[w * his] = (int32_t)(i * N + j);
                w++;
            }
        }
    }
}

/* GPU variant for k <= 32 and N <= 256: one warp per token, everything in registers, no serial
 * arg-max rounds.
 * Keys pack (value, index) into one uint64 whose unsigned order is the contract's order (value
 * descending through an order-preserving map of the float with -0 folded onto +0, then the lower
 * index through its complement), so sorting keys sorts by the contract.
 *  - each axis row (padded to 32*S, S = 2 or 8 keys per lane) is sorted by a warp bitonic
 *    network, sx and sy in lockstep: O(N log^2 N) work spread over 32 lanes with two independent
 *    chains, where extracting the top k+1 one arg-max at a time was k+1 dependent warp rounds;
 *  - the candidates (a+1)(b+1) <= k (at most 119; their rank map is built once per warp) take
 *    their sums from shuffled ranks and are sorted by a second bitonic network (1 or 4 per lane),
 *    which leaves rank r in lane r / CS: the outputs are written without another exchange;
 *  - exactness: every pair outside the candidate set is dominated (both ranks no better) by a
 *    frontier pair (a, k / (a+1)), a <= k; if no frontier sum reaches tau (the k-th candidate's
 *    sum) no outside pair does, and the candidates' top k is the answer. Otherwise the slots at
 *    tau are refilled by the warp scanning all pairs in flattened order, 32 columns per step (a
 *    single-thread scan there, latency-bound on global loads, cost ~1 ms per kernel when even a
 *    handful of the 16384 tokens tied); a token holding NaN or +inf is finished by lane 0 with
 *    the portable per-token routine.
 * OMPK_ROUTER_VARIANT=portable forces the portable kernel. */
#include "bare.h"
#if defined(OMPK_EMULATE)
/* tests/test_router_warp.c: the warp code on an emulated team of 32 threads (bare.h),
 * collectives through memory */
static unsigned rt_emu_u[32];
static int rt_emu_i[32];
static inline unsigned rt_wmax(unsigned v) {
    OMPK_SYNC();
    rt_emu_u[OMPK_TID()] = v;
    OMPK_SYNC();
    unsigned m = 0;
    for (int l = 0; l < 32; l++) m = rt_emu_u[l] > m ? rt_emu_u[l] : m;
    return m;
}
static inline int rt_wadd(int v) {
    OMPK_SYNC();
    rt_emu_i[OMPK_TID()] = v;
    OMPK_SYNC();
    int s = 0;
    for (int l = 0; l < 32; l++) s += rt_emu_i[l];
    return s;
}
static inline unsigned rt_wshfl(unsigned v, int src) {
    OMPK_SYNC();
    rt_emu_u[OMPK_TID()] = v;
    OMPK_SYNC();
    return rt_emu_u[src];
}
static inline unsigned rt_wballot(int pred) {
    OMPK_SYNC();
    rt_emu_i[OMPK_TID()] = pred != 0;
    OMPK_SYNC();
    unsigned m = 0;
    for (int l = 0; l < 32; l++) m |= (unsigned)rt_emu_i[l] << l;
    return m;
}
#elif defined(OMPK_NV_DEVICE)

/* Host bodies only satisfy the host compilation of the region; the kernel launches on GPUs. */
static inline unsigned rt_wmax(unsigned v) {
    return v;
}
static inline int rt_wadd(int v) {
    return v;
}
static inline unsigned rt_wshfl(unsigned v, int src) {
    (void)src;
    return v;
}
static inline unsigned rt_wballot(int pred) {
    return pred != 0;
}
#pragma omp begin declare variant match(device = {arch(nvptx64)})
static inline __attribute__((unused)) unsigned rt_wmax(unsigned v) {
    return __nvvm_redux_sync_umax(v, (int)0xffffffff);
}
static inline __attribute__((unused)) int rt_wadd(int v) {
    return __nvvm_redux_sync_add(v, (int)0xffffffff);
}
static inline __attribute__((unused)) unsigned rt_wshfl(unsigned v, int src) {
    return (unsigned)__nvvm_shfl_sync_idx_i32(0xffffffffu, (int)v, src, 0x1f);
}
static inline __attribute__((unused)) unsigned rt_wballot(int pred) {
    return __nvvm_vote_ballot_sync(0xffffffffu, pred != 0);
}
#pragma omp end declare variant
#endif

#ifdef OMPK_NV_KERNELS
#define RT_BARE_KMAX 32
#define RT_BARE_NMAX 256
#define RT_WARPS 4
/* Tokens per warp. The candidate map is built once per warp, but a grid that fits the resident
 * warp slots about once (4 tokens per warp fill an H200 1.1 times at 72 registers) pays a whole
 * extra wave for the remainder; one token per warp leaves a tail of one block. */
#define RT_TOK_PER_WARP 1

/* The network helpers take their sizes as literals; forced inlining makes every loop's trip
 * count a constant, so the loops unroll and the key arrays stay in registers. */
#define RT_AI static inline __attribute__((always_inline))
#if defined(__clang__)
#define RT_UNROLL _Pragma("unroll")
#define RT_NOUNROLL _Pragma("nounroll")
#else
#define RT_UNROLL _Pragma("GCC unroll 64")
#define RT_NOUNROLL _Pragma("GCC unroll 1")
#endif

static inline unsigned rt_ord(float v) {
    ompk_f32_bits b;
    b.f = v == 0.0f ? 0.0f : v;
    return (b.u & 0x80000000u) ? ~b.u : (b.u | 0x80000000u);
}

static inline float rt_unord(unsigned o) {
    ompk_f32_bits b;
    b.u = (o & 0x80000000u) ? (o & 0x7fffffffu) : ~o;
    return b.f;
}

static inline uint64_t rt_key(float v, int32_t idx) {
    return ((uint64_t)rt_ord(v) << 32) | (uint32_t)~(uint32_t)idx;
}

static inline uint64_t rt_wshfl64(uint64_t v, int src) {
    const unsigned hi = rt_wshfl((unsigned)(v >> 32), src), lo = rt_wshfl((unsigned)v, src);
    return ((uint64_t)hi << 32) | lo;
}

/* NaN and +inf break the monotone-sum argument (inf + -inf) */
static inline int rt_bad(float f) {
    return !(f < __builtin_inff()) && f != -__builtin_inff();
}

/* Descending bitonic sort of 32*S keys, lane l holding elements l*S .. l*S + S-1, so rank r
 * ends in lane r / S, slot r % S. With two = 1 a second array is sorted in lockstep. The steps
 * run as one flat loop so that full unrolling turns (size, d) into constants. With gb > 0 the
 * lanes gb.. form a narrower group (lane counts from its start; partners never leave it). */
// clang-format off
#define RT_DEF_BITONIC(NAME_, KT_, SHFL_) \
RT_AI void NAME_(KT_ *u, KT_ *v, const int S, const int two, int lane, int gb,    \
                            const int steps) {                                    \
    int size = 2, d = 1;                                                          \
    RT_UNROLL                                                                     \
    for (int st = 0; st < steps; st++) {                                          \
        if (d < S) {                                                              \
            RT_UNROLL                                                             \
            for (int m = 0; m < S; m++) {                                         \
                if (m & d) continue;                                              \
                const int desc = ((lane * S + m) & size) == 0;                    \
                if ((u[m] < u[m | d]) == desc) {                                  \
                    const KT_ t = u[m];                                           \
                    u[m] = u[m | d];                                              \
                    u[m | d] = t;                                                 \
                }                                                                 \
                if (two && (v[m] < v[m | d]) == desc) {                           \
                    const KT_ t = v[m];                                           \
                    v[m] = v[m | d];                                              \
                    v[m | d] = t;                                                 \
                }                                                                 \
            }                                                                     \
        } else {                                                                  \
            const int j = d / S, src = gb + (lane ^ j);                           \
            const int takemax = ((lane & j) == 0) == (((lane * S) & size) == 0);  \
            RT_UNROLL                                                             \
            for (int m = 0; m < S; m++) {                                         \
                const KT_ p = SHFL_(u[m], src);                                   \
                if ((p > u[m]) == takemax) u[m] = p;                              \
                if (two) {                                                        \
                    const KT_ q = SHFL_(v[m], src);                               \
                    if ((q > v[m]) == takemax) v[m] = q;                          \
                }                                                                 \
            }                                                                     \
        }                                                                         \
        if (d == 1) {                                                             \
            size <<= 1;                                                           \
            d = size >> 1;                                                        \
        } else {                                                                  \
            d >>= 1;                                                              \
        }                                                                         \
    }                                                                             \
}
// clang-format on
RT_DEF_BITONIC(rt_bitonic_steps, uint64_t, rt_wshfl64)
/* bf16 keys (16-bit ordered value, 16-bit index) fit in 32 bits: one shuffle per exchange */
RT_DEF_BITONIC(rt_bitonic_steps32, uint32_t, rt_wshfl)

RT_AI void rt_bitonic(uint64_t *u, uint64_t *v, const int S, const int two, int lane) {
    const int logn = S == 1 ? 5 : S == 2 ? 6 : S == 4 ? 7 : 8;
    rt_bitonic_steps(u, v, S, two, lane, 0, logn * (logn + 1) / 2);
}

/* rank `lane` of a sorted array (lane r / S, slot r % S) */
RT_AI uint64_t rt_rank_to_lane(const uint64_t *v, const int S, int lane) {
    uint64_t out = 0;
    RT_UNROLL
    for (int j = 0; j < S; j++) {
        const uint64_t t = rt_wshfl64(v[j], lane / S);
        if (lane % S == j) out = t;
    }
    return out;
}

/* the warp's best key (every lane gets it) */
static inline uint64_t rt_warp_best(uint64_t mine) {
    const unsigned hi = rt_wmax((unsigned)(mine >> 32));
    const unsigned lo = rt_wmax((unsigned)(mine >> 32) == hi ? (unsigned)mine : 0u);
    return ((uint64_t)hi << 32) | lo;
}

/* Top L <= 32 of two axes held 8 keys per lane: each lane sorts its 8 (registers only), then L
 * warp arg-max rounds, the two axes' rounds interleaved; rank r lands in lane r. For N = 256
 * and small k this is fewer instructions than sorting all 256 (the first warp kernel did). */
RT_AI void rt_axis_rounds(uint64_t *u, uint64_t *v, int L, int lane, uint64_t *ou, uint64_t *ov) {
    /* the first 6 steps (runs up to 8) stay in registers; lane 0's directions make every
     * lane's run descending */
    rt_bitonic_steps(u, v, 8, 1, 0, 0, 6);
    *ou = *ov = 0;
    for (int r = 0; r < L; r++) {
        const uint64_t wu = rt_warp_best(u[0]), wv = rt_warp_best(v[0]);
        if (lane == r) *ou = wu, *ov = wv;
        const int su = u[0] == wu, sv = v[0] == wv;
        RT_UNROLL
        for (int m = 0; m < 7; m++) {
            if (su) u[m] = u[m + 1];
            if (sv) v[m] = v[m + 1];
        }
        if (su) u[7] = 0;
        if (sv) v[7] = 0;
    }
}

/* the candidate set {(a, b): a, b < N, (a+1)(b+1) <= k}, row-major */
static inline int rt_cand_count(int N, int k) {
    int c = 0;
    for (int a = 0; a < k && a < N; a++) c += k / (a + 1) < N ? k / (a + 1) : N;
    return c;
}

/* candidate lane*CS + m -> ranks (ca[m], cb[m]); ca = -1 past the end */
RT_AI void rt_cand_map(int N, int k, int lane, const int CS, int *ca, int *cb) {
    RT_UNROLL
    for (int m = 0; m < CS; m++) ca[m] = -1, cb[m] = 0;
    for (int a = 0, base = 0; a < k && a < N; a++) {
        const int len = k / (a + 1) < N ? k / (a + 1) : N;
        RT_UNROLL
        for (int m = 0; m < CS; m++) {
            const int c = lane * CS + m;
            if (c >= base && c < base + len) ca[m] = a, cb[m] = c - base;
        }
        base += len;
    }
}

/* Ties at tau: slots fill.. get the lowest flattened indices whose sum is tau, found by the
 * whole warp scanning rows in ascending i (rows that cannot reach tau skipped) and, within a
 * row, ascending j, 32 columns per step; a ballot orders the hits of one step. */
static __attribute__((noinline)) void rt_warp_tie_fill(const void *sx, int64_t xo, int64_t xs,
                                                       const void *sy, int64_t yo, int64_t ys,
                                                       int bf16, int N, int k, int lane, float tau,
                                                       float ymax, int fill, float *sc, int64_t sc1,
                                                       int32_t *ix, int64_t ix1) {
    float xr[8], yr[8];
    for (int m = 0; m < 8; m++) {
        const int i = lane + 32 * m;
        xr[m] = i < N ? ompk_load_f(sx, xo + i * xs, bf16) : 0.0f;
        yr[m] = i < N ? ompk_load_f(sy, yo + i * ys, bf16) : 0.0f;
    }
    for (int mi = 0; 32 * mi < N; mi++) {
        unsigned rows = rt_wballot(lane + 32 * mi < N && xr[mi] + ymax >= tau);
        while (rows && fill < k) {
            const int src = __builtin_ctz(rows);
            rows &= rows - 1;
            ompk_f32_bits xb;
            xb.f = xr[mi];
            xb.u = rt_wshfl(xb.u, src);
            const int32_t i = src + 32 * mi;
            for (int mj = 0; 32 * mj < N; mj++) {
                const int j = lane + 32 * mj;
                const float s = xb.f + yr[mj];
                const int hit = j < N && s == tau;
                const unsigned hm = rt_wballot(hit);
                const int pos = fill + __builtin_popcount(hm & ((1u << lane) - 1u));
                if (hit && pos < k) {
                    sc[pos * sc1] = s;
                    ix[pos * ix1] = i * N + j;
                }
                fill += __builtin_popcount(hm);
            }
        }
    }
}

/* A token holding NaN or +inf breaks the monotone-sum argument: the portable routine, run by one
 * lane, ranks all its pairs in the contract's order. Kept out of line, like the tie scan, so the
 * rare paths' local arrays and registers stay out of the kernel's budget. */
static __attribute__((noinline)) void rt_token_lane(const void *sx, int64_t xo, int64_t xs,
                                                    const void *sy, int64_t yo, int64_t ys,
                                                    int bf16, int N, int k, float *sc, int64_t sc1,
                                                    int32_t *ix, int64_t ix1) {
    float lxv[RT_BARE_KMAX + 1], lyv[RT_BARE_KMAX + 1], lhv[RT_BARE_KMAX];
    int32_t lxi[RT_BARE_KMAX + 1], lyi[RT_BARE_KMAX + 1], lhi[RT_BARE_KMAX];
    const int L = k + 1 < N ? k + 1 : N;
    rt_token(sx, xo, xs, sy, yo, ys, bf16, N, k, L, lxv, lxi, lyv, lyi, lhv, lhi, 1, 1, 1);
    for (int r = 0; r < k; r++) {
        sc[r * sc1] = lhv[r];
        ix[r * ix1] = lhi[r];
    }
}

/* One token; sx, sy, sc, ix point at the token's rows (in-row strides fit in int32). */
RT_AI void rt_warp_token(const void *sx, int xs, const void *sy, int ys, int bf16, int N, int k,
                         int lane, const int S, const int CS, const int AR, const int *ca,
                         const int *cb, float *sc, int sc1, int32_t *ix, int ix1) {
    const int64_t xo = 0, yo = 0;
    uint64_t kx[8], ky[8];
    int bad = 0;
    RT_UNROLL
    for (int m = 0; m < S; m++) {
        const int i = lane * S + m;
        kx[m] = ky[m] = 0; /* below every real key */
        if (i < N) {
            const float fx = ompk_load_f(sx, xo + i * xs, bf16);
            const float fy = ompk_load_f(sy, yo + i * ys, bf16);
            bad |= rt_bad(fx) | rt_bad(fy);
            kx[m] = rt_key(fx, i);
            ky[m] = rt_key(fy, i);
        }
    }
    if (rt_wballot(bad)) {
        if (lane == 0) rt_token_lane(sx, xo, xs, sy, yo, ys, bf16, N, k, sc, sc1, ix, ix1);
        return;
    }
    /* lane r gets rank r of each axis; candidates and the frontier only read ranks <= k */
    uint64_t x0, y0;
    float x32 = 0.0f, y32 = 0.0f; /* rank 32: read by k = 32 only */
    if (S == 8 && AR) {
        rt_axis_rounds(kx, ky, k + 1, lane, &x0, &y0); /* k <= 11 here */
    } else {
        rt_bitonic(kx, ky, S, 1, lane);
        x0 = rt_rank_to_lane(kx, S, lane);
        y0 = rt_rank_to_lane(ky, S, lane);
        x32 = rt_unord(rt_wshfl((unsigned)(kx[0] >> 32), (32 / S) & 31));
        y32 = rt_unord(rt_wshfl((unsigned)(ky[0] >> 32), (32 / S) & 31));
    }

    uint64_t c[4];
    RT_UNROLL
    for (int m = 0; m < CS; m++) {
        const uint64_t px = rt_wshfl64(x0, ca[m] < 0 ? 0 : ca[m]), py = rt_wshfl64(y0, cb[m]);
        const float s = rt_unord((unsigned)(px >> 32)) + rt_unord((unsigned)(py >> 32));
        const int32_t i = (int32_t)~(uint32_t)px, j = (int32_t)~(uint32_t)py;
        c[m] = ca[m] < 0 ? 0 : rt_key(s, i * N + j);
    }
    rt_bitonic(c, c, CS, 0, lane);

    /* tau = the sum at rank k - 1 (lane (k-1) / CS, slot (k-1) % CS) */
    uint64_t sel = c[0];
    RT_UNROLL
    for (int m = 1; m < CS; m++)
        if ((k - 1) % CS == m) sel = c[m];
    const float tau = rt_unord(rt_wshfl((unsigned)(sel >> 32), (k - 1) / CS));

    /* frontier pair (a, k / (a+1)) in lane a; (32, 0) (k = 32 only) in lane 0 */
    const float xa = rt_unord((unsigned)(x0 >> 32));
    const int b = k / (lane + 1);
    const float yb = rt_unord(rt_wshfl((unsigned)(y0 >> 32), b & 31));
    int hit = lane <= k && lane < N && b < N && xa + (b == 32 ? y32 : yb) >= tau;
    if (lane == 0 && k >= 32 && N > 32 && x32 + rt_unord((unsigned)(y0 >> 32)) >= tau) hit = 1;
    const int sure = rt_wballot(hit) == 0;

    int above = 0;
    RT_UNROLL
    for (int m = 0; m < CS; m++)
        above += lane * CS + m < k && rt_unord((unsigned)(c[m] >> 32)) > tau;
    /* slots kept from the candidates: all k, or those strictly above tau */
    const int w0 = sure ? k : rt_wadd(above);
    RT_UNROLL
    for (int m = 0; m < CS; m++) {
        const int r = lane * CS + m;
        if (r < w0) {
            /* the sum again from the inputs: the key folded -0 onto +0 */
            const int32_t p = (int32_t)~(uint32_t)c[m], i = p / N, j = p % N;
            sc[r * sc1] = ompk_load_f(sx, xo + i * xs, bf16) + ompk_load_f(sy, yo + j * ys, bf16);
            ix[r * ix1] = p;
        }
    }
    if (sure) return;
    const float ymax = rt_unord(rt_wshfl((unsigned)(y0 >> 32), 0));
    rt_warp_tie_fill(sx, xo, xs, sy, yo, ys, bf16, N, k, lane, tau, ymax, w0, sc, sc1, ix, ix1);
}

/* The lane number, hidden from the optimizer: with it visible, every network step's lane
 * predicates (partner, direction) were hoisted out of the token loop and held live across it,
 * 114-220 registers instead of the working set's. */
static inline int rt_opaque(int v) {
    __asm__ volatile("" : "+r"(v));
    return v;
}

static inline const void *rt_row(const void *p, int64_t off, int bf16) {
    return bf16 ? (const void *)((const uint16_t *)p + off)
                : (const void *)((const float *)p + off);
}

/* One warp's share of the tokens: t0, t0 + step, ... < T (N <= 256, k <= 32; S and CS as
 * rt_warp_shape gives them, literals at every call). */
RT_AI void rt_warp_run(const void *sx, int64_t sx0, int sx1, const void *sy, int64_t sy0, int sy1,
                       int bf16, int N, int k, int lane, int64_t t0, int64_t step, int64_t T,
                       float *sc, int64_t sc0, int sc1, int32_t *ix, int64_t ix0, int ix1,
                       const int S, const int CS, const int AR) {
    int ca[4], cb[4];
    rt_cand_map(N, k, lane, CS, ca, cb);
    for (int64_t t = t0; t < T; t += step)
        rt_warp_token(rt_row(sx, t * sx0, bf16), sx1, rt_row(sy, t * sy0, bf16), sy1, bf16, N, k,
                      rt_opaque(lane), S, CS, AR, ca, cb, sc + t * sc0, sc1, ix + t * ix0, ix1);
}

/* The default for N <= 64 and k <= 11 (OMPK_ROUTER_VARIANT=warp1: one token per warp): two tokens
 * per warp, 16 lanes each (lanes 0-15 token t, 16-31 token t+1), 4 keys per lane per axis and 2
 * candidates per lane. Per token the axis sort takes 10 shuffle steps instead of 15 (the other 11
 * compare-exchanges stay in registers) and the candidate sort 10 instead of 15, and each warp
 * instruction serves two tokens, so the warp's latency chain (the limit: 40% of cycles without an
 * eligible warp) is shared by twice the work. Ranks <= k <= 11 and the frontier lanes a <= k fit in
 * 16 lanes; at most 29 candidates fit in 32 slots. Every collective is executed by all 32 lanes: a
 * token with NaN/+inf (or the missing partner of an odd last token) goes through the networks with
 * garbage keys and writes nothing; its fallback and the tie scans run after the networks (the
 * tie scan of each token by the whole warp). */
/* bf16 bits -> 32-bit key: the value's order in the high half (-0 folded onto +0), the index's
 * complement in the low half (N <= 64); and back to the 64-bit key of the same (value, index) */
static inline uint32_t rt_key16(uint16_t h, int idx) {
    const uint32_t u = h == 0x8000u ? 0u : h;
    const uint32_t o = (u & 0x8000u) ? (~u & 0xffffu) : (u | 0x8000u);
    return (o << 16) | (~(uint32_t)idx & 0xffffu);
}

static inline uint64_t rt_key16_wide(uint32_t k) {
    if (k == 0) return 0; /* padding stays below every real key */
    const uint32_t o = k >> 16;
    const uint16_t h = (uint16_t)((o & 0x8000u) ? (o & 0x7fffu) : (~o & 0xffffu));
    return rt_key(ompk_bf16_to_f32(h), (int32_t)(~k & 0xffffu));
}

#define RT_PAIR_KMAX 11
#define RT_PAIR_NMAX 64

static inline int rt_pair_eligible(int N, int k) {
    return N <= RT_PAIR_NMAX && k <= RT_PAIR_KMAX;
}

RT_AI void rt_pair_tokens(const void *sx, int64_t sx0, int sx1, const void *sy, int64_t sy0,
                          int sy1, int bf16, int N, int k, int lane, int64_t t, int64_t T,
                          float *sc, int64_t sc0, int sc1, int32_t *ix, int64_t ix0, int ix1,
                          const int *ca, const int *cb, const int B32) {
    const int gl = lane & 15, gb = lane & 16;
    const int64_t tt = t + (gb >> 4);
    const int valid = tt < T;
    const int64_t tr = valid ? tt : t;
    const void *rx = rt_row(sx, tr * sx0, bf16), *ry = rt_row(sy, tr * sy0, bf16);
    int bad = 0;
    uint64_t x0 = 0, y0 = 0; /* rank gl of each axis */
    if (B32) {
        uint32_t kx[4], ky[4];
        RT_UNROLL
        for (int m = 0; m < 4; m++) {
            const int i = gl * 4 + m;
            kx[m] = ky[m] = 0; /* below every real key */
            if (valid && i < N) {
                const uint16_t hx = ((const uint16_t *)rx)[(int64_t)i * sx1];
                const uint16_t hy = ((const uint16_t *)ry)[(int64_t)i * sy1];
                bad |= rt_bad(ompk_bf16_to_f32(hx)) | rt_bad(ompk_bf16_to_f32(hy));
                kx[m] = rt_key16(hx, i);
                ky[m] = rt_key16(hy, i);
            }
        }
        rt_bitonic_steps32(kx, ky, 4, 1, gl, gb, 21); /* 64 keys: 6 * 7 / 2 steps */
        uint32_t hx = 0, hy = 0;
        RT_UNROLL
        for (int j = 0; j < 4; j++) {
            const uint32_t px = rt_wshfl(kx[j], gb + gl / 4), py = rt_wshfl(ky[j], gb + gl / 4);
            if (gl % 4 == j) hx = px, hy = py;
        }
        x0 = rt_key16_wide(hx);
        y0 = rt_key16_wide(hy);
    } else {
        uint64_t kx[4], ky[4];
        RT_UNROLL
        for (int m = 0; m < 4; m++) {
            const int i = gl * 4 + m;
            kx[m] = ky[m] = 0; /* below every real key */
            if (valid && i < N) {
                const float fx = ompk_load_f(rx, (int64_t)i * sx1, bf16);
                const float fy = ompk_load_f(ry, (int64_t)i * sy1, bf16);
                bad |= rt_bad(fx) | rt_bad(fy);
                kx[m] = rt_key(fx, i);
                ky[m] = rt_key(fy, i);
            }
        }
        rt_bitonic_steps(kx, ky, 4, 1, gl, gb, 21);
        RT_UNROLL
        for (int j = 0; j < 4; j++) {
            const uint64_t px = rt_wshfl64(kx[j], gb + gl / 4);
            const uint64_t py = rt_wshfl64(ky[j], gb + gl / 4);
            if (gl % 4 == j) x0 = px, y0 = py;
        }
    }
    const int badg = ((rt_wballot(bad) >> gb) & 0xffffu) != 0;

    uint64_t c[2];
    RT_UNROLL
    for (int m = 0; m < 2; m++) {
        const uint64_t px = rt_wshfl64(x0, gb + (ca[m] < 0 ? 0 : ca[m]));
        const uint64_t py = rt_wshfl64(y0, gb + cb[m]);
        const float s = rt_unord((unsigned)(px >> 32)) + rt_unord((unsigned)(py >> 32));
        const int32_t i = (int32_t)~(uint32_t)px, j = (int32_t)~(uint32_t)py;
        c[m] = ca[m] < 0 ? 0 : rt_key(s, i * N + j);
    }
    rt_bitonic_steps(c, c, 2, 0, gl, gb, 15); /* 32 keys */

    /* tau = the sum at rank k - 1 (lane (k-1) / 2, slot (k-1) % 2) */
    const uint64_t sel = (k - 1) % 2 ? c[1] : c[0];
    const float tau = rt_unord(rt_wshfl((unsigned)(sel >> 32), gb + (k - 1) / 2));

    /* frontier pair (a, k / (a+1)) in lane a */
    const float xa = rt_unord((unsigned)(x0 >> 32));
    const int b = k / (gl + 1);
    const float yb = rt_unord(rt_wshfl((unsigned)(y0 >> 32), gb + (b & 15)));
    const int hit = gl <= k && gl < N && b < N && xa + yb >= tau;
    const int sure = ((rt_wballot(hit) >> gb) & 0xffffu) == 0;

    int above1 = 0, above2 = 0;
    if (gl * 2 < k && rt_unord((unsigned)(c[0] >> 32)) > tau) above1 = 1;
    if (gl * 2 + 1 < k && rt_unord((unsigned)(c[1] >> 32)) > tau) {
        if (above1)
            above2 = 1;
        else
            above1 = 1;
    }
    const unsigned m1 = (rt_wballot(above1) >> gb) & 0xffffu;
    const unsigned m2 = (rt_wballot(above2) >> gb) & 0xffffu;
    /* slots kept from the candidates: all k, or those strictly above tau */
    const int w0 = sure ? k : __builtin_popcount(m1) + __builtin_popcount(m2);
    float *osc = sc + tr * sc0;
    int32_t *oix = ix + tr * ix0;
    if (valid && !badg) {
        RT_UNROLL
        for (int m = 0; m < 2; m++) {
            const int r = gl * 2 + m;
            if (r < w0) {
                /* the sum again from the inputs: the key folded -0 onto +0 */
                const int32_t p = (int32_t)~(uint32_t)c[m], i = p / N, j = p % N;
                osc[r * sc1] = ompk_load_f(rx, (int64_t)i * sx1, bf16) +
                               ompk_load_f(ry, (int64_t)j * sy1, bf16);
                oix[r * ix1] = p;
            }
        }
    }
    if (valid && badg && gl == 0)
        rt_token_lane(rx, 0, sx1, ry, 0, sy1, bf16, N, k, osc, sc1, oix, ix1);

    /* the tie scans, one token at a time, by all 32 lanes */
    const unsigned need = rt_wballot(gl == 0 && valid && !badg && !sure);
    const unsigned ymaxb = (unsigned)(y0 >> 32); /* rank 0 of y (ordered) in lanes 0 and 16 */
    ompk_f32_bits tb;
    tb.f = tau;
    /* one call site: unrolled, the two calls cost the f32 (bf16) kernel 120 (96) registers
     * instead of 72 (63) */
    RT_NOUNROLL
    for (int g = 0; g < 2; g++) {
        if (!((need >> (16 * g)) & 1u)) continue;
        const int64_t tg = t + g;
        ompk_f32_bits gt;
        gt.u = rt_wshfl(tb.u, 16 * g);
        const float gy = rt_unord(rt_wshfl(ymaxb, 16 * g));
        const int gw = (int)rt_wshfl((unsigned)w0, 16 * g);
        rt_warp_tie_fill(rt_row(sx, tg * sx0, bf16), 0, sx1, rt_row(sy, tg * sy0, bf16), 0, sy1,
                         bf16, N, k, lane, gt.f, gy, gw, sc + tg * sc0, sc1, ix + tg * ix0, ix1);
    }
}

/* A warp's share of the token pairs: (t0, t0+1), (t0 + step, ...), ... (t0, step even). */
RT_AI void rt_pair_run(const void *sx, int64_t sx0, int sx1, const void *sy, int64_t sy0, int sy1,
                       int bf16, int N, int k, int lane, int64_t t0, int64_t step, int64_t T,
                       float *sc, int64_t sc0, int sc1, int32_t *ix, int64_t ix0, int ix1,
                       const int B32) {
    int ca[2], cb[2];
    rt_cand_map(N, k, lane & 15, 2, ca, cb);
    for (int64_t t = t0; t < T; t += step)
        rt_pair_tokens(sx, sx0, sx1, sy, sy0, sy1, bf16, N, k, rt_opaque(lane), t, T, sc, sc0, sc1,
                       ix, ix0, ix1, ca, cb, B32);
}

/* keys per lane per axis (S: 32*S >= N) and candidates per lane (CS: 32*CS >= their count).
 * With S = 8 and CS = 1 (N > 64, k <= 11) the kernel takes the top k+1 of each axis by arg-max
 * rounds over per-lane sorted 8s (AR = 1), not the full 256-key sort. */
static inline void rt_warp_shape(int N, int k, int *S, int *CS) {
    *S = N <= 64 ? 2 : 8;
    *CS = rt_cand_count(N, k) <= 32 ? 1 : 4;
}

#endif

#ifdef OMPK_NV_DEVICE

/* One kernel per (S, CS), so that each gets the registers of its own network sizes. */
// clang-format off
#define RT_BARE_REGION(S_, CS_, AR_)                                                                    \
    _Pragma("omp target teams ompx_bare num_teams(teams) thread_limit(32 * RT_WARPS) device(ex.device) is_device_ptr(sx, sy, sc, ix) firstprivate(T, N, k, bf16, sx0, sx1, sy0, sy1, sc0, sc1, ix0, ix1)") \
    {                                                                                              \
        const int lane = ompx_thread_id_x() & 31, warp = ompx_thread_id_x() >> 5;                  \
        rt_warp_run(sx, sx0, sx1, sy, sy0, sy1, bf16, N, k, lane,                                  \
                    (int64_t)ompx_block_id_x() * RT_WARPS + warp,                                  \
                    (int64_t)ompx_grid_dim_x() * RT_WARPS, T, sc, sc0, sc1, ix, ix0, ix1, S_, CS_, AR_); \
    }
// clang-format on

// clang-format off
#define RT_PAIR_REGION(B32_)                                                                       \
    _Pragma("omp target teams ompx_bare num_teams(pteams) thread_limit(32 * RT_WARPS) device(ex.device) is_device_ptr(sx, sy, sc, ix) firstprivate(T, N, k, bf16, sx0, sx1, sy0, sy1, sc0, sc1, ix0, ix1)") \
    {                                                                                              \
        const int lane = ompx_thread_id_x() & 31, warp = ompx_thread_id_x() >> 5;                  \
        rt_pair_run(sx, sx0, sx1, sy, sy0, sy1, bf16, N, k, lane,                                  \
                    2 * ((int64_t)ompx_block_id_x() * RT_WARPS + warp),                            \
                    2 * (int64_t)ompx_grid_dim_x() * RT_WARPS, T, sc, sc0, sc1, ix, ix0, ix1, B32_); \
    }
// clang-format on

static void rt_fwd_bare(ompk_exec ex, const ompk_router_fwd_args *a, int sort, int warp1) {
    const void *sx = a->sx, *sy = a->sy;
    float *sc = a->scores;
    int32_t *ix = a->indices;
    const int64_t T = a->T;
    const int N = (int)a->N, k = (int)a->k, bf16 = a->is_bf16;
    const int64_t sx0 = a->sx0, sy0 = a->sy0, sc0 = a->sc0, ix0 = a->ix0;
    const int sx1 = (int)a->sx1, sy1 = (int)a->sy1, sc1 = (int)a->sc1, ix1 = (int)a->ix1;
    const int64_t want = (T + RT_WARPS * RT_TOK_PER_WARP - 1) / (RT_WARPS * RT_TOK_PER_WARP);
    const int teams = (int)(want < 65536 ? want : 65536);
    int S, CS;
    rt_warp_shape(N, k, &S, &CS);
    /* sort: the full axis sort also where arg-max rounds are the default (lab builds only) */
#ifdef OMPK_LAB
    const int rounds = !sort;
#else
    const int rounds = 1;
    (void)sort;
#endif
    /* two tokens per warp where it applies: measured faster than one at N64 k8 (INDEX.md in
     * bench/results, Decisions); warp1 keeps one */
    if (!warp1 && rt_pair_eligible(N, k)) {
        const int64_t pw = (T + 2 * RT_WARPS - 1) / (2 * RT_WARPS);
        const int pteams = (int)(pw < 65536 ? pw : 65536);
        if (bf16)
            RT_PAIR_REGION(1)
        else
            RT_PAIR_REGION(0)
    } else if (S == 2 && CS == 1)
        RT_BARE_REGION(2, 1, 0)
    else if (S == 2)
        RT_BARE_REGION(2, 4, 0)
    else if (CS == 1 && rounds)
        RT_BARE_REGION(8, 1, 1)
#ifdef OMPK_LAB
    else if (CS == 1)
        RT_BARE_REGION(8, 1, 0)
#endif
    else
        RT_BARE_REGION(8, 4, 0)
}
#endif

#ifndef OMPK_EMULATE
int ompk_router_bare_fits(ompk_exec ex, const ompk_router_fwd_args *a) {
#ifdef OMPK_NV_DEVICE
    if (!ex.on_target || a->k > RT_BARE_KMAX || a->N > RT_BARE_NMAX) return 0;
    /* in-row offsets are int32 there (N <= 256) */
    const int64_t lim = INT32_MAX / RT_BARE_NMAX;
    return a->sx1 <= lim && a->sy1 <= lim && a->sc1 <= lim && a->ix1 <= lim;
#else
    (void)ex, (void)a;
    return 0;
#endif
}

void ompk_router_topk_fwd_bare(ompk_exec ex, const ompk_router_fwd_args *a, int sort, int warp1) {
#ifdef OMPK_NV_DEVICE
    rt_fwd_bare(ex, a, sort, warp1);
#else
    (void)ex, (void)a, (void)sort, (void)warp1;
#endif
}

ompk_status ompk_router_topk_fwd_kernel(ompk_exec ex, const ompk_router_fwd_args *a) {
    const void *sx = a->sx, *sy = a->sy;
    float *sc = a->scores;
    int32_t *ix = a->indices;
    const int64_t T = a->T, N = a->N, k = a->k, L = k + 1 < N ? k + 1 : N;
    const int bf16 = a->is_bf16;
    const int64_t sx0 = a->sx0, sx1 = a->sx1, sy0 = a->sy0, sy1 = a->sy1;
    const int64_t sc0 = a->sc0, sc1 = a->sc1, ix0 = a->ix0, ix1 = a->ix1;
    const int heap_out = k > RT_LOCAL_K;

    /* axis lists: 2 floats + 2 ints per rank */
    const int64_t per_tok = L > RT_LOCAL_L ? 4 * L : 0;
    int64_t chunk = T;
    char *ws = NULL;
    if (per_tok > 0 && T > 0) {
        const int64_t cap = RT_WS_MAX_BYTES / (per_tok * 4);
        chunk = T < cap ? T : (cap > 0 ? cap : 1);
        ws = ompk_scratch_alloc(a->device, (size_t)(chunk * per_tok * 4));
        if (!ws) return OMPK_ERR_OUT_OF_MEMORY;
    }

    for (int64_t t0 = 0; t0 < T; t0 += chunk) {
        const int64_t t1 = t0 + chunk < T ? t0 + chunk : T;
#pragma omp target teams distribute parallel for if (target : ex.on_target) device(ex.device)      \
    is_device_ptr(sx, sy, sc, ix, ws) thread_limit(128)
        for (int64_t t = t0; t < t1; t++) {
            float lxv[RT_LOCAL_L], lyv[RT_LOCAL_L], lhv[RT_LOCAL_K];
            int32_t lxi[RT_LOCAL_L], lyi[RT_LOCAL_L], lhi[RT_LOCAL_K];
            float *xv = lxv, *yv = lyv, *hv = lhv;
            int32_t *xi = lxi, *yi = lyi, *hi = lhi;
            int64_t hvs = 1, his = 1;
            if (ws) {
                float *base = (float *)ws + (t - t0) * per_tok;
                xv = base;
                yv = base + L;
                xi = (int32_t *)(base + 2 * L);
                yi = (int32_t *)(base + 3 * L);
            }
            if (heap_out) {
                hv = sc + t * sc0;
                hi = ix + t * ix0;
                hvs = sc1;
                his = ix1;
            }
            rt_token(sx, t * sx0, sx1, sy, t * sy0, sy1, bf16, N, k, L, xv, xi, yv, yi, hv, hi, hvs,
                     his, !heap_out);
            if (!heap_out)
                for (int64_t r = 0; r < k; r++) {
                    sc[t * sc0 + r * sc1] = lhv[r];
                    ix[t * ix0 + r * ix1] = lhi[r];
                }
        }
    }
    if (ws) ompk_scratch_free(a->device, ws);
    return OMPK_OK;
}

int64_t ompk_router_first_bad_index(ompk_exec ex, const ompk_router_bwd_args *a) {
    const int32_t *ix = a->indices;
    const int64_t T = a->T, k = a->k, NN = a->N * a->N, ix0 = a->ix0, ix1 = a->ix1;
    int64_t first = INT64_MAX;
#pragma omp target teams distribute parallel for collapse(2)                                       \
    reduction(min : first) if (target : ex.on_target) device(ex.device) is_device_ptr(ix)          \
    thread_limit(256)
    for (int64_t t = 0; t < T; t++)
        for (int64_t r = 0; r < k; r++) {
            const int64_t v = ix[t * ix0 + r * ix1];
            if (v != -1 && (v < 0 || v >= NN) && t * k + r < first) first = t * k + r;
        }
    return first == INT64_MAX ? -1 : first;
}

void ompk_router_bwd_zero(ompk_exec ex, const ompk_router_bwd_args *a) {
    void *dx = a->dsx, *dy = a->dsy;
    const int64_t T = a->T, N = a->N, dx0 = a->dx0, dx1 = a->dx1, dy0 = a->dy0, dy1 = a->dy1;
    const int ob = a->out_bf16;
#pragma omp target teams distribute parallel for collapse(2) if (target : ex.on_target)            \
    device(ex.device) is_device_ptr(dx, dy) thread_limit(256)
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < N; i++) {
            ompk_store_f(dx, t * dx0 + i * dx1, 0.0f, ob);
            ompk_store_f(dy, t * dy0 + i * dy1, 0.0f, ob);
        }
}

void ompk_router_topk_bwd_kernel(ompk_exec ex, const ompk_router_bwd_args *a) {
    const void *ds = a->dscores;
    const int32_t *ix = a->indices;
    void *dx = a->dsx, *dy = a->dsy;
    const int64_t T = a->T, N = a->N, k = a->k;
    const int64_t ds0 = a->ds0, ds1 = a->ds1, ix0 = a->ix0, ix1 = a->ix1;
    const int64_t dx0 = a->dx0, dx1 = a->dx1, dy0 = a->dy0, dy1 = a->dy1;
    const int dsb = a->ds_bf16;

    if (!a->out_bf16) {
        /* f32 outputs accumulate in place: zero, then each token's slots in order */
        ompk_router_bwd_zero(ex, a);
        float *fx = (float *)dx, *fy = (float *)dy;
#pragma omp target teams distribute parallel for if (target : ex.on_target) device(ex.device)      \
    is_device_ptr(ds, ix, fx, fy) thread_limit(128)
        for (int64_t t = 0; t < T; t++)
            for (int64_t r = 0; r < k; r++) {
                const int32_t v = ix[t * ix0 + r * ix1];
                if (v < 0) continue;
                const float d = ompk_load_f(ds, t * ds0 + r * ds1, dsb);
                fx[t * dx0 + (v / N) * dx1] += d;
                fy[t * dy0 + (v % N) * dy1] += d;
            }
        return;
    }

    /* bf16 outputs: each element gathers its fp32 sum in slot order, then rounds once */
#pragma omp target teams distribute parallel for collapse(2) if (target : ex.on_target)            \
    device(ex.device) is_device_ptr(ds, ix, dx, dy) thread_limit(256)
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < N; i++) {
            float ax = 0.0f, ay = 0.0f;
            for (int64_t r = 0; r < k; r++) {
                const int32_t v = ix[t * ix0 + r * ix1];
                if (v < 0) continue;
                const float d = ompk_load_f(ds, t * ds0 + r * ds1, dsb);
                if (v / N == i) ax += d;
                if (v % N == i) ay += d;
            }
            ompk_store_f(dx, t * dx0 + i * dx1, ax, 1);
            ompk_store_f(dy, t * dy0 + i * dy1, ay, 1);
        }
}
#endif
