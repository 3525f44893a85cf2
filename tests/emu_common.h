/* Shared by the host emulation suites (tests/test_*_emu.c), included right after the kernel
 * source they emulate: the kernels' loops over register arrays carry unroll pragmas; with the
 * emulated warp instructions (team syncs inside) the host compiler may keep them rolled, which
 * is harmless here (host arrays live in memory anyway), so that warning is off. */
#ifndef OMPK_TEST_EMU_COMMON_H
#define OMPK_TEST_EMU_COMMON_H

#if defined(__clang__)
#pragma clang diagnostic ignored "-Wpass-failed"
#endif

#endif
