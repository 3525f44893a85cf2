/* Internal: arrival counters for kernels in which the last team of a group finishes the group's
 * work (mhc_pre_dec.c). A block holds OMPK_COUNTERS_MAX ints on a device, all zero when handed
 * out; the kernel that uses it leaves every counter zero again, so a freed block returns to the
 * pool as it came and a call needs neither a memset region nor a host-to-device copy for them.
 * Thread-safe. */
#ifndef OMPK_COUNTERS_H
#define OMPK_COUNTERS_H

#include "ompk/tensor.h"

#define OMPK_COUNTERS_MAX 64

/* A zeroed block on device, NULL (with ompk_last_error set) on failure. */
int *ompk_counters_alloc(ompk_device device);
/* Returns a block whose counters are all zero again. */
void ompk_counters_free(ompk_device device, int *block);

#endif
