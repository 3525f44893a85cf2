/* Memory on the host or an OpenMP device. Device memory comes from omp_target_alloc (plain
 * cudaMalloc in LLVM's CUDA plugin), so kernels take it with is_device_ptr. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "gpu_ctx.h"
#include "memset_kernel.h"
#include "ompk/tensor.h"

static int device_ok(ompk_device d, const char *fn) {
    if (d.type == OMPK_HOST) return 1;
    if (d.type == OMPK_TARGET && d.id >= 0 && d.id < omp_get_num_devices()) return 1;
    ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "no such device (type %d, id %d; %d OpenMP devices)",
              (int)d.type, d.id, omp_get_num_devices());
    return 0;
}

/* LLVM >= 18 keeps the device memory API in libomptarget, which host-only clang builds do not
 * link (and which crashes when no image registered it); there, no target device exists, so
 * these paths are unreachable and compiled out. GCC's libgomp always has the API. */
#if defined(OMPK_OFFLOAD_BUILD) || !defined(__clang__)
static void *tgt_alloc(size_t n, int dev) {
    return omp_target_alloc(n, dev);
}
static void tgt_free(void *p, int dev) {
    omp_target_free(p, dev);
}
static int tgt_memcpy(void *d, const void *s, size_t n, int dd, int sd) {
    const int rc = omp_target_memcpy(d, s, n, 0, 0, dd, sd);
#ifdef OMPK_OFFLOAD_GCC_NVPTX
    /* GCC 12's nvptx plugin returns from a device-to-device copy before the copy ends (an async
     * copy on the default stream); a target region there waits for it, as ompk_memcpy promises */
    if (rc == 0 && dd != omp_get_initial_device() && sd != omp_get_initial_device()) {
#pragma omp target device(dd)
        {
        }
    }
#endif
    return rc;
}
#else
static void *tgt_alloc(size_t n, int dev) {
    return (void)n, (void)dev, NULL;
}
static void tgt_free(void *p, int dev) {
    (void)p, (void)dev;
}
static int tgt_memcpy(void *d, const void *s, size_t n, int dd, int sd) {
    return (void)d, (void)s, (void)n, (void)dd, (void)sd, -1;
}
#endif

static int omp_id(ompk_device d) {
    return d.type == OMPK_HOST ? omp_get_initial_device() : d.id;
}

int ompk_device_count(void) {
    return omp_get_num_devices();
}

void *ompk_malloc(ompk_device device, size_t bytes) {
    static const char fn[] = "ompk_malloc";
    if (!device_ok(device, fn)) return NULL;
    size_t n = bytes ? bytes : 1;
    void *p = device.type == OMPK_HOST ? malloc(n) : tgt_alloc(n, device.id);
    if (!p)
        ompk_fail(OMPK_ERR_OUT_OF_MEMORY, fn, "%zu bytes on %s %d", bytes,
                  device.type == OMPK_HOST ? "host" : "device", device.id);
    return p;
}

void ompk_free(ompk_device device, void *ptr) {
    if (!ptr) return;
    if (device.type == OMPK_HOST)
        free(ptr);
    else if (device.id >= 0 && device.id < omp_get_num_devices())
        tgt_free(ptr, device.id);
}

ompk_status ompk_memcpy(void *dst, ompk_device dst_device, const void *src, ompk_device src_device,
                        size_t bytes) {
    static const char fn[] = "ompk_memcpy";
    if (!device_ok(dst_device, fn) || !device_ok(src_device, fn)) return OMPK_ERR_INVALID_ARGUMENT;
    if (bytes == 0) return OMPK_OK;
    if (!dst || !src) return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "NULL pointer");
    if (dst_device.type == OMPK_HOST && src_device.type == OMPK_HOST) {
        memmove(dst, src, bytes);
        return OMPK_OK;
    }
    /* a copy to or from a GPU waits for it like a kernel does */
    if (dst_device.type != OMPK_HOST) ompk_gpu_prepare(dst_device.id);
    if (src_device.type != OMPK_HOST) ompk_gpu_prepare(src_device.id);
    if (tgt_memcpy(dst, src, bytes, omp_id(dst_device), omp_id(src_device)) != 0)
        return ompk_fail(OMPK_ERR_RUNTIME, fn, "omp_target_memcpy of %zu bytes failed", bytes);
    return OMPK_OK;
}

ompk_status ompk_memset(void *dst, ompk_device device, int value, size_t bytes) {
    static const char fn[] = "ompk_memset";
    if (!device_ok(device, fn)) return OMPK_ERR_INVALID_ARGUMENT;
    if (bytes == 0) return OMPK_OK;
    if (!dst) return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "NULL pointer");
    if (device.type == OMPK_HOST) {
        memset(dst, value, bytes);
        return OMPK_OK;
    }
    ompk_gpu_prepare(device.id);
    ompk_memset_kernel(dst, device.id, (unsigned char)value, bytes);
    return OMPK_OK;
}
