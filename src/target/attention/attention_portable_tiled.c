/* Portable GPU attention forward on team-shared tiles: standard OpenMP only (target teams, one
 * parallel region per team, barriers, team-shared arrays through omp_pteam_mem_alloc), for any
 * GPU a compiler offloads to.
 *
 * A team owns ATTP_BQ query rows of one (b, h) and walks the visible keys in tiles of ATTP_BK.
 * Its ATTP_T threads form a 16 x 8 grid (tr = tid / 8, tc = tid % 8): thread (tr, tc) owns rows
 * tr + 16 i (i < 4), for S = Q K^T the keys tc + 8 j (j < 8) of each tile and for O the columns
 * 32 e + 4 tc .. + 3 (e < DHP / 32), all in registers. Q and K reach shared memory in chunks of
 * ATTP_DC columns, V in chunks of ATTP_VK keys, as f32 whatever the input type: a thread loads
 * its groups of 4 elements (one load each where the layout is aligned) into registers, all
 * before the barrier that frees the shared chunk, then converts (bf16) and stores them; Q and K
 * chunks alternate between two buffers (the second is P's), so each takes one barrier. P goes
 * through shared memory transposed, four rows of a key side by side, so every inner-loop operand is
 * one 16-byte load that a warp reads without bank conflicts. A row's running max is combined over
 * its 8 threads through shared memory at every tile; each thread keeps its own partial sum l (same
 * max, same rescaling), and the 8 partial sums are added once at the end. The math is
 * att_fwd_block's (attention_portable.h): natural-unit scores rounded as att_score, the max taken
 * with the comparison that skips NaN, exponentials by att_exp2 of differences, rescaling only when
 * alpha != 1, a masked pair adding exactly 0 (a select, never 0 * v), a row that sees no key giving
 * 0 and -inf. Only the order of the sum l over a row's keys differs (8 partial sums), so results
 * agree to rounding, deterministically (no atomics). Head dims that are not a multiple of 32 run
 * padded to one (zero columns add exactly 0); dh 256 would need twice the accumulators, so
 * ompk_attn_fwd_tiled_ok leaves it to the per-row kernel. tests/test_attention_portable_emu.c runs
 * the team function on the host with emulated teams (OMPK_EMULATE) and ompk_attn_fwd_tiled itself
 * with if(target: 0). */
#include <stdint.h>

#include "attention_portable.h"

#if defined(OMPK_EMULATE)
#define ATTP_TID() OMPK_EMU_TID()
#define ATTP_SYNC() OMPK_EMU_SYNC()
#else
#include <omp.h>
#define ATTP_TID() omp_get_thread_num()
#define ATTP_SYNC() _Pragma("omp barrier")
#endif

#if defined(__clang__)
#define ATTP_UNROLL _Pragma("unroll")
#define ATTP_NO_UNROLL _Pragma("unroll 1")
#else
#define ATTP_UNROLL _Pragma("GCC unroll 16")
#define ATTP_NO_UNROLL _Pragma("GCC unroll 1")
#endif

#define ATTP_BQ 64   /* query rows per team */
#define ATTP_BK 64   /* keys per tile */
#define ATTP_T 128   /* threads per team */
#define ATTP_DC 32   /* columns of Q and K per shared chunk */
#define ATTP_VK 32   /* keys of V per shared chunk */
#define ATTP_LQ 36   /* pitch of the Q and K chunks: 16-byte rows, conflict-free reads */
#define ATTP_LP 68   /* pitch of P^T */
#define ATTP_DHP 128 /* the largest padded head dim */
/* floats of the team-shared arrays: the Q and K chunks (or one V chunk), P^T, partial maxima */
#define ATTP_SQK (2 * ATTP_BQ * ATTP_LQ)
/* P^T, or the odd chunks of Q and K (two buffers: one barrier a chunk) */
#define ATTP_SP (ATTP_BK * ATTP_LP > ATTP_SQK ? ATTP_BK * ATTP_LP : ATTP_SQK)
#define ATTP_SR (8 * ATTP_BQ)
#define ATTP_NQK (ATTP_BQ * ATTP_DC / 4 / ATTP_T) /* 4-element loads of Q (and K) a thread */
_Static_assert((ATTP_VK * ATTP_DHP) / 4 / ATTP_T <= 2 * ATTP_NQK, "a V chunk fits the loads");
/* The shared arrays are 16-byte aligned and read through attp_f4, four floats of a row, which
 * the compiler then loads at once (the alignment of a float would not let it). */
#define ATTP_ALIGN __attribute__((aligned(16)))
typedef struct {
    float f[4];
} ATTP_ALIGN attp_f4;

/* four bf16 elements, one 8-byte load */
typedef struct {
    uint16_t u[4];
} __attribute__((aligned(8))) attp_h4;

/* emulated (tests): host functions only, none offloaded */
#ifndef OMPK_EMULATE
#pragma omp declare target
#endif

/* Elements i .. i + 3 of a row of q, k or v, n of them left in the row (0 past the end or for a
 * row out of range: zeros), as loaded: f32 as floats, bf16 as their raw bits in the first 8 bytes
 * (attp_cvt4 converts them). A thread issues all its loads before a conversion waits on one.
 * With vec (attp_vec_ok) one load of an aligned group, else one load each. */
typedef union {
    attp_f4 f;
    attp_h4 h;
} attp_raw4;

ATT_INLINE attp_f4 attp_ld4(const void *p, int64_t i, int64_t n, const int vec, const int bf) {
    attp_raw4 r;
    r.f = (attp_f4){{0.f, 0.f, 0.f, 0.f}};
    if (vec && n > 0) {
        if (bf)
            r.h = *(const attp_h4 *)((const uint16_t *)p + i);
        else
            r.f = *(const attp_f4 *)((const float *)p + i);
    } else if (!vec) {
        ATTP_UNROLL
        for (int c = 0; c < 4; c++) {
            if (bf)
                r.h.u[c] = c < n ? ((const uint16_t *)p)[i + c] : 0;
            else
                r.f.f[c] = c < n ? ((const float *)p)[i + c] : 0.f;
        }
    }
    return r.f;
}

/* attp_ld4's group as floats */
ATT_INLINE attp_f4 attp_cvt4(attp_f4 v, const int bf) {
    if (!bf) return v;
    attp_raw4 r;
    r.f = v;
    attp_f4 o;
    ATTP_UNROLL
    for (int c = 0; c < 4; c++) o.f[c] = ompk_bf16_to_f32(r.h.u[c]);
    return o;
}

/* Whether every row of the tensor (element offsets of b, h, n strides s) starts at a multiple of
 * 4 elements of an aligned array and dh is a multiple of 4: then the chunks load 4 at once. */
ATT_INLINE int attp_vec_ok(const void *p, const int64_t s[3], int64_t dh, const int bf) {
    return dh % 4 == 0 && s[0] % 4 == 0 && s[1] % 4 == 0 && s[2] % 4 == 0 &&
           (uintptr_t)p % (bf ? 8u : 16u) == 0;
}

/* o += P V over the ATTP_VK keys of the V chunk in sv4 (keys jc.. of the head, columns of P^T
 * from c0); with CUT, a pair whose key the row does not see adds exactly 0 (a select: 0 * v
 * would turn a NaN or inf in v into NaN). */
ATT_INLINE void attp_pv(float (*o)[ATTP_DHP / 32][4], const attp_f4 *sp4, const attp_f4 *sv4,
                        int c0, int64_t jc, const int64_t lim[4], int tr, int tc, const int DH,
                        const int CUT) {
    ATTP_NO_UNROLL
    for (int kk = 0; kk < ATTP_VK; kk++) {
        const attp_f4 pa = sp4[(c0 + kk) * (ATTP_LP / 4) + tr];
        attp_f4 va[ATTP_DHP / 32];
        ATTP_UNROLL
        for (int e = 0; e < DH / 32; e++) va[e] = sv4[kk * (DH / 4) + 8 * e + tc];
        ATTP_UNROLL
        for (int i = 0; i < 4; i++) {
            const int vis = !CUT || jc + kk < lim[i];
            ATTP_UNROLL
            for (int e = 0; e < DH / 32; e++) {
                ATTP_UNROLL
                for (int c = 0; c < 4; c++) {
                    if (CUT)
                        o[i][e][c] += vis ? pa.f[i] * va[e].f[c] : 0.f;
                    else
                        o[i][e][c] += pa.f[i] * va[e].f[c];
                }
            }
        }
    }
}

/* Work item w (heaviest query block first, under a causal mask) of the team: rows of block qb
 * of head (b, h). Every thread of the team calls it with the same w; DH is dh padded to 32.
 * sqk, sp: ATTP_SQK and ATTP_SP floats, 16-byte aligned; sr: ATTP_SR floats. */
ATT_INLINE void attp_fwd_item(const ompk_attn_geom *g, const void *q, const void *k, const void *v,
                              void *out, float *lse, float *sqk, float *sp, float *sr, int64_t w,
                              const int DH, const int bf) {
    const int NE = DH / 32;
    const int tid = ATTP_TID(), tr = tid >> 3, tc = tid & 7;
    const int64_t N = g->N, M = g->M, dh = g->dh;
    const int64_t nqb = (N + ATTP_BQ - 1) / ATTP_BQ, bh = w / nqb;
    const int64_t qb = nqb - 1 - (w - bh * nqb);
    const int64_t b = bh / g->Hq, h = bh - b * g->Hq, hk = h / (g->Hq / g->Hkv);
    const int64_t i0 = qb * ATTP_BQ;
    const int64_t qbase = att_row(g->qs, b, h, 0), kbase = att_row(g->ks, b, hk, 0);
    const int64_t vbase = att_row(g->vs, b, hk, 0);
    const attp_f4 *const sv4 = (const attp_f4 *)sqk, *const sp4 = (const attp_f4 *)sp;
    attp_f4 *const sv4w = (attp_f4 *)sqk;
    /* 4 elements a load where the rows allow it; the layout decides, alike for every thread */
    const int vqk = attp_vec_ok(q, g->qs, dh, bf) && attp_vec_ok(k, g->ks, dh, bf);
    const int vv = attp_vec_ok(v, g->vs, dh, bf);

    /* the block's key range: all threads compute it alike from the rows' limits */
    int64_t jmax = 0, jfull = M;
    for (int r = 0; r < ATTP_BQ && i0 + r < N; r++) {
        const int64_t lr = ompk_attn_key_limit(g->mask, i0 + r, N, M);
        jmax = lr > jmax ? lr : jmax;
        jfull = lr < jfull ? lr : jfull;
    }
    int64_t lim[4];
    float m[4], l[4], o[4][ATTP_DHP / 32][4];
    ATTP_UNROLL
    for (int i = 0; i < 4; i++) {
        const int64_t r = i0 + tr + 16 * i;
        lim[i] = r < N ? ompk_attn_key_limit(g->mask, r, N, M) : 0;
        m[i] = -INFINITY;
        l[i] = 0.f;
        ATTP_UNROLL
        for (int e = 0; e < NE; e++) {
            ATTP_UNROLL
            for (int c = 0; c < 4; c++) o[i][e][c] = 0.f;
        }
    }

    for (int64_t j0 = 0; j0 < jmax; j0 += ATTP_BK) {
        /* S = Q K^T over dh in chunks; the sum over d runs in order, as att_dot's */
        float s[4][8];
        ATTP_UNROLL
        for (int i = 0; i < 4; i++) {
            ATTP_UNROLL
            for (int j = 0; j < 8; j++) s[i][j] = 0.f;
        }
        for (int d0 = 0; d0 < DH; d0 += ATTP_DC) {
            /* all of a thread's loads first, then its stores: the loads overlap */
            attp_f4 pf[2 * ATTP_NQK];
            ATTP_UNROLL
            for (int it = 0; it < ATTP_NQK; it++) {
                const int e = tid + ATTP_T * it, r = e / (ATTP_DC / 4);
                const int64_t dd = d0 + 4 * (e % (ATTP_DC / 4));
                pf[it] = attp_ld4(q, qbase + (i0 + r) * g->qs[2] + dd, i0 + r < N ? dh - dd : 0,
                                  vqk, bf);
                pf[ATTP_NQK + it] = attp_ld4(k, kbase + (j0 + r) * g->ks[2] + dd,
                                             j0 + r < M ? dh - dd : 0, vqk, bf);
            }
            /* even chunks in sqk, odd ones in sp: every thread read the buffer's previous chunk
             * before it reached the barrier that completed the last one */
            attp_f4 *const sq4 = (attp_f4 *)(d0 & ATTP_DC ? sp : sqk);
            attp_f4 *const sk4 = sq4 + ATTP_BQ * ATTP_LQ / 4;
            if (d0 == 0) {
                ATTP_SYNC(); /* the last tile's users of V and P are done */
            }
            ATTP_UNROLL
            for (int it = 0; it < ATTP_NQK; it++) {
                const int e = tid + ATTP_T * it;
                const int at = e / (ATTP_DC / 4) * (ATTP_LQ / 4) + e % (ATTP_DC / 4);
                sq4[at] = attp_cvt4(pf[it], bf);
                sk4[at] = attp_cvt4(pf[ATTP_NQK + it], bf);
            }
            ATTP_SYNC();
            ATTP_NO_UNROLL
            for (int d4 = 0; d4 < ATTP_DC / 4; d4++) {
                attp_f4 qa[4];
                ATTP_UNROLL
                for (int i = 0; i < 4; i++) qa[i] = sq4[(tr + 16 * i) * (ATTP_LQ / 4) + d4];
                /* the keys in two halves: fewer operands live at once */
                ATTP_UNROLL
                for (int jh = 0; jh < 8; jh += 4) {
                    attp_f4 ka[4];
                    ATTP_UNROLL
                    for (int j = 0; j < 4; j++)
                        ka[j] = sk4[(tc + 8 * (jh + j)) * (ATTP_LQ / 4) + d4];
                    ATTP_UNROLL
                    for (int c = 0; c < 4; c++) {
                        ATTP_UNROLL
                        for (int i = 0; i < 4; i++) {
                            ATTP_UNROLL
                            for (int j = 0; j < 4; j++) s[i][jh + j] += qa[i].f[c] * ka[j].f[c];
                        }
                    }
                }
            }
        }
        /* scores, and this thread's share of each row's max */
        ATTP_UNROLL
        for (int i = 0; i < 4; i++) {
            float mx = -INFINITY;
            ATTP_UNROLL
            for (int j = 0; j < 8; j++) {
                const float x = j0 + tc + 8 * j < lim[i] ? att_score(s[i][j], g->scale) : -INFINITY;
                s[i][j] = x;
                mx = x > mx ? x : mx;
            }
            sr[tc * ATTP_BQ + tr + 16 * i] = mx;
        }
        ATTP_SYNC();
        ATTP_UNROLL
        for (int i = 0; i < 4; i++) {
            float mx = m[i];
            ATTP_UNROLL
            for (int t = 0; t < 8; t++) {
                const float x = sr[t * ATTP_BQ + tr + 16 * i];
                mx = x > mx ? x : mx;
            }
            /* nothing visible (or only NaN) yet: exponentials against 0 give p = 0 or NaN */
            const float base = mx == -INFINITY ? 0.f : mx;
            const float alpha = att_exp2((m[i] - base) * ATT_LOG2E);
            float sum = 0.f;
            ATTP_UNROLL
            for (int j = 0; j < 8; j++) {
                const float p = att_exp2((s[i][j] - base) * ATT_LOG2E);
                sp[(tc + 8 * j) * ATTP_LP + 4 * tr + i] = p;
                sum += p;
            }
            l[i] = l[i] * alpha + sum;
            m[i] = mx;
            if (alpha != 1.f) {
                ATTP_UNROLL
                for (int e = 0; e < NE; e++) {
                    ATTP_UNROLL
                    for (int c = 0; c < 4; c++) o[i][e][c] *= alpha;
                }
            }
        }
        /* O += P V over the tile's keys, V in chunks; in a tile that a mask or the end of the
         * keys cuts, each pair is selected */
        const int cut = j0 + ATTP_BK > jfull;
        for (int c0 = 0; c0 < ATTP_BK; c0 += ATTP_VK) {
            attp_f4 pf[ATTP_VK * ATTP_DHP / 4 / ATTP_T];
            ATTP_UNROLL
            for (int it = 0; it < ATTP_VK * DH / 4 / ATTP_T; it++) {
                const int e = tid + ATTP_T * it, d = 4 * (e % (DH / 4));
                const int64_t kj = j0 + c0 + e / (DH / 4);
                pf[it] = attp_ld4(v, vbase + kj * g->vs[2] + d, kj < M ? dh - d : 0, vv, bf);
            }
            ATTP_SYNC(); /* P is complete; the chunks' previous users are done */
            ATTP_UNROLL
            for (int it = 0; it < ATTP_VK * DH / 4 / ATTP_T; it++)
                sv4w[tid + ATTP_T * it] = attp_cvt4(pf[it], bf);
            ATTP_SYNC();
            /* two instances: the uncut one is plain FMAs */
            if (cut)
                attp_pv(o, sp4, sv4, c0, j0 + c0, lim, tr, tc, DH, 1);
            else
                attp_pv(o, sp4, sv4, c0, j0 + c0, lim, tr, tc, DH, 0);
        }
    }
    /* the rows' sums from the 8 partial ones, in thread order */
    ATTP_SYNC(); /* the last max reads are long done; sr is free */
    ATTP_UNROLL
    for (int i = 0; i < 4; i++) sr[tc * ATTP_BQ + tr + 16 * i] = l[i];
    ATTP_SYNC();
    ATTP_UNROLL
    for (int i = 0; i < 4; i++) {
        const int64_t r = i0 + tr + 16 * i;
        float sum = 0.f;
        ATTP_UNROLL
        for (int t = 0; t < 8; t++) sum += sr[t * ATTP_BQ + tr + 16 * i];
        if (r >= N) continue;
        const int sees = lim[i] > 0;
        const float inv = att_inv_l(sees, sum);
        const int64_t ooff = att_row(g->os, b, h, r);
        ATTP_UNROLL
        for (int e = 0; e < NE; e++) {
            ATTP_UNROLL
            for (int c = 0; c < 4; c++) {
                const int64_t d = 32 * e + 4 * tc + c;
                if (d < dh) att_st(out, ooff + d, o[i][e][c] * inv, bf);
            }
        }
        if (lse && tc == 0) lse[att_row(g->ls, b, h, r)] = att_lse(sees, m[i], sum);
    }
    ATTP_SYNC(); /* sr and the chunks are free for the next item */
}

#ifndef OMPK_EMULATE
/* Item w on the per-row kernel, its rows spread over the team's threads: for a team that got
 * fewer threads than the tiles need. Out of line, so that its per-thread arrays stay out of
 * the tiled kernel's frame. */
static __attribute__((noinline)) void attp_fwd_rows(const ompk_attn_geom *g, const void *q,
                                                    const void *k, const void *v, void *out,
                                                    float *lse, int64_t w, const int bf) {
    const int64_t nqb = (g->N + ATTP_BQ - 1) / ATTP_BQ, bh = w / nqb;
    const int64_t i0 = (w - bh * nqb) * ATTP_BQ;
    for (int64_t r = i0 + omp_get_thread_num(); r < i0 + ATTP_BQ && r < g->N;
         r += omp_get_num_threads()) {
        if (bf)
            att_fwd_block(g, q, k, v, out, lse, bh / g->Hq, bh % g->Hq, r, 1, 1);
        else
            att_fwd_block(g, q, k, v, out, lse, bh / g->Hq, bh % g->Hq, r, 1, 0);
    }
}
#endif

#ifndef OMPK_EMULATE
#pragma omp end declare target
#endif

#ifndef OMPK_EMULATE

/* One kernel per padded head dim and type, so each gets its own register allocation. Teams
 * walk the work items: one each on a GPU; on the host (if(target: 0), or the initial device as
 * a target) one team of ATTP_T threads walks them all, so the host runs what a GPU runs. A team
 * that got fewer threads than asked for (a runtime may give fewer) runs its items on the per-row
 * kernel instead. */
// clang-format off
#define ATTP_LAUNCH(DH, BF)                                                                        \
    static void attp_fwd_##DH##_##BF(ompk_exec ex, const ompk_attn_geom *gp, const void *q,        \
                                     const void *k, const void *v, void *out, float *lse) {        \
        const ompk_attn_geom g = *gp;                                                              \
        const int64_t items = g.B * g.Hq * ((g.N + ATTP_BQ - 1) / ATTP_BQ);                        \
        const int on = ex.on_target;                                                               \
        const int nt = on && ex.device != omp_get_initial_device() ? (int)items : 1;               \
        _Pragma("omp target teams num_teams(nt) thread_limit(ATTP_T) if(target: on) device(ex.device) is_device_ptr(q, k, v, out, lse) firstprivate(g, items)") \
        {                                                                                          \
            ATTP_ALIGN float sqk[ATTP_SQK], sp[ATTP_SP], sr[ATTP_SR];                              \
            ATTP_TEAM_ALLOC(sqk, sp, sr)                                                           \
            _Pragma("omp parallel num_threads(ATTP_T)")                                            \
            {                                                                                      \
                const int full = omp_get_num_threads() == ATTP_T;                                  \
                for (int64_t w = omp_get_team_num(); w < items; w += omp_get_num_teams()) {        \
                    if (full) {                                                                    \
                        attp_fwd_item(&g, q, k, v, out, lse, sqk, sp, sr, w, DH, BF);              \
                    } else {                                                                       \
                        attp_fwd_rows(&g, q, k, v, out, lse, w, BF);                               \
                    }                                                                              \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }
// clang-format on

/* Team-shared memory for the team's arrays where the compiler maps the allocator to it (clang:
 * the GPU's shared memory); GCC 12 has no allocate directive, and shares the arrays of the
 * teams region with the team's threads as it shares any variable. */
#if defined(__clang__) && (defined(__NVPTX__) || defined(__AMDGCN__))
#define ATTP_TEAM_ALLOC(...)                                                                       \
    _Pragma(ATT_STR(omp allocate(__VA_ARGS__) allocator(omp_pteam_mem_alloc)))
#else
#define ATTP_TEAM_ALLOC(...)
#endif

ATTP_LAUNCH(32, 0)
ATTP_LAUNCH(64, 0)
ATTP_LAUNCH(96, 0)
ATTP_LAUNCH(128, 0)
ATTP_LAUNCH(32, 1)
ATTP_LAUNCH(64, 1)
ATTP_LAUNCH(96, 1)
ATTP_LAUNCH(128, 1)

int ompk_attn_fwd_tiled_ok(const ompk_attn_geom *g) {
    return g->dh <= ATTP_DHP && g->B * g->Hq * ((g->N + ATTP_BQ - 1) / ATTP_BQ) <= 0x7fffffff;
}

void ompk_attn_fwd_tiled(ompk_exec ex, const ompk_attn_geom *g, const void *q, const void *k,
                         const void *v, void *out, float *lse) {
    if (g->B * g->Hq * g->N == 0) return;
    const int dhp = (int)((g->dh + 31) / 32 * 32);
#define ATTP_CASE(D)                                                                               \
    case D:                                                                                        \
        if (g->bf16)                                                                               \
            attp_fwd_##D##_1(ex, g, q, k, v, out, lse);                                            \
        else                                                                                       \
            attp_fwd_##D##_0(ex, g, q, k, v, out, lse);                                            \
        break;
    switch (dhp) {
        ATTP_CASE(32)
        ATTP_CASE(64)
        ATTP_CASE(96)
        ATTP_CASE(128)
    default:
        break;
    }
#undef ATTP_CASE
}

#endif
