/* mHC pre backward: the implementation list (variant.h). Default: stage 4 on tensor cores where
 * the call fits (GPU, bf16, bwd_tc_plan in mhc_pre_bwd.c), else the portable kernels; lab builds
 * add tc-r128 (the same capped at 128 registers, a benchmark alternative). */
#include "mhc_impl.h"

static int ok_tc(const void *p) {
    const mhc_pre_bwd_call *k = p;
    return mhc_pre_bwd_tc_fits(k->ex, k->a);
}

static int64_t ws_bytes(const void *p) {
    return mhc_pre_bwd_workspace(((const mhc_pre_bwd_call *)p)->a);
}

static ompk_status run_with(const void *p, void *ws, int tc) {
    const mhc_pre_bwd_call *k = p;
    mhc_pre_bwd_kernel(k->ex, k->a, ws, tc);
    return OMPK_OK;
}
static ompk_status run_tc(const void *p, void *ws) {
    return run_with(p, ws, 1);
}
#ifdef OMPK_LAB
static ompk_status run_r128(const void *p, void *ws) {
    return run_with(p, ws, 2);
}
#endif
static ompk_status run_portable(const void *p, void *ws) {
    return run_with(p, ws, 0);
}

static const ompk_impl impls[] = {
    {"tc", 0, ompk_nv_kernels_built, ok_tc, ws_bytes, run_tc},
#ifdef OMPK_LAB
    {"tc-r128", 1, ompk_nv_kernels_built, ok_tc, ws_bytes, run_r128},
#endif
    {"portable", 0, NULL, NULL, ws_bytes, run_portable},
};

const ompk_impl_list ompk_impls_mhc_pre_bwd = {impls, (int)(sizeof impls / sizeof impls[0])};
