/* Internal: argument validation shared by every public entry point.
 *
 * An entry point opens an ompk_call, registers each tensor with its expected rank and dtypes,
 * adds shape relations, then closes the call. The first failed check records its message and
 * status; later checks become no-ops, so a validation block reads as a flat list. Closing the
 * call checks that all tensors share one device and that no output overlaps any other tensor.
 * Nothing here touches tensor data. */
#ifndef OMPK_CHECK_H
#define OMPK_CHECK_H

#include <stdint.h>

#include "ompk/tensor.h"

#define OMPK_CALL_MAX_TENSORS 24

/* Size policy of every descriptor a kernel accepts (tensor.h states it): each dim and stride at
 * most OMPK_MAX_DIM, at most OMPK_MAX_NUMEL elements, and at most OMPK_MAX_NUMEL elements from
 * the first addressable element to one past the last. So every element offset, and the product
 * of an offset with a dim or a small factor, fits int64 with room to spare. */
#define OMPK_MAX_DIM ((int64_t)1 << 40)
#define OMPK_MAX_NUMEL ((int64_t)1 << 46)

/* Checked arithmetic for sizes formed from user input: 1 and *r = a op b if it fits, else 0. */
static inline int ompk_mul_i64(int64_t a, int64_t b, int64_t *r) {
    return !__builtin_mul_overflow(a, b, r);
}
static inline int ompk_add_i64(int64_t a, int64_t b, int64_t *r) {
    return !__builtin_add_overflow(a, b, r);
}

/* Element count and extent (elements from the first addressable element to one past the last, 0
 * for an empty view) of t under the size policy. Returns NULL when t's rank, shape and strides
 * are valid and within it, else a reason ("too many elements", ...); nothing overflows either way.
 */
const char *ompk_tensor_sizes(const ompk_tensor *t, int64_t *numel, int64_t *extent);

/* dtype sets for ompk_call_tensor */
#define OMPK_DT(d) (1u << (d))
#define OMPK_DT_FLOAT (OMPK_DT(OMPK_F32) | OMPK_DT(OMPK_BF16))

typedef struct ompk_call {
    const char *fn;
    ompk_status status;
    int ntensors;
    const char *names[OMPK_CALL_MAX_TENSORS];
    const ompk_tensor *tensors[OMPK_CALL_MAX_TENSORS];
    int is_output[OMPK_CALL_MAX_TENSORS];
    ompk_device device; /* the call's device, valid after ompk_call_end returned OK */
} ompk_call;

void ompk_call_begin(ompk_call *c, const char *fn);

/* Register a tensor. ndim < 0 accepts any rank. A NULL t is an error unless optional is set.
 * Checks: non-NULL descriptor, rank, dtype in `dtypes`, non-negative shape and strides, data
 * non-NULL when numel > 0, device valid, outputs not self-overlapping. Returns 1 if t was
 * registered and checks so far passed (so the caller may read its shape), else 0. */
int ompk_call_tensor(ompk_call *c, const char *name, const ompk_tensor *t, int ndim,
                     unsigned dtypes, int is_output, int optional);
#define ompk_call_input(c, name, t, ndim, dtypes) ompk_call_tensor(c, name, t, ndim, dtypes, 0, 0)
#define ompk_call_output(c, name, t, ndim, dtypes) ompk_call_tensor(c, name, t, ndim, dtypes, 1, 0)

/* t->shape[dim] == expected */
void ompk_call_dim(ompk_call *c, const char *name, const ompk_tensor *t, int dim, int64_t expected);
/* a and b have the same dtype */
void ompk_call_same_dtype(ompk_call *c, const char *na, const ompk_tensor *a, const char *nb,
                          const ompk_tensor *b);
/* t->strides[dim] == 1 (or shape[dim] <= 1) */
void ompk_call_unit_stride(ompk_call *c, const char *name, const ompk_tensor *t, int dim);
/* A scalar condition; fmt describes the violation. */
void ompk_call_require(ompk_call *c, int ok, ompk_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int ompk_call_ok(const ompk_call *c);

/* Device agreement and output overlap; returns the call's status. */
ompk_status ompk_call_end(ompk_call *c);

/* Byte span [*lo, *hi) a view can touch (empty views give lo == hi). t must satisfy the size
 * policy and its span must not wrap the address space (ompk_call_tensor checks both). */
void ompk_tensor_span(const ompk_tensor *t, uintptr_t *lo, uintptr_t *hi);

#endif
