/* How the host thread waits for a GPU at the end of a synchronous target region.
 *
 * LLVM 19's CUDA plugin gives the device's primary context CU_CTX_SCHED_BLOCKING_SYNC when it
 * creates it, so every synchronous target region ends with the thread asleep on an OS primitive
 * until an interrupt wakes it. On the GPU machine (a VM) that wake-up costs tens of microseconds
 * per region (bench/results/INDEX.md, Decisions), more than many of our
 * kernels take. CUDA's own default for a process with fewer contexts than cores is to spin. So
 * on the first GPU call per device, ompk switches the context the kernels run in (gpu_ctx.c) to
 * spinning (cuCtxSetFlags, CUDA 12.1+), unless OMPK_GPU_WAIT says otherwise. Spinning keeps one
 * host core busy while a call waits, which is what CUDA does by default. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_ctx.h"
#include "gpu_wait.h"

#define GW_MAX_DEV 64
#define GW_SCHED_SPIN 0x1u
#define GW_SCHED_YIELD 0x2u
#define GW_SCHED_BLOCKING 0x4u
#define GW_SCHED_MASK 0x7u

/* 0: not tried yet; 1: settled (set, left alone, or impossible) */
static atomic_int settled[GW_MAX_DEV];

static unsigned wanted_flags(void) {
    const char *e = getenv("OMPK_GPU_WAIT");
    if (e && !strcmp(e, "block")) return 0; /* keep what the runtime chose */
    if (e && !strcmp(e, "yield")) return GW_SCHED_YIELD;
    return GW_SCHED_SPIN;
}

/* In the context device dev's kernels run in, made current for the call: its live flags into
 * *live, then, with set != 0, its scheduling bits replaced by set. The live flags come from the
 * context itself: cuDevicePrimaryCtxGetState reports the ones it was created with, not those
 * cuCtxSetFlags gave it later. 1: done; 0: the runtime has not created the context yet; -1: no
 * CUDA driver or context to work with. */
static int in_ctx(int dev, unsigned set, unsigned *live) {
    const ompk_cu *d = ompk_cu_driver();
    if (!d || !d->get_flags || !d->set_flags) return -1;
    ompk_cu_scope s;
    const int r = ompk_cu_enter(d, dev, &s);
    if (r != 1) return r;
    int rc = -1;
    unsigned flags = 0;
    if (d->get_flags(&flags) == 0) {
        rc = 1;
        if (live) *live = flags;
        if (set && (flags & GW_SCHED_MASK) != set) d->set_flags((flags & ~GW_SCHED_MASK) | set);
    }
    ompk_cu_leave(d, &s);
    return rc;
}

void ompk_gpu_wait_prepare(int dev) {
    if (dev < 0 || dev >= GW_MAX_DEV || atomic_load_explicit(&settled[dev], memory_order_acquire))
        return;
    /* two threads may both settle the same context; the result is the same. Until the runtime
     * has created the context (0), look again on the next call. */
    const unsigned want = wanted_flags();
    if (!want || in_ctx(dev, want, NULL) != 0)
        atomic_store_explicit(&settled[dev], 1, memory_order_release);
}

const char *ompk_gpu_wait_mode(int dev) {
    unsigned flags = 0;
    const int r = in_ctx(dev, 0, &flags);
    if (r < 0) return "unknown (no CUDA driver or context)";
    if (r == 0) return "no context yet";
    switch (flags & GW_SCHED_MASK) {
    case GW_SCHED_SPIN:
        return "spin";
    case GW_SCHED_YIELD:
        return "yield";
    case GW_SCHED_BLOCKING:
        return "block";
    default:
        return "auto";
    }
}
