/* Read-bandwidth probe for the access patterns of the mHC pre-forward GEMM (not part of the
 * library; built by bench/diag/build.sh and carried to the GPU machine by hand).
 *
 * Why it exists: the tensor-core GEMM streams x [T][n*D] bf16 (32 KB rows at the bench shape) at
 * 1.4 TB/s while the h_in pass over the same bytes reaches 4 TB/s. The probe reads the same
 * 512 MiB with the GEMM's team geometry (R token rows a team, the row's bytes split over KS
 * teams, W bytes of each row a stage) and varies only the shape of one warp load (lpr lanes on a
 * row: 4 = the mma fragment layout, 8 rows x 64 B; 32 = 512 contiguous bytes), so the cause
 * can be told from the numbers: pattern of one load, contiguity per stage, or team order. */
#include <omp.h>
#include <ompx.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define THREADS 128
#define U 16 /* 16-byte loads a thread a stage: a stage is 32 KB a team */
#define ROWB 32768L
#define T 16384L

typedef struct {
    uint32_t w[4];
} u128;

typedef struct {
    int lpr, W, R, KS, order, rot, mode;
} pat;

/* mode 0: plain loads; 1: ld.global.nc with an L2 fill of the 256-byte block; 2: with a 128-byte
 * fill; 3: plain loads plus one bulk L2 prefetch (TMA) of each row's W bytes two stages ahead */
static inline __attribute__((unused)) u128 ld(const char *p, int mode) {
    return *(const u128 *)p;
    (void)mode;
}
static inline __attribute__((unused)) void bulk_prefetch(const char *p, int bytes) {
    (void)p, (void)bytes;
}
#pragma omp begin declare variant match(device = {arch(nvptx64)})
static inline __attribute__((unused)) u128 ld(const char *p, int mode) {
    u128 r;
    if (mode == 1)
        __asm__ volatile("ld.global.nc.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                         : "=r"(r.w[0]), "=r"(r.w[1]), "=r"(r.w[2]), "=r"(r.w[3])
                         : "l"(p));
    else if (mode == 2)
        __asm__ volatile("ld.global.nc.L2::128B.v4.u32 {%0, %1, %2, %3}, [%4];"
                         : "=r"(r.w[0]), "=r"(r.w[1]), "=r"(r.w[2]), "=r"(r.w[3])
                         : "l"(p));
    else
        r = *(const u128 *)p;
    return r;
}
static inline __attribute__((unused)) void bulk_prefetch(const char *p, int bytes) {
    __asm__ volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}
#pragma omp end declare variant

static double run(const pat *pp, const char *buf, uint32_t *sink, int reps) {
    const pat p = *pp;
    const int ng = (int)(T / p.R), teams = ng * p.KS;
    double best = 1e30, t[64];
    for (int r = 0; r < reps + 1; r++) {
        const double t0 = omp_get_wtime();
#pragma omp target teams ompx_bare num_teams(teams) thread_limit(THREADS) is_device_ptr(buf, sink) \
    firstprivate(p, ng)
        {
            const int tid = ompx_thread_id_x(), lane = tid & 31, warp = tid >> 5;
            const int blk = ompx_block_id_x();
            const int split = p.order ? blk % p.KS : blk / ng;
            const int grp = p.order ? blk / p.KS : blk % ng;
            const long span = ROWB / p.KS;
            const int nst = (int)(span / p.W), C = p.W / 16, CB = C / p.lpr, RPI = 32 / p.lpr;
            const int rot = p.rot ? blk % nst : 0;
            uint32_t acc = 0;
            for (int st = 0; st < nst; st++) {
                const int s = st + rot < nst ? st + rot : st + rot - nst;
                const char *base = buf + (long)grp * p.R * ROWB + split * span + (long)s * p.W;
                if (p.mode == 3 && st + 2 < nst) {
                    const int s2 = st + 2 + rot < nst ? st + 2 + rot : st + 2 + rot - nst;
                    const char *pb = buf + (long)grp * p.R * ROWB + split * span + (long)s2 * p.W;
                    for (int r = tid; r < p.R; r += THREADS)
                        bulk_prefetch(pb + (long)r * ROWB, p.W);
                }
                u128 v[U];
#pragma unroll
                for (int u = 0; u < U; u++) {
                    const int b = warp * U + u, rb = b / CB, cb = b % CB;
                    const int row = rb * RPI + lane / p.lpr, piece = cb * p.lpr + lane % p.lpr;
                    v[u] = ld(base + (long)row * ROWB + piece * 16, p.mode);
                }
#pragma unroll
                for (int u = 0; u < U; u++) acc ^= v[u].w[0] ^ v[u].w[1] ^ v[u].w[2] ^ v[u].w[3];
            }
            if (acc == 0x9e3779b9u) sink[blk * THREADS + tid] = acc;
        }
        t[r] = omp_get_wtime() - t0;
        if (r > 0 && t[r] < best) best = t[r];
    }
    return best;
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 10;
    const int dev = omp_get_default_device();
    const size_t bytes = (size_t)T * ROWB;
    char *buf = omp_target_alloc(bytes, dev);
    uint32_t *sink = omp_target_alloc((size_t)T * 64 * THREADS * 4, dev);
    if (!buf || !sink) return fprintf(stderr, "alloc failed\n"), 1;
    /* touch every page (values do not matter, only that the reads are real) */
#pragma omp target teams distribute parallel for is_device_ptr(buf)
    for (long i = 0; i < (long)(bytes / 4); i++) ((uint32_t *)buf)[i] = (uint32_t)i * 2654435761u;
    const pat ps[] = {
        /* lpr W R KS order rot mode */
        {4, 128, 256, 8, 0, 1, 0},  /* the GEMM default: 8 rows x 64 B a load */
        {4, 128, 256, 8, 0, 1, 1},  /* + L2 fill of 256 B */
        {4, 128, 256, 8, 0, 1, 2},  /* + L2 fill of 128 B */
        {4, 128, 256, 8, 0, 1, 3},  /* + bulk L2 prefetch two stages ahead */
        {4, 256, 128, 8, 0, 1, 0},  /* 8 rows x 64 B, 256 B a row a stage */
        {4, 256, 128, 8, 0, 1, 1},  /* + L2 fill of 256 B */
        {4, 256, 128, 8, 0, 1, 3},  /* + bulk prefetch */
        {4, 512, 64, 8, 0, 1, 1},   /* 8 rows x 64 B, 512 B a row a stage, 256 B fills */
        {8, 128, 256, 8, 0, 1, 1},  /* 4 rows x 128 B + 256 B fills */
        {16, 256, 128, 8, 0, 1, 0}, /* 2 rows x 256 B a load */
        {16, 256, 128, 8, 0, 1, 1}, /* + 256 B fills */
        {32, 512, 64, 8, 0, 1, 0},  /* 1 row x 512 B a load */
        {4, 128, 256, 8, 0, 0, 1},  /* GEMM pattern unrotated + 256 B fills */
        {4, 128, 256, 4, 0, 1, 1},  /* 4 splits + 256 B fills */
    };
    printf("{\"probe\": \"dram_probe\", \"bytes\": %zu, \"patterns\": [\n", bytes);
    const int np = (int)(sizeof ps / sizeof ps[0]);
    for (int i = 0; i < np; i++) {
        pat p = ps[i];
        if (p.lpr * 16 > p.W) p.lpr = p.W / 16;
        const double s = run(&p, buf, sink, reps);
        printf("  {\"lpr\": %d, \"W\": %d, \"R\": %d, \"KS\": %d, \"order\": %d, \"rot\": %d, "
               "\"mode\": %d, \"ms\": %.4f, \"GBps\": %.0f}%s\n",
               p.lpr, p.W, p.R, p.KS, p.order, p.rot, p.mode, s * 1e3, bytes / s / 1e9,
               i + 1 < np ? "," : "");
    }
    printf("]}\n");
    omp_target_free(buf, dev);
    omp_target_free(sink, dev);
    return 0;
}
