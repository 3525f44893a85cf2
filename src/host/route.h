/* Internal: where a kernel runs. Every kernel in src/target is one OpenMP source whose target
 * constructs carry
 *     if(target: ex.on_target) device(ex.device) is_device_ptr(...)
 * so the same loops run on the tensors' offload device, or, for host tensors, on the host's
 * OpenMP threads (the target region's host fallback). */
#ifndef OMPK_ROUTE_H
#define OMPK_ROUTE_H

#include "ompk/tensor.h"

typedef struct ompk_exec {
    int on_target; /* 1: run on OpenMP device `device`; 0: run on the host */
    int device;    /* OpenMP device number (the initial device when on_target == 0) */
} ompk_exec;

ompk_exec ompk_exec_for(ompk_device d);

/* Number of OpenMP teams to use for host execution of a target teams region (the host
 * fallback otherwise creates one team per iteration chunk the runtime chooses). */
int ompk_host_teams(void);

#endif
