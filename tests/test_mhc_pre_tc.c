/* ompk_mhc_pre_fwd under the default order and each entry of its implementation list available
 * in this build (src/host/mhc/mhc_pre_fwd_impl.c: on a GPU the wide-load and register tensor-core
 * GEMMs and their benchmark alternatives, each where it fits the call, else the default; the host
 * form; portable = the SIMT kernels, on the host too), each against the double reference, on
 * every device tu_devices lists. Shapes that take the tensor-core
 * path: bf16, D a multiple of 8, with token and D tails and n up to 8. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "mhc_test_common.h"
#include "test_variant_util.h"

static void check_variant(ompk_device dev, const char *variant, int64_t B, int64_t S, int64_t n,
                          int64_t D, int has_gamma, uint64_t seed) {
    pre_prob q;
    pre_new(&q, dev, OMPK_BF16, B, S, n, D, has_gamma, seed, 1.0);
    tu_force("mhc_pre_fwd", variant);
    ompk_status st = pre_run_fwd(&q);
    tu_force("mhc_pre_fwd", NULL);
    cr_assert_eq(st, OMPK_OK, "pre_fwd: %s (%s)", ompk_status_str(st), ompk_last_error());
    const int64_t T = q.T, M = q.M;
    double *x = tt_get(&q.x), *phi = tt_get(&q.phi), *al = tt_get(&q.alpha);
    double *bias = tt_get(&q.bias), *g = has_gamma ? tt_get(&q.gamma) : NULL;
    double *h_in = calloc(T * D, 8), *h_post = calloc(T * n, 8), *lg = calloc(T * n * n, 8);
    double *comb = calloc(T * n * n, 8), *h_mix = calloc(T * M, 8), *inv = calloc(T, 8);
    double *h_pre = calloc(T * n, 8);
    ompk_mhc_ref_pre_fwd(T, (int)n, D, x, phi, g, al, bias, &q.p, h_in, h_post, lg, comb, h_mix,
                         inv, h_pre);
    char what[128];
    snprintf(what, sizeof what, "%s variant=%s n=%lld D=%lld T=%lld", tu_device_name(dev),
             variant ? variant : "default", (long long)n, (long long)D, (long long)T);
    cr_expect(tt_cmp("h_in", &q.h_in, h_in, 1) <= 1, "h_in %s", what);
    cr_expect(tt_cmp("h_post", &q.h_post, h_post, 1) <= 1, "h_post %s", what);
    cr_expect(tt_cmp("res_logits", &q.logits, lg, 1) <= 1, "res_logits %s", what);
    cr_expect(tt_cmp("comb", &q.comb, comb, 1) <= 1, "comb %s", what);
    cr_expect(tt_cmp("h_mix", &q.h_mix, h_mix, 1) <= 1, "h_mix %s", what);
    cr_expect(tt_cmp("inv_rms", &q.inv_rms, inv, 1) <= 1, "inv_rms %s", what);
    cr_expect(tt_cmp("h_pre", &q.h_pre, h_pre, 1) <= 1, "h_pre %s", what);
    /* same inputs, same bits: a second call */
    tt *outs[7] = {&q.h_in, &q.h_post, &q.logits, &q.comb, &q.h_mix, &q.inv_rms, &q.h_pre};
    void *first[7];
    for (int i = 0; i < 7; i++) {
        tu_buf_download(&outs[i]->b);
        first[i] = malloc(outs[i]->b.bytes);
        memcpy(first[i], outs[i]->b.host, outs[i]->b.bytes);
    }
    tu_force("mhc_pre_fwd", variant);
    st = pre_run_fwd(&q);
    tu_force("mhc_pre_fwd", NULL);
    cr_assert_eq(st, OMPK_OK, "pre_fwd (second call): %s", ompk_status_str(st));
    for (int i = 0; i < 7; i++) {
        tu_buf_download(&outs[i]->b);
        cr_expect(memcmp(first[i], outs[i]->b.host, outs[i]->b.bytes) == 0,
                  "output %d differs between two calls, %s", i, what);
        free(first[i]);
    }
    free(x), free(phi), free(al), free(bias), free(g), free(h_in), free(h_post), free(lg);
    free(comb), free(h_mix), free(inv), free(h_pre);
    pre_free(&q);
}

Test(mhc_pre_tc, every_variant_matches_reference) {
    const char *variants[32];
    const int nv = tu_variants("mhc_pre_fwd", variants, 32);
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++)
        for (int v = 0; v < nv; v++) {
            check_variant(devs[di], variants[v], 3, 37, 4, 4096, 1, 11);
            check_variant(devs[di], variants[v], 2, 300, 3, 1000, 0, 12);
            check_variant(devs[di], variants[v], 1, 70, 8, 264, 1, 13);
        }
}
