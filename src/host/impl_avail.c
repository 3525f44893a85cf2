/* Availability predicates shared by the implementation lists (variant.h). */
#include <omp.h>

#include "impl_avail.h"

int ompk_gpu_kernels_built(void) {
#if defined(OMPK_OFFLOAD_BUILD) && defined(__clang__)
    return omp_get_num_devices() > 0;
#else
    return 0;
#endif
}

int ompk_nv_kernels_built(void) {
#if defined(OMPK_OFFLOAD_BUILD) && defined(__clang__) && defined(OMPK_OFFLOAD_NVPTX)
    return omp_get_num_devices() > 0;
#else
    return 0;
#endif
}
