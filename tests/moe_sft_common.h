/* Shared helpers of the MoE fine-tuning suites: a layer with f32 master weights read back
 * dequantized, LoRA adapters, routings, one training step (forward PUSH + backward) and the
 * double reference of the same step. */
#ifndef MOE_SFT_COMMON_H
#define MOE_SFT_COMMON_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "ompk/moe.h"
#include "ref/moe_ref.h"
#include "test_util.h"

typedef struct sft_shape {
    int64_t E, H, I, T;
    int k, r, split, depth;
    ompk_moe_format fmt;
    ompk_moe_isa isa;
    int threads;
    ompk_moe_grad_operands grad; /* 0: OMPK_MOE_GRAD_SPLIT */
} sft_shape;

typedef struct sft_layer {
    sft_shape sh;
    ompk_moe *moe;
    float *W[3];          /* dequantized, as the kernels use them */
    float *la[3], *lb[3]; /* LoRA f32 (NULL without) */
    ompk_tensor ta[3], tb[3];
    float alpha;
} sft_layer;

/* every output of one step, f32/double as written */
typedef struct sft_out {
    float *dx, *dw, *y;
    float *da[3], *db[3], *dW[3];
} sft_out;

static inline int64_t sft_in(const sft_shape *s, int p) {
    return p < 2 ? s->H : s->I;
}
static inline int64_t sft_outd(const sft_shape *s, int p) {
    return p < 2 ? s->I : s->H;
}

static inline float *sft_rand(tu_rng *r, int64_t n, double scale) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
    for (int64_t i = 0; i < n; i++) p[i] = (float)(tu_normal(r) * scale);
    return p;
}

static inline ompk_moe_config sft_cfg(const sft_shape *s) {
    ompk_moe_config c;
    memset(&c, 0, sizeof c);
    c.experts = s->E;
    c.hidden = s->H;
    c.intermediate = s->I;
    c.top_k = s->k;
    c.max_tokens = s->T > 0 ? s->T : 1;
    c.format = s->fmt;
    c.group_size = 64;
    c.numa = OMPK_MOE_NUMA_FORCED;
    c.numa_split = s->split > 0 ? s->split : 1;
    c.isa = s->isa;
    c.threads = s->threads > 0 ? s->threads : 2;
    c.amx_min_rows = 2;
    c.cache_depth = s->depth > 0 ? s->depth : 1;
    c.lora_max_rank = 64;
    c.grad_operands = s->grad;
    return c;
}

static inline void sft_attach(sft_layer *L, int r, float alpha, float dropout, uint64_t seed) {
    const sft_shape *s = &L->sh;
    tu_rng g = tu_rng_make(99 + (uint64_t)r);
    L->alpha = alpha;
    for (int p = 0; p < 3; p++) {
        free(L->la[p]);
        free(L->lb[p]);
        int64_t in = sft_in(s, p), out = sft_outd(s, p);
        L->la[p] = sft_rand(&g, s->E * r * in, 1.0 / sqrt((double)in));
        L->lb[p] = sft_rand(&g, s->E * out * r, 0.5 / sqrt((double)r));
        int64_t sa[3] = {s->E, r, in}, sb[3] = {s->E, out, r};
        L->ta[p] = ompk_tensor_make(L->la[p], OMPK_F32, 3, sa, ompk_device_host());
        L->tb[p] = ompk_tensor_make(L->lb[p], OMPK_F32, 3, sb, ompk_device_host());
    }
    ompk_moe_lora lo;
    memset(&lo, 0, sizeof lo);
    lo.rank = r;
    lo.alpha = alpha;
    lo.gate_a = &L->ta[0];
    lo.gate_b = &L->tb[0];
    lo.up_a = &L->ta[1];
    lo.up_b = &L->tb[1];
    lo.down_a = &L->ta[2];
    lo.down_b = &L->tb[2];
    lo.dropout = dropout;
    lo.seed = seed;
    cr_assert_eq(ompk_moe_set_lora(L->moe, &lo), OMPK_OK, "%s", ompk_last_error());
    L->sh.r = r;
}

static inline int sft_new(sft_layer *L, sft_shape s) {
    memset(L, 0, sizeof *L);
    L->sh = s;
    ompk_moe_config c = sft_cfg(&s);
    if (ompk_moe_create(&c, &L->moe) != OMPK_OK) return 0;
    tu_rng g = tu_rng_make(1234);
    float *src[3];
    for (int p = 0; p < 3; p++) {
        int64_t n = s.E * s.I * s.H;
        src[p] = sft_rand(&g, n, 1.0 / sqrt((double)sft_in(&s, p)));
        L->W[p] = malloc((size_t)n * 4);
    }
    int64_t s1[3] = {s.E, s.I, s.H}, s2[3] = {s.E, s.H, s.I};
    ompk_tensor t[3];
    for (int p = 0; p < 3; p++)
        t[p] = ompk_tensor_make(src[p], OMPK_F32, 3, p < 2 ? s1 : s2, ompk_device_host());
    cr_assert_eq(ompk_moe_load_weights(L->moe, &t[0], &t[1], &t[2]), OMPK_OK, "%s",
                 ompk_last_error());
    for (int p = 0; p < 3; p++) {
        t[p].data = L->W[p];
        cr_assert_eq(ompk_moe_get_weights(L->moe, p, &t[p]), OMPK_OK);
        free(src[p]);
    }
    L->sh.r = 0;
    if (s.r > 0) sft_attach(L, s.r, 2.0f * (float)s.r, 0.0f, 0);
    return 1;
}

static inline void sft_free(sft_layer *L) {
    ompk_moe_destroy(L->moe);
    for (int p = 0; p < 3; p++) {
        free(L->W[p]);
        free(L->la[p]);
        free(L->lb[p]);
    }
}

typedef struct sft_batch {
    int64_t T;
    int k;
    float *x, *w, *dy;
    int64_t *ids;
} sft_batch;

/* random routing with -1 slots and a repeated expert; x and dy bf16-representable */
static inline sft_batch sft_batch_new(const sft_shape *s, int64_t T, uint64_t seed) {
    sft_batch b;
    tu_rng g = tu_rng_make(seed);
    b.T = T;
    b.k = s->k;
    b.x = sft_rand(&g, T * s->H, 1.0);
    b.dy = sft_rand(&g, T * s->H, 1.0);
    for (int64_t i = 0; i < T * s->H; i++) {
        b.x[i] = ompk_round_bf16(b.x[i]);
        b.dy[i] = ompk_round_bf16(b.dy[i]);
    }
    b.ids = malloc((size_t)(T * s->k + 1) * 8);
    b.w = malloc((size_t)(T * s->k + 1) * 4);
    for (int64_t t = 0; t < T; t++)
        for (int j = 0; j < s->k; j++) {
            int64_t e = (int64_t)(tu_uniform(&g) * (double)s->E);
            if (j == 0) e = 0; /* expert 0 takes every token: several row blocks */
            if (s->k > 1 && j == s->k - 1 && t % 4 == 1) e = -1;
            if (s->k > 2 && j == 1 && t % 5 == 2) e = b.ids[t * s->k]; /* same expert twice */
            b.ids[t * s->k + j] = e;
            b.w[t * s->k + j] = (float)(0.2 + tu_uniform(&g));
        }
    return b;
}

static inline void sft_batch_free(sft_batch *b) {
    free(b->x);
    free(b->w);
    free(b->dy);
    free(b->ids);
}

static inline void sft_out_alloc(const sft_shape *s, sft_out *o) {
    memset(o, 0, sizeof *o);
    int64_t T = s->T > 0 ? s->T : 1;
    o->dx = calloc((size_t)(T * s->H), 4);
    o->y = calloc((size_t)(T * s->H), 4);
    o->dw = calloc((size_t)(T * s->k), 4);
    for (int p = 0; p < 3; p++) {
        int64_t n = s->E * s->H * s->I;
        if (s->r) {
            o->da[p] = calloc((size_t)(s->E * s->r * sft_in(s, p)), 4);
            o->db[p] = calloc((size_t)(s->E * s->r * sft_outd(s, p)), 4);
        }
        if (s->fmt == OMPK_MOE_BF16) o->dW[p] = calloc((size_t)n, 4);
    }
}

static inline void sft_out_free(sft_out *o) {
    free(o->dx);
    free(o->y);
    free(o->dw);
    for (int p = 0; p < 3; p++) {
        free(o->da[p]);
        free(o->db[p]);
        free(o->dW[p]);
    }
}

/* ompk_moe_grads over the buffers of o (dx f32), views kept in v[12] */
static inline ompk_moe_grads sft_grads(const sft_shape *s, int64_t T, sft_out *o, ompk_tensor *v,
                                       int accumulate) {
    ompk_moe_grads g;
    memset(&g, 0, sizeof g);
    int64_t sx[2] = {T, s->H}, sw[2] = {T, s->k};
    v[0] = ompk_tensor_make(o->dx, OMPK_F32, 2, sx, ompk_device_host());
    v[1] = ompk_tensor_make(o->dw, OMPK_F32, 2, sw, ompk_device_host());
    g.dx = &v[0];
    g.dw = &v[1];
    ompk_tensor **da[3] = {&g.gate_da, &g.up_da, &g.down_da},
                **db[3] = {&g.gate_db, &g.up_db, &g.down_db},
                **dW[3] = {&g.gate_dw, &g.up_dw, &g.down_dw};
    for (int p = 0; p < 3; p++) {
        int64_t in = sft_in(s, p), out = sft_outd(s, p);
        int64_t sa[3] = {s->E, s->r, in}, sb[3] = {s->E, out, s->r}, sW[3] = {s->E, out, in};
        if (o->da[p]) {
            v[2 + p] = ompk_tensor_make(o->da[p], OMPK_F32, 3, sa, ompk_device_host());
            *da[p] = &v[2 + p];
            v[5 + p] = ompk_tensor_make(o->db[p], OMPK_F32, 3, sb, ompk_device_host());
            *db[p] = &v[5 + p];
        }
        if (o->dW[p]) {
            v[8 + p] = ompk_tensor_make(o->dW[p], OMPK_F32, 3, sW, ompk_device_host());
            *dW[p] = &v[8 + p];
        }
    }
    g.accumulate = accumulate;
    return g;
}

static inline ompk_status sft_forward(sft_layer *L, const sft_batch *b, float *y,
                                      ompk_moe_cache_mode mode) {
    int64_t sx[2] = {b->T, L->sh.H}, si[2] = {b->T, b->k};
    ompk_tensor tx = ompk_tensor_make(b->x, OMPK_F32, 2, sx, ompk_device_host());
    ompk_tensor ti = ompk_tensor_make(b->ids, OMPK_I64, 2, si, ompk_device_host());
    ompk_tensor tw = ompk_tensor_make(b->w, OMPK_F32, 2, si, ompk_device_host());
    ompk_tensor ty = ompk_tensor_make(y, OMPK_F32, 2, sx, ompk_device_host());
    return ompk_moe_fwd_train(L->moe, &tx, &ti, &tw, &ty, mode);
}

/* dy_dt: dy passed as OMPK_F32 or as OMPK_BF16 (the batch's dy is bf16-representable: the same
 * values either way) */
static inline ompk_status sft_backward_dt(sft_layer *L, const sft_batch *b, sft_out *o,
                                          int accumulate, ompk_dtype dy_dt) {
    ompk_tensor v[12];
    sft_shape s = L->sh;
    ompk_moe_grads g = sft_grads(&s, b->T, o, v, accumulate);
    int64_t sx[2] = {b->T, s.H};
    uint16_t *dyb = NULL;
    void *dyp = b->dy;
    if (dy_dt == OMPK_BF16) {
        dyb = malloc((size_t)(b->T > 0 ? b->T * s.H : 1) * 2);
        if (!dyb) return OMPK_ERR_OUT_OF_MEMORY;
        for (int64_t i = 0; i < b->T * s.H; i++) dyb[i] = ompk_f32_to_bf16(b->dy[i]);
        dyp = dyb;
    }
    ompk_tensor tdy = ompk_tensor_make(dyp, dy_dt, 2, sx, ompk_device_host());
    ompk_status st = ompk_moe_bwd(L->moe, &tdy, &g);
    free(dyb);
    return st;
}

static inline ompk_status sft_backward(sft_layer *L, const sft_batch *b, sft_out *o,
                                       int accumulate) {
    return sft_backward_dt(L, b, o, accumulate, OMPK_F32);
}

/* one step: forward PUSH then backward */
static inline void sft_step(sft_layer *L, const sft_batch *b, sft_out *o) {
    cr_assert_eq(sft_forward(L, b, o->y, OMPK_MOE_CACHE_PUSH), OMPK_OK, "%s", ompk_last_error());
    cr_assert_eq(sft_backward(L, b, o, 0), OMPK_OK, "%s", ompk_last_error());
}

/* the reference of the same step (double) */
typedef struct sft_ref {
    double *y, *dx, *dw, *da[3], *db[3], *dW[3];
} sft_ref;

static inline void sft_ref_run(const sft_layer *L, const sft_batch *b, float dropout, uint64_t seed,
                               sft_ref *R) {
    const sft_shape *s = &L->sh;
    int64_t T = b->T > 0 ? b->T : 1;
    memset(R, 0, sizeof *R);
    R->y = calloc((size_t)(T * s->H), 8);
    R->dx = calloc((size_t)(T * s->H), 8);
    R->dw = calloc((size_t)(T * s->k), 8);
    ompk_moe_ref_grads g;
    memset(&g, 0, sizeof g);
    g.dx = R->dx;
    g.dw = R->dw;
    for (int p = 0; p < 3; p++) {
        if (s->r) {
            R->da[p] = g.da[p] = calloc((size_t)(s->E * s->r * sft_in(s, p)), 8);
            R->db[p] = g.db[p] = calloc((size_t)(s->E * s->r * sft_outd(s, p)), 8);
        }
        R->dW[p] = g.dW[p] = calloc((size_t)(s->E * s->H * s->I), 8);
    }
    ompk_moe_ref_lora lr = {s->r,
                            s->r ? (double)(L->alpha / (float)s->r) : 0.0,
                            {L->la[0], L->la[1], L->la[2]},
                            {L->lb[0], L->lb[1], L->lb[2]},
                            dropout,
                            seed};
    ompk_moe_ref_train(b->T, s->E, s->H, s->I, s->k, b->x, b->ids, b->w, L->W[0], L->W[1], L->W[2],
                       s->fmt == OMPK_MOE_BF16 ? OMPK_MOE_REF_ACT_BF16 : OMPK_MOE_REF_ACT_INT8,
                       s->r ? &lr : NULL, R->y, b->dy, &g);
}

static inline void sft_ref_free(sft_ref *R) {
    free(R->y);
    free(R->dx);
    free(R->dw);
    for (int p = 0; p < 3; p++) {
        free(R->da[p]);
        free(R->db[p]);
        free(R->dW[p]);
    }
}

/* worst |out - ref| / (atol*rms(ref) + rtol*|ref|): <= 1 passes; *nbad (may be NULL) counts the
 * elements above 1. rtol is one bf16 rounding of a: an element of a within fp32 noise of a
 * rounding boundary rounds the other way in the reference (a flip), and dW_down, dA_down move
 * by that rounding step. */
static inline double sft_cmp_n(const char *what, const float *out, const double *ref, int64_t n,
                               double atol, double rtol, int64_t *nbad) {
    double s2 = 0;
    for (int64_t i = 0; i < n; i++) s2 += ref[i] * ref[i];
    double sc = n > 0 ? sqrt(s2 / (double)n) : 1.0, worst = 0;
    if (!(sc > 0)) sc = 1.0;
    int64_t wi = 0, bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double q = fabs((double)out[i] - ref[i]) / (atol * sc + rtol * fabs(ref[i]));
        bad += !(q <= 1.0);
        if (!(q <= worst)) {
            worst = isnan(q) ? INFINITY : q;
            wi = i;
        }
    }
    if (worst > 1)
        fprintf(stderr,
                "%s: %lld of %lld above tolerance, worst at %lld: %.9g vs %.9g (ratio %.3g)\n",
                what, (long long)bad, (long long)n, (long long)wi, n ? out[wi] : 0.0f,
                n ? ref[wi] : 0.0, worst);
    if (nbad) *nbad = bad;
    return worst;
}

static inline double sft_cmp(const char *what, const float *out, const double *ref, int64_t n,
                             double atol, double rtol) {
    return sft_cmp_n(what, out, ref, n, atol, rtol, NULL);
}

/* int formats: an int8 flip of a moves a whole code step (max|a|/127), far more than a bf16
 * one; a few such elements (at most max(2, n/200)) may reach 8x the tolerance */
static inline int sft_ok(const char *what, const float *out, const double *ref, int64_t n,
                         double atol, double rtol, int isint) {
    int64_t bad = 0;
    double w = sft_cmp_n(what, out, ref, n, atol, rtol, &bad);
    if (w <= 1.0) return 1;
    return isint && w <= 8.0 && bad <= (n / 200 > 2 ? n / 200 : 2);
}

/* every output of o against R */
static inline void sft_check(const char *tag, const sft_layer *L, int64_t T, const sft_out *o,
                             const sft_ref *R) {
    const sft_shape *s = &L->sh;
    const int isint = s->fmt != OMPK_MOE_BF16;
    /* OMPK_MOE_GRAD_BF16 rounds dy (int8: dy times the weight scales), dg and du to bf16 before
     * the data-gradient products: one more operand rounding in every gradient that uses them */
    const double gm = s->grad == OMPK_MOE_GRAD_BF16 ? 3.0 : 1.0;
    const double at = (isint ? 4e-3 : 2e-3) * gm, rt = 8e-3 * gm;
    char w[160];
    static const char *pn[3] = {"gate", "up", "down"};
    snprintf(w, sizeof w, "%s y", tag);
    cr_expect(sft_ok(w, o->y, R->y, T * s->H, at / gm, rt / gm, isint), "%s", w);
    snprintf(w, sizeof w, "%s dx", tag);
    cr_expect(sft_ok(w, o->dx, R->dx, T * s->H, at, rt, isint), "%s", w);
    snprintf(w, sizeof w, "%s dw", tag);
    cr_expect(sft_ok(w, o->dw, R->dw, T * s->k, at, rt, isint), "%s", w);
    for (int p = 0; p < 3; p++) {
        if (s->r) {
            snprintf(w, sizeof w, "%s %s dA", tag, pn[p]);
            cr_expect(sft_ok(w, o->da[p], R->da[p], s->E * s->r * sft_in(s, p), at, rt, isint),
                      "%s", w);
            snprintf(w, sizeof w, "%s %s dB", tag, pn[p]);
            cr_expect(sft_ok(w, o->db[p], R->db[p], s->E * s->r * sft_outd(s, p), at, rt, isint),
                      "%s", w);
        }
        if (o->dW[p]) {
            snprintf(w, sizeof w, "%s %s dW", tag, pn[p]);
            cr_expect(sft_ok(w, o->dW[p], R->dW[p], s->E * s->H * s->I, at, rt, isint), "%s", w);
        }
    }
}

#endif
