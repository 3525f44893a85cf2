/* Internal: fill device memory (LLVM 19 has no omp_target_memset). */
#ifndef OMPK_MEMSET_KERNEL_H
#define OMPK_MEMSET_KERNEL_H
#include <stddef.h>
void ompk_memset_kernel(void *dst, int device, unsigned char value, size_t bytes);
#endif
