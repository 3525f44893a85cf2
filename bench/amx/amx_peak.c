/* AMX ceilings of this CPU for the MoE tile kernels (not part of the library; built by
 * bench/amx/build.sh, run on the Xeon of the device machine):
 *  peak  TDPBF16PS on register-resident tiles (4 C tiles, 2 A, 2 B: the kernels' tile set),
 *        so only the instruction's throughput limits it;
 *  loads the same tiles with every A and B tile loaded from L1 each k-step (2 A + 2 B loads
 *        per 4 TDPBF16PS, A at the row stride of a 64-byte row and of the backward's 4160): the
 *        ceiling of the kernels' 2x2 blocking once its operands sit in L1;
 *  kern  the K-blocked kernel of the forward and the backward GEMMs (moe_kern_amx_n from
 *        src/amx/moe_kern_amx.c, compiled in) on 32 rows x MOE_NSTEPS n-steps, A in L1/L2, the
 *        packed weights of the call (K = 2048) in L2: what the kernel reaches with its data in
 *        cache.
 * Each on 1 thread and on every OpenMP thread (one copy of the data per thread). FLOPs of one
 * TDPBF16PS: 16 x 16 x 32 x 2. */
#define _GNU_SOURCE
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "moe_internal.h"

#define AMX_FN __attribute__((target("amx-tile,amx-bf16")))

/* palette 1, all 8 tiles 16 rows x 64 bytes (the kernels' configuration); C tiles 0-3 zeroed */
AMX_FN static void tiles_init(void) {
    uint8_t cfg[64] __attribute__((aligned(64)));
    memset(cfg, 0, sizeof cfg);
    cfg[0] = 1;
    for (int i = 0; i < 8; i++) {
        cfg[16 + 2 * i] = 64;
        cfg[48 + i] = 16;
    }
    _tile_loadconfig(cfg);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
}

AMX_FN static double peak_loop(long iters) {
    uint16_t buf[16 * 32] __attribute__((aligned(64)));
    float c[256] __attribute__((aligned(64)));
    for (int i = 0; i < 16 * 32; i++) buf[i] = 0x3f80; /* 1.0 */
    tiles_init();
    _tile_loadd(4, buf, 64);
    _tile_loadd(5, buf, 64);
    _tile_loadd(6, buf, 64);
    _tile_loadd(7, buf, 64);
    double t0 = omp_get_wtime();
    for (long i = 0; i < iters; i++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, c, 64);
    double t1 = omp_get_wtime();
    _tile_release();
    if (c[0] != 32.0f * (float)iters && iters < 100000) fprintf(stderr, "peak: bad sum\n");
    return t1 - t0;
}

/* the tile set with every A and B tile loaded from L1 each k-step (2 A + 2 B loads per 4
 * TDPBF16PS): the ceiling of the 2x2 blocking once its operands are in L1 */
AMX_FN static double load_loop(long iters, int64_t lda) {
    static __thread uint16_t abuf[32 * 2112] __attribute__((aligned(64)));
    static __thread uint16_t bbuf[2 * 8 * 512] __attribute__((aligned(64)));
    float c[256] __attribute__((aligned(64)));
    for (int i = 0; i < 32 * 2112; i++) abuf[i] = 0x3f80;
    for (int i = 0; i < 2 * 8 * 512; i++) bbuf[i] = 0x3f80;
    tiles_init();
    const uint8_t *a = (const uint8_t *)abuf, *b = (const uint8_t *)bbuf;
    double t0 = omp_get_wtime();
    for (long i = 0; i < iters; i++) {
        const int t = (int)(i & 7);
        _tile_loadd(4, a + t * 64, lda);
        _tile_loadd(6, b + t * 1024, 64);
        _tile_loadd(7, b + 8192 + t * 1024, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_loadd(5, a + 16 * lda + t * 64, lda);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, c, 64);
    double t1 = omp_get_wtime();
    _tile_release();
    return t1 - t0;
}

static double kern_loop(int kt, long calls) {
    const int ns = MOE_NSTEPS;
    const size_t abytes = (size_t)32 * ((size_t)kt * 64 + 64);
    uint8_t *a = aligned_alloc(64, abytes);
    uint8_t *b = aligned_alloc(64, (size_t)ns * 2 * kt * 1024);
    float *out = aligned_alloc(64, (size_t)ns * 1024 * 4);
    uint8_t *scr = aligned_alloc(64, MOE_KSCRATCH);
    for (size_t i = 0; i < abytes / 2; i++) ((uint16_t *)a)[i] = 0x3f80;
    for (size_t i = 0; i < (size_t)ns * 2 * kt * 512; i++) ((uint16_t *)b)[i] = 0x3c00;
    moe_kargs k;
    memset(&k, 0, sizeof k);
    k.fmt = OMPK_MOE_BF16;
    k.m = 32;
    k.kt = kt;
    k.a = a;
    k.lda = (int64_t)kt * 64 + 64; /* the backward's row stride */
    k.b[0] = b;
    k.b[1] = b + (size_t)kt * 1024;
    k.bstride = 1024;
    k.out = out;
    k.scratch = scr;
    k.nsteps = ns;
    k.nstride = 2 * (int64_t)kt * 1024;
    moe_kern_amx_n(&k);
    double t0 = omp_get_wtime();
    for (long i = 0; i < calls; i++) moe_kern_amx_n(&k);
    double t1 = omp_get_wtime();
    moe_amx_release();
    free(a);
    free(b);
    free(out);
    free(scr);
    return t1 - t0;
}

int main(int argc, char **argv) {
    if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) {
        printf("amx_peak: no XTILEDATA permission (no AMX here)\n");
        return 1;
    }
    const long iters = argc > 1 ? atol(argv[1]) : 20000000L;
    const int kt = 64; /* K = 2048 */
    const long calls = 4000;
    const double fl_tdp = 16.0 * 16 * 32 * 2;
    const double fl_call = 32.0 * 32 * MOE_NSTEPS * kt * 32 * 2;
    const int nt = omp_get_max_threads();
    double t = peak_loop(iters);
    printf("peak TDPBF16PS 1 thread: %.3f TFLOP/s (%.1f ns per instruction)\n",
           4 * iters * fl_tdp / t * 1e-12, t / (4.0 * iters) * 1e9);
    double worst = 0;
#pragma omp parallel reduction(max : worst)
    worst = peak_loop(iters);
    printf("peak TDPBF16PS %d threads: %.3f TFLOP/s (%.3f per core)\n", nt,
           nt * 4 * iters * fl_tdp / worst * 1e-12, 4 * iters * fl_tdp / worst * 1e-12);
    for (int li = 0; li < 2; li++) {
        const int64_t lda = li ? 4160 : 512;
        t = load_loop(iters / 4, lda);
        printf("loads-from-L1 lda %lld 1 thread: %.3f TFLOP/s\n", (long long)lda,
               iters * fl_tdp / t * 1e-12);
        worst = 0;
#pragma omp parallel reduction(max : worst)
        worst = load_loop(iters / 4, lda);
        printf("loads-from-L1 lda %lld %d threads: %.3f per core\n", (long long)lda, nt,
               iters * fl_tdp / worst * 1e-12);
    }
    t = kern_loop(kt, calls);
    printf("kernel moe_kern_amx_n (32 rows, %d n-steps, K %d, data in cache) 1 thread: %.3f "
           "TFLOP/s\n",
           MOE_NSTEPS, kt * 32, calls * fl_call / t * 1e-12);
    worst = 0;
#pragma omp parallel reduction(max : worst)
    worst = kern_loop(kt, calls);
    printf("kernel moe_kern_amx_n %d threads: %.3f TFLOP/s (%.3f per core)\n", nt,
           nt * calls * fl_call / worst * 1e-12, calls * fl_call / worst * 1e-12);
    return 0;
}
