/* CPUID feature bits and the Linux AMX permission request (arch_prctl ARCH_REQ_XCOMP_PERM for
 * XFEATURE_XTILEDATA): without the grant, the first tile instruction faults. */
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cpu.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#define ARCH_GET_XCOMP_PERM 0x1022
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static ompk_cpu_features features;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void detect(void) {
    memset(&features, 0, sizeof features);
#if defined(__x86_64__)
    unsigned a, b, c, d;
    if (!__get_cpuid_count(1, 0, &a, &b, &c, &d)) return;
    features.fma = (c >> 12) & 1;
    int osxsave = (c >> 27) & 1;
    unsigned long long xcr0 = 0;
    if (osxsave) {
        unsigned lo, hi;
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        xcr0 = ((unsigned long long)hi << 32) | lo;
    }
    int ymm_os = (xcr0 & 0x6) == 0x6, zmm_os = (xcr0 & 0xe6) == 0xe6;
    int tile_os = (xcr0 & (3ull << 17)) == (3ull << 17);
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
    features.avx2 = ymm_os && ((b >> 5) & 1);
    features.avx512f = zmm_os && ((b >> 16) & 1);
    features.avx512bw = zmm_os && ((b >> 30) & 1);
    features.avx512vl = zmm_os && ((b >> 31) & 1);
    features.avx512_vnni = zmm_os && ((c >> 11) & 1);
    features.amx_bf16 = tile_os && ((d >> 22) & 1);
    features.amx_tile = tile_os && ((d >> 24) & 1);
    features.amx_int8 = tile_os && ((d >> 25) & 1);
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) features.avx512_bf16 = zmm_os && ((a >> 5) & 1);
    if (features.amx_tile) {
        if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0) {
            unsigned long long perm = 0;
            features.amx_permitted = syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &perm) == 0 &&
                                     ((perm >> XFEATURE_XTILEDATA) & 1);
        } else {
            features.amx_permission_errno = errno;
        }
    }
#endif
}

const ompk_cpu_features *ompk_cpu_get(void) {
    pthread_once(&once, detect);
    return &features;
}

int ompk_cpu_amx_usable(void) {
    const ompk_cpu_features *f = ompk_cpu_get();
    return f->amx_tile && f->amx_permitted;
}
