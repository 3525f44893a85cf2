/* The thread id and block barrier of an emulated team, for the *_EMULATE branches of the kernel
 * sources (host tests only): tests/emu_team.h defines them, running a team as fibers on one host
 * thread, and is included before the kernel source. */
#ifndef OMPK_TARGET_EMU_HOOKS_H
#define OMPK_TARGET_EMU_HOOKS_H

#if !defined(OMPK_EMU_TID) || !defined(OMPK_EMU_SYNC)
#error "an emulated kernel needs OMPK_EMU_TID and OMPK_EMU_SYNC: include tests/emu_team.h first"
#endif

#endif
