/* Device memset: 8-byte words in parallel, then the unaligned head and tail bytes. */
#include <stdint.h>

#include "memset_kernel.h"

void ompk_memset_kernel(void *dst, int device, unsigned char value, size_t bytes) {
    unsigned char *p = (unsigned char *)dst;
    size_t head = (size_t)((8 - ((uintptr_t)p & 7)) & 7);
    if (head > bytes) head = bytes;
    size_t words = (bytes - head) / 8;
    size_t tail = bytes - head - words * 8;
    uint64_t pattern = 0x0101010101010101ull * value;
    uint64_t *w = (uint64_t *)(p + head);
    unsigned char *t = p + head + words * 8;
#pragma omp target teams distribute parallel for device(device) is_device_ptr(w)
    for (size_t i = 0; i < words; i++) w[i] = pattern;
    if (head || tail) {
#pragma omp target device(device) is_device_ptr(p, t)
        {
            for (size_t i = 0; i < head; i++) p[i] = value;
            for (size_t i = 0; i < tail; i++) t[i] = value;
        }
    }
}
