/* ompk-bench entry "mhc_pre_bwd_variants" (GPU): the mHC pre backward and the training chain
 * (pre fwd + Sinkhorn bwd + pre bwd) at the shape, B4 S4096 n4 D4096 bf16 (and n8 D2048),
 * under each stage-4 kernel that OMPK_MHC_PRE_BWD_VARIANT selects: the tensor-core default ("tc"),
 * its 128-register build ("tc-r128") and the portable SIMT kernel ("portable"), in one process so
 * the figures compare directly. Same byte and flop counts as the mhc_pre entry. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "variant.h"

typedef struct pb_bufs {
    int64_t B, S, n, D;
    ompk_mhc_params p;
    ompk_tensor x, phi, gamma, alpha, bias, h_in, h_post, logits, comb, h_mix, inv, h_pre;
    ompk_tensor dh_in, dh_post, dh_res, dcomb, dx, dphi, dalpha, dbias, dgamma;
} pb_bufs;

static ompk_status pb_fwd(void *p) {
    pb_bufs *m = p;
    return ompk_mhc_pre_fwd(&(ompk_mhc_pre_fwd_args){.x = &m->x,
                                                     .phi = &m->phi,
                                                     .gamma = &m->gamma,
                                                     .alpha = &m->alpha,
                                                     .bias = &m->bias,
                                                     .h_in = &m->h_in,
                                                     .h_post = &m->h_post,
                                                     .res_logits = &m->logits,
                                                     .comb = &m->comb,
                                                     .h_mix = &m->h_mix,
                                                     .inv_rms = &m->inv,
                                                     .h_pre = &m->h_pre},
                            &m->p);
}

static ompk_status pb_bwd(void *p) {
    pb_bufs *m = p;
    return ompk_mhc_pre_bwd(&(ompk_mhc_pre_bwd_args){.x = &m->x,
                                                     .phi = &m->phi,
                                                     .gamma = &m->gamma,
                                                     .alpha = &m->alpha,
                                                     .dh_in = &m->dh_in,
                                                     .dh_post = &m->dh_post,
                                                     .dh_res = &m->dh_res,
                                                     .h_mix = &m->h_mix,
                                                     .inv_rms = &m->inv,
                                                     .h_pre = &m->h_pre,
                                                     .h_post = &m->h_post,
                                                     .dx = &m->dx,
                                                     .dphi = &m->dphi,
                                                     .dalpha = &m->dalpha,
                                                     .dbias = &m->dbias,
                                                     .dgamma = &m->dgamma},
                            &m->p);
}

static ompk_status pb_chain(void *p) {
    pb_bufs *m = p;
    ompk_status st = pb_fwd(p);
    if (st == OMPK_OK) st = ompk_mhc_sinkhorn_bwd(&m->logits, &m->dcomb, &m->dh_res, &m->p);
    if (st == OMPK_OK) st = pb_bwd(p);
    return st;
}

static int pb_shape(ompk_bench_ctx *ctx, int64_t B, int64_t S, int64_t n, int64_t D) {
    pb_bufs m;
    memset(&m, 0, sizeof m);
    const int64_t T = B * S, K = n * D, M = 2 * n + n * n;
    const ompk_dtype bf = OMPK_BF16, F = OMPK_F32;
    m.B = B, m.S = S, m.n = n, m.D = D;
    m.p = ompk_mhc_params_default();
    ompk_tensor *ts[21] = {&m.x,      &m.phi,   &m.gamma, &m.alpha, &m.bias,   &m.h_in,  &m.h_post,
                           &m.logits, &m.comb,  &m.h_mix, &m.inv,   &m.h_pre,  &m.dh_in, &m.dh_post,
                           &m.dh_res, &m.dcomb, &m.dx,    &m.dphi,  &m.dalpha, &m.dbias, &m.dgamma};
    const struct {
        ompk_dtype dt;
        int nd;
        int64_t s[4];
    } sp[21] = {{bf, 4, {B, S, n, D}}, {F, 2, {M, K}},        {F, 1, {K}},
                {F, 1, {3}},           {F, 1, {M}},           {bf, 3, {B, S, D}},
                {F, 3, {B, S, n}},     {F, 4, {B, S, n, n}},  {F, 4, {B, S, n, n}},
                {F, 2, {T, M}},        {F, 1, {T}},           {F, 2, {T, n}},
                {bf, 3, {B, S, D}},    {F, 3, {B, S, n}},     {F, 4, {B, S, n, n}},
                {F, 4, {B, S, n, n}},  {bf, 4, {B, S, n, D}}, {F, 2, {M, K}},
                {F, 1, {3}},           {F, 1, {M}},           {F, 1, {K}}};
    void *mem[21];
    int rc = 0;
    for (int i = 0; i < 21; i++) {
        int64_t cnt = 1;
        for (int d = 0; d < sp[i].nd; d++) cnt *= sp[i].s[d];
        mem[i] = ompk_bench_alloc_random(ctx, sp[i].dt, cnt, (uint64_t)(100 + i));
        if (!mem[i]) rc = 1;
        *ts[i] = ompk_tensor_make(mem[i], sp[i].dt, sp[i].nd, sp[i].s, ctx->dev);
    }
    if (!rc && pb_fwd(&m) != OMPK_OK) rc = 1;
    char shape[64];
    snprintf(shape, sizeof shape, "B%lld S%lld n%lld D%lld", (long long)B, (long long)S,
             (long long)n, (long long)D);
    const double Td = (double)T, Kd = (double)K, Md = (double)M, Dd = (double)D, e = 2.0;
    const double nd = (double)n, nn = (double)(n * n), gemm = 2.0 * Td * Kd * Md;
    /* every entry of the mhc_pre_bwd list by name */
    const ompk_impl *var;
    for (int v = 0; !rc && (var = ompk_variant_list("mhc_pre_bwd", v)) != NULL; v++) {
        ompk_variant_force("mhc_pre_bwd", var->name);
        for (int c = 0; c < 2; c++) {
            double mn, ms = ompk_bench_time(ctx, c ? pb_chain : pb_bwd, &m, &mn);
            if (ms < 0) {
                rc = 1;
                continue;
            }
            ompk_bench_record r = {0};
            r.kernel = c ? "mhc_pre_fwd_sinkhorn_bwd" : "mhc_pre_bwd";
            r.dtype = "bf16";
            r.shape = shape;
            r.variant = var->name;
            r.ms = ms, r.ms_min = mn;
            r.bytes = c ? Td * (3 * Kd * e + 2 * Dd * e) + (3 * Md * Kd) * 4
                        : Td * (2 * Kd * e + Dd * e + (nd + nn + Md + 1 + 2 * nd) * 4) +
                              (2 * Md * Kd + 2 * Kd) * 4;
            r.flops = c ? 3 * gemm : 2 * gemm + 2 * Td * Kd;
            r.extra_mem_bytes = -1;
            r.peak = "fp32";
            ompk_bench_emit(ctx, &r);
        }
        ompk_bench_variant_restore(ctx, "mhc_pre_bwd");
    }
    for (int i = 0; i < 21; i++) ompk_bench_free(ctx, mem[i]);
    return rc;
}

/* the n4 shape, and n8 with the same bytes of x (the tensor-core stage 4's 16-k warps) */
static int bench_mhc_pre_bwd_variants(ompk_bench_ctx *ctx) {
    int rc = pb_shape(ctx, 4, 4096, 4, 4096);
    if (!ctx->quick) rc |= pb_shape(ctx, 4, 4096, 8, 2048);
    return rc;
}

OMPK_BENCH_REGISTER(bench_mhc_pre_bwd_variants, "mhc_pre_bwd_variants", 0, 1)
