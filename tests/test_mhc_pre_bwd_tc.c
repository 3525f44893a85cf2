/* ompk_mhc_pre_bwd under the default order and each entry of its implementation list available
 * in this build (on a GPU the tensor-core stage 4, its 128-register build tc-r128; portable =
 * SIMT), each against the double reference, on every device tu_devices lists (on the host every
 * entry runs the portable kernels). Shapes that take the tensor-core path (bf16, D a multiple of
 * 32, n*D of 128): every n it serves, token tails inside a tile and across batches, one and many
 * token blocks, several tiles a team, with and without gamma and grad_x_post. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "mhc_test_common.h"
#include "test_variant_util.h"

static void check_variant(ompk_device dev, const char *variant, int64_t B, int64_t S, int64_t n,
                          int64_t D, int has_gamma, int with_gxp, uint64_t seed) {
    pre_prob q;
    pre_new(&q, dev, OMPK_BF16, B, S, n, D, has_gamma, seed, 1.0);
    ompk_status st = pre_run_fwd(&q);
    cr_assert_eq(st, OMPK_OK, "pre_fwd: %s (%s)", ompk_status_str(st), ompk_last_error());
    tu_force("mhc_pre_bwd", variant);
    st = pre_run_bwd(&q, with_gxp);
    tu_force("mhc_pre_bwd", NULL);
    cr_assert_eq(st, OMPK_OK, "pre_bwd: %s (%s)", ompk_status_str(st), ompk_last_error());
    const int64_t T = q.T, M = q.M, K = q.K;
    double *x = tt_get(&q.x), *phi = tt_get(&q.phi), *al = tt_get(&q.alpha);
    double *g = has_gamma ? tt_get(&q.gamma) : NULL;
    double *dh = tt_get(&q.dh_in), *dp = tt_get(&q.dh_post), *dr = tt_get(&q.dh_res);
    double *gx = with_gxp ? tt_get(&q.gxp) : NULL;
    double *hm = tt_get(&q.h_mix), *inv = tt_get(&q.inv_rms), *hp = tt_get(&q.h_pre);
    double *hpo = tt_get(&q.h_post);
    double *rdx = calloc(T * K, 8), *rdphi = calloc(M * K, 8), *rdal = calloc(3, 8);
    double *rdb = calloc(M, 8), *rdg = calloc(K, 8);
    ompk_mhc_ref_pre_bwd(T, (int)n, D, x, phi, g, al, &q.p, dh, dp, dr, gx, hm, inv, hp, hpo, rdx,
                         rdphi, rdal, rdb, g ? rdg : NULL);
    char what[160];
    snprintf(what, sizeof what, "%s variant=%s n=%lld D=%lld T=%lld gamma=%d gxp=%d",
             tu_device_name(dev), variant ? variant : "default", (long long)n, (long long)D,
             (long long)T, has_gamma, with_gxp);
    cr_expect(tt_cmp("dx", &q.dx, rdx, 1) <= 1, "dx %s", what);
    cr_expect(tt_cmp("dphi", &q.dphi, rdphi, 1) <= 1, "dphi %s", what);
    cr_expect(tt_cmp("dalpha", &q.dalpha, rdal, 1) <= 1, "dalpha %s", what);
    cr_expect(tt_cmp("dbias", &q.dbias, rdb, 1) <= 1, "dbias %s", what);
    if (has_gamma) cr_expect(tt_cmp("dgamma", &q.dgamma, rdg, 1) <= 1, "dgamma %s", what);
    free(x), free(phi), free(al), free(g), free(dh), free(dp), free(dr), free(gx), free(hm);
    free(inv), free(hp), free(hpo), free(rdx), free(rdphi), free(rdal), free(rdb), free(rdg);
    pre_free(&q);
}

Test(mhc_pre_bwd_tc, every_variant_matches_reference) {
    const char *variants[8];
    const int nv = tu_variants("mhc_pre_bwd", variants, 8);
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++)
        for (int v = 0; v < nv; v++) {
            check_variant(devs[di], variants[v], 3, 37, 4, 4096, 1, 1, 21);
            check_variant(devs[di], variants[v], 2, 300, 4, 256, 0, 0, 22);
            check_variant(devs[di], variants[v], 4, 1030, 4, 128, 1, 0, 23);
            check_variant(devs[di], variants[v], 1, 70, 1, 128, 1, 1, 24);
            check_variant(devs[di], variants[v], 2, 33, 2, 64, 0, 1, 25);
            check_variant(devs[di], variants[v], 1, 45, 3, 128, 1, 0, 26);
        }
}
