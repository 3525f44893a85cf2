/* Fast GPU forward for f32 attention: the FlashAttention-2 shape of attention_fast.c on the
 * tensor cores through 3xTF32.
 *
 * Each f32 operand x is split into x_hi = tf32(x) (truncated) and x_lo = x - x_hi
 * (exact in f32, then truncated to tf32), and a product a*b runs as three
 * mma.sync.m16n8k8 tf32 with fp32 accumulation: a_lo*b_hi + a_hi*b_lo + a_hi*b_hi. The dropped
 * a_lo*b_lo and the truncation of the lo parts leave a relative error of about 2^-20 per
 * product, fp32 level (a single TF32 product errs by 2^-11, which the f32 tolerances reject).
 * Both Q K^T and P V run this way; the online softmax is fp32, as in the bf16 kernel.
 *
 * One team of 4 warps owns 64 query rows of one (b, h); each warp owns 16 rows and keeps its
 * raw f32 Q fragments (split again per tile: keeping hi and lo would not fit the register file
 * next to the accumulator), the O accumulator and the row statistics in registers. Key/value
 * tiles of 32 rows (f32 K 18 KB + V 17 KB at dh 128, under LLVM 19's 48 KB cap) stream through
 * team-shared memory by cp.async, the next K landing while P*V runs.
 *
 * The k index of every mma is permuted, which a dot product allows, so that fragments come
 * from wide loads and from registers:
 *  - Q K^T: in the 16 columns 16c..16c+15 of dh, lane t4 owns columns 16c+4*t4..+3: the k-step
 *    2c takes the first two as its k = t4 and t4 + 4, the k-step 2c+1 the last two. Q and K
 *    fragments are then one 16-byte load per row (K conflict-free with rows of 16 mod 32 floats).
 *  - P V: k = t4 and t4 + 4 of key tile kk are keys kk*8 + 2*t4 and + 1, exactly the two
 *    columns the lane holds of S's accumulator: P enters P V from registers, no shuffle.
 *    Output columns are permuted too (n-tile 2j + h, column n is dh column 16j + 2n + h), so a
 *    lane's V fragment for two n-tiles is one 8-byte load (conflict-free with rows of 4 mod 16
 *    floats) and its O row segment is one 16-byte store.
 *
 * Used for f32 target tensors with dh in {32, 64, 80, 96, 128} and 16-byte aligned rows;
 * dh 256 (its accumulator and Q would not fit the registers) and misaligned views use the
 * portable kernel, as does OMPK_ATTN_VARIANT=portable. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention_f32tc.h"

#define ATTT_BQ 64 /* query rows per team, 16 per warp */
#define ATTT_BK 32 /* keys per shared tile */
#define ATTT_SK_FLOATS (ATTT_BK * ATTT_LDK(128))
#define ATTT_SV_FLOATS (ATTT_BK * ATTT_LDV(128))

/* The team's ids and barrier come from bare.h, the warp instructions (mma.sync tf32, shuffles,
 * cp.async, ex2) from ptx_mma.h. tests/test_attention_f32tc_emu.c runs the kernel emulated
 * (OMPK_EMULATE): the team's 128 threads on the host and the warp instructions exchanging
 * fragments through memory, so CI runs the kernel's own algorithm (operand split, permuted
 * fragments, masks, online softmax) against the reference; the GPU run checks the real
 * instructions. */
#ifdef OMPK_NV_KERNELS
#include <math.h>

#include "attention_softmax.h"

#ifdef OMPK_EMULATE
static float attt_emu_sk[ATTT_SK_FLOATS] __attribute__((aligned(16)));
static float attt_emu_sv[ATTT_SV_FLOATS] __attribute__((aligned(16)));
#endif

/* One team: 64 query rows (block qb of head (b, h)), DH a compile-time constant. */
ATTT_INLINE void attt_fwd_team(const ompk_attn_geom *g, const float *q, const float *k,
                               const float *v, float *out, float *lse, float *sk, float *sv,
                               const int DH, const int SAFE) {
    const int LDK = ATTT_LDK(DH), LDV = ATTT_LDV(DH);
    const int tid = OMPK_TID(), lane = tid & 31, warp = tid >> 5;
    const int gq = lane >> 2, t4 = lane & 3;
    const int64_t N = g->N, M = g->M;
    const int64_t nqb = (N + ATTT_BQ - 1) / ATTT_BQ;
    const int64_t blk = OMPK_BID();
    const int64_t bh = blk / nqb;
    /* heaviest (last, under a causal mask) query blocks first */
    const int64_t qb = nqb - 1 - (blk - bh * nqb);
    const int64_t b = bh / g->Hq, h = bh - b * g->Hq, hk = h / (g->Hq / g->Hkv);
    const int64_t row0 = qb * ATTT_BQ + warp * 16;
    const int64_t r0 = row0 + gq, r1 = row0 + gq + 8;
    const float sl2 = g->scale * ATTT_LOG2E;

    /* qr[c][0] / qr[c][1]: columns 16c + 4 t4 .. + 3 of rows r0 / r1 */
    float qr[8][2][4];
    const float *qh = q + b * g->qs[0] + h * g->qs[1];
    attt_own_rows(qr, r0 < N ? qh + r0 * g->qs[2] : NULL, r1 < N ? qh + r1 * g->qs[2] : NULL, t4,
                  DH);
    const int64_t lim0 = r0 < N ? ompk_attn_key_limit(g->mask, r0, N, M) : 0;
    const int64_t lim1 = r1 < N ? ompk_attn_key_limit(g->mask, r1, N, M) : 0;
    const int64_t last = (qb + 1) * ATTT_BQ - 1 < N - 1 ? (qb + 1) * ATTT_BQ - 1 : N - 1;
    const int64_t jmax = ompk_attn_key_limit(g->mask, last, N, M);

    float o[16][4];
    ATTT_UNROLL
    for (int n = 0; n < DH / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

    const float *kh = k + b * g->ks[0] + hk * g->ks[1];
    const float *vh = v + b * g->vs[0] + hk * g->vs[1];
    /* cp.async groups are committed K0 V0 K1 V1 ...: "all but the newest group" is always the
     * tile needed next */
    if (jmax > 0) {
        attt_load_rows(sk, kh, g->ks[2], 0, M, tid, LDK, ATTT_BK, DH);
        attt_cp_commit();
        attt_load_rows(sv, vh, g->vs[2], 0, M, tid, LDV, ATTT_BK, DH);
        attt_cp_commit();
    }
    for (int64_t kt = 0; kt < jmax; kt += ATTT_BK) {
        attt_cp_wait1();
        OMPK_SYNC();

        float s[4][4];
        ATTT_UNROLL
        for (int nt = 0; nt < 4; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
        attt_mm_nt(s, 4, qr, sk, gq, t4, DH, SAFE, 0);
        OMPK_SYNC(); /* every warp is done with this K tile */
        if (kt + ATTT_BK < jmax)
            attt_load_rows(sk, kh, g->ks[2], kt + ATTT_BK, M, tid, LDK, ATTT_BK, DH);
        attt_cp_commit();

        /* visible keys of this tile for rows r0 and r1, as tile-relative counts */
        const int c0 = (int)(lim0 - kt < ATTT_BK ? lim0 - kt : ATTT_BK);
        const int c1 = (int)(lim1 - kt < ATTT_BK ? lim1 - kt : ATTT_BK);
        att_softmax_tile(s, 4, o, DH, t4, c0, c1, sl2, &m0, &m1, &l0, &l1);
        attt_cp_wait1();
        OMPK_SYNC(); /* this V tile has landed */
        attt_mm_nn(o, s, 4, sv, gq, t4, DH, SAFE);
        OMPK_SYNC(); /* every warp is done with this V tile */
        if (kt + ATTT_BK < jmax)
            attt_load_rows(sv, vh, g->vs[2], kt + ATTT_BK, M, tid, LDV, ATTT_BK, DH);
        attt_cp_commit();
    }
    l0 += attt_xor(l0, 1);
    l0 += attt_xor(l0, 2);
    l1 += attt_xor(l1, 1);
    l1 += attt_xor(l1, 2);
    /* 0 / -inf only for a row that sees no key; a NaN sum (a NaN score) stays NaN */
    const float i0 = lim0 > 0 ? 1.f / l0 : 0.f, i1 = lim1 > 0 ? 1.f / l1 : 0.f;
    attt_store_rows(out + b * g->os[0] + h * g->os[1], g->os[2], r0, r1, N, o, i0, i1, t4, DH);
    if (lse && t4 == 0) {
        const int64_t lb = b * g->ls[0] + h * g->ls[1];
        if (r0 < N)
            lse[lb + r0 * g->ls[2]] = lim0 == 0  ? -INFINITY
                                      : l0 > 0.f ? (m0 + log2f(l0)) * ATTT_LN2
                                                 : NAN;
        if (r1 < N)
            lse[lb + r1 * g->ls[2]] = lim1 == 0  ? -INFINITY
                                      : l1 > 0.f ? (m1 + log2f(l1)) * ATTT_LN2
                                                 : NAN;
    }
}

#ifdef OMPK_NV_DEVICE
static int attt_aligned(const void *p, const int64_t s[3]) {
    return ((uintptr_t)p & 15) == 0 && s[0] % 4 == 0 && s[1] % 4 == 0 && s[2] % 4 == 0;
}

int ompk_attn_fwd_f32tc_ok(ompk_exec ex, const ompk_attn_geom *g, const void *q, const void *k,
                           const void *v, const void *out) {
    if (!ex.on_target || g->bf16) return 0;
    if (g->dh != 32 && g->dh != 64 && g->dh != 80 && g->dh != 96 && g->dh != 128) return 0;
    const int64_t nqb = (g->N + ATTT_BQ - 1) / ATTT_BQ;
    if (g->B * g->Hq * nqb > 0x7fffffff) return 0;
    return attt_aligned(q, g->qs) && attt_aligned(k, g->ks) && attt_aligned(v, g->vs) &&
           attt_aligned(out, g->os);
}

/* One kernel per head dim and split (SAFE), so each gets its own register allocation. */
// clang-format off
#define ATTT_LAUNCH(DH, SAFE)                                                                      \
    static void attt_launch_##DH##_##SAFE(ompk_exec ex, const ompk_attn_geom *gp, const float *q,  \
                                          const float *k, const float *v, float *out,              \
                                          float *lse) {                                            \
        const ompk_attn_geom g = *gp;                                                              \
        const int teams = (int)(g.B * g.Hq * ((g.N + ATTT_BQ - 1) / ATTT_BQ));                     \
        _Pragma("omp target teams ompx_bare num_teams(teams) thread_limit(128) device(ex.device) is_device_ptr(q, k, v, out, lse) firstprivate(g)") \
        {                                                                                          \
            static float sk[ATTT_SK_FLOATS] __attribute__((aligned(16)));                          \
            static float sv[ATTT_SV_FLOATS] __attribute__((aligned(16)));                          \
            _Pragma("omp allocate(sk, sv) allocator(omp_pteam_mem_alloc)")                         \
            attt_fwd_team(&g, q, k, v, out, lse, sk, sv, DH, SAFE);                                \
        }                                                                                          \
    }
#define ATTT_LAUNCH2(DH) ATTT_LAUNCH(DH, 0) ATTT_LAUNCH(DH, 1)
ATTT_LAUNCH2(32)
ATTT_LAUNCH2(64)
ATTT_LAUNCH2(80)
ATTT_LAUNCH2(96)
ATTT_LAUNCH2(128)
// clang-format on

int ompk_attn_f32tc_finite(ompk_exec ex, const ompk_attn_geom *g, const void *q, const void *k,
                           const void *v, const void *dout) {
    return ompk_attn_all_finite(ex, q, 0, g->B, g->Hq, g->N, g->dh, g->qs) &&
           ompk_attn_all_finite(ex, k, 0, g->B, g->Hkv, g->M, g->dh, g->ks) &&
           ompk_attn_all_finite(ex, v, 0, g->B, g->Hkv, g->M, g->dh, g->vs) &&
           (!dout || ompk_attn_all_finite(ex, dout, 0, g->B, g->Hq, g->N, g->dh, g->dos));
}

void ompk_attn_fwd_f32tc(ompk_exec ex, const ompk_attn_geom *g, const void *q, const void *k,
                         const void *v, void *out, float *lse) {
    if (ompk_attn_f32tc_finite(ex, g, q, k, v, NULL)) {
#define ATTT_FWD(D) attt_launch_##D##_0(ex, g, q, k, v, out, lse)
        ATT_SWITCH_DH_TC(g->dh, ATTT_FWD)
#undef ATTT_FWD
    } else {
#define ATTT_FWD(D) attt_launch_##D##_1(ex, g, q, k, v, out, lse)
        ATT_SWITCH_DH_TC(g->dh, ATTT_FWD)
#undef ATTT_FWD
    }
}
#endif /* OMPK_NV_DEVICE */

#endif /* OMPK_NV_KERNELS */

#if !defined(OMPK_NV_KERNELS)
int ompk_attn_fwd_f32tc_ok(ompk_exec ex, const ompk_attn_geom *g, const void *q, const void *k,
                           const void *v, const void *out) {
    (void)ex, (void)g, (void)q, (void)k, (void)v, (void)out;
    return 0; /* no GPU image in this build: the portable kernel serves every call */
}

void ompk_attn_fwd_f32tc(ompk_exec ex, const ompk_attn_geom *g, const void *q, const void *k,
                         const void *v, void *out, float *lse) {
    ompk_attn_fwd_portable(ex, g, q, k, v, out, lse);
}
#endif
