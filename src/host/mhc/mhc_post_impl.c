/* mHC post forward and backward: the implementation lists (variant.h). The forward's defaults on
 * a GPU (target tensors on the vector path, D >= 512): the streaming kernel where (n, dtype) has
 * one (n <= 4), else the first bare kernel; everywhere else the portable kernels. Lab builds add
 * named-only streaming configurations of the benchmark's sweep at n = 4 and the team-size knob
 * (bench/results/INDEX.md, Decisions). */
#include <stdint.h>

#include "mhc_impl.h"

static int stream_ok(const void *p, const char *name) {
    const mhc_post_fwd_call *k = p;
    return ompk_mhc_post_bare_fits(k->ex, k->a) && k->a->B * k->a->S <= INT32_MAX &&
           ompk_mhc_post_stream_find(name, k->a->n, k->a->is_bf16) != NULL;
}

static ompk_status stream_run(const void *p, const char *name) {
    const mhc_post_fwd_call *k = p;
    const ompk_mhc_post_stream_cfg *cfg = ompk_mhc_post_stream_find(name, k->a->n, k->a->is_bf16);
#ifdef OMPK_LAB
    ompk_mhc_post_fwd_stream(k->ex, k->a, cfg, ompk_variant_knob(OMPK_KNOB_MHC_POST_THREADS));
#else
    ompk_mhc_post_fwd_stream(k->ex, k->a, cfg, 0);
#endif
    return OMPK_OK;
}

#define STREAM(id, name)                                                                           \
    static int ok_##id(const void *p) {                                                            \
        return stream_ok(p, name);                                                                 \
    }                                                                                              \
    static ompk_status run_##id(const void *p, void *ws) {                                         \
        (void)ws;                                                                                  \
        return stream_run(p, name);                                                                \
    }
STREAM(stream, NULL)
#ifdef OMPK_LAB
STREAM(u1c, "u1c")
STREAM(u2c, "u2c")
STREAM(u4c, "u4c")
STREAM(u4p, "u4p")
STREAM(f32u1c, "f32u1c")
#endif
#undef STREAM

static int ok_bare1(const void *p) {
    const mhc_post_fwd_call *k = p;
    return ompk_mhc_post_bare_fits(k->ex, k->a);
}
static ompk_status run_bare1(const void *p, void *ws) {
    const mhc_post_fwd_call *k = p;
    (void)ws;
    ompk_mhc_post_fwd_bare1(k->ex, k->a);
    return OMPK_OK;
}
static ompk_status run_portable(const void *p, void *ws) {
    const mhc_post_fwd_call *k = p;
    (void)ws;
    ompk_mhc_post_fwd_kernel(k->ex, k->a);
    return OMPK_OK;
}

/* the streaming kernels load and store through PTX: NVIDIA-only (bare.h) */
#define GPU(name, id, named, built) {name, named, built, ok_##id, NULL, run_##id}
/* clang-format off */
static const ompk_impl fwd[] = {
    GPU("stream", stream, 0, ompk_nv_kernels_built),
    GPU("bare1", bare1, 0, ompk_gpu_kernels_built),
#ifdef OMPK_LAB
    GPU("u1c", u1c, 1, ompk_nv_kernels_built),
    GPU("u2c", u2c, 1, ompk_nv_kernels_built),
    GPU("u4c", u4c, 1, ompk_nv_kernels_built),
    GPU("u4p", u4p, 1, ompk_nv_kernels_built),
    GPU("f32u1c", f32u1c, 1, ompk_nv_kernels_built),
#endif
    {"portable", 0, NULL, NULL, NULL, run_portable},
};
/* clang-format on */
#undef GPU
const ompk_impl_list ompk_impls_mhc_post_fwd = {fwd, (int)(sizeof fwd / sizeof fwd[0])};

static int64_t bwd_ws(const void *p) {
    return mhc_post_bwd_workspace(((const mhc_post_bwd_call *)p)->a);
}
static ompk_status run_bwd(const void *p, void *ws) {
    const mhc_post_bwd_call *k = p;
    mhc_post_bwd_kernel(k->ex, k->a, ws);
    return OMPK_OK;
}
static const ompk_impl bwd[] = {
    {"portable", 0, NULL, NULL, bwd_ws, run_bwd},
};
const ompk_impl_list ompk_impls_mhc_post_bwd = {bwd, (int)(sizeof bwd / sizeof bwd[0])};
