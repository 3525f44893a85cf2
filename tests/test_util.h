/* Shared helpers for the Criterion suites: reproducible random data, buffers mirrored on a
 * device, and the list of devices every test runs on (the host always; OpenMP device 0 when
 * the build has offload images and a GPU is present, or as OMPK_TEST_DEVICES says). */
#ifndef OMPK_TEST_UTIL_H
#define OMPK_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "ompk/ompk.h"

/* Devices to run on: OMPK_TEST_DEVICES = "host", "target" or "all" (default "all": host plus
 * every OpenMP device). Returns the count, fills devs (at most max). */
int tu_devices(ompk_device *devs, int max);
const char *tu_device_name(ompk_device d);

/* splitmix64-based generator */
typedef struct tu_rng {
    uint64_t s;
} tu_rng;
tu_rng tu_rng_make(uint64_t seed);
uint64_t tu_next(tu_rng *r);
double tu_uniform(tu_rng *r); /* [0,1) */
double tu_normal(tu_rng *r);

/* A host buffer with a device mirror. `host` is always valid; `dev` is the device pointer
 * (== host for the host device). */
typedef struct tu_buf {
    ompk_device device;
    ompk_dtype dtype;
    int64_t numel;
    size_t bytes;
    void *host;
    void *dev;
} tu_buf;

tu_buf tu_buf_new(ompk_device d, ompk_dtype dtype, int64_t numel);
void tu_buf_free(tu_buf *b);
void tu_buf_upload(tu_buf *b);   /* host -> device */
void tu_buf_download(tu_buf *b); /* device -> host */
/* Fill host with N(0, scale^2) values (rounded to dtype) and upload. */
void tu_buf_randn(tu_buf *b, tu_rng *r, double scale);
/* Fill every byte with `byte` (host and device), e.g. 0xFF as a poison: a kernel that writes
 * nothing on failure must leave it unchanged. */
void tu_buf_fill_bytes(tu_buf *b, int byte);
/* 1 if host bytes are all `byte` after a download. */
int tu_buf_all_bytes(tu_buf *b, int byte);
double tu_buf_get(const tu_buf *b, int64_t i);   /* host element as double */
void tu_buf_set(tu_buf *b, int64_t i, double v); /* host element, rounded to dtype */

/* Contiguous tensor view of the device side of a buffer. */
ompk_tensor tu_view(const tu_buf *b, int ndim, const int64_t *shape);

/* Max |a-b| / (atol*scale + rtol*|b|) over n elements: <= 1 passes. Prints the worst index. */
double tu_compare(const char *what, const tu_buf *out, const double *ref, int64_t n, double atol,
                  double rtol);

/* The default mHC parameters with Sinkhorn's repeat count and eps replaced. */
static inline ompk_mhc_params tu_sk_params(int repeat, float eps) {
    ompk_mhc_params p = ompk_mhc_params_default();
    p.sinkhorn_repeat = repeat;
    p.sinkhorn_eps = eps;
    return p;
}

#endif
