/* Launch 1 of the mHC pre forward as the wide-load tensor-core GEMM (mhc_pre_tcw.h), n <= 4: the
 * weight precompute, then one bare kernel a stream count. A file of its own so that its register
 * cap (CMakeLists.txt: 128, two teams of 256 threads an SM) leaves the other pre-forward kernels
 * alone. */
#include "mhc_pre_tcw.h"

#ifdef OMPK_NV_KERNELS
#define MHC_N_MAX PRE_TCW_NMAX
#define MHC_N_INC "mhc_pre_tcw_n.inc"
#include "mhc_each_n.inc"
#endif

void mhc_pre_tcw_gemm(ompk_exec ex, const pre_tc_geom *g, int n, int ring, const char *x,
                      const float *phi, const float *gamma, uint16_t *wp, float *part) {
#ifdef OMPK_NV_KERNELS
    const pre_tc_geom gg = *g;
    const int64_t items = (gg.NCH + PRE_TCW_SC - 1) / PRE_TCW_SC * (PRE_TC_NT(n) * 8) * 64;
#pragma omp target teams distribute parallel for device(ex.device) is_device_ptr(phi, gamma, wp)   \
    firstprivate(gg, n) thread_limit(256)
    for (int64_t e = 0; e < items; e++) pre_tcw_wpair(n, &gg, phi, gamma, wp, e);
#define PRE_TCW(N) pre_tcw_launch_##N(ex, g, ring, x, wp, part)
    MHC_SWITCH_N_UPTO(PRE_TCW_NMAX, n, PRE_TCW)
#undef PRE_TCW
#else
    (void)ex, (void)g, (void)n, (void)ring, (void)x, (void)phi, (void)gamma, (void)wp, (void)part;
#endif
}
