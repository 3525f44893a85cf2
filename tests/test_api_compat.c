/* The deprecated names (CHANGELOG.md) kept for one release: each old call once, against its
 * replacement on the same inputs, with bit-identical outputs and the same status and message on
 * a rejected call. Built with -Wno-deprecated-declarations (tests/CMakeLists.txt). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#ifdef OMPK_HAVE_MHC
#include "mhc_test_common.h"

/* Downloads r and returns a copy of its bytes (caller frees), then poisons it for the next run. */
static void *take(tt *r) {
    tu_buf_download(&r->b);
    void *c = malloc(r->b.bytes ? r->b.bytes : 1);
    cr_assert(c);
    memcpy(c, r->b.host, r->b.bytes);
    tu_buf_fill_bytes(&r->b, POISON);
    return c;
}

static void expect_same(tt *r, void *first, const char *what) {
    tu_buf_download(&r->b);
    cr_expect(memcmp(first, r->b.host, r->b.bytes) == 0, "%s differs from the new call", what);
    free(first);
}

Test(api_compat, mhc) {
    ompk_device devs[4];
    const int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++) {
        pre_prob q;
        pre_new(&q, devs[di], OMPK_F32, 2, 3, 4, 64, 1, 11, 1.0);
        tt *fo[] = {&q.h_in, &q.h_post, &q.logits, &q.comb, &q.h_mix, &q.inv_rms, &q.h_pre};
        const char *fn[] = {"h_in", "h_post", "res_logits", "comb", "h_mix", "inv_rms", "h_pre"};
        void *first[7];
        cr_assert_eq(pre_run_fwd(&q), OMPK_OK, "%s", ompk_last_error());
        for (int i = 0; i < 7; i++) first[i] = take(fo[i]);
        cr_assert_eq(ompk_mhc_pre_fwd_positional(
                         &q.x.t, &q.phi.t, &q.gamma.t, &q.alpha.t, &q.bias.t, &q.p, &q.h_in.t,
                         &q.h_post.t, &q.logits.t, &q.comb.t, &q.h_mix.t, &q.inv_rms.t, &q.h_pre.t),
                     OMPK_OK, "%s", ompk_last_error());
        for (int i = 0; i < 7; i++) expect_same(fo[i], first[i], fn[i]);

        tt *bo[] = {&q.dx, &q.dphi, &q.dalpha, &q.dbias, &q.dgamma};
        const char *bn[] = {"dx", "dphi", "dalpha", "dbias", "dgamma"};
        cr_assert_eq(pre_run_fwd(&q), OMPK_OK, "%s", ompk_last_error());
        cr_assert_eq(pre_run_bwd(&q, 1), OMPK_OK, "%s", ompk_last_error());
        for (int i = 0; i < 5; i++) first[i] = take(bo[i]);
        cr_assert_eq(ompk_mhc_pre_bwd_positional(
                         &q.x.t, &q.phi.t, &q.gamma.t, &q.alpha.t, &q.p, &q.dh_in.t, &q.dh_post.t,
                         &q.dh_res.t, &q.gxp.t, &q.h_mix.t, &q.inv_rms.t, &q.h_pre.t, &q.h_post.t,
                         &q.dx.t, &q.dphi.t, &q.dalpha.t, &q.dbias.t, &q.dgamma.t),
                     OMPK_OK, "%s", ompk_last_error());
        for (int i = 0; i < 5; i++) expect_same(bo[i], first[i], bn[i]);

        /* Sinkhorn on the forward's logits, at a repeat count and eps of its own */
        const ompk_mhc_params p = tu_sk_params(7, 1e-5f);
        cr_assert_eq(ompk_mhc_sinkhorn_fwd(&q.logits.t, &q.comb.t, &p), OMPK_OK);
        first[0] = take(&q.comb);
        cr_assert_eq(ompk_sinkhorn_fwd(&q.logits.t, 7, 1e-5f, &q.comb.t), OMPK_OK);
        expect_same(&q.comb, first[0], "sinkhorn comb");
        cr_assert_eq(ompk_mhc_sinkhorn_bwd(&q.logits.t, &q.dh_res.t, &q.comb.t, &p), OMPK_OK);
        first[0] = take(&q.comb);
        cr_assert_eq(ompk_sinkhorn_bwd(&q.logits.t, &q.dh_res.t, 7, 1e-5f, &q.comb.t), OMPK_OK);
        expect_same(&q.comb, first[0], "sinkhorn dlogits");
        pre_free(&q);
    }
}

/* A rejected call: the same status and message from either name. */
Test(api_compat, mhc_rejected) {
    pre_prob q;
    pre_new(&q, ompk_device_host(), OMPK_F32, 1, 2, 2, 8, 0, 3, 1.0);
    char msg[512];
    const ompk_mhc_params p = tu_sk_params(0, 1e-6f);
    cr_assert_eq(ompk_mhc_sinkhorn_bwd(&q.logits.t, &q.dh_res.t, &q.comb.t, &p),
                 OMPK_ERR_INVALID_ARGUMENT);
    snprintf(msg, sizeof msg, "%s", ompk_last_error());
    cr_assert_eq(ompk_sinkhorn_bwd(&q.logits.t, &q.dh_res.t, 0, 1e-6f, &q.comb.t),
                 OMPK_ERR_INVALID_ARGUMENT);
    cr_expect_str_eq(ompk_last_error(), msg);
    cr_assert_eq(ompk_mhc_pre_fwd(NULL, NULL), OMPK_ERR_INVALID_ARGUMENT);
    cr_assert_eq(ompk_mhc_pre_bwd(NULL, NULL), OMPK_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(ompk_last_error(), "args is NULL") != NULL, "%s", ompk_last_error());
    pre_free(&q);
}
#endif

#ifdef OMPK_HAVE_MOE
Test(api_compat, moe) {
    const int64_t E = 3, H = 64, I = 96, T = 5, k = 2;
    ompk_moe_config c;
    memset(&c, 0, sizeof c);
    c.experts = E, c.hidden = H, c.intermediate = I, c.top_k = (int)k, c.max_tokens = T;
    c.format = OMPK_MOE_BF16, c.isa = OMPK_MOE_ISA_PORTABLE, c.threads = 1, c.cache_depth = 2;
    ompk_moe *m;
    cr_assert_eq(ompk_moe_create(&c, &m), OMPK_OK, "%s", ompk_last_error());
    const ompk_device h = ompk_device_host();
    tu_rng r = tu_rng_make(5);
    tu_buf g = tu_buf_new(h, OMPK_F32, E * I * H), u = tu_buf_new(h, OMPK_F32, E * I * H),
           d = tu_buf_new(h, OMPK_F32, E * H * I), x = tu_buf_new(h, OMPK_F32, T * H),
           w = tu_buf_new(h, OMPK_F32, T * k), ids = tu_buf_new(h, OMPK_I32, T * k);
    tu_buf y[2] = {tu_buf_new(h, OMPK_F32, T * H), tu_buf_new(h, OMPK_F32, T * H)};
    tu_buf dy = tu_buf_new(h, OMPK_F32, T * H);
    tu_buf dx[2] = {tu_buf_new(h, OMPK_F32, T * H), tu_buf_new(h, OMPK_F32, T * H)};
    tu_buf_randn(&g, &r, 0.1), tu_buf_randn(&u, &r, 0.1), tu_buf_randn(&d, &r, 0.1);
    tu_buf_randn(&x, &r, 1.0), tu_buf_randn(&w, &r, 1.0), tu_buf_randn(&dy, &r, 1.0);
    for (int64_t i = 0; i < T * k; i++) ((int32_t *)ids.host)[i] = (int32_t)((i * 7 + 1) % E);
    const int64_t s1[3] = {E, I, H}, s2[3] = {E, H, I}, sx[2] = {T, H}, sk[2] = {T, k};
    ompk_tensor tg = tu_view(&g, 3, s1), tup = tu_view(&u, 3, s1), td = tu_view(&d, 3, s2);
    ompk_tensor tx = tu_view(&x, 2, sx), tw = tu_view(&w, 2, sk), ti = tu_view(&ids, 2, sk);
    ompk_tensor ty[2] = {tu_view(&y[0], 2, sx), tu_view(&y[1], 2, sx)};
    ompk_tensor tdy = tu_view(&dy, 2, sx),
                tdx[2] = {tu_view(&dx[0], 2, sx), tu_view(&dx[1], 2, sx)};
    cr_assert_eq(ompk_moe_load_weights(m, &tg, &tup, &td), OMPK_OK, "%s", ompk_last_error());

    cr_assert_eq(ompk_moe_fwd(m, &tx, &ti, &tw, &ty[0]), OMPK_OK, "%s", ompk_last_error());
    cr_assert_eq(ompk_moe_forward(m, &tx, &ti, &tw, &ty[1]), OMPK_OK, "%s", ompk_last_error());
    cr_expect(memcmp(y[0].host, y[1].host, y[0].bytes) == 0, "ompk_moe_forward differs");

    /* two saved forwards, one from each name; the backwards pop them in turn */
    tu_buf_fill_bytes(&y[0], 0xA5), tu_buf_fill_bytes(&y[1], 0xA5);
    cr_assert_eq(ompk_moe_fwd_train(m, &tx, &ti, &tw, &ty[0], OMPK_MOE_CACHE_PUSH), OMPK_OK, "%s",
                 ompk_last_error());
    cr_assert_eq(ompk_moe_forward_train(m, &tx, &ti, &tw, &ty[1], OMPK_MOE_CACHE_PUSH), OMPK_OK,
                 "%s", ompk_last_error());
    cr_expect(memcmp(y[0].host, y[1].host, y[0].bytes) == 0, "ompk_moe_forward_train differs");
    ompk_moe_grads gr;
    memset(&gr, 0, sizeof gr);
    gr.dx = &tdx[0];
    cr_assert_eq(ompk_moe_bwd(m, &tdy, &gr), OMPK_OK, "%s", ompk_last_error());
    gr.dx = &tdx[1];
    cr_assert_eq(ompk_moe_backward(m, &tdy, &gr), OMPK_OK, "%s", ompk_last_error());
    cr_expect(memcmp(dx[0].host, dx[1].host, dx[0].bytes) == 0, "ompk_moe_backward differs");
    cr_assert_eq(ompk_moe_backward(m, &tdy, &gr), OMPK_ERR_CACHE_EMPTY);

    /* get_weights: the enum and the integers it replaces */
    tu_buf o = tu_buf_new(h, OMPK_F32, E * H * I);
    ompk_tensor to = tu_view(&o, 3, s2);
    cr_assert_eq(ompk_moe_get_weights(m, OMPK_MOE_WEIGHT_DOWN, &to), OMPK_OK);
    void *first = malloc(o.bytes);
    cr_assert(first);
    memcpy(first, o.host, o.bytes);
    cr_assert_eq(ompk_moe_get_weights(m, (ompk_moe_weight)2, &to), OMPK_OK);
    cr_expect(memcmp(first, o.host, o.bytes) == 0, "which = 2 differs from OMPK_MOE_WEIGHT_DOWN");
    free(first);

    ompk_moe_destroy(m);
    tu_buf *all[] = {&g, &u, &d, &x, &w, &ids, &y[0], &y[1], &dy, &dx[0], &dx[1], &o};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tu_buf_free(all[i]);
}
#endif
