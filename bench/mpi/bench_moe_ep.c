/* Expert-parallel MoE forward (ompk/moe_ep.h) under mpirun: every rank holds T_total / P tokens
 * (strong scaling of one batch) and E / P experts; per rep, the time of the slowest rank, and per
 * rank the all-to-all, expert and combine times and the bytes exchanged. Not part of the library:
 * built when MPI is found (CMake target bench_moe_ep).
 * usage: mpirun -np P bench_moe_ep [E H I k T_total fmt reps threads_per_rank step]
 *        (default 64 2048 1408 6 4096 bf16 7 0 = omp_get_max_threads() fwd; step "train": a
 *        fine-tuning step instead, LoRA r8 on every projection, ompk_moe_ep_fwd_train with PUSH
 *        then ompk_moe_ep_bwd giving dx, dw and the LoRA gradients)
 * Prints one summary line on rank 0 and, with --json FILE as the last two arguments, a JSON
 * record. Ranks keep the binding mpirun gives them (no_pin): bind each to its own cores, e.g.
 * mpirun -np 2 --bind-to core --map-by slot:PE=8. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ompk/moe_ep.h"

static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static uint64_t rs = 0x2545F4914F6CDD1Dull;
static float urand(void) {
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (float)(rs >> 40) / 16777216.0f * 2.0f - 1.0f;
}

int main(int argc, char **argv) {
    int provided, rank, size;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const char *json = NULL;
    if (argc >= 3 && !strcmp(argv[argc - 2], "--json")) json = argv[argc - 1], argc -= 2;
    const int64_t E = argc > 1 ? atol(argv[1]) : 64, H = argc > 2 ? atol(argv[2]) : 2048;
    const int64_t I = argc > 3 ? atol(argv[3]) : 1408;
    const int k = argc > 4 ? atoi(argv[4]) : 6;
    const int64_t Tt = argc > 5 ? atol(argv[5]) : 4096;
    const char *fmts = argc > 6 ? argv[6] : "bf16";
    const int reps = argc > 7 ? atoi(argv[7]) : 7, thr = argc > 8 ? atoi(argv[8]) : 0;
    const int train = argc > 9 && !strcmp(argv[9], "train");
    const int rk = 8;
    const ompk_moe_format fmt = !strcmp(fmts, "int8") ? OMPK_MOE_INT8 : OMPK_MOE_BF16;
    const int64_t T = Tt / size + (rank < Tt % size);
    ompk_moe_config c;
    memset(&c, 0, sizeof c);
    c.experts = E, c.hidden = H, c.intermediate = I, c.top_k = k;
    c.max_tokens = Tt / size + 1;
    c.format = fmt;
    c.threads = thr;
    c.no_pin = 1;
    if (train) c.cache_depth = 1, c.lora_max_rank = rk;
    ompk_moe_ep *ep = NULL;
    if (ompk_moe_ep_create(&c, MPI_COMM_WORLD, &ep) != OMPK_OK) {
        fprintf(stderr, "rank %d: create: %s\n", rank, ompk_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    int64_t first, cnt;
    ompk_moe_ep_experts(ep, &first, &cnt);
    rs ^= (uint64_t)first * 0x9E3779B97F4A7C15ull;
    uint16_t *w = malloc((size_t)(cnt * I * H) * 2 * 3);
    for (int64_t i = 0; i < cnt * I * H * 3; i++) {
        const float v = 0.05f * urand();
        uint32_t u;
        memcpy(&u, &v, 4);
        w[i] = (uint16_t)(u >> 16);
    }
    const ompk_device h = ompk_device_host();
    const int64_t sg[3] = {cnt, I, H}, sd[3] = {cnt, H, I};
    ompk_tensor tg = ompk_tensor_make(w, OMPK_BF16, 3, sg, h),
                tu = ompk_tensor_make(w + cnt * I * H, OMPK_BF16, 3, sg, h),
                td = ompk_tensor_make(w + 2 * cnt * I * H, OMPK_BF16, 3, sd, h);
    if (ompk_moe_ep_load_weights(ep, &tg, &tu, &td) != OMPK_OK) {
        fprintf(stderr, "rank %d: load: %s\n", rank, ompk_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    free(w);
    /* LoRA adapters of this rank's experts and their gradients (train) */
    const int64_t lsz[6][3] = {{cnt, rk, H}, {cnt, I, rk}, {cnt, rk, H},
                               {cnt, I, rk}, {cnt, rk, I}, {cnt, H, rk}};
    float *lw[6] = {0}, *lg[6] = {0};
    ompk_tensor lt[6], gt[6];
    if (train) {
        for (int q = 0; q < 6; q++) {
            const int64_t n = lsz[q][0] * lsz[q][1] * lsz[q][2];
            lw[q] = malloc((size_t)n * 4), lg[q] = malloc((size_t)n * 4);
            for (int64_t i = 0; i < n; i++) lw[q][i] = 0.05f * urand();
            lt[q] = ompk_tensor_make(lw[q], OMPK_F32, 3, lsz[q], h);
            gt[q] = ompk_tensor_make(lg[q], OMPK_F32, 3, lsz[q], h);
        }
        ompk_moe_lora lo;
        memset(&lo, 0, sizeof lo);
        lo.rank = rk, lo.alpha = 2.0f * rk;
        lo.gate_a = &lt[0], lo.gate_b = &lt[1], lo.up_a = &lt[2], lo.up_b = &lt[3];
        lo.down_a = &lt[4], lo.down_b = &lt[5];
        if (ompk_moe_ep_set_lora(ep, &lo) != OMPK_OK) {
            fprintf(stderr, "rank %d: set_lora: %s\n", rank, ompk_last_error());
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    rs ^= (uint64_t)rank * 7919;
    uint16_t *x = malloc((size_t)(T * H) * 2 + 2), *y = malloc((size_t)(T * H) * 2 + 2);
    int32_t *ids = malloc((size_t)(T * k) * 4 + 4);
    float *wt = malloc((size_t)(T * k) * 4 + 4);
    for (int64_t i = 0; i < T * H; i++) {
        const float v = urand();
        uint32_t u;
        memcpy(&u, &v, 4);
        x[i] = (uint16_t)(u >> 16);
    }
    for (int64_t t = 0; t < T; t++)
        for (int j = 0; j < k; j++) {
            int32_t e;
            int dup;
            do { /* k distinct experts per token, uniform */
                e = (int32_t)((urand() + 1.0f) * 0.5f * (float)E) % (int32_t)E;
                dup = 0;
                for (int q = 0; q < j; q++) dup |= ids[t * k + q] == e;
            } while (dup);
            ids[t * k + j] = e;
            wt[t * k + j] = 0.2f;
        }
    const int64_t sx[2] = {T, H}, sk[2] = {T, k};
    ompk_tensor tx = ompk_tensor_make(x, OMPK_BF16, 2, sx, h),
                ti = ompk_tensor_make(ids, OMPK_I32, 2, sk, h),
                tw = ompk_tensor_make(wt, OMPK_F32, 2, sk, h),
                ty = ompk_tensor_make(y, OMPK_BF16, 2, sx, h);
    uint16_t *dyb = malloc((size_t)(T * H) * 2 + 2), *dxb = malloc((size_t)(T * H) * 2 + 2);
    float *dwb = malloc((size_t)(T * k) * 4 + 4);
    for (int64_t i = 0; i < T * H; i++) dyb[i] = x[i];
    ompk_tensor tdy = ompk_tensor_make(dyb, OMPK_BF16, 2, sx, h),
                tdx = ompk_tensor_make(dxb, OMPK_BF16, 2, sx, h),
                tdw = ompk_tensor_make(dwb, OMPK_F32, 2, sk, h);
    ompk_moe_grads g;
    memset(&g, 0, sizeof g);
    g.dx = &tdx, g.dw = &tdw;
    if (train) {
        g.gate_da = &gt[0], g.gate_db = &gt[1], g.up_da = &gt[2], g.up_db = &gt[3];
        g.down_da = &gt[4], g.down_db = &gt[5];
    }
    double *tot = malloc(sizeof(double) * (size_t)(reps + 2)), part[4] = {0, 0, 0, 0};
    int64_t bytes = 0;
    for (int r = -2; r < reps; r++) {
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = MPI_Wtime();
        ompk_moe_ep_stats s2; /* a training step: the forward's, then the backward's */
        memset(&s2, 0, sizeof s2);
        const ompk_status st =
            train ? ompk_moe_ep_fwd_train(ep, &tx, &ti, &tw, &ty, OMPK_MOE_CACHE_PUSH)
                  : ompk_moe_ep_fwd(ep, &tx, &ti, &tw, &ty);
        if (train && st == OMPK_OK) ompk_moe_ep_get_stats(ep, &s2);
        if (st != OMPK_OK || (train && ompk_moe_ep_bwd(ep, &tdy, &g) != OMPK_OK)) {
            fprintf(stderr, "rank %d: step: %s\n", rank, ompk_last_error());
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        double dt = (MPI_Wtime() - t0) * 1e3, mx;
        MPI_Allreduce(&dt, &mx, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (r < 0) continue;
        tot[r] = mx;
        ompk_moe_ep_stats s;
        ompk_moe_ep_get_stats(ep, &s);
        part[0] += (s.exchange_ms + s2.exchange_ms) / reps;
        part[1] += (s.experts_ms + s2.experts_ms) / reps;
        part[2] += (s.combine_ms + s2.combine_ms) / reps;
        part[3] += (s.total_ms + s2.total_ms) / reps;
        bytes = s.bytes_sent + s2.bytes_sent;
    }
    qsort(tot, (size_t)reps, sizeof(double), cmp_d);
    double pmax[4];
    int64_t ball = 0;
    MPI_Reduce(part, pmax, 4, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(&bytes, &ball, 1, MPI_INT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
    ompk_moe_info info;
    ompk_moe_get_info(ompk_moe_ep_local(ep), &info);
    if (rank == 0) {
        const double fl = (train ? 16.0 : 6.0) * (double)Tt * k * H * I;
        printf("moe_ep %s%s E%lld H%lld I%lld k%d T%lld: %d ranks x %d threads (%s): %.2f ms "
               "(min %.2f), %.2f TFLOP/s; slowest rank's mean: exchange %.2f ms (%.0f%%), experts "
               "%.2f, combine %.2f; %.1f MiB sent over all ranks a forward\n",
               train ? "step " : "", fmts, (long long)E, (long long)H, (long long)I, k,
               (long long)Tt, size, info.threads, ompk_moe_isa_name(info.isa), tot[reps / 2],
               tot[0], fl / tot[reps / 2] * 1e-9, pmax[0], 100.0 * pmax[0] / pmax[3], pmax[1],
               pmax[2], (double)ball / 1048576.0);
        if (json) {
            FILE *f = fopen(json, "w");
            if (f) {
                fprintf(f,
                        "{\"kernel\": \"%s\", \"dtype\": \"%s\", \"shape\": \"E%lld H%lld "
                        "I%lld k%d T%lld\", \"ranks\": %d, \"threads_per_rank\": %d, \"isa\": "
                        "\"%s\", \"median_ms\": %.4f, \"min_ms\": %.4f, \"exchange_ms\": %.4f, "
                        "\"experts_ms\": %.4f, \"combine_ms\": %.4f, \"bytes_sent_all_ranks\": "
                        "%lld}\n",
                        train ? "moe_ep_step" : "moe_ep_fwd", fmts, (long long)E, (long long)H,
                        (long long)I, k, (long long)Tt, size, info.threads,
                        ompk_moe_isa_name(info.isa), tot[reps / 2], tot[0], pmax[0], pmax[1],
                        pmax[2], (long long)ball);
                fclose(f);
            }
        }
    }
    ompk_moe_ep_destroy(ep);
    free(x), free(y), free(ids), free(wt), free(tot), free(dyb), free(dxb), free(dwb);
    for (int q = 0; q < 6; q++) free(lw[q]), free(lg[q]);
    MPI_Finalize();
    return 0;
}
