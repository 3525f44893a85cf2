/* Internal: the prelude of the bare GPU kernels (ompx_bare target regions, whose threads address
 * their team by number and synchronise it themselves), one for every kernel source:
 *   OMPK_BARE_KERNELS  bare kernels are compiled: a clang offload build, or a host emulation;
 *   OMPK_BARE_DEVICE   for a real device (a clang offload build, not emulated);
 *   OMPK_NV_KERNELS, OMPK_NV_DEVICE  the same for the NVIDIA-only kernels (inline PTX, nvvm
 *                      builtins, 32-lane warp collectives, mma.sync): an emulation, or an offload
 *                      build for NVPTX (OMPK_OFFLOAD_NVPTX, set by CMake for the host and the
 *                      device compilation alike, so that the host's dispatch and the image agree);
 *                      other targets (AMDGPU) build the portable kernels and bare ones only;
 *   OMPK_TID(), OMPK_BID(), OMPK_SYNC()  the thread's number in its team, the team's number,
 *                      the team barrier.
 * Host emulation (tests/test_*_emu.c, test_router_warp.c) runs a kernel's own code on the CI
 * machine: the test defines OMPK_EMULATE and includes tests/emu_team.h, which runs a team as
 * fibers and defines the hooks OMPK_EMU_TID() and OMPK_EMU_SYNC(), before the kernel source; it
 * sets ompk_emu_block to the team it runs. ptx_mma.h then emulates the warp instructions. */
#ifndef OMPK_TARGET_BARE_H
#define OMPK_TARGET_BARE_H

#if defined(OMPK_EMULATE)
#if !defined(OMPK_EMU_TID) || !defined(OMPK_EMU_SYNC)
#error "an emulated kernel needs OMPK_EMU_TID and OMPK_EMU_SYNC: include tests/emu_team.h first"
#endif
#include <omp.h>
#define OMPK_BARE_KERNELS 1
#define OMPK_NV_KERNELS 1
static int ompk_emu_block __attribute__((unused));
#define OMPK_TID() OMPK_EMU_TID()
#define OMPK_BID() ompk_emu_block
#define OMPK_SYNC() OMPK_EMU_SYNC()
#elif defined(__clang__) && defined(OMPK_OFFLOAD_BUILD)
#include <omp.h>
#include <ompx.h>
#define OMPK_BARE_KERNELS 1
#define OMPK_BARE_DEVICE 1
#define OMPK_TID() ompx_thread_id_x()
#define OMPK_BID() ompx_block_id_x()
#define OMPK_SYNC() ompx_sync_block_acq_rel()
#if defined(OMPK_OFFLOAD_NVPTX)
#if defined(__AMDGCN__)
#error "OMPK_OFFLOAD_NVPTX in a compilation for AMDGPU: one GPU vendor per build"
#endif
#define OMPK_NV_KERNELS 1
#define OMPK_NV_DEVICE 1
#endif
#endif

#endif
