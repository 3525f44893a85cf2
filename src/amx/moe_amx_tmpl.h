/* The AMX tile kernel, written once and compiled twice: moe_kern_amx.c maps the T_* macros to
 * the AMX intrinsics, moe_kern_amx_emu.c to a C emulation of the tile registers, so CI (no AMX)
 * runs exactly this code: tile configuration, tile shapes, strides, packed B addressing, the
 * int4 unpack and the group flushes; only the instructions themselves differ.
 *
 * Tiles (palette 1, all 16 rows x 64 bytes): C0 rows 0-15 stream 0, C1 rows 0-15 stream 1,
 * C2 rows 16-31 stream 0, C3 rows 16-31 stream 1; A4 rows 0-15, A5 rows 16-31 (k-tile t at
 * byte t*64 of each activation row, stride lda); B6 stream 0, B7 stream 1 (a packed tile,
 * stride 64). bf16: TDPBF16PS (16x32 by 16x(16x2)); int: TDPBSSD (16x64 by 16x(16x4)).
 * Required macros: MOE_AMX_FN, MOE_AMX_NAME, MOE_AMX_FLUSH, MOE_AMX_PIPE, T_CFG, T_LOAD,
 * T_STORE, T_ZERO, T_DPBF16, T_DPBSSD, T_UNPACK4, T_PF (prefetch of one packed tile), T_PF1 (of
 * one line); the prefetches do nothing in the emulation.
 *
 * Prefetch: a prefill streams every expert's weights from memory once while the tiles compute.
 * Self prefetch (k->self_pf) requests the B tiles MOE_PF_KT k-steps ahead (the packed streams are
 * contiguous, running past the last k-tile just touches the next n-block). Pipelined prefetch
 * (k->pf) spreads the next work item's lines over this call's k-steps: the row-block passes that
 * re-read B from L2 then keep the memory stream going too, so a core's demand on memory is even
 * instead of bursting during the first pass (one core's bandwidth is bounded by the requests it
 * can keep in flight, so bursts cost). */

#include "amx_tile_cfg.h"
#define MOE_PF_KT 8

/* Step s of total: this step's share of the pipelined prefetch regions. */
MOE_AMX_FN static inline void MOE_AMX_PIPE(const moe_kargs *k, int s, int total) {
    const int64_t step = k->pf_step > 0 ? k->pf_step : 64;
    for (int r = 0; r < 2; r++) {
        if (k->pf_bytes[r] <= 0) continue;
        const int64_t lines = (k->pf_bytes[r] + step - 1) / step;
        const int64_t l0 = lines * s / total, l1 = lines * (s + 1) / total;
        for (int64_t l = l0; l < l1; l++) T_PF1(k->pf[r] + l * step);
    }
}

/* Add the int32 C tiles of group g, scaled per column, into out (fp32), and clear them. */
MOE_AMX_FN static void MOE_AMX_FLUSH(const moe_kargs *k, int g, int two, int32_t *cst) {
    T_STORE(0, cst, 64);
    T_STORE(1, cst + 256, 64);
    if (two) {
        T_STORE(2, cst + 512, 64);
        T_STORE(3, cst + 768, 64);
    }
    T_ZERO(0);
    T_ZERO(1);
    T_ZERO(2);
    T_ZERO(3);
    for (int s = 0; s < 2; s++) {
        const float *sc = k->s[s] + (size_t)g * k->sstride;
        for (int h = 0; h <= two; h++) {
            const int32_t *c = cst + (h * 2 + s) * 256;
            float *o = k->out + (s * 32 + h * 16) * 16;
            for (int i = 0; i < 256; i++) o[i] = fmaf(sc[i & 15], (float)c[i], o[i]);
        }
    }
}

MOE_AMX_FN void MOE_AMX_NAME(const moe_kargs *k) {
    uint8_t cfg[64] __attribute__((aligned(64)));
    ompk_amx_cfg_full(cfg);
    T_CFG(cfg);
    const int two = k->m > 16;
    const int64_t lda = k->lda, bs = k->bstride;
    const uint8_t *a0 = k->a, *a1 = k->a + 16 * lda;
    float *o = k->out;
    T_ZERO(0);
    T_ZERO(1);
    T_ZERO(2);
    T_ZERO(3);
    if (k->fmt == OMPK_MOE_BF16) {
        for (int t = 0; t < k->kt; t++) {
            if (k->self_pf)
                T_PF(k->b[0] + (t + MOE_PF_KT) * bs, k->b[1] + (t + MOE_PF_KT) * bs, 1024);
            MOE_AMX_PIPE(k, t, k->kt);
            T_LOAD(4, a0 + t * 64, lda);
            T_LOAD(6, k->b[0] + t * bs, 64);
            T_LOAD(7, k->b[1] + t * bs, 64);
            T_DPBF16(0, 4, 6);
            T_DPBF16(1, 4, 7);
            if (two) {
                T_LOAD(5, a1 + t * 64, lda);
                T_DPBF16(2, 5, 6);
                T_DPBF16(3, 5, 7);
            }
        }
        T_STORE(0, o, 64);
        T_STORE(1, o + 512, 64);
        if (two) {
            T_STORE(2, o + 256, 64);
            T_STORE(3, o + 768, 64);
        }
        return;
    }
    uint8_t *u0 = k->scratch, *u1 = k->scratch + 1024;
    int32_t *cst = (int32_t *)(k->scratch + 2048);
    const int is4 = k->fmt != OMPK_MOE_INT8;
    int g0 = k->ktg0 / k->ktpg, gcur = 0, flushed = 0;
    for (int t = 0; t < k->kt; t++) {
        int g = (k->ktg0 + t) / k->ktpg - g0;
        if (g != gcur) {
            if (!flushed)
                for (int i = 0; i < 2 * 32 * 16; i++) o[i] = 0.0f;
            flushed = 1;
            MOE_AMX_FLUSH(k, gcur, two, cst);
            gcur = g;
        }
        const uint8_t *b0 = k->b[0] + t * bs, *b1 = k->b[1] + t * bs;
        if (k->self_pf) T_PF(b0 + MOE_PF_KT * bs, b1 + MOE_PF_KT * bs, is4 ? 512 : 1024);
        MOE_AMX_PIPE(k, t, k->kt);
        if (is4) {
            T_UNPACK4(u0, b0, k->z[0] + (size_t)g * k->zstride);
            T_UNPACK4(u1, b1, k->z[1] + (size_t)g * k->zstride);
            b0 = u0;
            b1 = u1;
        }
        T_LOAD(4, a0 + t * 64, lda);
        T_LOAD(6, b0, 64);
        T_LOAD(7, b1, 64);
        T_DPBSSD(0, 4, 6);
        T_DPBSSD(1, 4, 7);
        if (two) {
            T_LOAD(5, a1 + t * 64, lda);
            T_DPBSSD(2, 5, 6);
            T_DPBSSD(3, 5, 7);
        }
    }
    if (!flushed) {
        /* one group in this call (always for int8): scale straight from the int32 tiles */
        T_STORE(0, cst, 64);
        T_STORE(1, cst + 256, 64);
        if (two) {
            T_STORE(2, cst + 512, 64);
            T_STORE(3, cst + 768, 64);
        }
        for (int s = 0; s < 2; s++) {
            const float *sc = k->s[s] + (size_t)gcur * k->sstride;
            for (int r = 0; r < k->m; r++) {
                const int32_t *c = cst + ((r >> 4) * 2 + s) * 256 + (r & 15) * 16;
                float *orow = o + (s * 32 + r) * 16;
                for (int n = 0; n < 16; n++)
                    orow[n] = fmaf(sc[n], (float)c[n], 0.0f) * k->ascale[r];
            }
        }
        return;
    }
    MOE_AMX_FLUSH(k, gcur, two, cst);
    for (int s = 0; s < 2; s++)
        for (int r = 0; r < k->m; r++)
            for (int n = 0; n < 16; n++) o[(s * 32 + r) * 16 + n] *= k->ascale[r];
}

/* K-blocked variant (bf16 and int8): nsteps n-steps (weight streams b[s] + j*nstride, scales
 * s[st] + j*sstep, results out + j*1024) share one activation block; K is walked in chunks of
 * MOE_KC k-tiles so the A chunk (32 rows x MOE_KC*64 bytes) stays in L1 while every step's B
 * chunk streams past it. The C tiles of each step are parked in memory between chunks (fp32 in
 * out for bf16, int32 in scratch for int8), so each element sees exactly the same sequence of
 * operations as in the unblocked kernel: the results are bit-identical. */
#define MOE_KC 8
MOE_AMX_FN void MOE_AMX_NAME_N(const moe_kargs *k) {
    uint8_t cfg[64] __attribute__((aligned(64)));
    ompk_amx_cfg_full(cfg);
    T_CFG(cfg);
    const int two = k->m > 16, ns = k->nsteps, isbf = k->fmt == OMPK_MOE_BF16;
    const int64_t lda = k->lda, bs = k->bstride;
    const uint8_t *a0 = k->a, *a1 = k->a + 16 * lda;
    int32_t *acc = (int32_t *)(k->scratch + 2048);
    for (int kc = 0; kc < k->kt; kc += MOE_KC) {
        const int ke = kc + MOE_KC < k->kt ? kc + MOE_KC : k->kt;
        for (int j = 0; j < ns; j++) {
            const uint8_t *b0 = k->b[0] + j * k->nstride, *b1 = k->b[1] + j * k->nstride;
            uint8_t *cj = isbf ? (uint8_t *)(k->out + j * 1024) : (uint8_t *)(acc + j * 1024);
            /* C tile (rows h, stream s) at element (s*32 + h*16)*16 of the step's block */
            if (kc == 0) {
                T_ZERO(0);
                T_ZERO(1);
                T_ZERO(2);
                T_ZERO(3);
            } else {
                T_LOAD(0, cj, 64);
                T_LOAD(1, cj + 512 * 4, 64);
                if (two) {
                    T_LOAD(2, cj + 256 * 4, 64);
                    T_LOAD(3, cj + 768 * 4, 64);
                }
            }
            for (int t = kc; t < ke; t++) {
                if (k->self_pf) T_PF(b0 + (t + MOE_PF_KT) * bs, b1 + (t + MOE_PF_KT) * bs, 1024);
                MOE_AMX_PIPE(k, kc * ns + j * (ke - kc) + t - kc, k->kt * ns);
                T_LOAD(4, a0 + t * 64, lda);
                T_LOAD(6, b0 + t * bs, 64);
                T_LOAD(7, b1 + t * bs, 64);
                if (isbf) {
                    T_DPBF16(0, 4, 6);
                    T_DPBF16(1, 4, 7);
                } else {
                    T_DPBSSD(0, 4, 6);
                    T_DPBSSD(1, 4, 7);
                }
                if (two) {
                    T_LOAD(5, a1 + t * 64, lda);
                    if (isbf) {
                        T_DPBF16(2, 5, 6);
                        T_DPBF16(3, 5, 7);
                    } else {
                        T_DPBSSD(2, 5, 6);
                        T_DPBSSD(3, 5, 7);
                    }
                }
            }
            T_STORE(0, cj, 64);
            T_STORE(1, cj + 512 * 4, 64);
            if (two) {
                T_STORE(2, cj + 256 * 4, 64);
                T_STORE(3, cj + 768 * 4, 64);
            }
        }
    }
    if (isbf) return;
    for (int j = 0; j < ns; j++)
        for (int s = 0; s < 2; s++) {
            const float *sc = k->s[s] + j * k->sstep;
            for (int r = 0; r < k->m; r++) {
                const int32_t *c = acc + j * 1024 + (s * 32 + r) * 16;
                float *orow = k->out + j * 1024 + (s * 32 + r) * 16;
                for (int n = 0; n < 16; n++)
                    orow[n] = fmaf(sc[n], (float)c[n], 0.0f) * k->ascale[r];
            }
        }
}
