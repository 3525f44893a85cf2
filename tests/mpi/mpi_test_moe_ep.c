/* The expert-parallel MoE layer (ompk/moe_ep.h) against one ompk_moe layer on the ranks' tokens
 * concatenated in rank order: y must be bit-identical whatever the number of ranks (run under
 * mpirun -np 1, 2 and 4 by ci/mpi.sh). Also: uneven expert counts per rank, a rank with no
 * tokens, ranks that receive no rows, and bad inputs on one rank reported on every rank with no
 * output written and no rank left waiting. Fine-tuning likewise (two saved micro-batches, LoRA,
 * full-weight gradients: y, dx, dw and every gradient bit-identical). Prints
 * "mpi_test_moe_ep np=N: P passed, F failed" on rank 0; exits 1 on any failure. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ompk/moe_ep.h"

static int rank, size, npass, nfail;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (cond) {                                                                                \
            npass++;                                                                               \
        } else {                                                                                   \
            nfail++;                                                                               \
            printf("rank %d FAIL %s:%d: ", rank, __FILE__, __LINE__);                              \
            printf(__VA_ARGS__);                                                                   \
            printf(" (%s)\n", ompk_last_error());                                                  \
        }                                                                                          \
    } while (0)

static uint64_t rs;
static float urand(void) {
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (float)(rs >> 40) / 16777216.0f * 2.0f - 1.0f;
}
static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

typedef struct ep_case {
    const char *name;
    int64_t E, H, I;
    int k;
    ompk_moe_format fmt;
    ompk_dtype xdt, ydt;
    int routing;    /* 0 random with -1 padding, 1 every route to the last expert */
    int zero_rank0; /* rank 0 passes T = 0 */
} ep_case;

static int64_t tokens_of(const ep_case *c, int r) {
    return c->zero_rank0 && r == 0 ? 0 : 7 + 5 * r;
}

static ompk_moe_config cfg_of(const ep_case *c, ompk_moe_isa isa, int64_t max_tokens) {
    ompk_moe_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.experts = c->E;
    cfg.hidden = c->H;
    cfg.intermediate = c->I;
    cfg.top_k = c->k;
    cfg.max_tokens = max_tokens;
    cfg.format = c->fmt;
    cfg.group_size = 64;
    cfg.numa = OMPK_MOE_NUMA_FORCED; /* one partition: the bit-identity condition */
    cfg.numa_split = 1;
    cfg.isa = isa;
    cfg.no_pin = 1;
    return cfg;
}

static ompk_tensor t2(void *p, ompk_dtype dt, int64_t a, int64_t b) {
    const int64_t s[2] = {a, b};
    return ompk_tensor_make(p, dt, 2, s, ompk_device_host());
}
static ompk_tensor t3(void *p, ompk_dtype dt, int64_t a, int64_t b, int64_t c) {
    const int64_t s[3] = {a, b, c};
    return ompk_tensor_make(p, dt, 3, s, ompk_device_host());
}

/* One case on one ISA: returns after its checks. */
static void run_case(const ep_case *c, ompk_moe_isa isa) {
    const int64_t E = c->E, H = c->H, I = c->I, k = c->k;
    int64_t Tsum = 0, T0 = 0, Tmax = 1;
    for (int r = 0; r < size; r++) {
        if (r < rank) T0 += tokens_of(c, r);
        Tsum += tokens_of(c, r);
        if (tokens_of(c, r) > Tmax) Tmax = tokens_of(c, r);
    }
    const int64_t T = tokens_of(c, rank);
    const size_t xes = c->xdt == OMPK_BF16 ? 2 : 4, yes = c->ydt == OMPK_BF16 ? 2 : 4;
    /* global inputs, the same on every rank */
    rs = 0x9E3779B97F4A7C15ull ^ (uint64_t)E * 131 ^ (uint64_t)H;
    float *wg = malloc((size_t)(E * I * H) * 4), *wu = malloc((size_t)(E * I * H) * 4),
          *wd = malloc((size_t)(E * H * I) * 4);
    for (int64_t i = 0; i < E * I * H; i++) wg[i] = 0.2f * urand(), wu[i] = 0.2f * urand();
    for (int64_t i = 0; i < E * H * I; i++) wd[i] = 0.2f * urand();
    uint8_t *x = malloc((size_t)(Tsum * H) * xes + 1);
    int32_t *ids = malloc((size_t)(Tsum * k) * 4 + 4);
    float *w = malloc((size_t)(Tsum * k) * 4 + 4);
    for (int64_t i = 0; i < Tsum * H; i++) {
        const float v = urand();
        if (c->xdt == OMPK_BF16)
            ((uint16_t *)x)[i] = to_bf16(v);
        else
            ((float *)x)[i] = v;
    }
    for (int64_t i = 0; i < Tsum * k; i++) {
        const float u = urand();
        ids[i] = c->routing == 1 ? (int32_t)(E - 1)
                 : u < -0.8f     ? -1
                                 : (int32_t)((u + 1.0f) * 0.5f * (float)E) % (int32_t)E;
        w[i] = 0.5f + 0.25f * urand();
    }
    /* the reference: one layer on all tokens */
    ompk_moe_config rc = cfg_of(c, isa, Tsum > 0 ? Tsum : 1);
    ompk_moe *ref = NULL;
    ompk_status st = ompk_moe_create(&rc, &ref);
    CHECK(st == OMPK_OK, "%s: reference create", c->name);
    ompk_tensor tg = t3(wg, OMPK_F32, E, I, H), tu = t3(wu, OMPK_F32, E, I, H),
                td = t3(wd, OMPK_F32, E, H, I);
    if (st == OMPK_OK) st = ompk_moe_load_weights(ref, &tg, &tu, &td);
    uint8_t *yref = malloc((size_t)(Tsum * H) * yes + 1);
    ompk_tensor tx = t2(x, c->xdt, Tsum, H), ti = t2(ids, OMPK_I32, Tsum, k),
                tw = t2(w, OMPK_F32, Tsum, k), ty = t2(yref, c->ydt, Tsum, H);
    if (st == OMPK_OK) st = ompk_moe_fwd(ref, &tx, &ti, &tw, &ty);
    CHECK(st == OMPK_OK, "%s: reference forward", c->name);
    ompk_moe_destroy(ref);

    /* the expert-parallel layer, this rank's experts and tokens */
    ompk_moe_config ec = cfg_of(c, isa, Tmax);
    ompk_moe_ep *ep = NULL;
    st = ompk_moe_ep_create(&ec, MPI_COMM_WORLD, &ep);
    CHECK(st == OMPK_OK, "%s isa %s: ep create", c->name, ompk_moe_isa_name(isa));
    if (st == OMPK_OK) {
        int64_t first = -1, cnt = -1;
        ompk_moe_ep_experts(ep, &first, &cnt);
        const int64_t q = E / size, rem = E % size;
        CHECK(cnt == q + (rank < rem) && first == rank * q + (rank < rem ? rank : rem),
              "%s: rank owns experts %lld + %lld", c->name, (long long)first, (long long)cnt);
        ompk_tensor lg = t3(wg + first * I * H, OMPK_F32, cnt, I, H),
                    lu = t3(wu + first * I * H, OMPK_F32, cnt, I, H),
                    ld = t3(wd + first * H * I, OMPK_F32, cnt, H, I);
        st = ompk_moe_ep_load_weights(ep, &lg, &lu, &ld);
        CHECK(st == OMPK_OK, "%s: ep load", c->name);
        uint8_t *y = malloc((size_t)(T * H) * yes + 1);
        memset(y, 0xA5, (size_t)(T * H) * yes);
        ompk_tensor lx = t2(x + (size_t)(T0 * H) * xes, c->xdt, T, H),
                    li = t2(ids + T0 * k, OMPK_I32, T, k), lw = t2(w + T0 * k, OMPK_F32, T, k),
                    ly = t2(y, c->ydt, T, H);
        for (int rep = 0; rep < 2 && st == OMPK_OK; rep++) { /* twice: buffers reused */
            st = ompk_moe_ep_fwd(ep, &lx, &li, &lw, &ly);
            CHECK(st == OMPK_OK, "%s isa %s: ep forward", c->name, ompk_moe_isa_name(isa));
            CHECK(st != OMPK_OK ||
                      memcmp(y, yref + (size_t)(T0 * H) * yes, (size_t)(T * H) * yes) == 0,
                  "%s isa %s np %d: y differs from the single layer's", c->name,
                  ompk_moe_isa_name(isa), size);
        }
        ompk_moe_ep_stats es;
        ompk_moe_ep_get_stats(ep, &es);
        int64_t sent = 0, got = 0;
        for (int64_t i = 0; i < T * k; i++) sent += ids[T0 * k + i] >= 0;
        CHECK(es.routes_sent == sent, "%s: routes_sent %lld, expected %lld", c->name,
              (long long)es.routes_sent, (long long)sent);
        for (int64_t i = 0; i < Tsum * k; i++) got += ids[i] >= first && ids[i] < first + cnt;
        CHECK(es.routes_received == got, "%s: routes_received %lld, expected %lld", c->name,
              (long long)es.routes_received, (long long)got);

        /* a bad id on the last rank: an error on every rank, y untouched everywhere (every rank
         * calls: the call is collective) */
        {
            const int bad = rank == size - 1 && T > 0;
            int32_t keep = 0;
            if (bad) keep = ids[T0 * k], ids[T0 * k] = (int32_t)E;
            memset(y, 0x5A, (size_t)(T * H) * yes);
            st = ompk_moe_ep_fwd(ep, &lx, &li, &lw, &ly);
            if (bad) ids[T0 * k] = keep;
            int any_bad = 0;
            MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
            if (any_bad) {
                CHECK(st == (bad ? OMPK_ERR_INDEX_OUT_OF_RANGE : OMPK_ERR_INVALID_ARGUMENT),
                      "%s: a bad id on the last rank gives %s here", c->name, ompk_status_str(st));
                int untouched = 1;
                for (size_t i = 0; i < (size_t)(T * H) * yes; i++) untouched &= y[i] == 0x5A;
                CHECK(untouched, "%s: y written after a rejected call", c->name);
            }
            /* and the next good call works */
            st = ompk_moe_ep_fwd(ep, &lx, &li, &lw, &ly);
            CHECK(st == OMPK_OK &&
                      memcmp(y, yref + (size_t)(T0 * H) * yes, (size_t)(T * H) * yes) == 0,
                  "%s: the call after a rejected one", c->name);
        }
        free(y);
        ompk_moe_ep_destroy(ep);
    }
    free(wg), free(wu), free(wd), free(x), free(ids), free(w), free(yref);
}

/* Fine-tuning across the ranks against one layer: two saved micro-batches (PUSH, PUSH, then the
 * backwards in reverse), LoRA on every projection, bf16 base with full-weight gradients or int8;
 * y, dx, dw and every gradient bit-identical. */
static void run_train(ompk_moe_format fmt, ompk_dtype xdt, ompk_moe_isa isa) {
    const int64_t E = 7, H = 64, I = 48, k = 3, r = 4;
    const ep_case c = {"train", E, H, I, (int)k, fmt, xdt, OMPK_F32, 0, 0};
    int64_t Tsum = 0, T0 = 0, Tmax = 1;
    for (int q = 0; q < size; q++) {
        if (q < rank) T0 += tokens_of(&c, q);
        Tsum += tokens_of(&c, q);
        if (tokens_of(&c, q) > Tmax) Tmax = tokens_of(&c, q);
    }
    const int64_t T = tokens_of(&c, rank);
    const size_t xes = xdt == OMPK_BF16 ? 2 : 4;
    rs = 0xC0FFEEull ^ (uint64_t)fmt;
    const int64_t nw = E * I * H;
    float *wb = malloc((size_t)(3 * nw) * 4);
    for (int64_t i = 0; i < 3 * nw; i++) wb[i] = 0.2f * urand();
    /* LoRA: A gate [E,r,H], B gate [E,I,r], same for up, A down [E,r,I], B down [E,H,r] */
    const int64_t la[6] = {E * r * H, E * I * r, E * r * H, E * I * r, E * r * I, E * H * r};
    float *lw[6];
    for (int q = 0; q < 6; q++) {
        lw[q] = malloc((size_t)la[q] * 4);
        for (int64_t i = 0; i < la[q]; i++) lw[q][i] = 0.3f * urand();
    }
    uint8_t *x = malloc((size_t)(2 * Tsum * H) * xes + 1);
    float *dy = malloc((size_t)(2 * Tsum * H) * 4 + 4), *w = malloc((size_t)(2 * Tsum * k) * 4 + 4);
    int32_t *ids = malloc((size_t)(2 * Tsum * k) * 4 + 4);
    for (int64_t i = 0; i < 2 * Tsum * H; i++) {
        const float v = urand();
        if (xdt == OMPK_BF16)
            ((uint16_t *)x)[i] = to_bf16(v);
        else
            ((float *)x)[i] = v;
        dy[i] = urand();
    }
    for (int64_t i = 0; i < 2 * Tsum * k; i++) {
        const float u = urand();
        ids[i] = u < -0.8f ? -1 : (int32_t)((u + 1.0f) * 0.5f * (float)E) % (int32_t)E;
        w[i] = 0.5f + 0.25f * urand();
    }
    const int64_t lsh[6][3] = {{E, r, H}, {E, I, r}, {E, r, H}, {E, I, r}, {E, r, I}, {E, H, r}};
    const int full = fmt == OMPK_MOE_BF16; /* full-weight gradients: bf16 base */
    /* the reference: one layer on both micro-batches' tokens of every rank */
    ompk_moe_config rc = cfg_of(&c, isa, Tsum > 0 ? Tsum : 1);
    rc.cache_depth = 2, rc.lora_max_rank = (int)r;
    ompk_moe *ref = NULL;
    ompk_status st = ompk_moe_create(&rc, &ref);
    ompk_tensor tg = t3(wb, OMPK_F32, E, I, H), tu = t3(wb + nw, OMPK_F32, E, I, H),
                td = t3(wb + 2 * nw, OMPK_F32, E, H, I);
    ompk_tensor lt[6];
    for (int q = 0; q < 6; q++) lt[q] = t3(lw[q], OMPK_F32, lsh[q][0], lsh[q][1], lsh[q][2]);
    ompk_moe_lora lo;
    memset(&lo, 0, sizeof lo);
    lo.rank = (int)r, lo.alpha = 8.0f;
    lo.gate_a = &lt[0], lo.gate_b = &lt[1], lo.up_a = &lt[2], lo.up_b = &lt[3];
    lo.down_a = &lt[4], lo.down_b = &lt[5];
    if (st == OMPK_OK) st = ompk_moe_load_weights(ref, &tg, &tu, &td);
    if (st == OMPK_OK) st = ompk_moe_set_lora(ref, &lo);
    CHECK(st == OMPK_OK, "train reference setup");
    /* reference outputs per micro-batch mb: y, dx (x's dtype), dw, 6 LoRA grads, 3 dW */
    const int64_t gsz[9] = {la[0], la[1], la[2], la[3], la[4], la[5], nw, nw, nw};
    uint8_t *ry[2], *rdx[2];
    float *rdw[2], *rg[2][9];
    for (int mb = 0; mb < 2; mb++) {
        ry[mb] = malloc((size_t)(Tsum * H) * 4 + 4);
        rdx[mb] = malloc((size_t)(Tsum * H) * xes + 4);
        rdw[mb] = malloc((size_t)(Tsum * k) * 4 + 4);
        for (int q = 0; q < 9; q++) rg[mb][q] = calloc((size_t)gsz[q], 4);
    }
    for (int mb = 0; mb < 2 && st == OMPK_OK; mb++) {
        ompk_tensor tx = t2(x + (size_t)(mb * Tsum * H) * xes, xdt, Tsum, H),
                    ti = t2(ids + mb * Tsum * k, OMPK_I32, Tsum, k),
                    tw = t2(w + mb * Tsum * k, OMPK_F32, Tsum, k),
                    ty = t2(ry[mb], OMPK_F32, Tsum, H);
        st = ompk_moe_fwd_train(ref, &tx, &ti, &tw, &ty, OMPK_MOE_CACHE_PUSH);
    }
    for (int mb = 1; mb >= 0 && st == OMPK_OK; mb--) {
        ompk_tensor tdy = t2(dy + mb * Tsum * H, OMPK_F32, Tsum, H),
                    tdx = t2(rdx[mb], xdt, Tsum, H), tdw = t2(rdw[mb], OMPK_F32, Tsum, k);
        ompk_tensor gt[9];
        for (int q = 0; q < 6; q++)
            gt[q] = t3(rg[mb][q], OMPK_F32, lsh[q][0], lsh[q][1], lsh[q][2]);
        gt[6] = t3(rg[mb][6], OMPK_F32, E, I, H), gt[7] = t3(rg[mb][7], OMPK_F32, E, I, H);
        gt[8] = t3(rg[mb][8], OMPK_F32, E, H, I);
        ompk_moe_grads g;
        memset(&g, 0, sizeof g);
        g.dx = &tdx, g.dw = &tdw;
        g.gate_da = &gt[0], g.gate_db = &gt[1], g.up_da = &gt[2], g.up_db = &gt[3];
        g.down_da = &gt[4], g.down_db = &gt[5];
        if (full) g.gate_dw = &gt[6], g.up_dw = &gt[7], g.down_dw = &gt[8];
        st = ompk_moe_bwd(ref, &tdy, &g);
    }
    CHECK(st == OMPK_OK, "train reference %s", ompk_moe_isa_name(isa));
    ompk_moe_destroy(ref);

    /* the expert-parallel layer */
    ompk_moe_config ec = cfg_of(&c, isa, Tmax);
    ec.cache_depth = 2, ec.lora_max_rank = (int)r;
    ompk_moe_ep *ep = NULL;
    st = ompk_moe_ep_create(&ec, MPI_COMM_WORLD, &ep);
    CHECK(st == OMPK_OK, "train ep create");
    if (st != OMPK_OK) return;
    int64_t first, cnt;
    ompk_moe_ep_experts(ep, &first, &cnt);
    ompk_tensor lg = t3(wb + first * I * H, OMPK_F32, cnt, I, H),
                lu = t3(wb + nw + first * I * H, OMPK_F32, cnt, I, H),
                ld = t3(wb + 2 * nw + first * H * I, OMPK_F32, cnt, H, I);
    st = ompk_moe_ep_load_weights(ep, &lg, &lu, &ld);
    ompk_tensor ll[6];
    for (int q = 0; q < 6; q++) {
        const int64_t per = la[q] / E;
        ll[q] = t3(lw[q] + first * per, OMPK_F32, cnt, lsh[q][1], lsh[q][2]);
    }
    ompk_moe_lora el = lo;
    el.gate_a = &ll[0], el.gate_b = &ll[1], el.up_a = &ll[2], el.up_b = &ll[3];
    el.down_a = &ll[4], el.down_b = &ll[5];
    if (st == OMPK_OK) st = ompk_moe_ep_set_lora(ep, &el);
    CHECK(st == OMPK_OK, "train ep load / set_lora");
    uint8_t *y = malloc((size_t)(T * H) * 4 + 4), *dx = malloc((size_t)(T * H) * xes + 4);
    float *dw = malloc((size_t)(T * k) * 4 + 4), *eg[9];
    for (int q = 0; q < 9; q++) eg[q] = calloc((size_t)(gsz[q] / E * cnt) + 1, 4);
    for (int mb = 0; mb < 2 && st == OMPK_OK; mb++) {
        ompk_tensor tx = t2(x + (size_t)((mb * Tsum + T0) * H) * xes, xdt, T, H),
                    ti = t2(ids + (mb * Tsum + T0) * k, OMPK_I32, T, k),
                    tw = t2(w + (mb * Tsum + T0) * k, OMPK_F32, T, k), ty = t2(y, OMPK_F32, T, H);
        st = ompk_moe_ep_fwd_train(ep, &tx, &ti, &tw, &ty, OMPK_MOE_CACHE_PUSH);
        CHECK(st == OMPK_OK && memcmp(y, ry[mb] + (size_t)(T0 * H) * 4, (size_t)(T * H) * 4) == 0,
              "train %s np %d micro-batch %d: y", ompk_moe_isa_name(isa), size, mb);
    }
    /* a third push overflows the stack on every rank */
    if (st == OMPK_OK) {
        ompk_tensor tx = t2(x, xdt, T, H), ti = t2(ids, OMPK_I32, T, k), tw = t2(w, OMPK_F32, T, k),
                    ty = t2(y, OMPK_F32, T, H);
        CHECK(ompk_moe_ep_fwd_train(ep, &tx, &ti, &tw, &ty, OMPK_MOE_CACHE_PUSH) ==
                  OMPK_ERR_CACHE_FULL,
              "a third PUSH is CACHE_FULL");
    }
    for (int mb = 1; mb >= 0 && st == OMPK_OK; mb--) {
        ompk_tensor tdy = t2(dy + (mb * Tsum + T0) * H, OMPK_F32, T, H), tdx = t2(dx, xdt, T, H),
                    tdw = t2(dw, OMPK_F32, T, k);
        ompk_tensor gt[9];
        for (int q = 0; q < 6; q++) gt[q] = t3(eg[q], OMPK_F32, cnt, lsh[q][1], lsh[q][2]);
        gt[6] = t3(eg[6], OMPK_F32, cnt, I, H), gt[7] = t3(eg[7], OMPK_F32, cnt, I, H);
        gt[8] = t3(eg[8], OMPK_F32, cnt, H, I);
        ompk_moe_grads g;
        memset(&g, 0, sizeof g);
        g.dx = &tdx, g.dw = &tdw;
        g.gate_da = &gt[0], g.gate_db = &gt[1], g.up_da = &gt[2], g.up_db = &gt[3];
        g.down_da = &gt[4], g.down_db = &gt[5];
        if (full) g.gate_dw = &gt[6], g.up_dw = &gt[7], g.down_dw = &gt[8];
        st = ompk_moe_ep_bwd(ep, &tdy, &g);
        CHECK(st == OMPK_OK, "train backward %d", mb);
        if (st != OMPK_OK) break;
        CHECK(memcmp(dx, rdx[mb] + (size_t)(T0 * H) * xes, (size_t)(T * H) * xes) == 0,
              "train %s np %d micro-batch %d: dx", ompk_moe_isa_name(isa), size, mb);
        CHECK(memcmp(dw, rdw[mb] + T0 * k, (size_t)(T * k) * 4) == 0,
              "train %s np %d micro-batch %d: dw", ompk_moe_isa_name(isa), size, mb);
        for (int q = 0; q < (full ? 9 : 6); q++) {
            const int64_t per = gsz[q] / E;
            CHECK(memcmp(eg[q], rg[mb][q] + first * per, (size_t)(per * cnt) * 4) == 0,
                  "train %s np %d micro-batch %d: gradient %d of this rank's experts",
                  ompk_moe_isa_name(isa), size, mb, q);
        }
    }
    {
        ompk_tensor tdy = t2(dy, OMPK_F32, T, H), tdx = t2(dx, xdt, T, H);
        ompk_moe_grads g;
        memset(&g, 0, sizeof g);
        g.dx = &tdx;
        CHECK(ompk_moe_ep_bwd(ep, &tdy, &g) == OMPK_ERR_CACHE_EMPTY,
              "a backward with nothing saved");
    }
    ompk_moe_ep_destroy(ep);
    for (int mb = 0; mb < 2; mb++) {
        free(ry[mb]), free(rdx[mb]), free(rdw[mb]);
        for (int q = 0; q < 9; q++) free(rg[mb][q]);
    }
    for (int q = 0; q < 9; q++) free(eg[q]);
    for (int q = 0; q < 6; q++) free(lw[q]);
    free(wb), free(x), free(dy), free(w), free(ids), free(y), free(dx), free(dw);
}

/* Bad arguments that every rank must see the same way. */
static void run_bad(void) {
    const ep_case c = {"bad", 6, 32, 32, 2, OMPK_MOE_BF16, OMPK_F32, OMPK_F32, 0, 0};
    ompk_moe_config cfg = cfg_of(&c, OMPK_MOE_ISA_PORTABLE, 8);
    ompk_moe_ep *ep = NULL;
    if (size > 1) {
        cfg.experts = size - 1;
        CHECK(ompk_moe_ep_create(&cfg, MPI_COMM_WORLD, &ep) == OMPK_ERR_INVALID_ARGUMENT && !ep,
              "fewer experts than ranks refused");
        cfg.experts = 6;
    }
    CHECK(ompk_moe_ep_create(NULL, MPI_COMM_WORLD, &ep) == OMPK_ERR_INVALID_ARGUMENT,
          "NULL config refused");
    CHECK(ompk_moe_ep_create(&cfg, MPI_COMM_NULL, &ep) == OMPK_ERR_INVALID_ARGUMENT,
          "MPI_COMM_NULL refused");
    /* one rank's config asks for an ISA that does not exist: create fails on every rank */
    ompk_moe_config bc = cfg;
    if (rank == size - 1) bc.isa = (ompk_moe_isa)99;
    CHECK(ompk_moe_ep_create(&bc, MPI_COMM_WORLD, &ep) != OMPK_OK && !ep,
          "a bad config on one rank fails create everywhere");
    if (ompk_moe_ep_create(&cfg, MPI_COMM_WORLD, &ep) != OMPK_OK) {
        CHECK(0, "create");
        return;
    }
    int64_t first, cnt;
    ompk_moe_ep_experts(ep, &first, &cnt);
    float *wbuf = calloc((size_t)(7 * 32 * 32), 4);
    float x[4 * 32] = {0}, w[8] = {1, 1, 1, 1, 1, 1, 1, 1}, y[4 * 32];
    int32_t ids[8] = {0, 1, 2, 3, 4, 5, -1, -1};
    ompk_tensor tx = t2(x, OMPK_F32, 4, 32), ti = t2(ids, OMPK_I32, 4, 2),
                tw = t2(w, OMPK_F32, 4, 2), ty = t2(y, OMPK_F32, 4, 32);
    CHECK(ompk_moe_ep_fwd(ep, &tx, &ti, &tw, &ty) == OMPK_ERR_INVALID_ARGUMENT,
          "forward before load refused");
    /* one rank loads the wrong number of experts: every rank fails */
    const int64_t lc = rank == 0 ? cnt + 1 : cnt;
    ompk_tensor lg = t3(wbuf, OMPK_F32, lc, 32, 32);
    CHECK(ompk_moe_ep_load_weights(ep, &lg, &lg, &lg) != OMPK_OK,
          "a bad load on rank 0 fails everywhere");
    lg = t3(wbuf, OMPK_F32, cnt, 32, 32);
    CHECK(ompk_moe_ep_load_weights(ep, &lg, &lg, &lg) == OMPK_OK, "load");
    /* y of the wrong shape on rank 0 */
    ompk_tensor bad_y = t2(y, OMPK_F32, rank == 0 ? 3 : 4, 32);
    memset(y, 0x5A, sizeof y);
    const ompk_status st = ompk_moe_ep_fwd(ep, &tx, &ti, &tw, &bad_y);
    CHECK(st == OMPK_ERR_INVALID_ARGUMENT, "bad y on rank 0: %s", ompk_status_str(st));
    int untouched = 1;
    for (size_t i = 0; i < sizeof y; i++) untouched &= ((uint8_t *)y)[i] == 0x5A;
    CHECK(untouched, "y written after a rejected call");
    /* x of another dtype on the last rank */
    if (size > 1) {
        uint16_t xb[4 * 32] = {0};
        ompk_tensor tb = t2(xb, OMPK_BF16, 4, 32);
        CHECK(ompk_moe_ep_fwd(ep, rank == size - 1 ? &tb : &tx, &ti, &tw, &ty) ==
                  OMPK_ERR_INVALID_ARGUMENT,
              "x dtypes that differ between ranks refused");
    }
    CHECK(ompk_moe_ep_fwd(ep, &tx, &ti, &tw, &ty) == OMPK_OK, "a good call after the bad ones");
    ompk_moe_ep_destroy(ep);
    free(wbuf);
}

int main(int argc, char **argv) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const ep_case cases[] = {
        {"bf16 x-bf16 y-f32", 7, 80, 48, 3, OMPK_MOE_BF16, OMPK_BF16, OMPK_F32, 0, 0},
        {"int8 x-f32 y-bf16", 9, 64, 96, 2, OMPK_MOE_INT8, OMPK_F32, OMPK_BF16, 0, 0},
        {"int4 x-bf16 y-bf16", 5, 128, 64, 4, OMPK_MOE_INT4, OMPK_BF16, OMPK_BF16, 0, 0},
        {"bf16 one hot expert, rank 0 without tokens", 6, 48, 32, 2, OMPK_MOE_BF16, OMPK_F32,
         OMPK_F32, 1, 1},
    };
    const ompk_moe_isa isas[] = {OMPK_MOE_ISA_PORTABLE, OMPK_MOE_ISA_AVX512BF16,
                                 OMPK_MOE_ISA_AMX_EMULATED, OMPK_MOE_ISA_AMX};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (size_t ii = 0; ii < sizeof isas / sizeof isas[0]; ii++)
            if (ompk_moe_isa_available(isas[ii])) run_case(&cases[ci], isas[ii]);
    for (size_t ii = 0; ii < sizeof isas / sizeof isas[0]; ii++) {
        if (!ompk_moe_isa_available(isas[ii])) continue;
        run_train(OMPK_MOE_BF16, OMPK_BF16, isas[ii]);
        run_train(OMPK_MOE_INT8, OMPK_F32, isas[ii]);
    }
    run_bad();
    int tot[2] = {npass, nfail}, all[2];
    MPI_Reduce(tot, all, 2, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) printf("mpi_test_moe_ep np=%d: %d passed, %d failed\n", size, all[0], all[1]);
    MPI_Bcast(all, 2, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Finalize();
    return all[1] ? 1 : 0;
}
