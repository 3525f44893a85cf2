/* The tile products of the AMX attention kernels (attention_amx.h), written once and compiled
 * twice: attention_amx.c maps the T_* macros to the AMX intrinsics, attention_amx_emu.c to the
 * tile emulation (amx_tile_emu.h). Required macros: ATX_FN (function attributes), ATX_NAME(x),
 * T_CFG, T_RELEASE, T_LOAD, T_STORE, T_ZERO, T_DPBF16.
 *
 * Tiles (palette 1, all 16 rows x 64 bytes): C0..C3 the 2 x 2 blocks of 16 x 16 f32 of a 32 x 32
 * result, A4 rows 0-15 and A5 rows 16-31 of the A operand's k-step, B6 and B7 the two packed
 * B tiles of the step: four TDPBF16PS per two A and two B loads. */

#include "amx_tile_cfg.h"

ATX_FN static void ATX_NAME(begin)(void) {
    uint8_t cfg[64] __attribute__((aligned(64)));
    ompk_amx_cfg_full(cfg);
    T_CFG(cfg);
}

ATX_FN static void ATX_NAME(end)(void) {
    T_RELEASE();
}

ATX_FN static void ATX_NAME(nt)(float *c, const uint16_t *a, int64_t lda, const uint32_t *bt,
                                int dc) {
    const uint8_t *a0 = (const uint8_t *)a, *a1 = a0 + 16 * lda;
    for (int h = 0; h < 2; h++) {
        const uint32_t *b0 = bt + (size_t)(2 * h) * dc * 256, *b1 = b0 + (size_t)dc * 256;
        T_ZERO(0);
        T_ZERO(1);
        T_ZERO(2);
        T_ZERO(3);
        for (int k = 0; k < dc; k++) {
            T_LOAD(4, a0 + 64 * k, lda);
            T_LOAD(5, a1 + 64 * k, lda);
            T_LOAD(6, b0 + 256 * k, 64);
            T_LOAD(7, b1 + 256 * k, 64);
            T_DPBF16(0, 4, 6);
            T_DPBF16(1, 4, 7);
            T_DPBF16(2, 5, 6);
            T_DPBF16(3, 5, 7);
        }
        T_STORE(0, c + 32 * h, 256);
        T_STORE(1, c + 32 * h + 16, 256);
        T_STORE(2, c + 16 * 64 + 32 * h, 256);
        T_STORE(3, c + 16 * 64 + 32 * h + 16, 256);
    }
}

ATX_FN static void ATX_NAME(acc)(float *c, int64_t ldc, const uint16_t *a, int64_t lda,
                                 const uint32_t *bp, int ks, int d16) {
    const uint8_t *a0 = (const uint8_t *)a, *a1 = a0 + 16 * lda;
    uint8_t *c0 = (uint8_t *)c, *c1 = c0 + 16 * ldc;
    for (int dd = 0; dd < d16; dd += 2) {
        T_LOAD(0, c0 + 64 * dd, ldc);
        T_LOAD(1, c0 + 64 * dd + 64, ldc);
        T_LOAD(2, c1 + 64 * dd, ldc);
        T_LOAD(3, c1 + 64 * dd + 64, ldc);
        for (int s = 0; s < ks; s++) {
            const uint32_t *b = bp + ((size_t)s * d16 + dd) * 256;
            T_LOAD(4, a0 + 64 * s, lda);
            T_LOAD(5, a1 + 64 * s, lda);
            T_LOAD(6, b, 64);
            T_LOAD(7, b + 256, 64);
            T_DPBF16(0, 4, 6);
            T_DPBF16(1, 4, 7);
            T_DPBF16(2, 5, 6);
            T_DPBF16(3, 5, 7);
        }
        T_STORE(0, c0 + 64 * dd, ldc);
        T_STORE(1, c0 + 64 * dd + 64, ldc);
        T_STORE(2, c1 + 64 * dd, ldc);
        T_STORE(3, c1 + 64 * dd + 64, ldc);
    }
}

const atx_ops ATX_NAME(ops) = {ATX_NAME(begin), ATX_NAME(end), ATX_NAME(nt), ATX_NAME(acc)};
