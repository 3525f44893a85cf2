/* mHC pre forward: the implementation list (variant.h). Defaults: the host form on the host; on a
 * GPU the one-region decode kernel for calls of at most MHC_DEC_TMAX tokens, else the wide-load
 * tensor-core GEMM for n <= 4, the register GEMM with rotated stages and L2 fills above (bf16);
 * the SIMT kernels everywhere else. The decode kernel runs on the host when named. Lab builds
 * (OMPK_LAB) add the benchmark alternatives as named-only entries (bench/results/INDEX.md,
 * Decisions). */
#include "mhc_impl.h"
#include "target/mhc/mhc_pre_dec.h"

/* teams the wide-load GEMM aims at (0: its default; a knob of lab builds) */
static int pre_teams(void) {
#ifdef OMPK_LAB
    return (int)ompk_variant_knob(OMPK_KNOB_MHC_PRE_TCW_TEAMS);
#else
    return 0;
#endif
}

static int pre_ok_tc(const void *p, mhc_pre_fwd_cfg c) {
    const mhc_pre_fwd_call *k = p;
    c.teams = pre_teams();
    return mhc_pre_fwd_tc_fits(k->ex, k->a, &c);
}

static ompk_status pre_run_cfg(const void *p, void *ws, mhc_pre_fwd_cfg c) {
    const mhc_pre_fwd_call *k = p;
    c.teams = pre_teams();
    mhc_pre_fwd_kernel(k->ex, k->a, ws, &c);
    return OMPK_OK;
}

static int64_t pre_ws(const void *p) {
    return mhc_pre_fwd_workspace(((const mhc_pre_fwd_call *)p)->a);
}

/* {host, tc, rot, epi, l2f, ring, teams} */
#define PRE_CFG(id, ...)                                                                           \
    static const mhc_pre_fwd_cfg cfg_##id = {__VA_ARGS__};                                         \
    static int ok_##id(const void *p) {                                                            \
        return pre_ok_tc(p, cfg_##id);                                                             \
    }                                                                                              \
    static ompk_status run_##id(const void *p, void *ws) {                                         \
        return pre_run_cfg(p, ws, cfg_##id);                                                       \
    }

PRE_CFG(wide, 0, 4, 1, 1, 0, 3, 0)
PRE_CFG(l2fill, 0, 1, 1, 1, 1, 3, 0)
#ifdef OMPK_LAB
PRE_CFG(rot, 0, 1, 1, 1, 0, 3, 0)
PRE_CFG(norot, 0, 1, 0, 1, 0, 3, 0)
PRE_CFG(interleaved, 0, 2, 0, 1, 0, 3, 0)
PRE_CFG(async, 0, 3, 0, 1, 0, 3, 0)
PRE_CFG(async_rot, 0, 3, 1, 1, 0, 3, 0)
PRE_CFG(epi_thread, 0, 1, 0, 0, 0, 3, 0)
PRE_CFG(fused, 0, 1, 0, 2, 0, 3, 0)
PRE_CFG(ring2, 0, 4, 1, 1, 0, 2, 0)
#endif

static int ok_host(const void *p) {
    return !((const mhc_pre_fwd_call *)p)->ex.on_target;
}
static ompk_status run_host(const void *p, void *ws) {
    const mhc_pre_fwd_cfg c = {1, 0, 0, 0, 0, 3, 0};
    return pre_run_cfg(p, ws, c);
}
static int ok_decode(const void *p) {
    return mhc_pre_dec_ok(((const mhc_pre_fwd_call *)p)->a);
}
static ompk_status run_decode(const void *p, void *ws) {
    const mhc_pre_fwd_call *k = p;
    return mhc_pre_dec_kernel(k->ex, k->a, k->post, ws) == 0 ? OMPK_OK : OMPK_ERR_OUT_OF_MEMORY;
}
static ompk_status run_portable(const void *p, void *ws) {
    const mhc_pre_fwd_cfg c = {0, 0, 0, 0, 0, 3, 0};
    return pre_run_cfg(p, ws, c);
}

#define TC(name, id, named) {name, named, ompk_nv_kernels_built, ok_##id, pre_ws, run_##id}
static const ompk_impl impls[] = {
    {"host", 0, NULL, ok_host, pre_ws, run_host},
    {"decode", 0, NULL, ok_decode, pre_ws, run_decode},
    TC("tc-wide", wide, 0),
    TC("tc-l2fill", l2fill, 0),
#ifdef OMPK_LAB
    TC("tc-rot", rot, 1),
    TC("tc-norot", norot, 1),
    TC("tc-interleaved", interleaved, 1),
    TC("tc-async", async, 1),
    TC("tc-async-rot", async_rot, 1),
    TC("tc-epi-thread", epi_thread, 1),
    TC("tc-fused", fused, 1),
    TC("tc-wide-ring2", ring2, 1),
#endif
    {"portable", 0, NULL, NULL, pre_ws, run_portable},
};
#undef TC

const ompk_impl_list ompk_impls_mhc_pre_fwd = {impls, (int)(sizeof impls / sizeof impls[0])};
