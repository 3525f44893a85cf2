/* Internal: per-call scratch memory. Device allocations (cudaMalloc/cudaFree under
 * omp_target_alloc/free) synchronise the device and cost tens to hundreds of microseconds, a
 * large share of a sub-millisecond kernel; freed scratch blocks are therefore kept in a small
 * cache and handed to later calls. Host scratch is plain malloc. Thread-safe. */
#ifndef OMPK_SCRATCH_H
#define OMPK_SCRATCH_H

#include <stddef.h>

#include "ompk/tensor.h"

/* NULL (with ompk_last_error set) on failure. */
void *ompk_scratch_alloc(ompk_device device, size_t bytes);
void ompk_scratch_free(ompk_device device, void *ptr);

/* Give every cached device block back (tests; an application may call it to shrink). */
void ompk_scratch_trim(void);

#endif
