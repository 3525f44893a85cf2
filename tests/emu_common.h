/* Shared by the host emulation suites (tests/test_*_emu.c), included right after the kernel
 * source they emulate: the kernels' loops over register arrays carry unroll pragmas; with the
 * emulated warp instructions (team syncs inside) the host compiler may keep them rolled, which
 * is harmless here (host arrays live in memory anyway), so that warning is off. */
#ifndef OMPK_TEST_EMU_COMMON_H
#define OMPK_TEST_EMU_COMMON_H

#if defined(__clang__)
#pragma clang diagnostic ignored "-Wpass-failed"
#endif

#include <stdint.h>
#include <stdlib.h>

#include "bf16.h"

/* The suites' inputs: a 64-bit LCG, uniform in [-1, 1), seeded per test by emu_seed. */
static inline uint64_t *emu_rng_state(void) {
    static uint64_t s;
    return &s;
}
static inline void emu_seed(uint64_t s) {
    *emu_rng_state() = s;
}
static inline double emu_rnd(void) {
    uint64_t *s = emu_rng_state();
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(*s >> 11) / (double)(1ull << 52) - 1.0;
}
/* numel bf16 values scale * emu_rnd(), 16-byte aligned */
static inline uint16_t *emu_bf16_tensor(int64_t numel, double scale) {
    uint16_t *p = aligned_alloc(16, (size_t)((numel * 2 + 15) / 16 * 16));
    for (int64_t i = 0; i < numel; i++) p[i] = ompk_f32_to_bf16((float)(scale * emu_rnd()));
    return p;
}

#endif
