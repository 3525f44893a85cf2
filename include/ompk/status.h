/* ompk status codes. Every public call returns one; a non-OK call wrote nothing to its outputs
 * and left a human-readable reason in ompk_last_error(). */
#ifndef OMPK_STATUS_H
#define OMPK_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

/* Marks the old form of a renamed or reshaped call (CHANGELOG.md), so that
 * callers see the replacement at compile time. */
#if defined(__GNUC__) || defined(__clang__)
#define OMPK_DEPRECATED(msg) __attribute__((deprecated(msg)))
#elif defined(_MSC_VER)
#define OMPK_DEPRECATED(msg) __declspec(deprecated(msg))
#else
#define OMPK_DEPRECATED(msg)
#endif

typedef enum ompk_status {
    OMPK_OK = 0,
    OMPK_ERR_INVALID_ARGUMENT = 1,   /* null, rank, shape, dtype, stride, aliasing, parameter */
    OMPK_ERR_DEVICE_MISMATCH = 2,    /* tensors of one call live on different devices */
    OMPK_ERR_OUT_OF_MEMORY = 3,      /* an allocation (host or device) failed */
    OMPK_ERR_UNSUPPORTED = 4,        /* valid request this build or machine cannot serve */
    OMPK_ERR_INDEX_OUT_OF_RANGE = 5, /* index data (expert ids, router indices) out of range */
    OMPK_ERR_CACHE_FULL = 6,         /* forward cache stack overflow */
    OMPK_ERR_CACHE_EMPTY = 7,        /* backward with nothing saved */
    OMPK_ERR_RUNTIME = 8             /* the OpenMP / offload runtime failed */
} ompk_status;

/* Static name of a status, e.g. "OMPK_ERR_INVALID_ARGUMENT". Never NULL. */
const char *ompk_status_str(ompk_status status);

/* The message of the last failed call on this thread ("" if none). Valid until the next ompk
 * call on the same thread. Messages are per thread: a call failing on one thread never changes
 * what another thread reads here. */
const char *ompk_last_error(void);

/* Forget the last error on this thread. */
void ompk_clear_error(void);

#ifdef __cplusplus
}
#endif
#endif
