/* The ompk tensor descriptor: a non-owning, DLPack-compatible view, plus device memory helpers.
 * Every public kernel validates each descriptor it receives before touching memory.
 *
 * Thread safety: every function here may be called from any number of threads at once:
 * descriptors are plain values, and the memory helpers call the OpenMP runtime, which is
 * thread-safe. Memory one thread frees must not be in use by another. */
#ifndef OMPK_TENSOR_H
#define OMPK_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#include "ompk/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define OMPK_MAX_NDIM 8

typedef enum ompk_dtype {
    OMPK_F32 = 0,
    OMPK_BF16 = 1,
    OMPK_F16 = 2,
    OMPK_I8 = 3,
    OMPK_I4 = 4, /* signed 4-bit, two per byte, element 2k in the low nibble */
    OMPK_I32 = 5,
    OMPK_I64 = 6,
    OMPK_DTYPE_COUNT_ = 7
} ompk_dtype;

typedef enum ompk_device_type {
    OMPK_HOST = 0,  /* host memory; kernels run on the host's OpenMP threads */
    OMPK_TARGET = 1 /* memory of OpenMP offload device `id` (omp_target_alloc / cudaMalloc) */
} ompk_device_type;

typedef struct ompk_device {
    ompk_device_type type;
    int id; /* OpenMP device number for OMPK_TARGET; ignored for OMPK_HOST */
} ompk_device;

typedef struct ompk_tensor {
    void *data;
    ompk_dtype dtype;
    int32_t ndim;
    int64_t shape[OMPK_MAX_NDIM];
    int64_t strides[OMPK_MAX_NDIM]; /* in elements, never negative */
    ompk_device device;
} ompk_tensor;

ompk_device ompk_device_host(void);
ompk_device ompk_device_target(int id);
int ompk_device_equal(ompk_device a, ompk_device b);

/* Size of one element in bits (4 for OMPK_I4) and its name ("f32", "bf16", ...). */
int ompk_dtype_bits(ompk_dtype dtype);
const char *ompk_dtype_name(ompk_dtype dtype);

/* Size limits. A kernel accepts a view only if every dim and every stride is at most 2^40, it
 * has at most 2^46 elements, the elements it addresses lie within 2^46 elements of the first
 * one ((shape[d]-1)*strides[d] summed over the dims, plus 1), and its byte span does not wrap
 * the address space. Larger views fail with OMPK_ERR_INVALID_ARGUMENT before any arithmetic on
 * them can overflow. */

/* Fill *out. strides == NULL means contiguous row-major. Validates rank, dtype, non-negative
 * shape and strides and the size limits; returns OMPK_ERR_INVALID_ARGUMENT (and leaves *out
 * untouched) otherwise. */
ompk_status ompk_tensor_init(ompk_tensor *out, void *data, ompk_dtype dtype, int ndim,
                             const int64_t *shape, const int64_t *strides, ompk_device device);

/* Convenience for literals: a contiguous view, no validation (the kernels validate). */
ompk_tensor ompk_tensor_make(void *data, ompk_dtype dtype, int ndim, const int64_t *shape,
                             ompk_device device);

/* Element count: 0 for NULL or an empty view, -1 for a rank above OMPK_MAX_NDIM, a negative dim
 * or a count that does not fit int64. */
int64_t ompk_tensor_numel(const ompk_tensor *t);
int ompk_tensor_is_contiguous(const ompk_tensor *t);

/* DLPack interop (dlpack.h from libdlpack-dev). kDLCPU/kDLCUDAHost map to OMPK_HOST, kDLCUDA
 * device n to OMPK_TARGET n. byte_offset is folded into data (it must not wrap the pointer, and
 * NULL data takes none). Strides NULL = contiguous. The size limits above apply. */
ompk_status ompk_tensor_from_dlpack(const DLTensor *src, ompk_tensor *out);
/* The DLTensor borrows t's shape and strides arrays: keep *t alive while *out is used. */
ompk_status ompk_tensor_to_dlpack(const ompk_tensor *t, DLTensor *out);

/* Memory on any device. ompk_malloc returns NULL (and sets ompk_last_error) on failure. */
void *ompk_malloc(ompk_device device, size_t bytes);
void ompk_free(ompk_device device, void *ptr);
ompk_status ompk_memcpy(void *dst, ompk_device dst_device, const void *src, ompk_device src_device,
                        size_t bytes);
ompk_status ompk_memset(void *dst, ompk_device device, int value, size_t bytes);

/* Number of OpenMP offload devices (0 without a GPU or in a host-only build). */
int ompk_device_count(void);

#ifdef __cplusplus
}
#endif
#endif
