/* More than one GPU (needs a machine with two or more; run under mpirun with one rank per GPU):
 *  1. threads: rank 0 drives GPU 0 and GPU 1 from two host threads at once, each with its own
 *     data, three rounds; every output must equal, bit for bit, the same data run alone on GPU 0;
 *  2. ranks: rank r runs its own data on GPU r % count and again on GPU 0; equal bit for bit;
 *  3. the expert-parallel layer (ompk/moe_ep.h) with each rank's tokens on its GPU: forward and
 *     a fine-tuning step (LoRA) equal the same calls on host tensors bit for bit.
 * The calls: attention forward (bf16, out and lse), router top-k forward, mHC post forward and
 * Sinkhorn forward, MoE forward with device tensors (staged through the host). Prints one line
 * per check and "multi_gpu_check: P passed, F failed" on rank 0; exits 1 on a failure, 2 when
 * fewer than two GPUs are present (nothing checked). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "ompk/moe_ep.h"
#include "ompk/ompk.h"

typedef struct blob {
    uint8_t *p;
    size_t n;
} blob;

static uint64_t rnd(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}
static float urand(uint64_t *s) {
    return (float)(rnd(s) >> 40) / 16777216.0f * 2.0f - 1.0f;
}
static uint16_t bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* A tensor on dev holding n elements of host data h (copied up). */
static ompk_tensor up(ompk_device dev, const void *h, ompk_dtype dt, int nd, const int64_t *shape,
                      size_t bytes) {
    void *d = ompk_malloc(dev, bytes);
    if (d && h) ompk_memcpy(d, dev, h, ompk_device_host(), bytes);
    if (d && !h) ompk_memset(d, dev, 0, bytes);
    return ompk_tensor_make(d, dt, nd, shape, dev);
}
/* Appends t's bytes (downloaded) to b and frees t. */
static void take(blob *b, ompk_tensor *t, size_t bytes) {
    b->p = realloc(b->p, b->n + bytes);
    ompk_memcpy(b->p + b->n, ompk_device_host(), t->data, t->device, bytes);
    b->n += bytes;
    ompk_free(t->device, t->data);
}

/* Every call on GPU gpu with the data of seed; the outputs in *out. Returns the first failure. */
static ompk_status run_ops(int gpu, uint64_t seed, blob *out) {
    const ompk_device dev = ompk_device_target(gpu), h = ompk_device_host();
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    ompk_status st = OMPK_OK;
    out->p = NULL, out->n = 0;
    { /* attention, bf16 B1 H4 N384 dh64 */
        const int64_t sh[4] = {1, 4, 384, 64}, sl[3] = {1, 4, 384}, n = 4 * 384 * 64;
        uint16_t *hq = malloc((size_t)n * 2 * 3);
        for (int64_t i = 0; i < 3 * n; i++) hq[i] = bf16(urand(&s));
        ompk_tensor q = up(dev, hq, OMPK_BF16, 4, sh, (size_t)n * 2),
                    k = up(dev, hq + n, OMPK_BF16, 4, sh, (size_t)n * 2),
                    v = up(dev, hq + 2 * n, OMPK_BF16, 4, sh, (size_t)n * 2),
                    o = up(dev, NULL, OMPK_BF16, 4, sh, (size_t)n * 2),
                    l = up(dev, NULL, OMPK_F32, 3, sl, 4 * 384 * 4);
        if (st == OMPK_OK) st = ompk_attention_fwd(&q, &k, &v, &o, &l, NULL);
        take(out, &o, (size_t)n * 2);
        take(out, &l, 4 * 384 * 4);
        ompk_free(dev, q.data), ompk_free(dev, k.data), ompk_free(dev, v.data);
        free(hq);
    }
    { /* router top-8 over 64 x 64 pairs, T 1024 */
        const int64_t sx[2] = {1024, 64}, so[2] = {1024, 8};
        float *hx = malloc(2 * 1024 * 64 * 4);
        for (int i = 0; i < 2 * 1024 * 64; i++) hx[i] = urand(&s);
        ompk_tensor a = up(dev, hx, OMPK_F32, 2, sx, 1024 * 64 * 4),
                    b = up(dev, hx + 1024 * 64, OMPK_F32, 2, sx, 1024 * 64 * 4),
                    sc = up(dev, NULL, OMPK_F32, 2, so, 1024 * 8 * 4),
                    ix = up(dev, NULL, OMPK_I32, 2, so, 1024 * 8 * 4);
        if (st == OMPK_OK) st = ompk_router_topk_fwd(&a, &b, 8, &sc, &ix);
        take(out, &sc, 1024 * 8 * 4);
        take(out, &ix, 1024 * 8 * 4);
        ompk_free(dev, a.data), ompk_free(dev, b.data);
        free(hx);
    }
    { /* mHC post forward bf16 B2 S128 n4 D256, Sinkhorn of [2,128,4,4] */
        const int64_t sx[4] = {2, 128, 4, 256}, sc[4] = {2, 128, 4, 4}, sp[3] = {2, 128, 4},
                      sf[3] = {2, 128, 256};
        const int64_t nx = 2 * 128 * 4 * 256, nc = 2 * 128 * 16, np = 2 * 128 * 4,
                      nf = 2 * 128 * 256;
        uint16_t *hx = malloc((size_t)(nx + nf) * 2);
        float *hc = malloc((size_t)(2 * nc + np) * 4);
        for (int64_t i = 0; i < nx + nf; i++) hx[i] = bf16(urand(&s));
        for (int64_t i = 0; i < 2 * nc + np; i++) hc[i] = urand(&s);
        ompk_tensor x = up(dev, hx, OMPK_BF16, 4, sx, (size_t)nx * 2),
                    f = up(dev, hx + nx, OMPK_BF16, 3, sf, (size_t)nf * 2),
                    c = up(dev, hc, OMPK_F32, 4, sc, (size_t)nc * 4),
                    p = up(dev, hc + nc, OMPK_F32, 3, sp, (size_t)np * 4),
                    lg = up(dev, hc + nc + np, OMPK_F32, 4, sc, (size_t)nc * 4),
                    o = up(dev, NULL, OMPK_BF16, 4, sx, (size_t)nx * 2),
                    cb = up(dev, NULL, OMPK_F32, 4, sc, (size_t)nc * 4);
        if (st == OMPK_OK) st = ompk_mhc_post_fwd(&x, &c, &p, &f, &o);
        if (st == OMPK_OK) st = ompk_mhc_sinkhorn_fwd(&lg, &cb, NULL);
        take(out, &o, (size_t)nx * 2);
        take(out, &cb, (size_t)nc * 4);
        ompk_free(dev, x.data), ompk_free(dev, f.data), ompk_free(dev, c.data);
        ompk_free(dev, p.data), ompk_free(dev, lg.data);
        free(hx), free(hc);
    }
    { /* MoE forward with device tensors: E8 H256 I128 top-2, T 64 */
        ompk_moe_config cfg;
        memset(&cfg, 0, sizeof cfg);
        cfg.experts = 8, cfg.hidden = 256, cfg.intermediate = 128, cfg.top_k = 2;
        cfg.max_tokens = 64, cfg.threads = 4, cfg.no_pin = 1;
        ompk_moe *m = NULL;
        const int64_t sg[3] = {8, 128, 256}, sd[3] = {8, 256, 128}, sx[2] = {64, 256},
                      sk[2] = {64, 2}, nw = 8 * 128 * 256;
        float *hw = malloc((size_t)(3 * nw + 64 * 256 + 128) * 4);
        int32_t ids[128];
        for (int64_t i = 0; i < 3 * nw + 64 * 256 + 128; i++) hw[i] = 0.1f * urand(&s);
        for (int i = 0; i < 128; i++)
            ids[i] = i % 2 ? (int32_t)(rnd(&s) % 4) + 4 : (int32_t)(rnd(&s) % 4);
        ompk_tensor g = ompk_tensor_make(hw, OMPK_F32, 3, sg, h),
                    u = ompk_tensor_make(hw + nw, OMPK_F32, 3, sg, h),
                    d = ompk_tensor_make(hw + 2 * nw, OMPK_F32, 3, sd, h);
        ompk_tensor x = up(dev, hw + 3 * nw, OMPK_F32, 2, sx, 64 * 256 * 4),
                    w = up(dev, hw + 3 * nw + 64 * 256, OMPK_F32, 2, sk, 128 * 4),
                    ix = up(dev, ids, OMPK_I32, 2, sk, 128 * 4),
                    y = up(dev, NULL, OMPK_F32, 2, sx, 64 * 256 * 4);
        if (st == OMPK_OK) st = ompk_moe_create(&cfg, &m);
        if (st == OMPK_OK) st = ompk_moe_load_weights(m, &g, &u, &d);
        if (st == OMPK_OK) st = ompk_moe_fwd(m, &x, &ix, &w, &y);
        take(out, &y, 64 * 256 * 4);
        ompk_moe_destroy(m);
        ompk_free(dev, x.data), ompk_free(dev, w.data), ompk_free(dev, ix.data);
        free(hw);
    }
    return st;
}

/* 3: one expert-parallel layer, this rank's tokens on the host and then on GPU gpu */
static int ep_check(int rank, int gpu) {
    const int64_t E = 8, H = 128, I = 64, k = 2, r = 4, T = 16 + 8 * rank;
    const ompk_device hd = ompk_device_host(), dev = ompk_device_target(gpu);
    ompk_moe_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.experts = E, cfg.hidden = H, cfg.intermediate = I, cfg.top_k = (int)k;
    cfg.max_tokens = 64, cfg.threads = 4, cfg.no_pin = 1, cfg.cache_depth = 1;
    cfg.lora_max_rank = (int)r;
    ompk_moe_ep *ep = NULL;
    if (ompk_moe_ep_create(&cfg, MPI_COMM_WORLD, &ep) != OMPK_OK) return 0;
    int64_t first, cnt;
    ompk_moe_ep_experts(ep, &first, &cnt);
    uint64_t s = 77 + (uint64_t)first;
    const int64_t nw = cnt * I * H, sg[3] = {cnt, I, H}, sd[3] = {cnt, H, I};
    float *wb = malloc((size_t)(3 * nw) * 4);
    for (int64_t i = 0; i < 3 * nw; i++) wb[i] = 0.1f * urand(&s);
    ompk_tensor g = ompk_tensor_make(wb, OMPK_F32, 3, sg, hd),
                u = ompk_tensor_make(wb + nw, OMPK_F32, 3, sg, hd),
                d = ompk_tensor_make(wb + 2 * nw, OMPK_F32, 3, sd, hd);
    int ok = ompk_moe_ep_load_weights(ep, &g, &u, &d) == OMPK_OK;
    const int64_t lsh[6][3] = {{cnt, r, H}, {cnt, I, r}, {cnt, r, H},
                               {cnt, I, r}, {cnt, r, I}, {cnt, H, r}};
    float *lw[6], *lg[2][6];
    ompk_tensor lt[6], gt[2][6];
    for (int q = 0; q < 6; q++) {
        const int64_t n = lsh[q][0] * lsh[q][1] * lsh[q][2];
        lw[q] = malloc((size_t)n * 4);
        for (int64_t i = 0; i < n; i++) lw[q][i] = 0.2f * urand(&s);
        lt[q] = ompk_tensor_make(lw[q], OMPK_F32, 3, lsh[q], hd);
        for (int v = 0; v < 2; v++) {
            lg[v][q] = calloc((size_t)n, 4);
            gt[v][q] = ompk_tensor_make(lg[v][q], OMPK_F32, 3, lsh[q], hd);
        }
    }
    ompk_moe_lora lo;
    memset(&lo, 0, sizeof lo);
    lo.rank = (int)r, lo.alpha = 8.0f;
    lo.gate_a = &lt[0], lo.gate_b = &lt[1], lo.up_a = &lt[2], lo.up_b = &lt[3];
    lo.down_a = &lt[4], lo.down_b = &lt[5];
    s = 1000 + (uint64_t)rank;
    uint16_t *x = malloc((size_t)(T * H) * 2), *dy = malloc((size_t)(T * H) * 2);
    float *w = malloc((size_t)(T * k) * 4);
    int32_t *ids = malloc((size_t)(T * k) * 4);
    for (int64_t i = 0; i < T * H; i++) x[i] = bf16(urand(&s)), dy[i] = bf16(urand(&s));
    for (int64_t i = 0; i < T * k; i++) {
        ids[i] = i % 5 == 4 ? -1 : (int32_t)(rnd(&s) % (uint64_t)E);
        w[i] = 0.5f + 0.25f * urand(&s);
    }
    const int64_t sx[2] = {T, H}, sk[2] = {T, k};
    /* outputs of the two passes: y (fwd), y (fwd_train), dx (bf16), dw */
    const size_t ob = (size_t)(T * H) * 2 * 3 + (size_t)(T * k) * 4;
    uint8_t *out[2] = {malloc(ob), malloc(ob)};
    for (int v = 0; v < 2 && ok; v++) {
        const ompk_device dv = v ? dev : hd;
        ompk_tensor tx = up(dv, x, OMPK_BF16, 2, sx, (size_t)(T * H) * 2),
                    tdy = up(dv, dy, OMPK_BF16, 2, sx, (size_t)(T * H) * 2),
                    ti = up(dv, ids, OMPK_I32, 2, sk, (size_t)(T * k) * 4),
                    tw = up(dv, w, OMPK_F32, 2, sk, (size_t)(T * k) * 4),
                    ty = up(dv, NULL, OMPK_BF16, 2, sx, (size_t)(T * H) * 2),
                    ty2 = up(dv, NULL, OMPK_BF16, 2, sx, (size_t)(T * H) * 2),
                    tdx = up(dv, NULL, OMPK_BF16, 2, sx, (size_t)(T * H) * 2),
                    tdw = up(dv, NULL, OMPK_F32, 2, sk, (size_t)(T * k) * 4);
        ompk_moe_grads gr;
        memset(&gr, 0, sizeof gr);
        gr.dx = &tdx, gr.dw = &tdw;
        gr.gate_da = &gt[v][0], gr.gate_db = &gt[v][1], gr.up_da = &gt[v][2], gr.up_db = &gt[v][3];
        gr.down_da = &gt[v][4], gr.down_db = &gt[v][5];
        ok &= ompk_moe_ep_set_lora(ep, &lo) == OMPK_OK;
        ok &= ompk_moe_ep_fwd(ep, &tx, &ti, &tw, &ty) == OMPK_OK;
        ok &= ompk_moe_ep_fwd_train(ep, &tx, &ti, &tw, &ty2, OMPK_MOE_CACHE_PUSH) == OMPK_OK;
        ok &= ompk_moe_ep_bwd(ep, &tdy, &gr) == OMPK_OK;
        blob b = {NULL, 0};
        take(&b, &ty, (size_t)(T * H) * 2);
        take(&b, &ty2, (size_t)(T * H) * 2);
        take(&b, &tdx, (size_t)(T * H) * 2);
        take(&b, &tdw, (size_t)(T * k) * 4);
        memcpy(out[v], b.p, ob);
        free(b.p);
        ompk_free(dv, tx.data), ompk_free(dv, tdy.data), ompk_free(dv, ti.data),
            ompk_free(dv, tw.data);
        ompk_moe_ep_set_lora(ep, NULL);
    }
    ok = ok && memcmp(out[0], out[1], ob) == 0;
    for (int q = 0; q < 6 && ok; q++)
        ok = memcmp(lg[0][q], lg[1][q], (size_t)(lsh[q][0] * lsh[q][1] * lsh[q][2]) * 4) == 0;
    ompk_moe_ep_destroy(ep);
    for (int q = 0; q < 6; q++) free(lw[q]), free(lg[0][q]), free(lg[1][q]);
    free(wb), free(x), free(dy), free(w), free(ids), free(out[0]), free(out[1]);
    return ok;
}

typedef struct job {
    int gpu;
    uint64_t seed;
    blob out;
    ompk_status st;
} job;

static void *thread_main(void *a) {
    job *j = a;
    j->st = run_ops(j->gpu, j->seed, &j->out);
    return NULL;
}

static int npass, nfail, rank;
static void check(int ok, const char *what) {
    if (ok)
        npass++;
    else
        nfail++;
    printf("rank %d %s: %s\n", rank, ok ? "ok" : "FAIL", what);
}

int main(int argc, char **argv) {
    int provided, size;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const int count = ompk_device_count();
    if (count < 2) {
        if (rank == 0)
            printf("multi_gpu_check: %d GPU(s): needs two or more, nothing checked\n", count);
        MPI_Finalize();
        return 2;
    }
    char what[160];
    if (rank == 0) { /* 1: two GPUs from two host threads */
        blob ref[2];
        for (int i = 0; i < 2; i++)
            check(run_ops(0, 11 + i, &ref[i]) == OMPK_OK, "reference on GPU 0");
        for (int round = 0; round < 3; round++) {
            job jb[2] = {{0, 11, {0, 0}, OMPK_OK}, {1, 12, {0, 0}, OMPK_OK}};
            pthread_t th[2];
            for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, thread_main, &jb[i]);
            for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
            for (int i = 0; i < 2; i++) {
                snprintf(what, sizeof what,
                         "round %d: thread %d on GPU %d, %zu bytes of outputs equal GPU 0's alone",
                         round, i, i, jb[i].out.n);
                check(jb[i].st == OMPK_OK && jb[i].out.n == ref[i].n &&
                          memcmp(jb[i].out.p, ref[i].p, ref[i].n) == 0,
                      what);
                free(jb[i].out.p);
            }
        }
        free(ref[0].p), free(ref[1].p);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    { /* 2: one rank per GPU */
        blob own, ref;
        const int gpu = rank % count;
        const ompk_status s1 = run_ops(gpu, 100 + rank, &own);
        MPI_Barrier(MPI_COMM_WORLD);
        const ompk_status s2 = run_ops(0, 100 + rank, &ref);
        snprintf(what, sizeof what, "rank %d of %d on GPU %d: outputs equal GPU 0's", rank, size,
                 gpu);
        check(s1 == OMPK_OK && s2 == OMPK_OK && own.n == ref.n && memcmp(own.p, ref.p, own.n) == 0,
              what);
        free(own.p), free(ref.p);
    }
    {
        snprintf(what, sizeof what,
                 "rank %d: expert-parallel forward and training step on GPU %d equal host tensors",
                 rank, rank % count);
        check(ep_check(rank, rank % count), what);
    }
    int loc[2] = {npass, nfail}, all[2];
    MPI_Reduce(loc, all, 2, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0)
        printf("multi_gpu_check: %d passed, %d failed (%d GPUs, %d ranks)\n", all[0], all[1], count,
               size);
    MPI_Bcast(all, 2, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Finalize();
    return all[1] ? 1 : 0;
}
