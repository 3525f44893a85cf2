/* Argument validation (see check.h). */
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "variant.h"
#include "error.h"

void ompk_call_begin(ompk_call *c, const char *fn) {
    c->fn = fn;
    c->status = OMPK_OK;
    c->ntensors = 0;
    c->device = ompk_device_host();
}

int ompk_call_ok(const ompk_call *c) {
    return c->status == OMPK_OK;
}

static void call_fail(ompk_call *c, ompk_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void call_fail(ompk_call *c, ompk_status st, const char *fmt, ...) {
    if (c->status != OMPK_OK) return;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->status = ompk_fail(st, c->fn, "%s", msg);
}

void ompk_tensor_span(const ompk_tensor *t, uintptr_t *lo, uintptr_t *hi) {
    uintptr_t base = (uintptr_t)t->data;
    int64_t numel, extent;
    ompk_tensor_sizes(t, &numel, &extent);
    *lo = base;
    /* extent <= 2^46, so the bit count fits; the caller checked that base + bytes fits */
    *hi = base + (uintptr_t)((extent * ompk_dtype_bits(t->dtype) + 7) / 8);
}

/* Would two distinct indices of t address one element? Sort the non-trivial dims by stride;
 * each stride must step over the whole extent of the smaller dims. */
static int self_overlaps(const ompk_tensor *t) {
    int idx[OMPK_MAX_NDIM], n = 0;
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] > 1) idx[n++] = d;
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && t->strides[idx[j]] < t->strides[idx[j - 1]]; j--) {
            int tmp = idx[j];
            idx[j] = idx[j - 1];
            idx[j - 1] = tmp;
        }
    int64_t extent = 1;
    for (int i = 0; i < n; i++) {
        int64_t s = t->strides[idx[i]];
        if (s < extent) return 1;
        /* cannot overflow within the size policy (s * shape <= span + s); saturating keeps the
         * answer right anyway: nothing has a larger stride */
        if (!ompk_mul_i64(s, t->shape[idx[i]], &extent)) extent = INT64_MAX;
    }
    return 0;
}

int ompk_call_tensor(ompk_call *c, const char *name, const ompk_tensor *t, int ndim,
                     unsigned dtypes, int is_output, int optional) {
    if (c->status != OMPK_OK) return 0;
    if (!t) {
        if (!optional) call_fail(c, OMPK_ERR_INVALID_ARGUMENT, "%s is NULL", name);
        return 0;
    }
    if (t->ndim < 0 || t->ndim > OMPK_MAX_NDIM) {
        call_fail(c, OMPK_ERR_INVALID_ARGUMENT, "%s has invalid ndim %d", name, t->ndim);
        return 0;
    }
    if (ndim >= 0 && t->ndim != ndim) {
        call_fail(c, OMPK_ERR_INVALID_ARGUMENT, "%s must have rank %d, got %d", name, ndim,
                  t->ndim);
        return 0;
    }
    if ((unsigned)t->dtype >= (unsigned)OMPK_DTYPE_COUNT_ || !(dtypes & OMPK_DT(t->dtype))) {
        call_fail(c, OMPK_ERR_INVALID_ARGUMENT, "%s has unsupported dtype %s", name,
                  ompk_dtype_name(t->dtype));
        return 0;
    }
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] < 0 || t->strides[d] < 0) {
            call_fail(c, OMPK_ERR_INVALID_ARGUMENT,
                      "%s has negative shape or stride in dim %d (%lld, %lld)", name, d,
                      (long long)t->shape[d], (long long)t->strides[d]);
            return 0;
        }
    int64_t numel, extent;
    const char *why = ompk_tensor_sizes(t, &numel, &extent);
    if (why) {
        call_fail(c, OMPK_ERR_INVALID_ARGUMENT, "%s: %s", name, why);
        return 0;
    }
    if (numel > 0 && !t->data) {
        call_fail(c, OMPK_ERR_INVALID_ARGUMENT, "%s has NULL data", name);
        return 0;
    }
    /* extent <= 2^46 elements, so the byte count fits; the span must not wrap the address space */
    const uintptr_t bytes = (uintptr_t)((extent * ompk_dtype_bits(t->dtype) + 7) / 8);
    if ((uintptr_t)t->data > UINTPTR_MAX - bytes) {
        call_fail(c, OMPK_ERR_INVALID_ARGUMENT, "%s: data + span wraps the address space", name);
        return 0;
    }
    if (t->device.type == OMPK_TARGET) {
        if (t->device.id < 0 || t->device.id >= omp_get_num_devices()) {
            call_fail(c, OMPK_ERR_INVALID_ARGUMENT, "%s is on device %d, but %d devices exist",
                      name, t->device.id, omp_get_num_devices());
            return 0;
        }
    } else if (t->device.type != OMPK_HOST) {
        call_fail(c, OMPK_ERR_INVALID_ARGUMENT, "%s has unknown device type %d", name,
                  (int)t->device.type);
        return 0;
    }
    if (t->dtype == OMPK_I4) {
        /* nibbles are addressed in pairs: the innermost stride must be 1, the others even */
        for (int d = 0; d < t->ndim; d++)
            if (t->shape[d] > 1 && (d == t->ndim - 1 ? t->strides[d] != 1 : t->strides[d] % 2)) {
                call_fail(c, OMPK_ERR_INVALID_ARGUMENT, "%s: i4 needs packed rows", name);
                return 0;
            }
    }
    if (is_output && self_overlaps(t)) {
        call_fail(c, OMPK_ERR_INVALID_ARGUMENT,
                  "%s has strides under which elements overlap (outputs must not)", name);
        return 0;
    }
    if (c->ntensors >= OMPK_CALL_MAX_TENSORS) {
        call_fail(c, OMPK_ERR_INVALID_ARGUMENT, "too many tensors");
        return 0;
    }
    c->names[c->ntensors] = name;
    c->tensors[c->ntensors] = t;
    c->is_output[c->ntensors] = is_output;
    c->ntensors++;
    return 1;
}

void ompk_call_dim(ompk_call *c, const char *name, const ompk_tensor *t, int dim,
                   int64_t expected) {
    if (c->status != OMPK_OK || !t) return;
    if (dim < 0 || dim >= t->ndim || t->shape[dim] != expected)
        call_fail(c, OMPK_ERR_INVALID_ARGUMENT, "%s dim %d must be %lld, got %lld", name, dim,
                  (long long)expected, (long long)(dim >= 0 && dim < t->ndim ? t->shape[dim] : -1));
}

void ompk_call_same_dtype(ompk_call *c, const char *na, const ompk_tensor *a, const char *nb,
                          const ompk_tensor *b) {
    if (c->status != OMPK_OK || !a || !b) return;
    if (a->dtype != b->dtype)
        call_fail(c, OMPK_ERR_INVALID_ARGUMENT, "%s (%s) and %s (%s) must have the same dtype", na,
                  ompk_dtype_name(a->dtype), nb, ompk_dtype_name(b->dtype));
}

void ompk_call_unit_stride(ompk_call *c, const char *name, const ompk_tensor *t, int dim) {
    if (c->status != OMPK_OK || !t) return;
    if (dim < 0 || dim >= t->ndim || (t->shape[dim] > 1 && t->strides[dim] != 1))
        call_fail(c, OMPK_ERR_INVALID_ARGUMENT, "%s needs unit stride in dim %d", name, dim);
}

void ompk_call_require(ompk_call *c, int ok, ompk_status st, const char *fmt, ...) {
    if (c->status != OMPK_OK || ok) return;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->status = ompk_fail(st, c->fn, "%s", msg);
}

ompk_status ompk_call_end(ompk_call *c) {
    if (c->status != OMPK_OK) return c->status;
    for (int i = 0; i < c->ntensors; i++) {
        if (i == 0) {
            c->device = c->tensors[0]->device;
            continue;
        }
        if (!ompk_device_equal(c->tensors[i]->device, c->device)) {
            call_fail(c, OMPK_ERR_DEVICE_MISMATCH, "%s is on %s %d but %s is on %s %d", c->names[i],
                      c->tensors[i]->device.type == OMPK_HOST ? "host" : "device",
                      c->tensors[i]->device.id, c->names[0],
                      c->device.type == OMPK_HOST ? "host" : "device", c->device.id);
            return c->status;
        }
    }
    for (int i = 0; i < c->ntensors; i++) {
        if (!c->is_output[i]) continue;
        uintptr_t lo, hi;
        ompk_tensor_span(c->tensors[i], &lo, &hi);
        if (lo == hi) continue;
        for (int j = 0; j < c->ntensors; j++) {
            if (j == i) continue;
            uintptr_t lo2, hi2;
            ompk_tensor_span(c->tensors[j], &lo2, &hi2);
            if (lo2 < hi && lo < hi2) {
                call_fail(c, OMPK_ERR_INVALID_ARGUMENT, "output %s overlaps %s %s", c->names[i],
                          c->is_output[j] ? "output" : "input", c->names[j]);
                return c->status;
            }
        }
    }
    /* a bad OMPK_VARIANT or OMPK_ISA fails every call (variant.h) */
    const char *bad = ompk_variant_env_error();
    if (bad) call_fail(c, OMPK_ERR_INVALID_ARGUMENT, "%s", bad);
    return c->status;
}
