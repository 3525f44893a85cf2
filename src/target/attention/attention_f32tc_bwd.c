/* Fast GPU backward for f32 attention on the tensor cores through 3xTF32 (attention_f32tc.h: the
 * operand split, the two warp products, fp32 accumulation), FlashAttention-2's recomputation in
 * four kernels. A team is 4 warps, a warp owns 16 rows and every output row is written by the
 * warp that owns it after a walk in a fixed order: no atomics, deterministic.
 *  - lse: each query row's lse from the scores the other kernels recompute, bit for bit (the lse
 *    passed in is not read: attb_lse_team says why).
 *  - dV: a team owns 64 keys of one (b, kv head) and walks the group's query heads and their
 *    rows in tiles of 32: S^T = K Q^T, P^T = exp(S^T - lse), dV += P^T dO.
 *  - dK: the same keys, tiles of 16 query rows: S^T and dP^T = V dO^T, dS^T = P^T (dP^T - D),
 *    dK += dS^T Q.
 *  - dQ: a team owns 64 query rows of one (b, head) and walks its visible keys in tiles of 16:
 *    S = Q K^T, dP = dO V^T, dS = P (dP - D), dQ += dS K.
 * One kernel for dK and dV would hold K, V, dK and dV (4 DH/2 registers a lane: 256 at dh 128);
 * apart, each holds at most two row sets in registers and reads a third per step from memory,
 * for one product more (with lse's, 9 instead of 7). The tile products take their B operand from
 * shared tiles at the pitch their access wants (a tile read both ways is loaded twice); tiles are 3
 * at most (48 KB cap of LLVM 19's team memory). Loads are pipelined as in the forward: the first
 * tile group of step t + 1 lands while step t's second product runs. p = 2^((s scale - lse) log2
 * e): the difference is taken in natural units, as the portable kernel does, so large logits keep
 * their low bits. Under a causal mask a masked pair's P = 0 (dS = 0) meets the other operand inside
 * the mma: calls with a non-finite q, k or dout there go to the portable kernel (attention_impl.c).
 * A call whose q, k, v and dout are all finite runs the kernels with the shorter operand split
 * (attention_f32tc.h, SAFE 0). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention_f32tc.h"

#define ATTB_ROWS 64 /* rows a team owns (keys, or queries for dQ), 16 a warp */
#define ATTB_TV 32   /* query rows a dV step */
#define ATTB_T 16    /* query rows a dK step, keys a dQ step */
#define ATTB_V_FLOATS (ATTB_TV * (ATTT_LDK(128) + ATTT_LDV(128)))
#define ATTB_KQ_FLOATS (ATTB_T * (2 * ATTT_LDK(128) + ATTT_LDV(128)))
#define ATTB_L_FLOATS (2 * ATTB_TV * ATTT_LDK(128))

#ifdef OMPK_NV_KERNELS
#include <math.h>

#ifdef OMPK_EMULATE
#define ATTB_MAX2(a, b) ((a) > (b) ? (a) : (b))
static float attb_emu_tiles[ATTB_MAX2(ATTB_L_FLOATS, ATTB_MAX2(ATTB_V_FLOATS, ATTB_KQ_FLOATS))]
    __attribute__((aligned(16)));
static float attb_emu_rows[3 * 2 * ATTB_TV];
#endif

/* The query rows i0 .. i0 + T - 1 of head h for a key team (key0 its first key): lse (natural
 * units), D and how many of the team's keys each row sees (0 past N and for a row that sees no
 * key at all), by threads tid < T. */
ATTT_INLINE void attb_query_rows(const ompk_attn_geom *g, const float *lse, const float *dsum,
                                 int64_t b, int64_t h, int64_t i0, int64_t key0, int tid,
                                 const int T, float *sl, float *sd, float *sc) {
    if (tid >= T) return;
    const int64_t i = i0 + tid, N = g->N, M = g->M;
    const float l = i < N ? lse[(b * g->Hq + h) * N + i] : -INFINITY;
    int64_t lim = l == -INFINITY ? 0 : ompk_attn_key_limit(g->mask, i, N, M) - key0;
    lim = lim < 0 ? 0 : lim > ATTB_ROWS ? ATTB_ROWS : lim;
    sl[tid] = l == -INFINITY ? 0.f : l;
    sd[tid] = i < N ? dsum[(b * g->Hq + h) * N + i] : 0.f;
    sc[tid] = (float)lim;
}

/* The key team's walk: step t is query tile (t % nqt) of head hk * G + t / nqt, from the first
 * query row that sees the team's first key. */
typedef struct attb_walk {
    int64_t b, hk, key0, ifirst, nqt, steps;
} attb_walk;

ATTT_INLINE attb_walk attb_walk_make(const ompk_attn_geom *g, int64_t blk, const int T) {
    attb_walk w;
    const int64_t nkb = (g->M + ATTB_ROWS - 1) / ATTB_ROWS, bh = blk / nkb;
    w.b = bh / g->Hkv;
    w.hk = bh - w.b * g->Hkv;
    w.key0 = (blk - bh * nkb) * ATTB_ROWS;
    w.ifirst = ompk_attn_first_row(g->mask, w.key0, g->N, g->M);
    w.nqt = w.ifirst < g->N ? (g->N - w.ifirst + T - 1) / T : 0;
    w.steps = (g->Hq / g->Hkv) * w.nqt;
    return w;
}

ATTT_INLINE int64_t attb_walk_head(const ompk_attn_geom *g, const attb_walk *w, int64_t t) {
    return w->hk * (g->Hq / g->Hkv) + t / w->nqt;
}

ATTT_INLINE int64_t attb_walk_row(const attb_walk *w, int64_t t, const int T) {
    return w->ifirst + (t % w->nqt) * T;
}

/* P^T (dpt NULL) or dS^T (dpt: the dP^T tile) in place of the scores st of the warp's keys kl0,
 * kl1 (team relative) against NT n-tiles of query rows, whose lse, D and visible-key counts are
 * sl, sd, sc: a masked pair gives exactly 0 (a select: never 0 * NaN). */
ATTT_INLINE void attb_probs(float (*st)[4], float (*dpt)[4], const int NT, int kl0, int kl1, int t4,
                            float scale, const float *sl, const float *sd, const float *sc) {
    ATTT_UNROLL
    for (int nt = 0; nt < NT; nt++) {
        ATTT_UNROLL
        for (int e = 0; e < 4; e++) {
            const int col = nt * 8 + t4 * 2 + (e & 1);
            const int vis = (float)(e < 2 ? kl0 : kl1) < sc[col];
            /* the score rounded on its own, as attb_lse_team has it: fused into x - lse, a
             * one-hot row's p would miss 1 */
            const float x = ATT_ROUNDED_MUL(st[nt][e], scale);
            const float p = vis ? attt_ex2((x - sl[col]) * ATTT_LOG2E) : 0.f;
            if (dpt)
                st[nt][e] = vis ? p * (dpt[nt][e] - sd[col]) : 0.f;
            else
                st[nt][e] = p;
        }
    }
}

/* lse (natural units) of the 64 query rows of one team into lw [B*Hq*N], from the scores the
 * other kernels recompute, bit for bit (attt_mm_nt; attt_mm_nt TR for S^T): the lse passed in
 * came from a forward whose scores may round differently, and at large logits p = exp(s - lse)
 * would then miss a one-hot row's exact 1 by an ulp of the logit. Online max and sum per lane,
 * merged over the row's 4 lanes in a fixed order; NaN and fully masked rows as the portable
 * kernel has them. tiles: two K tiles of ATTB_TV keys (pitch LDK), the next landing while the
 * current one runs. */
ATTT_INLINE void attb_lse_team(const ompk_attn_geom *g, const float *q, const float *k, float *lw,
                               float *tiles, const int DH, const int SAFE) {
    const int T = ATTB_TV, LDK = ATTT_LDK(DH);
    const int tid = OMPK_TID(), lane = tid & 31, warp = tid >> 5;
    const int gq = lane >> 2, t4 = lane & 3;
    const int64_t N = g->N, M = g->M;
    const int64_t nqb = (N + ATTB_ROWS - 1) / ATTB_ROWS, blk = OMPK_BID(), bh = blk / nqb;
    const int64_t qb = nqb - 1 - (blk - bh * nqb);
    const int64_t b = bh / g->Hq, h = bh - b * g->Hq, hk = h / (g->Hq / g->Hkv);
    const int64_t r0 = qb * ATTB_ROWS + warp * 16 + gq, r1 = r0 + 8;
    float qr[8][2][4];
    const float *qh = q + b * g->qs[0] + h * g->qs[1];
    attt_own_rows(qr, r0 < N ? qh + r0 * g->qs[2] : NULL, r1 < N ? qh + r1 * g->qs[2] : NULL, t4,
                  DH);
    const int64_t lim[2] = {r0 < N ? ompk_attn_key_limit(g->mask, r0, N, M) : 0,
                            r1 < N ? ompk_attn_key_limit(g->mask, r1, N, M) : 0};
    const int64_t last = (qb + 1) * ATTB_ROWS - 1 < N - 1 ? (qb + 1) * ATTB_ROWS - 1 : N - 1;
    const int64_t jmax = ompk_attn_key_limit(g->mask, last, N, M);
    const float *kh = k + b * g->ks[0] + hk * g->ks[1];
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    if (jmax > 0) attt_load_rows(tiles, kh, g->ks[2], 0, M, tid, LDK, T, DH);
    attt_cp_commit();
    for (int64_t kt = 0, it = 0; kt < jmax; kt += T, it++) {
        float *cur = tiles + (it & 1) * T * LDK, *nxt = tiles + ((it + 1) & 1) * T * LDK;
        if (kt + T < jmax) attt_load_rows(nxt, kh, g->ks[2], kt + T, M, tid, LDK, T, DH);
        attt_cp_commit();
        attt_cp_wait1();
        OMPK_SYNC(); /* this tile has landed */
        float s[ATTB_TV / 8][4];
        ATTT_UNROLL
        for (int nt = 0; nt < T / 8; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
        attt_mm_nt(s, T / 8, qr, cur, gq, t4, DH, SAFE, 0);
        ATTT_UNROLL
        for (int nt = 0; nt < T / 8; nt++) {
            ATTT_UNROLL
            for (int e = 0; e < 4; e++) {
                const int rr = e >> 1;
                if (kt + nt * 8 + t4 * 2 + (e & 1) >= lim[rr]) continue;
                const float x = ATT_ROUNDED_MUL(s[nt][e], g->scale);
                if (x > m[rr]) { /* a NaN score leaves m alone and turns l into NaN below */
                    l[rr] *= attt_ex2((m[rr] - x) * ATTT_LOG2E);
                    m[rr] = x;
                }
                l[rr] += attt_ex2((x - (m[rr] == -INFINITY ? 0.f : m[rr])) * ATTT_LOG2E);
            }
        }
        OMPK_SYNC(); /* every warp is done with this tile */
    }
    ATTT_UNROLL
    for (int rr = 0; rr < 2; rr++) {
        ATTT_UNROLL
        for (int off = 1; off <= 2; off *= 2) {
            const float mo = attt_xor(m[rr], off), lo = attt_xor(l[rr], off);
            const float mx = mo > m[rr] ? mo : m[rr];
            const float a = m[rr] == mx ? l[rr] : l[rr] * attt_ex2((m[rr] - mx) * ATTT_LOG2E);
            const float c = mo == mx ? lo : lo * attt_ex2((mo - mx) * ATTT_LOG2E);
            l[rr] = a + c;
            m[rr] = mx;
        }
    }
    if (t4 == 0) {
        const int64_t row[2] = {r0, r1};
        ATTT_UNROLL
        for (int rr = 0; rr < 2; rr++)
            if (row[rr] < N)
                lw[(b * g->Hq + h) * N + row[rr]] = lim[rr] == 0  ? -INFINITY
                                                    : l[rr] > 0.f ? m[rr] + log2f(l[rr]) * ATTT_LN2
                                                                  : NAN;
    }
}

/* dV of one key team. tiles: Q (pitch LDK) then dO (pitch LDV), ATTB_TV rows each; rows: the
 * query-row arrays, two steps' worth. */
ATTT_INLINE void attb_dv_team(const ompk_attn_geom *g, const float *q, const float *k,
                              const float *dout, const float *lse, const float *dsum, float *dv,
                              float *tiles, float *rows, const int DH, const int SAFE) {
    const int T = ATTB_TV, LDK = ATTT_LDK(DH), LDV = ATTT_LDV(DH);
    const int tid = OMPK_TID(), lane = tid & 31, warp = tid >> 5;
    const int gq = lane >> 2, t4 = lane & 3;
    const attb_walk w = attb_walk_make(g, OMPK_BID(), T);
    const int kl0 = warp * 16 + gq, kl1 = kl0 + 8;
    const int64_t kr0 = w.key0 + kl0, kr1 = w.key0 + kl1, M = g->M;
    float *sq = tiles, *sdo = tiles + T * LDK;
    /* K rows are read per step (attt_mm_nt_mem): in registers beside dV they would spill */
    const float *kh = k + w.b * g->ks[0] + w.hk * g->ks[1];
    const float *k0 = kr0 < M ? kh + kr0 * g->ks[2] : NULL;
    const float *k1 = kr1 < M ? kh + kr1 * g->ks[2] : NULL;
    float acc[16][4];
    ATTT_UNROLL
    for (int n = 0; n < DH / 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
    const int64_t qs0 = w.b * g->qs[0], ds0 = w.b * g->dos[0];
    if (w.steps > 0) {
        const int64_t h = attb_walk_head(g, &w, 0), i0 = attb_walk_row(&w, 0, T);
        attt_load_rows(sq, q + qs0 + h * g->qs[1], g->qs[2], i0, g->N, tid, LDK, T, DH);
        attb_query_rows(g, lse, dsum, w.b, h, i0, w.key0, tid, T, rows, rows + T, rows + 2 * T);
        attt_cp_commit();
        attt_load_rows(sdo, dout + ds0 + h * g->dos[1], g->dos[2], i0, g->N, tid, LDV, T, DH);
        attt_cp_commit();
    }
    for (int64_t t = 0; t < w.steps; t++) {
        float *r = rows + (t & 1) * 3 * T;
        attt_cp_wait1();
        OMPK_SYNC();
        float st[ATTB_TV / 8][4];
        ATTT_UNROLL
        for (int nt = 0; nt < T / 8; nt++) st[nt][0] = st[nt][1] = st[nt][2] = st[nt][3] = 0.f;
        attt_mm_nt_mem(st, T / 8, k0, k1, sq, gq, t4, DH, SAFE, 1);
        OMPK_SYNC(); /* every warp is done with this Q tile */
        if (t + 1 < w.steps) {
            const int64_t h = attb_walk_head(g, &w, t + 1), i0 = attb_walk_row(&w, t + 1, T);
            float *rn = rows + ((t + 1) & 1) * 3 * T;
            attt_load_rows(sq, q + qs0 + h * g->qs[1], g->qs[2], i0, g->N, tid, LDK, T, DH);
            attb_query_rows(g, lse, dsum, w.b, h, i0, w.key0, tid, T, rn, rn + T, rn + 2 * T);
        }
        attt_cp_commit();
        attb_probs(st, NULL, T / 8, kl0, kl1, t4, g->scale, r, r + T, r + 2 * T);
        attt_cp_wait1();
        OMPK_SYNC(); /* this dO tile has landed */
        attt_mm_nn(acc, st, T / 8, sdo, gq, t4, DH, SAFE);
        OMPK_SYNC(); /* every warp is done with this dO tile */
        if (t + 1 < w.steps) {
            const int64_t h = attb_walk_head(g, &w, t + 1), i0 = attb_walk_row(&w, t + 1, T);
            attt_load_rows(sdo, dout + ds0 + h * g->dos[1], g->dos[2], i0, g->N, tid, LDV, T, DH);
        }
        attt_cp_commit();
    }
    attt_store_rows(dv + w.b * g->dvs[0] + w.hk * g->dvs[1], g->dvs[2], kr0, kr1, M, acc, 1.f, 1.f,
                    t4, DH);
}

/* dK of one key team. tiles: Q and dO (pitch LDK), then Q again (pitch LDV), ATTB_T rows each. */
ATTT_INLINE void attb_dk_team(const ompk_attn_geom *g, const float *q, const float *k,
                              const float *v, const float *dout, const float *lse,
                              const float *dsum, float *dk, float *tiles, float *rows, const int DH,
                              const int SAFE) {
    const int T = ATTB_T, LDK = ATTT_LDK(DH), LDV = ATTT_LDV(DH);
    const int tid = OMPK_TID(), lane = tid & 31, warp = tid >> 5;
    const int gq = lane >> 2, t4 = lane & 3;
    const attb_walk w = attb_walk_make(g, OMPK_BID(), T);
    const int kl0 = warp * 16 + gq, kl1 = kl0 + 8;
    const int64_t kr0 = w.key0 + kl0, kr1 = w.key0 + kl1, M = g->M;
    float *sq = tiles, *sdo = tiles + T * LDK, *sqv = tiles + 2 * T * LDK;
    float kr[8][2][4];
    const float *kh = k + w.b * g->ks[0] + w.hk * g->ks[1];
    const float *vh = v + w.b * g->vs[0] + w.hk * g->vs[1];
    attt_own_rows(kr, kr0 < M ? kh + kr0 * g->ks[2] : NULL, kr1 < M ? kh + kr1 * g->ks[2] : NULL,
                  t4, DH);
    /* V rows are read per step (attt_mm_nt_mem): K, V and dK in registers would spill */
    const float *v0 = kr0 < M ? vh + kr0 * g->vs[2] : NULL;
    const float *v1 = kr1 < M ? vh + kr1 * g->vs[2] : NULL;
    float acc[16][4];
    ATTT_UNROLL
    for (int n = 0; n < DH / 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
    const int64_t qs0 = w.b * g->qs[0], ds0 = w.b * g->dos[0];
    if (w.steps > 0) {
        const int64_t h = attb_walk_head(g, &w, 0), i0 = attb_walk_row(&w, 0, T);
        attt_load_rows(sq, q + qs0 + h * g->qs[1], g->qs[2], i0, g->N, tid, LDK, T, DH);
        attt_load_rows(sdo, dout + ds0 + h * g->dos[1], g->dos[2], i0, g->N, tid, LDK, T, DH);
        attb_query_rows(g, lse, dsum, w.b, h, i0, w.key0, tid, T, rows, rows + T, rows + 2 * T);
        attt_cp_commit();
        attt_load_rows(sqv, q + qs0 + h * g->qs[1], g->qs[2], i0, g->N, tid, LDV, T, DH);
        attt_cp_commit();
    }
    for (int64_t t = 0; t < w.steps; t++) {
        float *r = rows + (t & 1) * 3 * T;
        attt_cp_wait1();
        OMPK_SYNC();
        float st[ATTB_T / 8][4], dpt[ATTB_T / 8][4];
        ATTT_UNROLL
        for (int nt = 0; nt < T / 8; nt++) {
            st[nt][0] = st[nt][1] = st[nt][2] = st[nt][3] = 0.f;
            dpt[nt][0] = dpt[nt][1] = dpt[nt][2] = dpt[nt][3] = 0.f;
        }
        attt_mm_nt(st, T / 8, kr, sq, gq, t4, DH, SAFE, 1);
        attt_mm_nt_mem(dpt, T / 8, v0, v1, sdo, gq, t4, DH, SAFE, 1);
        OMPK_SYNC(); /* every warp is done with these Q and dO tiles */
        if (t + 1 < w.steps) {
            const int64_t h = attb_walk_head(g, &w, t + 1), i0 = attb_walk_row(&w, t + 1, T);
            float *rn = rows + ((t + 1) & 1) * 3 * T;
            attt_load_rows(sq, q + qs0 + h * g->qs[1], g->qs[2], i0, g->N, tid, LDK, T, DH);
            attt_load_rows(sdo, dout + ds0 + h * g->dos[1], g->dos[2], i0, g->N, tid, LDK, T, DH);
            attb_query_rows(g, lse, dsum, w.b, h, i0, w.key0, tid, T, rn, rn + T, rn + 2 * T);
        }
        attt_cp_commit();
        attb_probs(st, dpt, T / 8, kl0, kl1, t4, g->scale, r, r + T, r + 2 * T);
        attt_cp_wait1();
        OMPK_SYNC(); /* this Q tile (pitch LDV) has landed */
        attt_mm_nn(acc, st, T / 8, sqv, gq, t4, DH, SAFE);
        OMPK_SYNC(); /* every warp is done with it */
        if (t + 1 < w.steps) {
            const int64_t h = attb_walk_head(g, &w, t + 1), i0 = attb_walk_row(&w, t + 1, T);
            attt_load_rows(sqv, q + qs0 + h * g->qs[1], g->qs[2], i0, g->N, tid, LDV, T, DH);
        }
        attt_cp_commit();
    }
    attt_store_rows(dk + w.b * g->dks[0] + w.hk * g->dks[1], g->dks[2], kr0, kr1, M, acc, g->scale,
                    g->scale, t4, DH);
}

/* dQ of one query team. tiles: K and V (pitch LDK), then K again (pitch LDV), ATTB_T keys each. */
ATTT_INLINE void attb_dq_team(const ompk_attn_geom *g, const float *q, const float *k,
                              const float *v, const float *dout, const float *lse,
                              const float *dsum, float *dq, float *tiles, const int DH,
                              const int SAFE) {
    const int T = ATTB_T, LDK = ATTT_LDK(DH), LDV = ATTT_LDV(DH);
    const int tid = OMPK_TID(), lane = tid & 31, warp = tid >> 5;
    const int gq = lane >> 2, t4 = lane & 3;
    const int64_t N = g->N, M = g->M;
    const int64_t nqb = (N + ATTB_ROWS - 1) / ATTB_ROWS, blk = OMPK_BID(), bh = blk / nqb;
    /* heaviest (last, under a causal mask) query blocks first */
    const int64_t qb = nqb - 1 - (blk - bh * nqb);
    const int64_t b = bh / g->Hq, h = bh - b * g->Hq, hk = h / (g->Hq / g->Hkv);
    const int64_t r0 = qb * ATTB_ROWS + warp * 16 + gq, r1 = r0 + 8;
    float *sk = tiles, *sv = tiles + T * LDK, *skv = tiles + 2 * T * LDK;
    float qr[8][2][4];
    const float *qh = q + b * g->qs[0] + h * g->qs[1];
    const float *oh = dout + b * g->dos[0] + h * g->dos[1];
    attt_own_rows(qr, r0 < N ? qh + r0 * g->qs[2] : NULL, r1 < N ? qh + r1 * g->qs[2] : NULL, t4,
                  DH);
    /* dO rows are read per step (attt_mm_nt_mem): Q, dO and dQ in registers would spill */
    const float *o0 = r0 < N ? oh + r0 * g->dos[2] : NULL;
    const float *o1 = r1 < N ? oh + r1 * g->dos[2] : NULL;
    const float la = r0 < N ? lse[(b * g->Hq + h) * N + r0] : -INFINITY;
    const float lc = r1 < N ? lse[(b * g->Hq + h) * N + r1] : -INFINITY;
    /* a row past N or fully masked (lse = -inf) sees no key: its dq is 0 */
    const int64_t lim0 = la != -INFINITY ? ompk_attn_key_limit(g->mask, r0, N, M) : 0;
    const int64_t lim1 = lc != -INFINITY ? ompk_attn_key_limit(g->mask, r1, N, M) : 0;
    const float l0 = la == -INFINITY ? 0.f : la, l1 = lc == -INFINITY ? 0.f : lc;
    const float d0 = r0 < N ? dsum[(b * g->Hq + h) * N + r0] : 0.f;
    const float d1 = r1 < N ? dsum[(b * g->Hq + h) * N + r1] : 0.f;
    const int64_t last = (qb + 1) * ATTB_ROWS - 1 < N - 1 ? (qb + 1) * ATTB_ROWS - 1 : N - 1;
    const int64_t jmax = ompk_attn_key_limit(g->mask, last, N, M);
    const float sl[2] = {l0, l1}, sd[2] = {d0, d1};
    float acc[16][4];
    ATTT_UNROLL
    for (int n = 0; n < DH / 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
    const float *kh = k + b * g->ks[0] + hk * g->ks[1];
    const float *vh = v + b * g->vs[0] + hk * g->vs[1];
    if (jmax > 0) {
        attt_load_rows(sk, kh, g->ks[2], 0, M, tid, LDK, T, DH);
        attt_load_rows(sv, vh, g->vs[2], 0, M, tid, LDK, T, DH);
        attt_cp_commit();
        attt_load_rows(skv, kh, g->ks[2], 0, M, tid, LDV, T, DH);
        attt_cp_commit();
    }
    for (int64_t kt = 0; kt < jmax; kt += T) {
        attt_cp_wait1();
        OMPK_SYNC();
        float s[ATTB_T / 8][4], dp[ATTB_T / 8][4];
        ATTT_UNROLL
        for (int nt = 0; nt < T / 8; nt++) {
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
            dp[nt][0] = dp[nt][1] = dp[nt][2] = dp[nt][3] = 0.f;
        }
        attt_mm_nt(s, T / 8, qr, sk, gq, t4, DH, SAFE, 0);
        attt_mm_nt_mem(dp, T / 8, o0, o1, sv, gq, t4, DH, SAFE, 0);
        OMPK_SYNC(); /* every warp is done with these K and V tiles */
        if (kt + T < jmax) {
            attt_load_rows(sk, kh, g->ks[2], kt + T, M, tid, LDK, T, DH);
            attt_load_rows(sv, vh, g->vs[2], kt + T, M, tid, LDK, T, DH);
        }
        attt_cp_commit();
        /* visible keys of this tile for rows r0 and r1, as tile-relative counts */
        const float c[2] = {(float)(lim0 - kt < T ? lim0 - kt : T),
                            (float)(lim1 - kt < T ? lim1 - kt : T)};
        ATTT_UNROLL
        for (int nt = 0; nt < T / 8; nt++) {
            ATTT_UNROLL
            for (int e = 0; e < 4; e++) {
                const int key = nt * 8 + t4 * 2 + (e & 1), rr = e >> 1;
                const int vis = (float)key < c[rr];
                const float x = ATT_ROUNDED_MUL(s[nt][e], g->scale); /* as in attb_probs */
                const float p = vis ? attt_ex2((x - sl[rr]) * ATTT_LOG2E) : 0.f;
                s[nt][e] = vis ? p * (dp[nt][e] - sd[rr]) : 0.f;
            }
        }
        attt_cp_wait1();
        OMPK_SYNC(); /* this K tile (pitch LDV) has landed */
        attt_mm_nn(acc, s, T / 8, skv, gq, t4, DH, SAFE);
        OMPK_SYNC(); /* every warp is done with it */
        if (kt + T < jmax) attt_load_rows(skv, kh, g->ks[2], kt + T, M, tid, LDV, T, DH);
        attt_cp_commit();
    }
    attt_store_rows(dq + b * g->dqs[0] + h * g->dqs[1], g->dqs[2], r0, r1, N, acc, g->scale,
                    g->scale, t4, DH);
}

#ifdef OMPK_NV_DEVICE
static int attb_aligned(const void *p, const int64_t s[3]) {
    return ((uintptr_t)p & 15) == 0 && s[0] % 4 == 0 && s[1] % 4 == 0 && s[2] % 4 == 0;
}

int ompk_attn_bwd_f32tc_ok(ompk_exec ex, const ompk_attn_geom *g, const void *const ptrs[8]) {
    if (!ex.on_target || g->bf16) return 0;
    if (g->dh != 32 && g->dh != 64 && g->dh != 80 && g->dh != 96 && g->dh != 128) return 0;
    if (g->B * g->Hq * ((g->N + ATTB_ROWS - 1) / ATTB_ROWS) > 0x7fffffff) return 0;
    if (g->B * g->Hkv * ((g->M + ATTB_ROWS - 1) / ATTB_ROWS) > 0x7fffffff) return 0;
    const int64_t *st[8] = {g->qs, g->ks, g->vs, g->os, g->dos, g->dqs, g->dks, g->dvs};
    for (int i = 0; i < 8; i++)
        if (!attb_aligned(ptrs[i], st[i])) return 0;
    return 1;
}

/* One set of kernels per head dim and split (SAFE), so each gets its own register allocation.
 * lw: the recomputed lse (attb_lse_team). */
// clang-format off
#define ATTB_LAUNCH(DH, SAFE)                                                                      \
    static void attb_bwd_##DH##_##SAFE(ompk_exec ex, const ompk_attn_geom *gp, const float *q,     \
                                       const float *k, const float *v, const float *dout,          \
                                       const float *dsum, float *lw, float *dq, float *dk,         \
                                       float *dv) {                                                \
        const ompk_attn_geom g = *gp;                                                              \
        const int kteams = (int)(g.B * g.Hkv * ((g.M + ATTB_ROWS - 1) / ATTB_ROWS));               \
        const int qteams = (int)(g.B * g.Hq * ((g.N + ATTB_ROWS - 1) / ATTB_ROWS));                \
        if (qteams > 0)                                                                            \
        _Pragma("omp target teams ompx_bare num_teams(qteams) thread_limit(128) device(ex.device) is_device_ptr(q, k, lw) firstprivate(g)") \
        {                                                                                          \
            static float tiles[ATTB_L_FLOATS] __attribute__((aligned(16)));          \
            _Pragma("omp allocate(tiles) allocator(omp_pteam_mem_alloc)")                          \
            attb_lse_team(&g, q, k, lw, tiles, DH, SAFE);                                          \
        }                                                                                          \
        if (kteams > 0)                                                                            \
        _Pragma("omp target teams ompx_bare num_teams(kteams) thread_limit(128) device(ex.device) is_device_ptr(q, k, dout, lw, dsum, dv) firstprivate(g)") \
        {                                                                                          \
            static float tiles[ATTB_V_FLOATS] __attribute__((aligned(16)));                        \
            static float rows[3 * 2 * ATTB_TV];                                                    \
            _Pragma("omp allocate(tiles, rows) allocator(omp_pteam_mem_alloc)")                    \
            attb_dv_team(&g, q, k, dout, lw, dsum, dv, tiles, rows, DH, SAFE);                     \
        }                                                                                          \
        if (kteams > 0)                                                                            \
        _Pragma("omp target teams ompx_bare num_teams(kteams) thread_limit(128) device(ex.device) is_device_ptr(q, k, v, dout, lw, dsum, dk) firstprivate(g)") \
        {                                                                                          \
            static float tiles[ATTB_KQ_FLOATS] __attribute__((aligned(16)));                       \
            static float rows[3 * 2 * ATTB_T];                                                     \
            _Pragma("omp allocate(tiles, rows) allocator(omp_pteam_mem_alloc)")                    \
            attb_dk_team(&g, q, k, v, dout, lw, dsum, dk, tiles, rows, DH, SAFE);                  \
        }                                                                                          \
        if (qteams > 0)                                                                            \
        _Pragma("omp target teams ompx_bare num_teams(qteams) thread_limit(128) device(ex.device) is_device_ptr(q, k, v, dout, lw, dsum, dq) firstprivate(g)") \
        {                                                                                          \
            static float tiles[ATTB_KQ_FLOATS] __attribute__((aligned(16)));                       \
            _Pragma("omp allocate(tiles) allocator(omp_pteam_mem_alloc)")                          \
            attb_dq_team(&g, q, k, v, dout, lw, dsum, dq, tiles, DH, SAFE);                        \
        }                                                                                          \
    }
#define ATTB_LAUNCH2(DH) ATTB_LAUNCH(DH, 0) ATTB_LAUNCH(DH, 1)
ATTB_LAUNCH2(32)
ATTB_LAUNCH2(64)
ATTB_LAUNCH2(80)
ATTB_LAUNCH2(96)
ATTB_LAUNCH2(128)
// clang-format on

/* dsum: the workspace of 2 B*Hq*N floats: D, then the recomputed lse (the lse passed in is
 * not read). */
void ompk_attn_bwd_f32tc(ompk_exec ex, const ompk_attn_geom *g, const void *dout, const void *q,
                         const void *k, const void *v, const void *out, const float *lse, void *dq,
                         void *dk, void *dv, float *dsum) {
    (void)lse;
    float *lw = dsum + g->B * g->Hq * g->N;
    ompk_attn_rowsum(ex, g, dout, out, dsum);
    if (ompk_attn_f32tc_finite(ex, g, q, k, v, dout)) {
#define ATTB_BWD(D) attb_bwd_##D##_0(ex, g, q, k, v, dout, dsum, lw, dq, dk, dv)
        ATT_SWITCH_DH_TC(g->dh, ATTB_BWD)
#undef ATTB_BWD
    } else {
#define ATTB_BWD(D) attb_bwd_##D##_1(ex, g, q, k, v, dout, dsum, lw, dq, dk, dv)
        ATT_SWITCH_DH_TC(g->dh, ATTB_BWD)
#undef ATTB_BWD
    }
}
#endif /* OMPK_NV_DEVICE */

#endif /* OMPK_NV_KERNELS */

#if !defined(OMPK_NV_KERNELS)
int ompk_attn_bwd_f32tc_ok(ompk_exec ex, const ompk_attn_geom *g, const void *const ptrs[8]) {
    (void)ex, (void)g, (void)ptrs;
    return 0; /* no GPU image in this build: another kernel serves every call */
}

void ompk_attn_bwd_f32tc(ompk_exec ex, const ompk_attn_geom *g, const void *dout, const void *q,
                         const void *k, const void *v, const void *out, const float *lse, void *dq,
                         void *dk, void *dv, float *dsum) {
    ompk_attn_bwd_portable(ex, g, dout, q, k, v, out, lse, dq, dk, dv, dsum);
}
#endif
