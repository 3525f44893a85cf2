/* Launch 1 of the mHC pre forward as the wide-load tensor-core GEMM (mhc_pre_tcw.h), n <= 4: the
 * weight precompute, then one bare kernel a stream count. A file of its own so that its register
 * cap (CMakeLists.txt: 128, two teams of 256 threads an SM) leaves the other pre-forward kernels
 * alone. */
#include "mhc_pre_tcw.h"

/* clang-format off */
#define TCW_KERNEL(N, NB)                                                                          \
    _Pragma("omp target teams ompx_bare num_teams(teams) thread_limit(PRE_TCW_THREADS) device(ex.device) is_device_ptr(x, wp, part) firstprivate(gg)") \
    {                                                                                              \
        static uint16_t ring[PRE_TCW_RING(NB)] __attribute__((aligned(16)));                       \
        _Pragma("omp allocate(ring) allocator(omp_pteam_mem_alloc)")                              \
        pre_tcw_team(N, NB, &gg, x, wp, part, ring);                                               \
    }
/* clang-format on */

void mhc_pre_tcw_gemm(ompk_exec ex, const pre_tc_geom *g, int n, int ring, const char *x,
                      const float *phi, const float *gamma, uint16_t *wp, float *part) {
#ifdef OMPK_BARE_KERNELS
    const pre_tc_geom gg = *g;
    const int teams = gg.NG * gg.KS;
    const int64_t items = (gg.NCH + PRE_TCW_SC - 1) / PRE_TCW_SC * (PRE_TC_NT(n) * 8) * 64;
#pragma omp target teams distribute parallel for device(ex.device) is_device_ptr(phi, gamma, wp)   \
    firstprivate(gg, n) thread_limit(256)
    for (int64_t e = 0; e < items; e++) pre_tcw_wpair(n, &gg, phi, gamma, wp, e);
    switch (n) {
    case 1:
        TCW_KERNEL(1, 3)
        break;
    case 2:
        TCW_KERNEL(2, 3)
        break;
    case 3:
        TCW_KERNEL(3, 3)
        break;
    default:
#ifdef OMPK_LAB
        if (ring == 2) {
            TCW_KERNEL(4, 2)
            break;
        }
#else
        (void)ring; /* a ring of 2: lab builds only */
#endif
        TCW_KERNEL(4, 3)
        break;
    }
#else
    (void)ex, (void)g, (void)n, (void)ring, (void)x, (void)phi, (void)gamma, (void)wp, (void)part;
#endif
}
