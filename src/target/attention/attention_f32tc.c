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

#include "attention_kernels.h"

#if defined(__clang__)
#define ATTT_UNROLL _Pragma("unroll")
#else
#define ATTT_UNROLL _Pragma("GCC unroll 16")
#endif

#define ATTT_BQ 64 /* query rows per team, 16 per warp */
#define ATTT_BK 32 /* keys per shared tile */
/* Row pitches in floats: K rows are read 16 bytes per lane (pitch 16 mod 32 floats), V rows
 * 8 bytes per lane two rows apart (pitch 4 mod 16 floats); both keep 16-byte row starts. */
#define ATTT_LDK(DH) ((DH) % 32 == 0 ? (DH) + 16 : (DH) + 32)
#define ATTT_LDV(DH) ((DH) + 4)
#define ATTT_SK_FLOATS (ATTT_BK * ATTT_LDK(128))
#define ATTT_SV_FLOATS (ATTT_BK * ATTT_LDV(128))
#define ATTT_LOG2E 1.4426950408889634f
#define ATTT_LN2 0.6931471805599453f

/* The team's ids and barrier come from bare.h, the warp instructions (mma.sync tf32, shuffles,
 * cp.async, ex2) from ptx_mma.h. tests/test_attention_f32tc_emu.c runs the kernel emulated
 * (OMPK_EMULATE): the team's 128 threads on the host and the warp instructions exchanging
 * fragments through memory, so CI runs the kernel's own algorithm (operand split, permuted
 * fragments, masks, online softmax) against the reference; the GPU run checks the real
 * instructions. */
#include "bare.h"

#ifdef OMPK_NV_KERNELS
#include <math.h>

#include "attention_softmax.h"
#include "ptx_mma.h"
#define ATTT_INLINE static inline __attribute__((always_inline))
#define attt_mma ptx_mma_tf32_1688
#define attt_xor ptx_shfl_xor
#define attt_ex2 ptx_ex2
#define attt_cp16 ptx_cp_async16
#define attt_cp_commit ptx_cp_async_commit
#define attt_cp_wait1 ptx_cp_async_wait1

#ifdef OMPK_EMULATE
static float attt_emu_sk[ATTT_SK_FLOATS] __attribute__((aligned(16)));
static float attt_emu_sv[ATTT_SV_FLOATS] __attribute__((aligned(16)));
ATTT_INLINE float attt_opaque(float x) {
    return x;
}
#else
ATTT_INLINE __attribute__((unused)) float attt_opaque(float x) {
    return x;
}
#pragma omp begin declare variant match(device = {arch(nvptx64)})
/* x, as a value the compiler cannot see through: keeps the split of the loop-invariant Q
 * fragments inside the key loop (hoisted, hi and lo of Q would take 2 DH/2 registers more and
 * spill at dh 128). */
ATTT_INLINE __attribute__((unused)) float attt_opaque(float x) {
    float y;
    __asm__ volatile("mov.b32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
#pragma omp end declare variant
#endif
#endif

#ifdef OMPK_NV_KERNELS

typedef struct attt_f4 {
    float v[4];
} __attribute__((aligned(16))) attt_f4;

typedef struct attt_f2 {
    float v[2];
} __attribute__((aligned(8))) attt_f2;

ATTT_INLINE uint32_t attt_bits(float x) {
    union {
        float f;
        uint32_t u;
    } c;
    c.f = x;
    return c.u;
}

ATTT_INLINE float attt_float(uint32_t u) {
    union {
        uint32_t u;
        float f;
    } c;
    c.u = u;
    return c.f;
}

/* x = hi + lo: hi is x truncated to tf32, lo the exact remainder (|lo| < 2^-10 |x|, the sign
 * of x) truncated to tf32. An infinite operand b meets a_lo * b_hi + a_hi * b_hi (+ a_hi * b_lo)
 * and must give sign(a) * inf, as one product would: so lo never has the opposite sign of hi
 * (rounding hi would allow it, and inf - inf), and a nonzero x never has lo = 0 (0 * inf): lo is
 * then the smallest normal with x's sign, whose products are negligible or flushed. NaN stays
 * NaN in hi (truncation could turn a NaN with a small payload into inf). */
ATTT_INLINE void attt_split(float x, uint32_t *hi, uint32_t *lo) {
    const uint32_t u = attt_bits(x), mag = u & 0x7fffffffu, tiny = (u & 0x80000000u) | 0x00800000u;
    const uint32_t h = mag > 0x7f800000u ? 0x7fffffffu : u & 0xffffe000u;
    const uint32_t l = attt_bits(x - attt_float(h)) & 0xffffe000u;
    *hi = h;
    *lo = mag == 0u ? 0u : mag >= 0x7f800000u || (l & 0x7fffffffu) == 0u ? tiny : l;
}

/* c += a * b in 3xTF32: the two small cross terms first, then the large one. */
ATTT_INLINE void attt_mma3(float c[4], const uint32_t ah[4], const uint32_t al[4], uint32_t bh0,
                           uint32_t bh1, uint32_t bl0, uint32_t bl1) {
    attt_mma(c, al, bh0, bh1);
    attt_mma(c, ah, bl0, bl1);
    attt_mma(c, ah, bh0, bh1);
}

/* Rows kt .. kt+31 of one head's K or V into a shared tile of pitch ld (zeros past M). */
ATTT_INLINE void attt_load_tile(float *tile, const float *base, int64_t rs, int64_t kt, int64_t M,
                                int tid, int ld, const int DH) {
    for (int c = tid; c < ATTT_BK * DH / 4; c += 128) {
        const int rr = c / (DH / 4), cc = (c - rr * (DH / 4)) * 4;
        float *d = tile + rr * ld + cc;
        if (kt + rr < M) {
            attt_cp16(d, base + (kt + rr) * rs + cc);
        } else {
            attt_f4 z = {{0.f, 0.f, 0.f, 0.f}};
            *(attt_f4 *)d = z;
        }
    }
}

/* One team: 64 query rows (block qb of head (b, h)), DH a compile-time constant. */
ATTT_INLINE void attt_fwd_team(const ompk_attn_geom *g, const float *q, const float *k,
                               const float *v, float *out, float *lse, float *sk, float *sv,
                               const int DH) {
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
    const float *q0 = q + b * g->qs[0] + h * g->qs[1] + r0 * g->qs[2];
    const float *q1 = q + b * g->qs[0] + h * g->qs[1] + r1 * g->qs[2];
    ATTT_UNROLL
    for (int c = 0; c < DH / 16; c++) {
        const attt_f4 z = {{0.f, 0.f, 0.f, 0.f}};
        const attt_f4 x0 = r0 < N ? *(const attt_f4 *)(q0 + c * 16 + t4 * 4) : z;
        const attt_f4 x1 = r1 < N ? *(const attt_f4 *)(q1 + c * 16 + t4 * 4) : z;
        ATTT_UNROLL
        for (int i = 0; i < 4; i++) {
            qr[c][0][i] = x0.v[i];
            qr[c][1][i] = x1.v[i];
        }
    }
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
        attt_load_tile(sk, kh, g->ks[2], 0, M, tid, LDK, DH);
        attt_cp_commit();
        attt_load_tile(sv, vh, g->vs[2], 0, M, tid, LDV, DH);
        attt_cp_commit();
    }
    for (int64_t kt = 0; kt < jmax; kt += ATTT_BK) {
        attt_cp_wait1();
        OMPK_SYNC();

        float s[4][4];
        ATTT_UNROLL
        for (int nt = 0; nt < 4; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
        ATTT_UNROLL
        for (int c = 0; c < DH / 16; c++) {
            /* A fragments of k-steps 2c (columns +0, +1) and 2c+1 (+2, +3) */
            uint32_t ah[2][4], al[2][4];
            ATTT_UNROLL
            for (int st = 0; st < 2; st++) {
                attt_split(attt_opaque(qr[c][0][2 * st]), &ah[st][0], &al[st][0]);
                attt_split(attt_opaque(qr[c][1][2 * st]), &ah[st][1], &al[st][1]);
                attt_split(attt_opaque(qr[c][0][2 * st + 1]), &ah[st][2], &al[st][2]);
                attt_split(attt_opaque(qr[c][1][2 * st + 1]), &ah[st][3], &al[st][3]);
            }
            ATTT_UNROLL
            for (int nt = 0; nt < 4; nt++) {
                const attt_f4 kv = *(const attt_f4 *)(sk + (nt * 8 + gq) * LDK + c * 16 + t4 * 4);
                uint32_t bh[4], bl[4];
                ATTT_UNROLL
                for (int i = 0; i < 4; i++) attt_split(kv.v[i], &bh[i], &bl[i]);
                /* 16 columns at a time into a fresh accumulator: large logits would otherwise
                 * round every product into a sum of their full size */
                float t[4] = {0.f, 0.f, 0.f, 0.f};
                attt_mma3(t, ah[0], al[0], bh[0], bh[1], bl[0], bl[1]);
                attt_mma3(t, ah[1], al[1], bh[2], bh[3], bl[2], bl[3]);
                ATTT_UNROLL
                for (int e = 0; e < 4; e++) s[nt][e] += t[e];
            }
        }
        OMPK_SYNC(); /* every warp is done with this K tile */
        if (kt + ATTT_BK < jmax) attt_load_tile(sk, kh, g->ks[2], kt + ATTT_BK, M, tid, LDK, DH);
        attt_cp_commit();

        /* visible keys of this tile for rows r0 and r1, as tile-relative counts */
        const int c0 = (int)(lim0 - kt < ATTT_BK ? lim0 - kt : ATTT_BK);
        const int c1 = (int)(lim1 - kt < ATTT_BK ? lim1 - kt : ATTT_BK);
        att_softmax_tile(s, 4, o, DH, t4, c0, c1, sl2, &m0, &m1, &l0, &l1);
        attt_cp_wait1();
        OMPK_SYNC(); /* this V tile has landed */
        ATTT_UNROLL
        for (int kk = 0; kk < 4; kk++) {
            /* P's A fragment: k = t4 is key 2 t4 (C element 0 / 2), k = t4 + 4 key 2 t4 + 1 */
            uint32_t ph[4], pl[4];
            attt_split(s[kk][0], &ph[0], &pl[0]);
            attt_split(s[kk][2], &ph[1], &pl[1]);
            attt_split(s[kk][1], &ph[2], &pl[2]);
            attt_split(s[kk][3], &ph[3], &pl[3]);
            const float *v0 = sv + (kk * 8 + t4 * 2) * LDV + gq * 2;
            ATTT_UNROLL
            for (int j = 0; j < DH / 16; j++) {
                /* x0 / x1: keys 2 t4 / 2 t4 + 1 (B rows k = t4 / t4 + 4) of n-tiles 2j, 2j+1 */
                const attt_f2 x0 = *(const attt_f2 *)(v0 + j * 16);
                const attt_f2 x1 = *(const attt_f2 *)(v0 + LDV + j * 16);
                uint32_t bh[4], bl[4];
                attt_split(x0.v[0], &bh[0], &bl[0]);
                attt_split(x1.v[0], &bh[1], &bl[1]);
                attt_split(x0.v[1], &bh[2], &bl[2]);
                attt_split(x1.v[1], &bh[3], &bl[3]);
                attt_mma3(o[2 * j], ph, pl, bh[0], bh[1], bl[0], bl[1]);
                attt_mma3(o[2 * j + 1], ph, pl, bh[2], bh[3], bl[2], bl[3]);
            }
        }
        OMPK_SYNC(); /* every warp is done with this V tile */
        if (kt + ATTT_BK < jmax) attt_load_tile(sv, vh, g->vs[2], kt + ATTT_BK, M, tid, LDV, DH);
        attt_cp_commit();
    }
    l0 += attt_xor(l0, 1);
    l0 += attt_xor(l0, 2);
    l1 += attt_xor(l1, 1);
    l1 += attt_xor(l1, 2);
    /* 0 / -inf only for a row that sees no key; a NaN sum (a NaN score) stays NaN */
    const float i0 = lim0 > 0 ? 1.f / l0 : 0.f, i1 = lim1 > 0 ? 1.f / l1 : 0.f;
    float *o0 = out + b * g->os[0] + h * g->os[1] + r0 * g->os[2];
    float *o1 = out + b * g->os[0] + h * g->os[1] + r1 * g->os[2];
    ATTT_UNROLL
    for (int j = 0; j < DH / 16; j++) {
        /* columns 16j + 4 t4 .. + 3 are elements 0 and 1 of n-tiles 2j, 2j+1 interleaved */
        const attt_f4 y0 = {
            {o[2 * j][0] * i0, o[2 * j + 1][0] * i0, o[2 * j][1] * i0, o[2 * j + 1][1] * i0}};
        const attt_f4 y1 = {
            {o[2 * j][2] * i1, o[2 * j + 1][2] * i1, o[2 * j][3] * i1, o[2 * j + 1][3] * i1}};
        if (r0 < N) *(attt_f4 *)(o0 + j * 16 + t4 * 4) = y0;
        if (r1 < N) *(attt_f4 *)(o1 + j * 16 + t4 * 4) = y1;
    }
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

/* One kernel per head dim, so each gets its own register allocation. */
// clang-format off
#define ATTT_LAUNCH(DH)                                                                            \
    static void attt_launch_##DH(ompk_exec ex, const ompk_attn_geom *gp, const float *q,           \
                                 const float *k, const float *v, float *out, float *lse) {         \
        const ompk_attn_geom g = *gp;                                                              \
        const int teams = (int)(g.B * g.Hq * ((g.N + ATTT_BQ - 1) / ATTT_BQ));                     \
        _Pragma("omp target teams ompx_bare num_teams(teams) thread_limit(128) device(ex.device) is_device_ptr(q, k, v, out, lse) firstprivate(g)") \
        {                                                                                          \
            static float sk[ATTT_SK_FLOATS] __attribute__((aligned(16)));                          \
            static float sv[ATTT_SV_FLOATS] __attribute__((aligned(16)));                          \
            _Pragma("omp allocate(sk, sv) allocator(omp_pteam_mem_alloc)")                         \
            attt_fwd_team(&g, q, k, v, out, lse, sk, sv, DH);                                      \
        }                                                                                          \
    }
ATTT_LAUNCH(32)
ATTT_LAUNCH(64)
ATTT_LAUNCH(80)
ATTT_LAUNCH(96)
ATTT_LAUNCH(128)
// clang-format on

void ompk_attn_fwd_f32tc(ompk_exec ex, const ompk_attn_geom *g, const void *q, const void *k,
                         const void *v, void *out, float *lse) {
#define ATTT_FWD(D) attt_launch_##D(ex, g, q, k, v, out, lse)
    ATT_SWITCH_DH_TC(g->dh, ATTT_FWD)
#undef ATTT_FWD
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
