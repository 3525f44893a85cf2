/* Routing probe: the host fallback of a target teams region (how every ompk kernel runs on the
 * host) against the same loop nest under a plain `omp parallel for`. Reported as a ratio; the
 * design requires it to stay under 1.3. */
#include <stdio.h>

#include "bench.h"
#include "target/mhc/mhc_post.h"

typedef struct probe {
    ompk_mhc_post_args a;
    int plain;
} probe;

static ompk_status probe_call(void *p) {
    probe *q = p;
    if (q->plain)
        ompk_mhc_post_fwd_plain_host(&q->a);
    else
        ompk_mhc_post_fwd_kernel(ompk_exec_for(ompk_device_host()), &q->a);
    return OMPK_OK;
}

static int bench_routing(ompk_bench_ctx *ctx) {
    const int64_t B = 1, S = ctx->quick ? 1024 : 4096, n = 4, D = 2048;
    const int64_t T = B * S;
    probe q = {0};
    q.a.x = ompk_bench_alloc_random(ctx, OMPK_BF16, T * n * D, 1);
    q.a.comb = ompk_bench_alloc_random(ctx, OMPK_F32, T * n * n, 2);
    q.a.post = ompk_bench_alloc_random(ctx, OMPK_F32, T * n, 3);
    q.a.f = ompk_bench_alloc_random(ctx, OMPK_BF16, T * D, 4);
    q.a.out = ompk_bench_alloc_random(ctx, OMPK_BF16, T * n * D, 5);
    q.a.B = B, q.a.S = S, q.a.D = D, q.a.n = (int)n, q.a.is_bf16 = 1;
    int64_t sx[4] = {S * n * D, n * D, D, 1}, sc[4] = {S * n * n, n * n, n, 1};
    int64_t sp[3] = {S * n, n, 1}, sf[3] = {S * D, D, 1};
    for (int d = 0; d < 4; d++) q.a.sx[d] = q.a.so[d] = sx[d], q.a.sc[d] = sc[d];
    for (int d = 0; d < 3; d++) q.a.sp[d] = sp[d], q.a.sf[d] = sf[d];
    int rc = 1;
    if (q.a.x && q.a.comb && q.a.post && q.a.f && q.a.out && ompk_mhc_post_vec_ok(&q.a)) {
        double mn_t, mn_p;
        q.plain = 0;
        double t_target = ompk_bench_time(ctx, probe_call, &q, &mn_t);
        q.plain = 1;
        double t_plain = ompk_bench_time(ctx, probe_call, &q, &mn_p);
        char shape[64];
        snprintf(shape, sizeof shape, "B%lld S%lld n%lld D%lld", (long long)B, (long long)S,
                 (long long)n, (long long)D);
        double bytes = (double)T * ((2.0 * n + 1) * D * 2 + (n * n + n) * 4.0);
        ompk_bench_record r = {0};
        r.kernel = "routing_target_host_fallback";
        r.dtype = "bf16";
        r.shape = shape;
        r.ms = t_target, r.ms_min = mn_t, r.bytes = bytes, r.extra_mem_bytes = 0;
        ompk_bench_emit(ctx, &r);
        r.kernel = "routing_plain_parallel_for";
        r.ms = t_plain, r.ms_min = mn_p;
        ompk_bench_emit(ctx, &r);
        printf("routing ratio (target-teams host fallback / plain parallel for): %.3f\n",
               t_target / t_plain);
        rc = 0;
    }
    ompk_bench_free(ctx, (void *)q.a.x);
    ompk_bench_free(ctx, (void *)q.a.comb);
    ompk_bench_free(ctx, (void *)q.a.post);
    ompk_bench_free(ctx, (void *)q.a.f);
    ompk_bench_free(ctx, q.a.out);
    return rc;
}

OMPK_BENCH_REGISTER(bench_routing, "routing_probe", 1, 0)
