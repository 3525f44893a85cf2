/* Shared by the host emulation suites (tests/test_*_emu.c), included right after the kernel
 * source they emulate:
 *  - the kernels' loops over register arrays carry unroll pragmas; with the emulated warp
 *    instructions (barriers inside) the host compiler may keep them rolled, which is harmless
 *    here (host arrays live in memory anyway), so that warning is off;
 *  - an emulated team is up to 1024 host threads on a CI machine of a few cores: waiting threads
 *    sleep instead of spinning (OMP_WAIT_POLICY is read when the OpenMP runtime starts, after
 *    this constructor). */
#ifndef OMPK_TEST_EMU_COMMON_H
#define OMPK_TEST_EMU_COMMON_H

#include <stdlib.h>

#if defined(__clang__)
#pragma clang diagnostic ignored "-Wpass-failed"
#endif

static void __attribute__((constructor)) emu_passive_wait(void) {
    setenv("OMP_WAIT_POLICY", "passive", 0);
}

#endif
