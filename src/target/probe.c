/* Offload health probe used by ompk-info and the device test script: a silent host fallback
 * (e.g. an image the runtime does not recognise) must be reported, not mistaken for a GPU. */
#include <omp.h>

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
