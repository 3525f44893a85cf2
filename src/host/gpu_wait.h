/* Internal: the wait mode of a GPU's context (see gpu_wait.c for why ompk changes it). */
#ifndef OMPK_GPU_WAIT_H
#define OMPK_GPU_WAIT_H

/* Called on the way into every GPU call (ompk_gpu_prepare, gpu_ctx.h); does its work once per
 * device. OMPK_GPU_WAIT=spin (default), yield, or block (leave the offload runtime's choice). */
void ompk_gpu_wait_prepare(int dev);

/* "spin", "yield", "block", "auto", or why it is not known; for ompk-info and the tests. */
const char *ompk_gpu_wait_mode(int dev);

#endif
