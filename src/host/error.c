/* Status names and the per-thread error message. */
#include <stdarg.h>
#include <stdio.h>

#include "error.h"

static _Thread_local char last_error[512];

const char *ompk_status_str(ompk_status status) {
    switch (status) {
    case OMPK_OK:
        return "OMPK_OK";
    case OMPK_ERR_INVALID_ARGUMENT:
        return "OMPK_ERR_INVALID_ARGUMENT";
    case OMPK_ERR_DEVICE_MISMATCH:
        return "OMPK_ERR_DEVICE_MISMATCH";
    case OMPK_ERR_OUT_OF_MEMORY:
        return "OMPK_ERR_OUT_OF_MEMORY";
    case OMPK_ERR_UNSUPPORTED:
        return "OMPK_ERR_UNSUPPORTED";
    case OMPK_ERR_INDEX_OUT_OF_RANGE:
        return "OMPK_ERR_INDEX_OUT_OF_RANGE";
    case OMPK_ERR_CACHE_FULL:
        return "OMPK_ERR_CACHE_FULL";
    case OMPK_ERR_CACHE_EMPTY:
        return "OMPK_ERR_CACHE_EMPTY";
    case OMPK_ERR_RUNTIME:
        return "OMPK_ERR_RUNTIME";
    }
    return "OMPK_ERR_UNKNOWN";
}

const char *ompk_last_error(void) {
    return last_error;
}

void ompk_clear_error(void) {
    last_error[0] = '\0';
}

ompk_status ompk_fail(ompk_status st, const char *fn, const char *fmt, ...) {
    int n = snprintf(last_error, sizeof last_error, "%s: ", fn ? fn : "ompk");
    if (n < 0 || (size_t)n >= sizeof last_error) return st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error + n, sizeof last_error - (size_t)n, fmt, ap);
    va_end(ap);
    return st;
}
