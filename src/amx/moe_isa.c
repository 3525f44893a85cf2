/* CPU feature detection for the MoE paths: CPUID leaf 7, XCR0 (the OS saves the state), and for
 * AMX the per-process XTILEDATA permission (Linux arch_prctl); a refusal means no AMX. */
#include <pthread.h>

#include "moe_internal.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static int has_avx512, has_amx;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void detect(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return; /* OSXSAVE */
    uint64_t xcr0 = xgetbv0();
    int zmm_os = (xcr0 & 0xe6) == 0xe6; /* SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
    int f = (b >> 16) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1, vnni = (c >> 11) & 1;
    int amx_tile = (d >> 24) & 1, amx_bf16 = (d >> 22) & 1, amx_int8 = (d >> 25) & 1;
    unsigned a1 = 0, b1, c1, d1;
    int bf16 = 0;
    if (a >= 1 && __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1)) bf16 = (a1 >> 5) & 1;
    has_avx512 = zmm_os && f && bw && vl && vnni && bf16;
    int amx_os = (xcr0 & (3u << 17)) == (3u << 17); /* XTILECFG, XTILEDATA */
    if (has_avx512 && amx_tile && amx_bf16 && amx_int8 && amx_os) {
        /* ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 */
        has_amx = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
    }
}

int moe_cpu_has_avx512(void) {
    pthread_once(&once, detect);
    return has_avx512;
}

int moe_cpu_has_amx(void) {
    pthread_once(&once, detect);
    return has_amx;
}
#else
int moe_cpu_has_avx512(void) {
    return 0;
}
int moe_cpu_has_amx(void) {
    return 0;
}
#endif
