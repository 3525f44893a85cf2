/* Internal: the GPU thread stack limit of a device's context (see gpu_stack.c). */
#ifndef OMPK_GPU_STACK_H
#define OMPK_GPU_STACK_H

/* Called on the way into every GPU call through ompk_gpu_prepare (gpu_ctx.h): in GCC offload
 * builds, raises the stack limit of the context the kernels run in, once per device; elsewhere
 * nothing. */
void ompk_gpu_stack_prepare(int dev);

/* The context's GPU thread stack limit in bytes (CU_LIMIT_STACK_SIZE); -1 when there is no CUDA
 * driver or context to ask, 0 when the runtime has not created the context yet. For ompk-info. */
long long ompk_gpu_stack_limit(int dev);

/* The limit ompk_gpu_stack_prepare sets in this build (0: it leaves the runtime's). */
long long ompk_gpu_stack_wanted(void);

#endif
