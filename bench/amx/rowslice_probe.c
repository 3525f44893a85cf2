/* The memory side of the MoE backward's I-chunk pass (src/amx/moe_backward.c phase 2), alone:
 * per (expert, chunk of I) task, every route of the expert reads its g, u and q slices and writes
 * dg (over q) and du, with a few flops per element. Compares the cache's token-order rows (the
 * library's layout) with expert-sorted rows, at chunk widths 64 and 256, against one contiguous
 * pass over the same bytes (the bandwidth bound). Not part of the library; bench/amx/build.sh.
 * usage: rowslice_probe [E I T k reps] (default E64 I1408 T4096 k6, 5 reps) */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void slice(const float *g, const float *u, float *q, float *du, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float a = q[i], sg = 1.0f / (1.0f + g[i]);
        q[i] = a * u[i] * sg;
        du[i] = a * g[i] * sg;
    }
}

int main(int argc, char **argv) {
    const int64_t E = argc > 1 ? atol(argv[1]) : 64, I = argc > 2 ? atol(argv[2]) : 1408;
    const int64_t T = argc > 3 ? atol(argv[3]) : 4096;
    const int k = argc > 4 ? atoi(argv[4]) : 6, reps = argc > 5 ? atoi(argv[5]) : 5;
    const int64_t R = T * k;
    int32_t *ids = malloc((size_t)R * 4), *rroute = malloc((size_t)R * 4);
    int64_t *offs = calloc((size_t)E + 1, 8), *cur = malloc((size_t)E * 8);
    uint64_t z = 88172645463325252ull;
    for (int64_t t = 0; t < T; t++)
        for (int j = 0; j < k; j++) {
            int64_t e;
            int dup;
            do {
                z ^= z << 13, z ^= z >> 7, z ^= z << 17;
                e = (int64_t)(z % (uint64_t)E);
                dup = 0;
                for (int q = 0; q < j; q++) dup |= ids[t * k + q] == e;
            } while (dup);
            ids[t * k + j] = (int32_t)e;
            offs[e + 1]++;
        }
    for (int64_t e = 0; e < E; e++) {
        offs[e + 1] += offs[e];
        cur[e] = offs[e];
    }
    for (int64_t r = 0; r < R; r++) rroute[cur[ids[r]]++] = (int32_t)r;
    const size_t bytes = (size_t)R * I * 4;
    float *g = aligned_alloc(64, bytes), *u = aligned_alloc(64, bytes);
    float *q = aligned_alloc(64, bytes), *du = aligned_alloc(64, bytes);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < R; r++)
        for (int64_t i = 0; i < I; i++) {
            g[r * I + i] = 0.5f + (float)(i & 7);
            u[r * I + i] = 1.0f;
            q[r * I + i] = 1.0f;
            du[r * I + i] = 0.0f;
        }
    printf("rowslice_probe E%lld I%lld T%lld k%d: %d threads, 4 arrays of %.1f MiB (3 read, 2 "
           "written per element)\n",
           (long long)E, (long long)I, (long long)T, k, omp_get_max_threads(), bytes / 1048576.0);
    const double moved = 5.0 * (double)bytes;
    for (int v = 0; v < 5; v++) {
        const int sorted = v == 2 || v == 4, cw = v >= 3 ? 256 : 64;
        const int64_t nch = (I + cw - 1) / cw;
        double ts[64];
        for (int rep = 0; rep < reps + 1; rep++) {
            const double t0 = omp_get_wtime();
            if (v == 0) {
#pragma omp parallel for schedule(static)
                for (int64_t r = 0; r < R; r++)
                    slice(g + r * I, u + r * I, q + r * I, du + r * I, I);
            } else {
#pragma omp parallel for schedule(dynamic, 1)
                for (int64_t task = 0; task < E * nch; task++) {
                    const int64_t e = task / nch, i0 = task % nch * cw;
                    const int64_t n = I - i0 < cw ? I - i0 : cw;
                    for (int64_t rr = offs[e]; rr < offs[e + 1]; rr++) {
                        const int64_t row = sorted ? rr : rroute[rr], o = row * I + i0;
                        slice(g + o, u + o, q + o, du + o, n);
                    }
                }
            }
            if (rep) ts[rep - 1] = omp_get_wtime() - t0;
        }
        qsort(ts, (size_t)reps, sizeof ts[0], cmp_d);
        static const char *name[5] = {"contiguous rows (bound)", "token-order rows, chunk 64",
                                      "expert-sorted rows, chunk 64", "token-order rows, chunk 256",
                                      "expert-sorted rows, chunk 256"};
        printf("  %-32s %8.2f ms (min %.2f)  %6.1f GB/s\n", name[v], ts[reps / 2] * 1e3,
               ts[0] * 1e3, moved / ts[reps / 2] * 1e-9);
    }
    free(g);
    free(u);
    free(q);
    free(du);
    free(ids);
    free(rroute);
    free(offs);
    free(cur);
    return 0;
}
