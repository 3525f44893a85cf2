/* Attention forward and backward: the implementation lists (variant.h). Defaults: on the host
 * the AMX kernels for bf16 where the CPU has AMX, else the AVX-512 kernels where it has them
 * (amx-emulated: the AMX kernels on the tile emulation, for tests, only when named); on a GPU the
 * tensor-core kernels (bf16 forward and backward, its split-KV form for N <= 16, the 3xTF32
 * forward and backward for f32); the portable kernels everywhere else. */
#include "attention_impl.h"

#include "cpu.h"
#include "impl_avail.h"

static int cpu_avx512(void) {
    const ompk_cpu_features *f = ompk_cpu_get();
    return f->avx512f && f->avx512bw && f->avx512vl;
}

/* the AMX kernels' softmax and packing: AVX-512 with BF16 */
static int cpu_avx512_bf16(void) {
    return cpu_avx512() && ompk_cpu_get()->avx512_bf16;
}

static int cpu_amx(void) {
    return cpu_avx512_bf16() && ompk_cpu_amx_usable() && ompk_cpu_get()->amx_bf16;
}

/* Under a causal mask the tensor-core and AMX kernels multiply a masked pair's P = 0 (or dS = 0)
 * with the operand inside a tile product, where 0 * inf or 0 * NaN would reach rows that do not
 * see it: a non-finite operand there (v in the forward; q, k, dout in the backward) goes to the
 * next kernel (AVX-512 or portable), which selects. */
static int tc_fwd_safe(ompk_exec ex, const ompk_attn_geom *g, const void *v) {
    return g->mask == 0 || ompk_attn_all_finite(ex, v, g->bf16, g->B, g->Hkv, g->M, g->dh, g->vs);
}

static int tc_bwd_safe(ompk_exec ex, const ompk_attn_geom *g, const void *q, const void *k,
                       const void *dout) {
    return g->mask == 0 ||
           (ompk_attn_all_finite(ex, q, g->bf16, g->B, g->Hq, g->N, g->dh, g->qs) &&
            ompk_attn_all_finite(ex, k, g->bf16, g->B, g->Hkv, g->M, g->dh, g->ks) &&
            ompk_attn_all_finite(ex, dout, g->bf16, g->B, g->Hq, g->N, g->dh, g->dos));
}

/* ---- forward ---- */

static int fwd_amx_ok(const void *p) {
    const attention_fwd_call *c = p;
    return ompk_attn_amx_ok(c->ex, c->g, 0) && tc_fwd_safe(c->ex, c->g, c->v);
}
static int fwd_amx_emu_ok(const void *p) {
    const attention_fwd_call *c = p;
    return ompk_attn_amx_ok(c->ex, c->g, 1) && tc_fwd_safe(c->ex, c->g, c->v);
}
/* declines (nothing written) when the packed operands are not to be had */
static ompk_status fwd_amx_run(const void *p, void *ws) {
    const attention_fwd_call *c = p;
    (void)ws;
    return ompk_attn_fwd_amx(c->g, c->q, c->k, c->v, c->out, c->lse, 0) == 0 ? OMPK_OK
                                                                             : OMPK_ERR_UNSUPPORTED;
}
static ompk_status fwd_amx_emu_run(const void *p, void *ws) {
    const attention_fwd_call *c = p;
    (void)ws;
    return ompk_attn_fwd_amx(c->g, c->q, c->k, c->v, c->out, c->lse, 1) == 0 ? OMPK_OK
                                                                             : OMPK_ERR_UNSUPPORTED;
}

static int fwd_host_ok(const void *p) {
    const attention_fwd_call *c = p;
    return ompk_attn_host_ok(c->ex, c->g, 0);
}
static ompk_status fwd_host_run(const void *p, void *ws) {
    const attention_fwd_call *c = p;
    (void)ws;
    ompk_attn_fwd_host(c->g, c->q, c->k, c->v, c->out, c->lse);
    return OMPK_OK;
}

static int fwd_tc_ok(const void *p) {
    const attention_fwd_call *c = p;
    return ompk_attn_fwd_fast_ok(c->ex, c->g, c->q, c->k, c->v, c->out) &&
           tc_fwd_safe(c->ex, c->g, c->v);
}
static ompk_status fwd_tc_run(const void *p, void *ws) {
    const attention_fwd_call *c = p;
    (void)ws;
    ompk_attn_fwd_fast(c->ex, c->g, c->q, c->k, c->v, c->out, c->lse);
    return OMPK_OK;
}

static int fwd_dec_ok(const void *p) {
    const attention_fwd_call *c = p;
    return ompk_attn_fwd_decode_ok(c->ex, c->g, c->q, c->k, c->v, c->out) &&
           tc_fwd_safe(c->ex, c->g, c->v);
}
static int64_t fwd_dec_ws(const void *p) {
    return ompk_attn_fwd_decode_ws(((const attention_fwd_call *)p)->g);
}
static ompk_status fwd_dec_run(const void *p, void *ws) {
    const attention_fwd_call *c = p;
    ompk_attn_fwd_decode(c->ex, c->g, c->q, c->k, c->v, c->out, c->lse, ws);
    return OMPK_OK;
}

static int fwd_tf32_ok(const void *p) {
    const attention_fwd_call *c = p;
    return ompk_attn_fwd_f32tc_ok(c->ex, c->g, c->q, c->k, c->v, c->out) &&
           tc_fwd_safe(c->ex, c->g, c->v);
}
static ompk_status fwd_tf32_run(const void *p, void *ws) {
    const attention_fwd_call *c = p;
    (void)ws;
    ompk_attn_fwd_f32tc(c->ex, c->g, c->q, c->k, c->v, c->out, c->lse);
    return OMPK_OK;
}

static ompk_status fwd_portable_run(const void *p, void *ws) {
    const attention_fwd_call *c = p;
    (void)ws;
    ompk_attn_fwd_portable(c->ex, c->g, c->q, c->k, c->v, c->out, c->lse);
    return OMPK_OK;
}

static const ompk_impl fwd[] = {
    {"host-amx", 0, cpu_amx, fwd_amx_ok, NULL, fwd_amx_run},
    {"amx-emulated", 1, cpu_avx512_bf16, fwd_amx_emu_ok, NULL, fwd_amx_emu_run},
    {"host-avx512", 0, cpu_avx512, fwd_host_ok, NULL, fwd_host_run},
    {"tc-bf16-splitkv", 0, ompk_nv_kernels_built, fwd_dec_ok, fwd_dec_ws, fwd_dec_run},
    {"tc-bf16", 0, ompk_nv_kernels_built, fwd_tc_ok, NULL, fwd_tc_run},
    {"tc-3xtf32", 0, ompk_nv_kernels_built, fwd_tf32_ok, NULL, fwd_tf32_run},
    {"portable", 0, NULL, NULL, NULL, fwd_portable_run},
};
const ompk_impl_list ompk_impls_attention_fwd = {fwd, (int)(sizeof fwd / sizeof fwd[0])};

/* ---- backward: every entry takes D = rowsum(dout * out) and, on a GPU, the portable kernel's
 * lse in a workspace of 2 B*Hq*N floats ---- */

static int64_t bwd_ws(const void *p) {
    const ompk_attn_geom *g = ((const attention_bwd_call *)p)->g;
    const int64_t rows = g->B * g->Hq * g->N;
    return (int64_t)sizeof(float) * (rows > 0 ? 2 * rows : 1);
}

static int bwd_host_ok(const void *p) {
    const attention_bwd_call *c = p;
    return ompk_attn_host_ok(c->ex, c->g, 1);
}
/* declines (the next entry overwrites dq, dk, dv) when its own f32 workspace is not to be had */
static ompk_status bwd_host_run(const void *p, void *ws) {
    const attention_bwd_call *c = p;
    ompk_attn_rowsum(c->ex, c->g, c->dout, c->out, ws);
    return ompk_attn_bwd_host(c->g, c->dout, c->q, c->k, c->v, c->lse, c->dq, c->dk, c->dv, ws) == 0
               ? OMPK_OK
               : OMPK_ERR_UNSUPPORTED;
}

static int bwd_amx_ok(const void *p) {
    const attention_bwd_call *c = p;
    return ompk_attn_amx_ok(c->ex, c->g, 0) && tc_bwd_safe(c->ex, c->g, c->q, c->k, c->dout);
}
static int bwd_amx_emu_ok(const void *p) {
    const attention_bwd_call *c = p;
    return ompk_attn_amx_ok(c->ex, c->g, 1) && tc_bwd_safe(c->ex, c->g, c->q, c->k, c->dout);
}
static ompk_status bwd_amx_any(const attention_bwd_call *c, float *ws, int emulated) {
    ompk_attn_rowsum(c->ex, c->g, c->dout, c->out, ws);
    return ompk_attn_bwd_amx(c->g, c->dout, c->q, c->k, c->v, c->lse, c->dq, c->dk, c->dv, ws,
                             emulated) == 0
               ? OMPK_OK
               : OMPK_ERR_UNSUPPORTED;
}
static ompk_status bwd_amx_run(const void *p, void *ws) {
    return bwd_amx_any(p, ws, 0);
}
static ompk_status bwd_amx_emu_run(const void *p, void *ws) {
    return bwd_amx_any(p, ws, 1);
}

static int bwd_tc_ok(const void *p) {
    const attention_bwd_call *c = p;
    const void *ptrs[8] = {c->q, c->k, c->v, c->out, c->dout, c->dq, c->dk, c->dv};
    return ompk_attn_bwd_fast_ok(c->ex, c->g, ptrs) &&
           tc_bwd_safe(c->ex, c->g, c->q, c->k, c->dout);
}
static ompk_status bwd_tc_run(const void *p, void *ws) {
    const attention_bwd_call *c = p;
    ompk_attn_bwd_fast(c->ex, c->g, c->dout, c->q, c->k, c->v, c->out, c->lse, c->dq, c->dk, c->dv,
                       ws);
    return OMPK_OK;
}

static int bwd_tf32_ok(const void *p) {
    const attention_bwd_call *c = p;
    const void *ptrs[8] = {c->q, c->k, c->v, c->out, c->dout, c->dq, c->dk, c->dv};
    return ompk_attn_bwd_f32tc_ok(c->ex, c->g, ptrs) &&
           tc_bwd_safe(c->ex, c->g, c->q, c->k, c->dout);
}
static ompk_status bwd_tf32_run(const void *p, void *ws) {
    const attention_bwd_call *c = p;
    ompk_attn_bwd_f32tc(c->ex, c->g, c->dout, c->q, c->k, c->v, c->out, c->lse, c->dq, c->dk, c->dv,
                        ws);
    return OMPK_OK;
}

static ompk_status bwd_portable_run(const void *p, void *ws) {
    const attention_bwd_call *c = p;
    ompk_attn_bwd_portable(c->ex, c->g, c->dout, c->q, c->k, c->v, c->out, c->lse, c->dq, c->dk,
                           c->dv, ws);
    return OMPK_OK;
}

static const ompk_impl bwd[] = {
    {"host-amx", 0, cpu_amx, bwd_amx_ok, bwd_ws, bwd_amx_run},
    {"amx-emulated", 1, cpu_avx512_bf16, bwd_amx_emu_ok, bwd_ws, bwd_amx_emu_run},
    {"host-avx512", 0, cpu_avx512, bwd_host_ok, bwd_ws, bwd_host_run},
    {"tc-bf16", 0, ompk_nv_kernels_built, bwd_tc_ok, bwd_ws, bwd_tc_run},
    {"tc-3xtf32", 0, ompk_nv_kernels_built, bwd_tf32_ok, bwd_ws, bwd_tf32_run},
    {"portable", 0, NULL, NULL, bwd_ws, bwd_portable_run},
};
const ompk_impl_list ompk_impls_attention_bwd = {bwd, (int)(sizeof bwd / sizeof bwd[0])};

int attention_impl_bf16_p(const ompk_impl *ran, const ompk_attn_geom *g) {
    if (!ran) return 0;
    if (ran->run == fwd_host_run || ran->run == bwd_host_run) return g->bf16;
    if (ran->run == fwd_amx_run || ran->run == fwd_amx_emu_run || ran->run == bwd_amx_run ||
        ran->run == bwd_amx_emu_run)
        return 1; /* bf16 only */
    return ran->run == fwd_tc_run || ran->run == fwd_dec_run || ran->run == bwd_tc_run;
}
