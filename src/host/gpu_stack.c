/* The GPU thread stack of GCC offload builds.
 *
 * GCC's nvptx code keeps the SIMT-private arrays and the spills of the portable kernels in each
 * GPU thread's native stack, and reaches them through libgomp's GOMP_parallel, an indirect call,
 * so the PTX JIT cannot size that stack and each thread gets the context's CU_LIMIT_STACK_SIZE.
 * GCC 12's libgomp leaves CUDA's default, smaller than the deepest kernels need (their frame plus
 * the libgomp frames below it), and those kernels overflow it. So on the first GPU call per
 * device, ompk raises the limit of the context the kernels run in (gpu_ctx.c), unless it is
 * larger already. CUDA reserves the limit for every thread the device can hold at once, so it
 * costs device memory (the limit x the threads an SM holds x the SMs). LLVM's plugin sizes the
 * stacks of clang's kernels itself: clang builds change nothing. */
#include <stdatomic.h>

#include "gpu_ctx.h"
#include "gpu_stack.h"

#define STACK_MAX_DEV 64
#define CU_LIMIT_STACK_SIZE 0

#ifdef OMPK_OFFLOAD_GCC_NVPTX
/* about twice the deepest chain of frames ptxas gives the kernels and libgomp, rounded up to a
 * power of two (bench/results/INDEX.md, the gcc-offload stack run, has the measurement) */
#define STACK_BYTES 8192
#else
#define STACK_BYTES 0
#endif

/* 0: not tried yet; 1: settled (raised, large enough already, or impossible) */
static atomic_int settled[STACK_MAX_DEV];

/* In the context device dev's kernels run in: its stack limit into *now, then, with want > *now,
 * the limit raised to want. As ompk_cu_enter returns. */
static int in_ctx(int dev, size_t want, size_t *now) {
    const ompk_cu *d = ompk_cu_driver();
    ompk_cu_scope s;
    const int r = ompk_cu_enter(d, dev, &s);
    if (r != 1) return r;
    int rc = -1;
    if (d->get_limit(now, CU_LIMIT_STACK_SIZE) == 0) {
        rc = 1;
        if (want > *now && d->set_limit(CU_LIMIT_STACK_SIZE, want) == 0) *now = want;
    }
    ompk_cu_leave(d, &s);
    return rc;
}

void ompk_gpu_stack_prepare(int dev) {
    if (!STACK_BYTES || dev < 0 || dev >= STACK_MAX_DEV ||
        atomic_load_explicit(&settled[dev], memory_order_acquire))
        return;
    /* as for the wait mode: two threads may both settle it, to the same result */
    size_t now = 0;
    if (in_ctx(dev, STACK_BYTES, &now) != 0)
        atomic_store_explicit(&settled[dev], 1, memory_order_release);
}

long long ompk_gpu_stack_limit(int dev) {
    size_t now = 0;
    const int r = in_ctx(dev, 0, &now);
    return r == 1 ? (long long)now : r;
}

long long ompk_gpu_stack_wanted(void) {
    return STACK_BYTES;
}
