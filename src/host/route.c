/* Routing: a target construct with if(target: 0) runs its region on the host, where LLVM's and
 * GCC's runtimes execute `teams distribute parallel for` over the host's threads. */
#include <omp.h>

#include "gpu_ctx.h"
#include "route.h"

ompk_exec ompk_exec_for(ompk_device d) {
    ompk_exec e;
    e.on_target = d.type == OMPK_TARGET;
    e.device = e.on_target ? d.id : omp_get_initial_device();
    if (e.on_target) ompk_gpu_prepare(d.id);
    return e;
}

int ompk_host_teams(void) {
    return omp_get_max_threads();
}
