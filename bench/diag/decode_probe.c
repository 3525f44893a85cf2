/* Decode-size mHC calls on the first GPU: the time of one post forward, one pre forward, the two
 * in a row and ompk_mhc_post_pre_fwd (T tokens, n4 D4096 bf16), averaged over many calls, to see
 * the host and launch cost that ompk-bench's medians fold together. Usage: decode_probe [T] [reps].
 * With LIBOMPTARGET_INFO set, run it with reps = 1 to list the regions and transfers of one call.
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include <ompk/ompk.h>

enum { n = 4, D = 4096, K = n * D, M = 2 * n + n * n };

static ompk_device dev;

static ompk_tensor make(ompk_dtype dt, int nd, const int64_t *shape) {
    int64_t numel = 1;
    for (int i = 0; i < nd; i++) numel *= shape[i];
    const size_t bytes = (size_t)numel * (dt == OMPK_BF16 ? 2 : 4);
    void *p = ompk_malloc(dev, bytes);
    if (!p) {
        fprintf(stderr, "decode_probe: %s\n", ompk_last_error());
        exit(1);
    }
    ompk_memset(p, dev, 0, bytes);
    return ompk_tensor_make(p, dt, nd, shape, dev);
}

static void check(const char *what, ompk_status st) {
    if (st == OMPK_OK) return;
    fprintf(stderr, "decode_probe: %s: %s (%s)\n", what, ompk_status_str(st), ompk_last_error());
    exit(1);
}

int main(int argc, char **argv) {
    const int64_t T = argc > 1 ? atoll(argv[1]) : 16;
    const int reps = argc > 2 ? atoi(argv[2]) : 200;
    if (omp_get_num_devices() < 1) {
        fprintf(stderr, "decode_probe: no GPU\n");
        return 1;
    }
    dev = ompk_device_target(0);
    const int64_t sx[4] = {1, T, n, D}, sh[3] = {1, T, D}, sp[3] = {1, T, n}, sc[4] = {1, T, n, n},
                  sphi[2] = {M, K}, s3[1] = {3}, sm[1] = {M};
    ompk_tensor x = make(OMPK_BF16, 4, sx), f = make(OMPK_BF16, 3, sh),
                out = make(OMPK_BF16, 4, sx);
    ompk_tensor comb = make(OMPK_F32, 4, sc), post = make(OMPK_F32, 3, sp);
    ompk_tensor phi = make(OMPK_F32, 2, sphi), alpha = make(OMPK_F32, 1, s3),
                bias = make(OMPK_F32, 1, sm);
    ompk_tensor h_in = make(OMPK_BF16, 3, sh), h_post = make(OMPK_F32, 3, sp),
                comb2 = make(OMPK_F32, 4, sc);
    ompk_mhc_pre_fwd_args a = {0};
    a.x = &out, a.phi = &phi, a.alpha = &alpha, a.bias = &bias;
    a.h_in = &h_in, a.h_post = &h_post, a.comb = &comb2;
    ompk_mhc_post_pre_fwd_args pp = {.x = &x, .comb = &comb, .post = &post, .f = &f, .x_out = &out};
    pp.pre = a;
    pp.pre.x = NULL;
    double t_pre = 0, t_post = 0, t_both = 0, t_fused = 0;
    for (int r = 0; r < reps + (reps > 1); r++) {
        double t0 = omp_get_wtime();
        check("post_fwd", ompk_mhc_post_fwd(&x, &comb, &post, &f, &out));
        double t1 = omp_get_wtime();
        check("pre_fwd", ompk_mhc_pre_fwd(&a, NULL));
        double t2 = omp_get_wtime();
        check("post_pre_fwd", ompk_mhc_post_pre_fwd(&pp, NULL));
        double t3 = omp_get_wtime();
        if (r == 0 && reps > 1) continue; /* first call: device and workspace setup */
        t_post += t1 - t0, t_pre += t2 - t1, t_both += t2 - t0, t_fused += t3 - t2;
    }
    printf("T %lld n4 D4096 bf16, %d calls: post_fwd %.1f us, pre_fwd %.1f us, both %.1f us, "
           "post_pre_fwd %.1f us\n",
           (long long)T, reps, 1e6 * t_post / reps, 1e6 * t_pre / reps, 1e6 * t_both / reps,
           1e6 * t_fused / reps);
    return 0;
}
