/* ompk-bench entry attention_decode: the forward with few queries against a long key cache (GQA,
 * 32 query heads on 8 kv heads, dh 128, bf16, lse out), the shape of a decode step. Memory-bound:
 * the record's bytes are K and V read once plus q, out and lse, so the bench's copy-bandwidth
 * column is the efficiency. On a GPU it runs the default order (the split-KV kernel for N <= 16)
 * and the tensor-core forward without splits (variant tc-bf16) for comparison. */
#include <stdio.h>

#include "bench.h"
#include "variant.h"
#include "ompk/attention.h"

typedef struct dec_arg {
    ompk_tensor q, k, v, out, lse;
    ompk_attention_params p;
} dec_arg;

static ompk_status dec_call(void *p) {
    dec_arg *a = p;
    return ompk_attention_fwd(&a->q, &a->k, &a->v, &a->out, &a->lse, &a->p);
}

static int dec_shape(ompk_bench_ctx *ctx, int64_t B, int64_t N, int64_t M, const char *variant) {
    const int64_t Hq = 32, Hkv = 8, dh = 128;
    const int64_t nq = B * Hq * N * dh, nk = B * Hkv * M * dh, nl = B * Hq * N;
    int64_t qs[4] = {B, Hq, N, dh}, ks[4] = {B, Hkv, M, dh}, ls[3] = {B, Hq, N};
    void *q = ompk_bench_alloc_random(ctx, OMPK_BF16, nq, 1);
    void *k = ompk_bench_alloc_random(ctx, OMPK_BF16, nk, 2);
    void *v = ompk_bench_alloc_random(ctx, OMPK_BF16, nk, 3);
    void *o = ompk_bench_alloc_random(ctx, OMPK_BF16, nq, 4);
    void *l = ompk_bench_alloc_random(ctx, OMPK_F32, nl, 5);
    int rc = 1;
    if (q && k && v && o && l) {
        dec_arg a;
        a.q = ompk_tensor_make(q, OMPK_BF16, 4, qs, ctx->dev);
        a.k = ompk_tensor_make(k, OMPK_BF16, 4, ks, ctx->dev);
        a.v = ompk_tensor_make(v, OMPK_BF16, 4, ks, ctx->dev);
        a.out = ompk_tensor_make(o, OMPK_BF16, 4, qs, ctx->dev);
        a.lse = ompk_tensor_make(l, OMPK_F32, 3, ls, ctx->dev);
        a.p = ompk_attention_params_default();
        double mn, ms = ompk_bench_time(ctx, dec_call, &a, &mn);
        if (ms >= 0) {
            char shape[96];
            snprintf(shape, sizeof shape, "B%lld Hq%lld Hkv%lld N%lld M%lld dh%lld", (long long)B,
                     (long long)Hq, (long long)Hkv, (long long)N, (long long)M, (long long)dh);
            ompk_bench_record r = {0};
            r.kernel = "attention_decode";
            r.dtype = "bf16";
            r.shape = shape;
            r.variant = variant;
            r.ms = ms;
            r.ms_min = mn;
            r.bytes = (double)nk * 2 * 2 + (double)nq * 2 * 2 + nl * 4.0;
            r.flops = 4.0 * B * Hq * N * M * dh;
            r.extra_mem_bytes = -1;
            r.peak = "bf16";
            ompk_bench_emit(ctx, &r);
            rc = 0;
        }
    }
    void *bufs[5] = {q, k, v, o, l};
    for (int i = 0; i < 5; i++)
        if (bufs[i]) ompk_bench_free(ctx, bufs[i]);
    return rc;
}

static int bench_decode(ompk_bench_ctx *ctx) {
    int rc = 0;
    if (ctx->quick || ctx->dev.type != OMPK_TARGET) {
        rc |= dec_shape(ctx, 1, 1, ctx->quick ? 2048 : 8192, NULL);
        return rc;
    }
    static const int64_t shapes[][3] = {{4, 1, 32768}, {4, 4, 32768}, {4, 16, 32768},
                                        {1, 1, 32768}, {4, 1, 4096},  {1, 16, 8192}};
    for (int fast = 0; fast < 2; fast++) {
        ompk_variant_force("attention_fwd", fast ? "tc-bf16" : NULL);
        for (int s = 0; s < 6; s++)
            rc |= dec_shape(ctx, shapes[s][0], shapes[s][1], shapes[s][2],
                            fast ? "tc-bf16" : "tc-bf16-splitkv");
    }
    ompk_bench_variant_restore(ctx, "attention_fwd");
    return rc;
}

OMPK_BENCH_REGISTER(bench_decode, "attention_decode", 1, 1)
