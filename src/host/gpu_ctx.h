/* Internal: the CUDA driver as the offload runtime loaded it, and the context a device's kernels
 * run in (see gpu_ctx.c). Used by the wait mode (gpu_wait.c) and the stack limit (gpu_stack.c). */
#ifndef OMPK_GPU_CTX_H
#define OMPK_GPU_CTX_H

#include <stddef.h>

/* The driver calls ompk makes, with the types of their C ABI (CUdevice is an int, CUcontext a
 * pointer, CUresult an int, 0 = success). */
typedef struct ompk_cu {
    int (*dev_get)(int *, int);
    int (*primary_state)(int, unsigned *, int *);
    int (*primary_retain)(void **, int);
    int (*primary_release)(int);
    int (*ctx_get)(void **);
    int (*ctx_set)(void *);
    int (*ctx_device)(int *);
    int (*get_flags)(unsigned *); /* CUDA 12.1+: may be NULL */
    int (*set_flags)(unsigned);   /* CUDA 12.1+: may be NULL */
    int (*get_limit)(size_t *, int);
    int (*set_limit)(int, size_t);
} ompk_cu;

/* The driver if the offload runtime has loaded it, else NULL (ompk never loads it itself). */
const ompk_cu *ompk_cu_driver(void);

/* What ompk_cu_enter changed on the calling thread, for ompk_cu_leave to undo. */
typedef struct ompk_cu_scope {
    void *prev;  /* the thread's context before, restored on leave */
    int primary; /* CUdevice + 1 whose primary context was retained (0: none) */
} ompk_cu_scope;

/* Makes the context in which the offload runtime runs device dev's kernels current on the calling
 * thread. 1: done, undo with ompk_cu_leave; 0: the runtime has not created it yet; -1: no CUDA
 * driver or context to work with. */
int ompk_cu_enter(const ompk_cu *d, int dev, ompk_cu_scope *s);
void ompk_cu_leave(const ompk_cu *d, ompk_cu_scope *s);

/* Called on the way into every GPU call: the context's wait mode (gpu_wait.c) and, in GCC offload
 * builds, its thread stack limit (gpu_stack.c), each settled once per device. */
void ompk_gpu_prepare(int dev);

#endif
