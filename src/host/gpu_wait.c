/* How the host thread waits for a GPU at the end of a synchronous target region.
 *
 * LLVM 19's CUDA plugin gives the device's primary context CU_CTX_SCHED_BLOCKING_SYNC when it
 * creates it, so every synchronous target region ends with the thread asleep on an OS primitive
 * until an interrupt wakes it. On the GPU machine (a VM) that wake-up costs tens of microseconds
 * per region (bench/results/INDEX.md, Decisions), more than many of our
 * kernels take. CUDA's own default for a process with fewer contexts than cores is to spin. So
 * on the first GPU call per device, ompk switches that context to spinning (cuCtxSetFlags, CUDA
 * 12.1+), unless OMPK_GPU_WAIT says otherwise. Spinning keeps one host core busy while a call
 * waits, which is what CUDA does by default.
 *
 * libcuda is looked up only if the offload plugin has already loaded it (RTLD_NOLOAD): ompk adds
 * no dependency, and on a machine without the CUDA plugin nothing happens. The driver functions
 * are declared here with the types of their C ABI, so no CUDA header is needed either. */
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_wait.h"

#define GW_MAX_DEV 64
#define GW_SCHED_SPIN 0x1u
#define GW_SCHED_YIELD 0x2u
#define GW_SCHED_BLOCKING 0x4u
#define GW_SCHED_MASK 0x7u

typedef int (*gw_dev_get_f)(int *, int);
typedef int (*gw_state_f)(int, unsigned *, int *);
typedef int (*gw_retain_f)(void **, int);
typedef int (*gw_release_f)(int);
typedef int (*gw_ctx_get_f)(void **);
typedef int (*gw_ctx_set_f)(void *);
typedef int (*gw_flags_f)(unsigned);
typedef int (*gw_get_flags_f)(unsigned *);

typedef struct gw_driver {
    gw_dev_get_f dev_get;
    gw_state_f state;
    gw_retain_f retain;
    gw_release_f release;
    gw_ctx_get_f ctx_get;
    gw_ctx_set_f ctx_set;
    gw_flags_f set_flags;
    gw_get_flags_f get_flags;
} gw_driver;

/* 0: not tried yet; 1: settled (set, left alone, or impossible) */
static atomic_int settled[GW_MAX_DEV];

static int load_driver(gw_driver *d) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h) return 0;
    d->dev_get = (gw_dev_get_f)dlsym(h, "cuDeviceGet");
    d->state = (gw_state_f)dlsym(h, "cuDevicePrimaryCtxGetState");
    d->retain = (gw_retain_f)dlsym(h, "cuDevicePrimaryCtxRetain");
    d->release = (gw_release_f)dlsym(h, "cuDevicePrimaryCtxRelease_v2");
    d->ctx_get = (gw_ctx_get_f)dlsym(h, "cuCtxGetCurrent");
    d->ctx_set = (gw_ctx_set_f)dlsym(h, "cuCtxSetCurrent");
    d->set_flags = (gw_flags_f)dlsym(h, "cuCtxSetFlags");
    d->get_flags = (gw_get_flags_f)dlsym(h, "cuCtxGetFlags");
    /* the handle stays open: the plugin holds libcuda for the life of the process anyway */
    return d->dev_get && d->state && d->retain && d->release && d->ctx_get && d->ctx_set;
}

static unsigned wanted_flags(void) {
    const char *e = getenv("OMPK_GPU_WAIT");
    if (e && !strcmp(e, "block")) return 0; /* keep what the runtime chose */
    if (e && !strcmp(e, "yield")) return GW_SCHED_YIELD;
    return GW_SCHED_SPIN;
}

/* In device dev's primary context, made current for the call (the caller's is restored): its
 * live flags into *live, then, with set != 0, its scheduling bits replaced by set. The live flags
 * come from the context itself: cuDevicePrimaryCtxGetState reports the ones it was created with,
 * not those cuCtxSetFlags gave it later. 1: done; 0: the runtime has not created the context yet;
 * -1: no CUDA driver or context to work with. */
static int in_primary(int dev, unsigned set, unsigned *live) {
    gw_driver d;
    if (dev < 0 || !load_driver(&d) || !d.get_flags || !d.set_flags) return -1;
    int cu = 0, active = 0;
    unsigned created = 0;
    if (d.dev_get(&cu, dev) != 0 || d.state(cu, &created, &active) != 0) return -1;
    if (!active) return 0;
    void *prev = NULL, *ctx = NULL;
    int rc = -1;
    if (d.ctx_get(&prev) != 0 || d.retain(&ctx, cu) != 0) return -1;
    if (d.ctx_set(ctx) == 0) {
        unsigned flags = 0;
        if (d.get_flags(&flags) == 0) {
            rc = 1;
            if (live) *live = flags;
            if (set && (flags & GW_SCHED_MASK) != set) d.set_flags((flags & ~GW_SCHED_MASK) | set);
        }
        d.ctx_set(prev);
    }
    d.release(cu);
    return rc;
}

void ompk_gpu_wait_prepare(int dev) {
    if (dev < 0 || dev >= GW_MAX_DEV || atomic_load_explicit(&settled[dev], memory_order_acquire))
        return;
    /* two threads may both settle the same context; the result is the same. Until the runtime
     * has created the context (0), look again on the next call. */
    const unsigned want = wanted_flags();
    if (!want || in_primary(dev, want, NULL) != 0)
        atomic_store_explicit(&settled[dev], 1, memory_order_release);
}

const char *ompk_gpu_wait_mode(int dev) {
    unsigned flags = 0;
    const int r = in_primary(dev, 0, &flags);
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
