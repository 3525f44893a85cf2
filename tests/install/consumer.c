/* A program built against the installed ompk (tests/install/run.sh builds it three ways:
 * find_package, pkg-config and the README's plain compiler line). One mHC post forward on the
 * host, checked against the formula, and a DLPack view of the output. Exit status 0 when right. */
#include <math.h>
#include <stdio.h>

#include <ompk/ompk.h>

enum { B = 1, S = 3, n = 2, D = 4 };

int main(void) {
    float x[B * S * n * D], comb[B * S * n * n], post[B * S * n], f[B * S * D], out[B * S * n * D];
    for (int e = 0; e < B * S * n * D; e++) x[e] = 0.25f * (float)(e % 7) - 0.5f;
    for (int e = 0; e < B * S * n * n; e++) comb[e] = 0.125f * (float)(e % 5);
    for (int e = 0; e < B * S * n; e++) post[e] = 1.0f + 0.5f * (float)e;
    for (int e = 0; e < B * S * D; e++) f[e] = 0.1f * (float)e;
    const int64_t xs[4] = {B, S, n, D}, cs[4] = {B, S, n, n}, ps[3] = {B, S, n}, fs[3] = {B, S, D};
    const ompk_device host = ompk_device_host();
    ompk_tensor tx = ompk_tensor_make(x, OMPK_F32, 4, xs, host);
    ompk_tensor tc = ompk_tensor_make(comb, OMPK_F32, 4, cs, host);
    ompk_tensor tp = ompk_tensor_make(post, OMPK_F32, 3, ps, host);
    ompk_tensor tf = ompk_tensor_make(f, OMPK_F32, 3, fs, host);
    ompk_tensor to = ompk_tensor_make(out, OMPK_F32, 4, xs, host);
    ompk_status st = ompk_mhc_post_fwd(&tx, &tc, &tp, &tf, &to);
    if (st != OMPK_OK) {
        fprintf(stderr, "consumer: %s: %s\n", ompk_status_str(st), ompk_last_error());
        return 1;
    }
    double worst = 0;
    for (int t = 0; t < B * S; t++)
        for (int o = 0; o < n; o++)
            for (int d = 0; d < D; d++) {
                double r = (double)post[t * n + o] * f[t * D + d];
                for (int i = 0; i < n; i++)
                    r += (double)comb[(t * n + i) * n + o] * x[(t * n + i) * D + d];
                worst = fmax(worst, fabs(r - out[(t * n + o) * D + d]));
            }
    DLTensor dl;
    if (ompk_tensor_to_dlpack(&to, &dl) != OMPK_OK || dl.ndim != 4 ||
        dl.device.device_type != kDLCPU) {
        fprintf(stderr, "consumer: DLPack view wrong\n");
        return 1;
    }
    printf("consumer: ompk %s, mhc_post_fwd max error %.2g\n", ompk_version(), worst);
    return worst < 1e-5 ? 0 : 1;
}
