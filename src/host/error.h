/* Internal: recording the reason of a failed call (thread-local, read by ompk_last_error). */
#ifndef OMPK_ERROR_H
#define OMPK_ERROR_H

#include "ompk/status.h"

#if defined(__GNUC__)
#define OMPK_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define OMPK_PRINTF(a, b)
#endif

/* Record "fn: message" for this thread and return st, so callers can `return ompk_fail(...)`. */
ompk_status ompk_fail(ompk_status st, const char *fn, const char *fmt, ...) OMPK_PRINTF(3, 4);

#endif
