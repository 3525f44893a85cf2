/* Internal: availability predicates of implementation-list entries (variant.h). */
#ifndef OMPK_IMPL_AVAIL_H
#define OMPK_IMPL_AVAIL_H

/* GPU kernels compiled into this build and an offload device present. */
int ompk_gpu_kernels_built(void);
/* The NVIDIA-only GPU kernels (bare.h: OMPK_NV_DEVICE) compiled into this build and an offload
 * device present. */
int ompk_nv_kernels_built(void);

#endif
