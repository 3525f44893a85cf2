/* The CUDA driver and the context a device's kernels run in, for the settings ompk gives that
 * context (gpu_wait.c: how a host thread waits; gpu_stack.c: the GPU thread stack of GCC builds).
 *
 * libcuda is looked up only if the offload plugin has already loaded it (RTLD_NOLOAD): ompk adds
 * no dependency, and on a machine without the CUDA plugin nothing happens. The driver functions
 * are declared (gpu_ctx.h) with the types of their C ABI, so no CUDA header is needed either.
 *
 * Which context: LLVM's CUDA plugin runs a device's kernels in its primary context. GCC's libgomp
 * nvptx plugin runs them in the context that was current on the thread that initialised the
 * device, or else in one it creates (cuCtxCreate), and makes it current on each host thread it
 * serves; so in GCC builds the context is the one current after libgomp has served this thread. */
#include <dlfcn.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>

#include "gpu_ctx.h"
#include "gpu_stack.h"
#include "gpu_wait.h"

static ompk_cu driver;
static atomic_int driver_ready;
static pthread_mutex_t driver_lock = PTHREAD_MUTEX_INITIALIZER;

static void driver_load(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h) return;
    ompk_cu d;
    d.dev_get = (int (*)(int *, int))dlsym(h, "cuDeviceGet");
    d.primary_state = (int (*)(int, unsigned *, int *))dlsym(h, "cuDevicePrimaryCtxGetState");
    d.primary_retain = (int (*)(void **, int))dlsym(h, "cuDevicePrimaryCtxRetain");
    d.primary_release = (int (*)(int))dlsym(h, "cuDevicePrimaryCtxRelease_v2");
    d.ctx_get = (int (*)(void **))dlsym(h, "cuCtxGetCurrent");
    d.ctx_set = (int (*)(void *))dlsym(h, "cuCtxSetCurrent");
    d.ctx_device = (int (*)(int *))dlsym(h, "cuCtxGetDevice");
    d.get_flags = (int (*)(unsigned *))dlsym(h, "cuCtxGetFlags");
    d.set_flags = (int (*)(unsigned))dlsym(h, "cuCtxSetFlags");
    d.get_limit = (int (*)(size_t *, int))dlsym(h, "cuCtxGetLimit");
    d.set_limit = (int (*)(int, size_t))dlsym(h, "cuCtxSetLimit");
    if (!d.dev_get || !d.primary_state || !d.primary_retain || !d.primary_release || !d.ctx_get ||
        !d.ctx_set || !d.ctx_device || !d.get_limit || !d.set_limit) {
        dlclose(h);
        return;
    }
    /* the handle stays open: the plugin holds libcuda for the life of the process anyway */
    driver = d;
    atomic_store_explicit(&driver_ready, 1, memory_order_release);
}

const ompk_cu *ompk_cu_driver(void) {
    if (!atomic_load_explicit(&driver_ready, memory_order_acquire)) {
        /* until the plugin has loaded libcuda, look again on the next call */
        pthread_mutex_lock(&driver_lock);
        if (!atomic_load_explicit(&driver_ready, memory_order_relaxed)) driver_load();
        pthread_mutex_unlock(&driver_lock);
    }
    return atomic_load_explicit(&driver_ready, memory_order_acquire) ? &driver : NULL;
}

int ompk_cu_enter(const ompk_cu *d, int dev, ompk_cu_scope *s) {
    s->prev = NULL;
    s->primary = 0;
    int cu = 0;
    if (!d || dev < 0 || d->dev_get(&cu, dev) != 0) return -1;
#ifdef OMPK_OFFLOAD_GCC_NVPTX
    /* an allocation has libgomp initialise the device if it has not yet and attach its context
     * to this thread; it stays current there, as libgomp leaves it */
    void *p = omp_target_alloc(16, dev);
    if (!p) return -1;
    omp_target_free(p, dev);
    void *cur = NULL;
    int cur_dev = -1;
    if (d->ctx_get(&cur) != 0 || !cur || d->ctx_device(&cur_dev) != 0 || cur_dev != cu) return -1;
    return 1;
#else
    unsigned created = 0;
    int active = 0;
    if (d->primary_state(cu, &created, &active) != 0) return -1;
    if (!active) return 0;
    void *ctx = NULL;
    if (d->ctx_get(&s->prev) != 0 || d->primary_retain(&ctx, cu) != 0) return -1;
    if (d->ctx_set(ctx) != 0) {
        d->primary_release(cu);
        return -1;
    }
    s->primary = cu + 1;
    return 1;
#endif
}

void ompk_cu_leave(const ompk_cu *d, ompk_cu_scope *s) {
    if (!s->primary) return;
    d->ctx_set(s->prev);
    d->primary_release(s->primary - 1);
    s->primary = 0;
}

void ompk_gpu_prepare(int dev) {
    ompk_gpu_wait_prepare(dev);
    ompk_gpu_stack_prepare(dev);
}
