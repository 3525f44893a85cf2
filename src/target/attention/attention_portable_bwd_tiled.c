/* Portable GPU backward with team-shared tiles: standard OpenMP (target teams, one parallel region
 * of ATTP_T threads per team, team-local tiles in omp_pteam_mem_alloc memory, barriers), for the
 * head dims up to ATTP_DMAX, in two kernels:
 *  - rows: a team owns ATTP_RB query rows of one (b, h): D = rowsum(dout * out), then it walks
 *    their visible keys twice in tiles of ATTP_KT: first each row's lse from this kernel's own
 *    scores (the lse passed in may come from another forward whose scores round differently),
 *    then S = Q K^T, dP = dO V^T, dS = P (dP - D), dQ += dS K. It writes D and lse for the
 *    second kernel.
 *  - keys: a team owns ATTP_RB keys of one (b, kv head) and walks the group's query heads in
 *    increasing order and their rows in tiles of ATTP_QT: S, dP, dS as above, dV += P^T dO,
 *    dK += dS^T Q. Every output element is written by the thread that summed it, in a fixed
 *    order: deterministic, no atomics.
 * A thread owns ATTP_R rows (keys) and one slice s of the head dim, elements s * EN + m (EN =
 * dh / ATTP_NS), held in registers; the other operand comes from the shared tile, where each slice
 * starts 16-byte aligned at a pitch of an odd number of 16-byte groups (attp_pitch): a thread
 * reads four elements a load, each feeding ATTP_R FMAs, and the ATTP_NS slices of a row fall in
 * different banks. A dot product is ATTP_NS partial sums (one per slice, in increasing m) added in
 * a fixed tree (attp_dot): both kernels and the lse form every score the same way, so
 * p = exp(s - lse) is exactly 1 where the softmax is one-hot. A masked pair adds exactly 0 (it is
 * skipped, never 0 * inf); NaN propagates. Host runs: tests include this file with OMPK_EMULATE and
 * run the team functions on emulated teams (tests/emu_team.h); a host OpenMP runtime does not form
 * teams of ATTP_T threads on a machine of few cores. */
#include <math.h>
#include <stdint.h>

#include "attention_portable.h"

#ifndef OMPK_EMULATE
#include <omp.h>
#endif

#define ATTP_T 128 /* threads of a team */
#define ATTP_NS 8  /* threads sharing a row (key), each holding one slice of dh / ATTP_NS */
#define ATTP_R 2   /* rows (keys) a thread owns */
#define ATTP_NG (ATTP_T / ATTP_NS)
#define ATTP_RB (ATTP_R * ATTP_NG) /* rows a rows team owns, keys a keys team owns */
#define ATTP_KT 8                  /* keys of a tile in the rows kernel */
#define ATTP_QT 8                  /* query rows of a tile in the keys kernel */
#define ATTP_DMAX 128
#define ATTP_E (ATTP_DMAX / ATTP_NS)      /* largest slice */
#define ATTP_ROW (ATTP_NS * (ATTP_E + 4)) /* largest shared row (attp_pitch) */
#define ATTP_PW (ATTP_RB * ATTP_NS + 1)   /* partial sums of one tile row; odd: no bank conflicts */

#define ATTP_INLINE static inline __attribute__((always_inline))
/* Loops over a thread's register arrays unroll completely on the GPU, or the arrays go to local
 * memory. The host pass (fallback, emulation) keeps them rolled: unrolled in its ten instances of
 * each kernel they only cost compile time (minutes under ASan). */
#if defined(__clang__) && (defined(__NVPTX__) || defined(__AMDGCN__))
#define ATTP_UNROLL _Pragma("unroll")
#else
#define ATTP_UNROLL
#endif
#define ATTP_STR(x) #x

#ifdef OMPK_EMULATE
#define ATTP_TID() OMPK_EMU_TID()
#define ATTP_SYNC() OMPK_EMU_SYNC()
#else
#define ATTP_TID() omp_get_thread_num()
#define ATTP_SYNC() _Pragma("omp barrier")
#endif

/* Team-local tiles in team-shared memory. GCC 12 has no allocate directive ("not yet supported"):
 * there the tiles would sit on the team's initial thread's stack, so GCC builds keep the row
 * kernels (attention_portable.c). The host pass needs no allocator either. */
#if defined(__clang__) && (defined(__NVPTX__) || defined(__AMDGCN__))
#define ATTP_TEAM_SHARED(x) _Pragma(ATTP_STR(omp allocate(x) allocator(omp_pteam_mem_alloc)))
#else
#define ATTP_TEAM_SHARED(x)
#endif

/* Tiles of the rows kernel: a key tile of K and V (fp32), the slices' partial dots for each
 * (key, row, slice), dS, and the slices' partial D and lse statistics. */
typedef struct attp_rows_smem {
    float k[ATTP_KT][ATTP_ROW], v[ATTP_KT][ATTP_ROW];
    float ps[ATTP_KT][ATTP_PW], pd[ATTP_KT][ATTP_PW];
    float ds[ATTP_RB][ATTP_KT + 1];
    float cm[ATTP_RB * ATTP_NS], cl[ATTP_RB * ATTP_NS];
} __attribute__((aligned(16))) attp_rows_smem;

/* Tiles of the keys kernel: a query tile of Q and dO (fp32), the partial dots for each (row, key,
 * slice), P and dS, and the tile rows' lse, D and key limit. */
typedef struct attp_keys_smem {
    float q[ATTP_QT][ATTP_ROW], o[ATTP_QT][ATTP_ROW];
    float ps[ATTP_QT][ATTP_PW], pd[ATTP_QT][ATTP_PW];
    float p[ATTP_QT][ATTP_RB + 1], ds[ATTP_QT][ATTP_RB + 1];
    float lse[ATTP_QT], dsum[ATTP_QT];
    int64_t lim[ATTP_QT];
} __attribute__((aligned(16))) attp_keys_smem;

/* emulated (tests): host functions only, none offloaded */
#ifndef OMPK_EMULATE
#pragma omp declare target
#endif

/* A dot product from its ATTP_NS slice sums, in one fixed order. */
ATTP_INLINE float attp_dot(const float *p) {
    return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}

/* A score in natural units, rounded to fp32 before its next use (ATT_ROUNDED_MUL). */
ATTP_INLINE float attp_score(const float *p, float scale) {
    return ATT_ROUNDED_MUL(attp_dot(p), scale);
}

ATTP_INLINE int64_t attp_row(const int64_t s[3], int64_t b, int64_t h, int64_t n) {
    return b * s[0] + h * s[1] + n * s[2];
}

/* The shared pitch of a head-dim slice: its EN = DH / ATTP_NS elements rounded up to a 16-byte
 * group, plus one group where that is even, so the slices of a row start in different banks. */
ATTP_INLINE int attp_pitch(const int DH) {
    const int w = (DH / ATTP_NS + 3) / 4 * 4;
    return w % 8 ? w : w + 4;
}

/* n rows of a [.., L, dh] tensor from row r0 of head (b, h) into dst as fp32, slice by slice at
 * attp_pitch, by all threads. */
ATTP_INLINE void attp_stage(float (*dst)[ATTP_ROW], const void *src, const int64_t st[3], int64_t b,
                            int64_t h, int64_t r0, int n, int tid, const int DH, const int bf) {
    const int64_t base = attp_row(st, b, h, r0);
    const int EN = DH / ATTP_NS, SW = attp_pitch(DH);
    for (int e = tid; e < n * DH; e += ATTP_T) {
        const int t = e / DH, d = e % DH;
        dst[t][d / EN * SW + d % EN] = ompk_load_f(src, base + t * st[2] + d, bf);
    }
}

/* A thread's slice of a shared row (16-byte aligned, attp_pitch) into registers, four elements
 * a load; the elements past EN read are the pitch's padding, never used. */
typedef struct attp_f4 {
    float f[4];
} __attribute__((aligned(16))) attp_f4;

ATTP_INLINE void attp_slice(float *dst, const float *row, const int EN) {
    ATTP_UNROLL
    for (int m4 = 0; m4 < EN; m4 += 4) {
        const attp_f4 v = *(const attp_f4 *)(row + m4);
        ATTP_UNROLL
        for (int z = 0; z < 4; z++)
            if (m4 + z < EN) dst[m4 + z] = v.f[z];
    }
}

/* The rows kernel's work item w: D (dsum), lse (lw, both [B, Hq, N]) and dq of ATTP_RB rows of
 * one (b, h). */
ATTP_INLINE void attp_rows_item(const ompk_attn_geom *g, const void *dout, const void *q,
                                const void *k, const void *v, const void *out, float *dsum,
                                float *lw, void *dq, attp_rows_smem *sm, int64_t w, const int DH,
                                const int bf) {
    enum { NS = ATTP_NS, R = ATTP_R, NG = ATTP_NG, E = ATTP_E, KT = ATTP_KT };
    const int tid = ATTP_TID(), gi = tid / NS, s = tid % NS, EN = DH / NS, SW = attp_pitch(DH);
    const int64_t N = g->N, M = g->M, nblk = (N + ATTP_RB - 1) / ATTP_RB;
    const int64_t i0 = (w % nblk) * ATTP_RB, bh = w / nblk, b = bh / g->Hq, h = bh % g->Hq;
    const int64_t hk = h / (g->Hq / g->Hkv);
    const int rb = (int)(N - i0 < ATTP_RB ? N - i0 : ATTP_RB);
    const float sc = g->scale;
    float qr[R][E], dr[R][E], acc[R][E], Di[R], mr[R], lr[R], l2[R];
    int64_t lim[R];
    ATTP_UNROLL
    for (int u = 0; u < R; u++) {
        const int r = gi + u * NG;
        const int64_t i = i0 + (r < rb ? r : 0);
        const int64_t qo = attp_row(g->qs, b, h, i) + s * EN;
        const int64_t oo = attp_row(g->dos, b, h, i) + s * EN;
        ATTP_UNROLL
        for (int m = 0; m < EN; m++) {
            qr[u][m] = r < rb ? ompk_load_f(q, qo + m, bf) : 0.f;
            dr[u][m] = r < rb ? ompk_load_f(dout, oo + m, bf) : 0.f;
            acc[u][m] = 0.f;
        }
        lim[u] = r < rb ? ompk_attn_key_limit(g->mask, i, N, M) : 0;
        mr[u] = -INFINITY;
        lr[u] = 0.f;
        /* D = <dout, out> in attp_dot's order, the order of dP = <dout, v>: a one-hot row (out
         * exactly one v row) gets dP - D = 0 exactly, as the float64 math does */
        const int64_t xo = attp_row(g->os, b, h, i) + s * EN;
        float pd = 0.f;
        ATTP_UNROLL
        for (int m = 0; m < EN; m++) pd += dr[u][m] * (r < rb ? ompk_load_f(out, xo + m, bf) : 0.f);
        sm->cl[r * NS + s] = pd;
    }
    ATTP_SYNC();
    ATTP_UNROLL
    for (int u = 0; u < R; u++) {
        const int r = gi + u * NG;
        Di[u] = attp_dot(&sm->cl[r * NS]);
        if (s == 0 && r < rb) dsum[(b * g->Hq + h) * N + i0 + r] = Di[u];
    }
    ATTP_SYNC(); /* cl is read; the lse below writes it again */
    /* the key limit grows with the row under every mask */
    const int64_t jmax = ompk_attn_key_limit(g->mask, i0 + rb - 1, N, M);
    /* sweep 1: each thread's running max and sum over its keys s, s + NS, ... of each tile */
    for (int64_t j0 = 0; j0 < jmax; j0 += KT) {
        const int jn = (int)(jmax - j0 < KT ? jmax - j0 : KT);
        attp_stage(sm->k, k, g->ks, b, hk, j0, jn, tid, DH, bf);
        ATTP_SYNC();
        for (int t = 0; t < jn; t++) {
            float pa[R];
            ATTP_UNROLL
            for (int u = 0; u < R; u++) pa[u] = 0.f;
            float ks[E];
            attp_slice(ks, &sm->k[t][s * SW], EN);
            ATTP_UNROLL
            for (int m = 0; m < EN; m++) {
                const float kv = ks[m];
                ATTP_UNROLL
                for (int u = 0; u < R; u++) pa[u] += qr[u][m] * kv;
            }
            ATTP_UNROLL
            for (int u = 0; u < R; u++) sm->ps[t][(gi + u * NG) * NS + s] = pa[u];
        }
        ATTP_SYNC();
        for (int t = s; t < jn; t += NS) {
            ATTP_UNROLL
            for (int u = 0; u < R; u++) {
                if (j0 + t >= lim[u]) continue;
                const float x = attp_score(&sm->ps[t][(gi + u * NG) * NS], sc);
                if (x > mr[u]) { /* a NaN score leaves m alone and turns l into NaN below */
                    lr[u] *= att_exp2((mr[u] - x) * ATT_LOG2E);
                    mr[u] = x;
                }
                lr[u] += att_exp2((x - (mr[u] == -INFINITY ? 0.f : mr[u])) * ATT_LOG2E);
            }
        }
        ATTP_SYNC();
    }
    /* the row's lse from its NS threads' (m, l), in slice order */
    ATTP_UNROLL
    for (int u = 0; u < R; u++) {
        sm->cm[(gi + u * NG) * NS + s] = mr[u];
        sm->cl[(gi + u * NG) * NS + s] = lr[u];
    }
    ATTP_SYNC();
    ATTP_UNROLL
    for (int u = 0; u < R; u++) {
        const int r = gi + u * NG;
        float mx = -INFINITY, l = 0.f;
        for (int z = 0; z < NS; z++) mx = sm->cm[r * NS + z] > mx ? sm->cm[r * NS + z] : mx;
        const float base = mx == -INFINITY ? 0.f : mx;
        for (int z = 0; z < NS; z++)
            l += sm->cl[r * NS + z] * att_exp2((sm->cm[r * NS + z] - base) * ATT_LOG2E);
        const float lse = lim[u] == 0 ? -INFINITY : l > 0.f ? mx + log2f(l) * ATT_LN2 : NAN;
        if (s == 0 && r < rb) lw[(b * g->Hq + h) * N + i0 + r] = lse;
        l2[u] = lse;
    }
    /* sweep 2: dS and dq */
    for (int64_t j0 = 0; j0 < jmax; j0 += KT) {
        const int jn = (int)(jmax - j0 < KT ? jmax - j0 : KT);
        attp_stage(sm->k, k, g->ks, b, hk, j0, jn, tid, DH, bf);
        attp_stage(sm->v, v, g->vs, b, hk, j0, jn, tid, DH, bf);
        ATTP_SYNC();
        for (int t = 0; t < jn; t++) {
            float pa[R], pb[R];
            ATTP_UNROLL
            for (int u = 0; u < R; u++) pa[u] = pb[u] = 0.f;
            float ks[E], vs[E];
            attp_slice(ks, &sm->k[t][s * SW], EN);
            attp_slice(vs, &sm->v[t][s * SW], EN);
            ATTP_UNROLL
            for (int m = 0; m < EN; m++) {
                const float kv = ks[m], vv = vs[m];
                ATTP_UNROLL
                for (int u = 0; u < R; u++) {
                    pa[u] += qr[u][m] * kv;
                    pb[u] += dr[u][m] * vv;
                }
            }
            ATTP_UNROLL
            for (int u = 0; u < R; u++) {
                sm->ps[t][(gi + u * NG) * NS + s] = pa[u];
                sm->pd[t][(gi + u * NG) * NS + s] = pb[u];
            }
        }
        ATTP_SYNC();
        for (int t = s; t < jn; t += NS) {
            ATTP_UNROLL
            for (int u = 0; u < R; u++) {
                const int r = gi + u * NG;
                const float x = attp_score(&sm->ps[t][r * NS], sc);
                const float p = att_exp2((x - l2[u]) * ATT_LOG2E);
                sm->ds[r][t] = p * (attp_dot(&sm->pd[t][r * NS]) - Di[u]);
            }
        }
        ATTP_SYNC();
        for (int t = 0; t < jn; t++) {
            float dsv[R];
            int on[R];
            ATTP_UNROLL
            for (int u = 0; u < R; u++) {
                on[u] = j0 + t < lim[u];
                dsv[u] = sm->ds[gi + u * NG][t];
            }
            float ks[E];
            attp_slice(ks, &sm->k[t][s * SW], EN);
            ATTP_UNROLL
            for (int m = 0; m < EN; m++) {
                const float kv = ks[m];
                ATTP_UNROLL
                for (int u = 0; u < R; u++)
                    if (on[u]) acc[u][m] += dsv[u] * kv;
            }
        }
        ATTP_SYNC();
    }
    ATTP_UNROLL
    for (int u = 0; u < R; u++) {
        const int r = gi + u * NG;
        if (r >= rb) continue;
        const int64_t off = attp_row(g->dqs, b, h, i0 + r) + s * EN;
        ATTP_UNROLL
        for (int m = 0; m < EN; m++) ompk_store_f(dq, off + m, acc[u][m] * sc, bf);
    }
}

/* The keys kernel's work item w: dk and dv of ATTP_RB keys of one (b, kv head), lse from lw. */
ATTP_INLINE void attp_keys_item(const ompk_attn_geom *g, const void *dout, const void *q,
                                const void *k, const void *v, const float *dsum, const float *lw,
                                void *dk, void *dv, attp_keys_smem *sm, int64_t w, const int DH,
                                const int bf) {
    enum { NS = ATTP_NS, R = ATTP_R, NG = ATTP_NG, E = ATTP_E, QT = ATTP_QT };
    const int tid = ATTP_TID(), gi = tid / NS, s = tid % NS, EN = DH / NS, SW = attp_pitch(DH);
    const int64_t N = g->N, M = g->M, G = g->Hq / g->Hkv, nblk = (M + ATTP_RB - 1) / ATTP_RB;
    const int64_t j0 = (w % nblk) * ATTP_RB, bh = w / nblk, b = bh / g->Hkv, hk = bh % g->Hkv;
    const int cb = (int)(M - j0 < ATTP_RB ? M - j0 : ATTP_RB);
    const float sc = g->scale;
    float kr[R][E], vr[R][E], dka[R][E], dva[R][E];
    ATTP_UNROLL
    for (int u = 0; u < R; u++) {
        const int c = gi + u * NG;
        const int64_t j = j0 + (c < cb ? c : 0);
        const int64_t ko = attp_row(g->ks, b, hk, j) + s * EN;
        const int64_t vo = attp_row(g->vs, b, hk, j) + s * EN;
        ATTP_UNROLL
        for (int m = 0; m < EN; m++) {
            kr[u][m] = c < cb ? ompk_load_f(k, ko + m, bf) : 0.f;
            vr[u][m] = c < cb ? ompk_load_f(v, vo + m, bf) : 0.f;
            dka[u][m] = dva[u][m] = 0.f;
        }
    }
    const int64_t ifirst = ompk_attn_first_row(g->mask, j0, N, M);
    for (int64_t h = hk * G; h < (hk + 1) * G; h++)
        for (int64_t ii0 = ifirst; ii0 < N; ii0 += QT) {
            const int in = (int)(N - ii0 < QT ? N - ii0 : QT);
            attp_stage(sm->q, q, g->qs, b, h, ii0, in, tid, DH, bf);
            attp_stage(sm->o, dout, g->dos, b, h, ii0, in, tid, DH, bf);
            if (tid < in) {
                const int64_t i = ii0 + tid;
                const float l = lw[(b * g->Hq + h) * N + i];
                sm->lse[tid] = l;
                sm->dsum[tid] = dsum[(b * g->Hq + h) * N + i];
                sm->lim[tid] = l == -INFINITY ? 0 : ompk_attn_key_limit(g->mask, i, N, M);
            }
            ATTP_SYNC();
            for (int t = 0; t < in; t++) {
                float pa[R], pb[R];
                ATTP_UNROLL
                for (int u = 0; u < R; u++) pa[u] = pb[u] = 0.f;
                float qs[E], os[E];
                attp_slice(qs, &sm->q[t][s * SW], EN);
                attp_slice(os, &sm->o[t][s * SW], EN);
                ATTP_UNROLL
                for (int m = 0; m < EN; m++) {
                    const float qv = qs[m], ov = os[m];
                    ATTP_UNROLL
                    for (int u = 0; u < R; u++) {
                        pa[u] += qv * kr[u][m];
                        pb[u] += ov * vr[u][m];
                    }
                }
                ATTP_UNROLL
                for (int u = 0; u < R; u++) {
                    sm->ps[t][(gi + u * NG) * NS + s] = pa[u];
                    sm->pd[t][(gi + u * NG) * NS + s] = pb[u];
                }
            }
            ATTP_SYNC();
            for (int t = s; t < in; t += NS) {
                ATTP_UNROLL
                for (int u = 0; u < R; u++) {
                    const int c = gi + u * NG;
                    const float x = attp_score(&sm->ps[t][c * NS], sc);
                    const float p = att_exp2((x - sm->lse[t]) * ATT_LOG2E);
                    sm->p[t][c] = p;
                    sm->ds[t][c] = p * (attp_dot(&sm->pd[t][c * NS]) - sm->dsum[t]);
                }
            }
            ATTP_SYNC();
            for (int t = 0; t < in; t++) {
                float pv[R], dsv[R];
                int on[R];
                ATTP_UNROLL
                for (int u = 0; u < R; u++) {
                    const int c = gi + u * NG;
                    on[u] = j0 + c < sm->lim[t];
                    pv[u] = sm->p[t][c];
                    dsv[u] = sm->ds[t][c];
                }
                float qs[E], os[E];
                attp_slice(qs, &sm->q[t][s * SW], EN);
                attp_slice(os, &sm->o[t][s * SW], EN);
                ATTP_UNROLL
                for (int m = 0; m < EN; m++) {
                    const float qv = qs[m], ov = os[m];
                    ATTP_UNROLL
                    for (int u = 0; u < R; u++)
                        if (on[u]) {
                            dva[u][m] += pv[u] * ov;
                            dka[u][m] += dsv[u] * qv;
                        }
                }
            }
            ATTP_SYNC();
        }
    ATTP_UNROLL
    for (int u = 0; u < R; u++) {
        const int c = gi + u * NG;
        if (c >= cb) continue;
        const int64_t ko = attp_row(g->dks, b, hk, j0 + c) + s * EN;
        const int64_t vo = attp_row(g->dvs, b, hk, j0 + c) + s * EN;
        ATTP_UNROLL
        for (int m = 0; m < EN; m++) {
            ompk_store_f(dk, ko + m, dka[u][m] * sc, bf);
            ompk_store_f(dv, vo + m, dva[u][m], bf);
        }
    }
}

/* One instance per head dim and element type inside each kernel. */
#define ATTP_SWITCH(g, CALL)                                                                       \
    if ((g)->bf16) {                                                                               \
        ATT_SWITCH_DH_TC((g)->dh, CALL##1)                                                         \
    } else {                                                                                       \
        ATT_SWITCH_DH_TC((g)->dh, CALL##0)                                                         \
    }

ATTP_INLINE void attp_rows_team(const ompk_attn_geom *g, const void *dout, const void *q,
                                const void *k, const void *v, const void *out, float *dsum,
                                float *lw, void *dq, attp_rows_smem *sm, int64_t w){
#define ATTP_ROWS1(D) attp_rows_item(g, dout, q, k, v, out, dsum, lw, dq, sm, w, D, 1)
#define ATTP_ROWS0(D) attp_rows_item(g, dout, q, k, v, out, dsum, lw, dq, sm, w, D, 0)
    ATTP_SWITCH(g, ATTP_ROWS)
#undef ATTP_ROWS1
#undef ATTP_ROWS0
}

ATTP_INLINE void attp_keys_team(const ompk_attn_geom *g, const void *dout, const void *q,
                                const void *k, const void *v, const float *dsum, const float *lw,
                                void *dk, void *dv, attp_keys_smem *sm, int64_t w) {
#define ATTP_KEYS1(D) attp_keys_item(g, dout, q, k, v, dsum, lw, dk, dv, sm, w, D, 1)
#define ATTP_KEYS0(D) attp_keys_item(g, dout, q, k, v, dsum, lw, dk, dv, sm, w, D, 0)
    ATTP_SWITCH(g, ATTP_KEYS)
#undef ATTP_KEYS1
#undef ATTP_KEYS0
}

#ifndef OMPK_EMULATE
#pragma omp end declare target
#endif

#ifndef OMPK_EMULATE
int ompk_attn_bwd_tiled_ok(ompk_exec ex, const ompk_attn_geom *g) {
#if defined(__clang__)
    /* a team of ATTP_T threads is sure on a GPU only, not on a host running the target regions */
    if (!ex.on_target || ex.device == omp_get_initial_device()) return 0;
    return g->dh == 32 || g->dh == 64 || g->dh == 80 || g->dh == 96 || g->dh == 128;
#else
    (void)ex;
    (void)g;
    return 0;
#endif
}

/* Teams loop over the work items, so any grid the runtime forms covers them all. */
static int attp_teams(int64_t items) {
    return (int)(items < 65536 ? items : 65536);
}

void ompk_attn_bwd_tiled(ompk_exec ex, const ompk_attn_geom *gp, const void *dout, const void *q,
                         const void *k, const void *v, const void *out, float *dsum, float *lw,
                         void *dq, void *dk, void *dv) {
    const ompk_attn_geom g = *gp;
    const int64_t qitems = g.B * g.Hq * ((g.N + ATTP_RB - 1) / ATTP_RB);
    const int64_t kitems = g.B * g.Hkv * ((g.M + ATTP_RB - 1) / ATTP_RB);
    const int qteams = attp_teams(qitems), kteams = attp_teams(kitems);
    if (qitems > 0) {
#pragma omp target teams num_teams(qteams) thread_limit(ATTP_T) device(ex.device)                  \
    is_device_ptr(dout, q, k, v, out, dsum, lw, dq) firstprivate(g)
        {
            attp_rows_smem sm;
            ATTP_TEAM_SHARED(sm)
#pragma omp parallel num_threads(ATTP_T)
            for (int64_t w = omp_get_team_num(); w < qitems; w += omp_get_num_teams())
                attp_rows_team(&g, dout, q, k, v, out, dsum, lw, dq, &sm, w);
        }
    }
    if (kitems > 0) {
#pragma omp target teams num_teams(kteams) thread_limit(ATTP_T) device(ex.device)                  \
    is_device_ptr(dout, q, k, v, dsum, lw, dk, dv) firstprivate(g)
        {
            attp_keys_smem sm;
            ATTP_TEAM_SHARED(sm)
#pragma omp parallel num_threads(ATTP_T)
            for (int64_t w = omp_get_team_num(); w < kitems; w += omp_get_num_teams())
                attp_keys_team(&g, dout, q, k, v, dsum, lw, dk, dv, &sm, w);
        }
    }
}
#endif
