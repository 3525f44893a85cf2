/* Router forward and backward: the implementation lists (variant.h). The forward's default on a
 * GPU is the warp-per-token bare kernel (two tokens a warp and arg-max rounds where they apply);
 * lab builds add sort and warp1, benchmark alternatives (bench/results/INDEX.md, Decisions). */
#include "error.h"
#include "impl_avail.h"
#include "router_impl.h"

static int bare_ok(const void *p) {
    const router_fwd_call *c = p;
    return ompk_router_bare_fits(c->ex, c->a);
}

#define BARE(id, sort, warp1)                                                                      \
    static ompk_status run_##id(const void *p, void *ws) {                                         \
        const router_fwd_call *c = p;                                                              \
        (void)ws;                                                                                  \
        ompk_router_topk_fwd_bare(c->ex, c->a, sort, warp1);                                       \
        return OMPK_OK;                                                                            \
    }
BARE(warp, 0, 0)
#ifdef OMPK_LAB
BARE(sort, 1, 0)
BARE(warp1, 0, 1)
#endif
#undef BARE

static ompk_status run_portable(const void *p, void *ws) {
    const router_fwd_call *c = p;
    (void)ws;
    const ompk_status st = ompk_router_topk_fwd_kernel(c->ex, c->a);
    if (st != OMPK_OK)
        return ompk_fail(st, "ompk_router_topk_fwd", "workspace for k = %lld on this device",
                         (long long)c->a->k);
    return OMPK_OK;
}

static const ompk_impl fwd[] = {
    {"warp", 0, ompk_nv_kernels_built, bare_ok, NULL, run_warp},
#ifdef OMPK_LAB
    {"sort", 1, ompk_nv_kernels_built, bare_ok, NULL, run_sort},
    {"warp1", 1, ompk_nv_kernels_built, bare_ok, NULL, run_warp1},
#endif
    {"portable", 0, NULL, NULL, NULL, run_portable},
};
const ompk_impl_list ompk_impls_router_fwd = {fwd, (int)(sizeof fwd / sizeof fwd[0])};

static ompk_status run_bwd(const void *p, void *ws) {
    const router_bwd_call *c = p;
    (void)ws;
    ompk_router_topk_bwd_kernel(c->ex, c->a);
    return OMPK_OK;
}

static const ompk_impl bwd[] = {
    {"portable", 0, NULL, NULL, NULL, run_bwd},
};
const ompk_impl_list ompk_impls_router_bwd = {bwd, (int)(sizeof bwd / sizeof bwd[0])};
