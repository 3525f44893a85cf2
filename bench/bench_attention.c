/* ompk-bench entries for attention forward and backward (f32, bf16; no mask and causal).
 * bf16 shapes on a GPU and every shape on the host run with each variant (fast, the default
 * order; portable; on an AMX host also host-avx512 for bf16). FLOPs follow
 * the FlashAttention convention: forward 4*B*Hq*N*M*dh (half under a causal mask), backward
 * 2.5x the forward. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "variant.h"
#include "ompk/attention.h"

typedef struct att_arg {
    ompk_tensor q, k, v, out, lse, dout, dq, dk, dv;
    ompk_attention_params p;
} att_arg;

static ompk_status fwd_call(void *p) {
    att_arg *a = p;
    return ompk_attention_fwd(&a->q, &a->k, &a->v, &a->out, &a->lse, &a->p);
}

static ompk_status bwd_call(void *p) {
    att_arg *a = p;
    return ompk_attention_bwd(&a->dout, &a->q, &a->k, &a->v, &a->out, &a->lse, &a->dq, &a->dk,
                              &a->dv, &a->p);
}

static int bench_shape(ompk_bench_ctx *ctx, int bwd, ompk_dtype dt, ompk_attention_mask mask,
                       int64_t B, int64_t H, int64_t N, int64_t dh, const char *variant) {
    const int64_t nq = B * H * N * dh, nl = B * H * N;
    int64_t qs[4] = {B, H, N, dh}, ls[3] = {B, H, N};
    void *buf[8] = {0};
    for (int i = 0; i < 7; i++) buf[i] = ompk_bench_alloc_random(ctx, dt, nq, (uint64_t)(i + 1));
    buf[7] = ompk_bench_alloc_random(ctx, OMPK_F32, nl, 9);
    int rc = 1;
    for (int i = 0; i < 8; i++)
        if (!buf[i]) goto done;
    att_arg a;
    a.q = ompk_tensor_make(buf[0], dt, 4, qs, ctx->dev);
    a.k = ompk_tensor_make(buf[1], dt, 4, qs, ctx->dev);
    a.v = ompk_tensor_make(buf[2], dt, 4, qs, ctx->dev);
    a.out = ompk_tensor_make(buf[3], dt, 4, qs, ctx->dev);
    a.dout = ompk_tensor_make(buf[4], dt, 4, qs, ctx->dev);
    a.dq = ompk_tensor_make(buf[5], dt, 4, qs, ctx->dev);
    a.dk = ompk_tensor_make(buf[6], dt, 4, qs, ctx->dev);
    a.dv = ompk_tensor_make(buf[3], dt, 4, qs, ctx->dev); /* replaced below for bwd */
    a.lse = ompk_tensor_make(buf[7], OMPK_F32, 3, ls, ctx->dev);
    a.p = ompk_attention_params_default();
    a.p.mask = mask;
    void *dvb = NULL;
    if (bwd) {
        dvb = ompk_bench_alloc_random(ctx, dt, nq, 11);
        if (!dvb) goto done;
        a.dv = ompk_tensor_make(dvb, dt, 4, qs, ctx->dev);
        /* a real out and lse, so the backward's softmax is the forward's */
        if (fwd_call(&a) != OMPK_OK) {
            ompk_bench_free(ctx, dvb);
            goto done;
        }
    }
    double mn, ms = ompk_bench_time(ctx, bwd ? bwd_call : fwd_call, &a, &mn);
    if (ms >= 0) {
        int esz = ompk_dtype_bits(dt) / 8;
        char shape[96];
        snprintf(shape, sizeof shape, "B%lld H%lld N%lld dh%lld%s", (long long)B, (long long)H,
                 (long long)N, (long long)dh, mask == OMPK_ATTN_MASK_NONE ? "" : " causal");
        double fl = 4.0 * B * H * N * N * dh * (mask == OMPK_ATTN_MASK_NONE ? 1.0 : 0.5);
        ompk_bench_record r = {0};
        r.kernel = bwd ? "attention_bwd" : "attention_fwd";
        r.dtype = ompk_dtype_name(dt);
        r.shape = shape;
        r.variant = variant;
        r.ms = ms;
        r.ms_min = mn;
        /* fwd: q, k, v read, out and lse written; bwd: dout, q, k, v, out, lse read,
         * dq, dk, dv written */
        r.bytes = bwd ? (double)nq * esz * 8 + nl * 4.0 : (double)nq * esz * 4 + nl * 4.0;
        r.flops = bwd ? 2.5 * fl : fl;
        r.extra_mem_bytes = bwd ? nl * 4.0 : 0.0;
        r.peak = dt == OMPK_BF16 ? "bf16" : "fp32";
        ompk_bench_emit(ctx, &r);
        rc = 0;
    }
    if (dvb) ompk_bench_free(ctx, dvb);
done:
    for (int i = 0; i < 8; i++)
        if (buf[i]) ompk_bench_free(ctx, buf[i]);
    return rc;
}

/* Whether op's host-amx entry runs on this machine (then the AVX-512 kernels get a record of
 * their own: the default order takes AMX for bf16). */
static int host_amx(const char *op) {
    const ompk_impl *e;
    for (int i = 0; (e = ompk_variant_list(op, i)) != NULL; i++)
        if (strcmp(e->name, "host-amx") == 0) return ompk_impl_available(e);
    return 0;
}

static int bench_dir(ompk_bench_ctx *ctx, int bwd) {
    int rc = 0;
    const ompk_dtype dts[2] = {OMPK_BF16, OMPK_F32};
    const ompk_attention_mask masks[2] = {OMPK_ATTN_MASK_NONE, OMPK_ATTN_MASK_CAUSAL_TOP_LEFT};
    int gpu = ctx->dev.type == OMPK_TARGET;
    const char *op = bwd ? "attention_bwd" : "attention_fwd";
    /* "fast", the default order: on the GPU the tensor-core kernels (bf16 through mma, f32
     * through 3xTF32, forward and backward); on the host the AMX kernels (bf16, where the CPU
     * has AMX) and the AVX-512 kernels (f32, and bf16 without AMX); "host-avx512" the AVX-512
     * kernels named, for bf16 on an AMX host. Everything else (and every call with the portable
     * entry named) runs the portable kernel, so each record names what ran. */
    const char *const vars[3] = {"fast", "host-avx512", "portable"};
    for (int vi = 0; vi < 3; vi++) {
        if (vi == 1 && (gpu || !host_amx(op))) continue;
        ompk_variant_force(op, vi == 0 ? NULL : vars[vi]);
        const int fast = vi < 2;
        for (int d = 0; d < 2; d++)
            for (int m = 0; m < 2; m++) {
                if (vi == 1 && dts[d] != OMPK_BF16) continue;
                const char *var = vars[vi];
                if (ctx->quick && !gpu)
                    rc |= bench_shape(ctx, bwd, dts[d], masks[m], 1, 4, 1024, 64, var);
                else if (!gpu)
                    rc |= bench_shape(ctx, bwd, dts[d], masks[m], 1, 8, 2048, 128, var);
                else if (bwd && !fast)
                    /* a smaller shape for the portable GPU backward: where it runs its row
                     * kernels (GCC builds, dh 256) a call at B4 N4096 takes seconds */
                    rc |= bench_shape(ctx, bwd, dts[d], masks[m], 1, 16, 2048, 128, var);
                else
                    rc |= bench_shape(ctx, bwd, dts[d], masks[m], 4, 16, 4096, 128, var);
            }
    }
    ompk_bench_variant_restore(ctx, op);
    return rc;
}

static int bench_fwd(ompk_bench_ctx *ctx) {
    return bench_dir(ctx, 0);
}
static int bench_bwd(ompk_bench_ctx *ctx) {
    return bench_dir(ctx, 1);
}

OMPK_BENCH_REGISTER(bench_fwd, "attention_fwd", 1, 1)
OMPK_BENCH_REGISTER(bench_bwd, "attention_bwd", 1, 1)
