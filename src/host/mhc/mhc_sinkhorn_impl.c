/* Sinkhorn forward and backward: the implementation lists (variant.h). The backward's default on
 * a GPU spreads a token's rows over 4 or 8 lanes; portable keeps one thread a token. */
#include "mhc_impl.h"

static ompk_status run_fwd(const void *p, void *ws) {
    const mhc_sk_call *k = p;
    (void)ws;
    mhc_sk_fwd_kernel(k->ex, k->a);
    return OMPK_OK;
}

static const ompk_impl fwd[] = {
    {"portable", 0, NULL, NULL, NULL, run_fwd},
};
const ompk_impl_list ompk_impls_mhc_sinkhorn_fwd = {fwd, (int)(sizeof fwd / sizeof fwd[0])};

static int64_t bwd_ws(const void *p) {
    return mhc_sk_bwd_workspace(((const mhc_sk_call *)p)->a);
}

static int ok_lanes(const void *p) {
    return ((const mhc_sk_call *)p)->ex.on_target;
}

static ompk_status run_lanes(const void *p, void *ws) {
#if defined(__clang__) && defined(OMPK_OFFLOAD_BUILD) && defined(OMPK_OFFLOAD_NVPTX)
    const mhc_sk_call *k = p;
    mhc_sk_bwd_lanes_kernel(k->ex, k->a, ws);
    return OMPK_OK;
#else
    (void)p, (void)ws;
    return OMPK_ERR_UNSUPPORTED;
#endif
}

static ompk_status run_bwd(const void *p, void *ws) {
    const mhc_sk_call *k = p;
    mhc_sk_bwd_kernel(k->ex, k->a, ws);
    return OMPK_OK;
}

static const ompk_impl bwd[] = {
    {"lanes", 0, ompk_nv_kernels_built, ok_lanes, bwd_ws, run_lanes},
    {"portable", 0, NULL, NULL, bwd_ws, run_bwd},
};
const ompk_impl_list ompk_impls_mhc_sinkhorn_bwd = {bwd, (int)(sizeof bwd / sizeof bwd[0])};
