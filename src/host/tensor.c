/* Descriptor construction and queries. */
#include <string.h>

#include "check.h"
#include "error.h"
#include "ompk/tensor.h"

ompk_device ompk_device_host(void) {
    ompk_device d = {OMPK_HOST, 0};
    return d;
}

ompk_device ompk_device_target(int id) {
    ompk_device d = {OMPK_TARGET, id};
    return d;
}

int ompk_device_equal(ompk_device a, ompk_device b) {
    if (a.type != b.type) return 0;
    return a.type == OMPK_HOST || a.id == b.id;
}

int ompk_dtype_bits(ompk_dtype dtype) {
    switch (dtype) {
    case OMPK_F32:
        return 32;
    case OMPK_BF16:
        return 16;
    case OMPK_F16:
        return 16;
    case OMPK_I8:
        return 8;
    case OMPK_I4:
        return 4;
    case OMPK_I32:
        return 32;
    case OMPK_I64:
        return 64;
    default:
        return 0;
    }
}

const char *ompk_dtype_name(ompk_dtype dtype) {
    static const char *names[] = {"f32", "bf16", "f16", "i8", "i4", "i32", "i64"};
    if ((unsigned)dtype < (unsigned)OMPK_DTYPE_COUNT_) return names[dtype];
    return "invalid";
}

const char *ompk_tensor_sizes(const ompk_tensor *t, int64_t *numel, int64_t *extent) {
    *numel = 0;
    *extent = 0;
    if (t->ndim < 0 || t->ndim > OMPK_MAX_NDIM) return "invalid ndim";
    int empty = 0;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] < 0 || t->strides[d] < 0) return "negative shape or stride";
        if (t->shape[d] > OMPK_MAX_DIM || t->strides[d] > OMPK_MAX_DIM)
            return "dim or stride too large";
        empty |= t->shape[d] == 0;
    }
    if (empty) return NULL;
    int64_t n = 1, last = 0; /* last: offset in elements of the last element */
    for (int d = 0; d < t->ndim; d++) {
        int64_t step;
        if (!ompk_mul_i64(n, t->shape[d], &n) || n > OMPK_MAX_NUMEL) return "too many elements";
        if (!ompk_mul_i64(t->shape[d] - 1, t->strides[d], &step) ||
            !ompk_add_i64(last, step, &last) || last >= OMPK_MAX_NUMEL)
            return "strides span too many elements";
    }
    *numel = n;
    *extent = last + 1;
    return NULL;
}

ompk_status ompk_tensor_init(ompk_tensor *out, void *data, ompk_dtype dtype, int ndim,
                             const int64_t *shape, const int64_t *strides, ompk_device device) {
    static const char fn[] = "ompk_tensor_init";
    if (!out) return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "out is NULL");
    if (ompk_dtype_bits(dtype) == 0)
        return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "unknown dtype %d", (int)dtype);
    if (ndim < 0 || ndim > OMPK_MAX_NDIM)
        return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "ndim %d outside 0..%d", ndim,
                         OMPK_MAX_NDIM);
    if (ndim > 0 && !shape) return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "shape is NULL");
    if (device.type != OMPK_HOST && device.type != OMPK_TARGET)
        return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "unknown device type %d", (int)device.type);
    ompk_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dtype;
    t.ndim = ndim;
    t.device = device;
    int64_t stride = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        if (shape[d] < 0)
            return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "shape[%d] = %lld is negative", d,
                             (long long)shape[d]);
        if (strides && strides[d] < 0)
            return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "strides[%d] = %lld is negative", d,
                             (long long)strides[d]);
        t.shape[d] = shape[d];
        t.strides[d] = strides ? strides[d] : stride;
        /* past the size policy the running stride is never used: the check below rejects it */
        if (!ompk_mul_i64(stride, shape[d] > 0 ? shape[d] : 1, &stride)) stride = INT64_MAX;
    }
    int64_t numel, extent;
    const char *why = ompk_tensor_sizes(&t, &numel, &extent);
    if (why) return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "%s", why);
    *out = t;
    return OMPK_OK;
}

ompk_tensor ompk_tensor_make(void *data, ompk_dtype dtype, int ndim, const int64_t *shape,
                             ompk_device device) {
    ompk_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dtype;
    t.ndim = ndim;
    t.device = device;
    if (ndim < 0 || ndim > OMPK_MAX_NDIM || (ndim > 0 && !shape)) {
        t.ndim = -1; /* rejected by every kernel's validation */
        return t;
    }
    int64_t stride = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        t.shape[d] = shape[d];
        t.strides[d] = stride;
        /* a saturated stride is past the size policy, so every kernel rejects the view */
        if (!ompk_mul_i64(stride, shape[d] > 0 ? shape[d] : 1, &stride)) stride = INT64_MAX;
    }
    return t;
}

int64_t ompk_tensor_numel(const ompk_tensor *t) {
    if (!t || t->ndim < 0) return 0;
    if (t->ndim > OMPK_MAX_NDIM) return -1;
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] < 0) return -1;
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] == 0) return 0;
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        if (!ompk_mul_i64(n, t->shape[d], &n)) return -1;
    return n;
}

int ompk_tensor_is_contiguous(const ompk_tensor *t) {
    if (!t || t->ndim > OMPK_MAX_NDIM) return 0;
    int64_t stride = 1;
    int past = 0; /* the contiguous stride no longer fits int64: only unit dims may follow */
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] != 1 && (past || t->strides[d] != stride)) return 0;
        if (!ompk_mul_i64(stride, t->shape[d], &stride)) past = 1;
    }
    return 1;
}
