/* Offload health probe used by ompk-info and the device test script: a silent host fallback
 * (e.g. an image the runtime does not recognise) must be reported, not mistaken for a GPU.
 * Also the launch probe: the fixed cost of one synchronous target region, which every small
 * ompk call pays and which no kernel tuning can remove. */
#include <omp.h>

#include "bare.h"
#include "gpu_ctx.h"
#include "probe.h"

int ompk_probe_device(int dev) {
    if (dev < 0 || dev >= omp_get_num_devices()) return -1;
    int on_host = 1, sum = 0;
#pragma omp target device(dev) map(from : on_host, sum)
    {
        on_host = omp_is_initial_device();
        int s = 0;
        for (int i = 1; i <= 10; i++) s += i;
        sum = s;
    }
    return !on_host && sum == 55;
}

int ompk_probe_launch(int dev, ompk_probe_form form, int *word) {
    if (dev < 0 || dev >= omp_get_num_devices() || !word) return -1;
    /* what every ompk GPU call does first, so the probe measures the library's own wait */
    ompk_gpu_prepare(dev);
    switch (form) {
    case OMPK_PROBE_BARE:
#ifdef OMPK_BARE_DEVICE
#pragma omp target teams ompx_bare num_teams(1) thread_limit(32) device(dev) is_device_ptr(word)
    {
        if (ompx_thread_id_x() == 0) word[0] += 1;
    }
        return 0;
#else
        return -1;
#endif
    case OMPK_PROBE_COMBINED:
#pragma omp target teams distribute parallel for device(dev) is_device_ptr(word)
        for (int i = 0; i < 1; i++) word[i] += 1;
        return 0;
    case OMPK_PROBE_NOWAIT:
#pragma omp target teams distribute parallel for device(dev) is_device_ptr(word) nowait
        for (int i = 0; i < 1; i++) word[i] += 1;
#pragma omp taskwait
        return 0;
    }
    return -1;
}
