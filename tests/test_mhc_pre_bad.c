/* ompk_mhc_pre_fwd / ompk_mhc_pre_bwd bad inputs: each rejected call returns its documented
 * status and message and writes none of its outputs. Host and every GPU. */
#include <criterion/criterion.h>

#include "mhc_test_common.h"

static int fwd_outputs_untouched(pre_prob *q) {
    tt *o[] = {&q->h_in, &q->h_post, &q->logits, &q->comb, &q->h_mix, &q->inv_rms, &q->h_pre};
    for (int i = 0; i < 7; i++)
        if (!tu_buf_all_bytes(&o[i]->b, POISON)) return 0;
    return 1;
}

static int bwd_outputs_untouched(pre_prob *q) {
    tt *o[] = {&q->dx, &q->dphi, &q->dalpha, &q->dbias, &q->dgamma};
    for (int i = 0; i < 5; i++)
        if (o[i]->live && !tu_buf_all_bytes(&o[i]->b, POISON)) return 0;
    return 1;
}

typedef struct fargs {
    const ompk_tensor *x, *phi, *gamma, *alpha, *bias;
    const ompk_mhc_params *p;
    ompk_tensor *h_in, *h_post, *logits, *comb, *h_mix, *inv_rms, *h_pre;
} fargs;

static fargs fdef(pre_prob *q) {
    fargs a = {&q->x.t,     &q->phi.t,     &q->gamma.t,  &q->alpha.t,  &q->bias.t,
               &q->p,       &q->h_in.t,    &q->h_post.t, &q->logits.t, &q->comb.t,
               &q->h_mix.t, &q->inv_rms.t, &q->h_pre.t};
    return a;
}

static void fbad(pre_prob *q, fargs a, ompk_status want, const char *part) {
    ompk_clear_error();
    ompk_status st = ompk_mhc_pre_fwd(&(ompk_mhc_pre_fwd_args){.x = a.x,
                                                               .phi = a.phi,
                                                               .gamma = a.gamma,
                                                               .alpha = a.alpha,
                                                               .bias = a.bias,
                                                               .h_in = a.h_in,
                                                               .h_post = a.h_post,
                                                               .res_logits = a.logits,
                                                               .comb = a.comb,
                                                               .h_mix = a.h_mix,
                                                               .inv_rms = a.inv_rms,
                                                               .h_pre = a.h_pre},
                                      a.p);
    cr_expect_eq(st, want, "'%s': want %s got %s (%s)", part, ompk_status_str(want),
                 ompk_status_str(st), ompk_last_error());
    cr_expect(strstr(ompk_last_error(), part) != NULL, "message '%s' lacks '%s'", ompk_last_error(),
              part);
    cr_expect(fwd_outputs_untouched(q), "pre_fwd wrote outputs on a rejected call ('%s')", part);
}

Test(mhc_pre_bad, forward_rejects_and_writes_nothing) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    const ompk_status INV = OMPK_ERR_INVALID_ARGUMENT;
    for (int di = 0; di < nd; di++) {
        pre_prob q;
        pre_new(&q, devs[di], OMPK_BF16, 2, 3, 4, 16, 1, 7, 1.0);
        fargs a;
        ompk_tensor t;
        ompk_mhc_params p;
        a = fdef(&q), a.x = NULL;
        fbad(&q, a, INV, "x is NULL");
        a = fdef(&q), a.phi = NULL;
        fbad(&q, a, INV, "phi is NULL");
        a = fdef(&q), a.alpha = NULL;
        fbad(&q, a, INV, "alpha is NULL");
        a = fdef(&q), a.bias = NULL;
        fbad(&q, a, INV, "bias is NULL");
        a = fdef(&q), a.h_in = NULL;
        fbad(&q, a, INV, "h_in is NULL");
        a = fdef(&q), a.h_post = NULL;
        fbad(&q, a, INV, "h_post is NULL");
        a = fdef(&q), a.comb = NULL;
        fbad(&q, a, INV, "comb is NULL");
        p = q.p, p.fuse_sinkhorn = 0, a = fdef(&q), a.p = &p;
        fbad(&q, a, INV, "comb must be NULL");
        p = q.p, p.fuse_sinkhorn = 0, a = fdef(&q), a.p = &p, a.comb = NULL, a.logits = NULL;
        fbad(&q, a, INV, "res_logits is NULL");
        /* n = 0 and n = 9 (views over the same buffers: only the shape is wrong) */
        a = fdef(&q), t = q.x.t, t.shape[2] = 0, a.x = &t;
        fbad(&q, a, INV, "n = 0");
        a = fdef(&q), t = q.x.t, t.shape[2] = 9, t.shape[3] = 1, a.x = &t;
        fbad(&q, a, INV, "n = 9");
        a = fdef(&q), t = q.x.t, t.ndim = 3, a.x = &t;
        fbad(&q, a, INV, "rank");
        a = fdef(&q), t = q.x.t, t.dtype = OMPK_I8, a.x = &t;
        fbad(&q, a, INV, "x has unsupported dtype");
        a = fdef(&q), t = q.phi.t, t.shape[0] = 23, a.phi = &t;
        fbad(&q, a, INV, "phi dim 0");
        a = fdef(&q), t = q.phi.t, t.shape[1] = 63, a.phi = &t;
        fbad(&q, a, INV, "phi dim 1");
        a = fdef(&q), t = q.gamma.t, t.shape[0] = 63, a.gamma = &t;
        fbad(&q, a, INV, "gamma dim 0");
        a = fdef(&q), t = q.alpha.t, t.shape[0] = 2, a.alpha = &t;
        fbad(&q, a, INV, "alpha dim 0");
        a = fdef(&q), t = q.bias.t, t.dtype = OMPK_BF16, a.bias = &t;
        fbad(&q, a, INV, "bias has unsupported dtype");
        a = fdef(&q), t = q.h_in.t, t.dtype = OMPK_F32, a.h_in = &t;
        fbad(&q, a, INV, "same dtype");
        a = fdef(&q), t = q.h_post.t, t.shape[2] = 3, a.h_post = &t;
        fbad(&q, a, INV, "h_post dim 2");
        a = fdef(&q), t = q.h_mix.t, t.shape[1] = 23, a.h_mix = &t;
        fbad(&q, a, INV, "h_mix dim 1");
        a = fdef(&q), t = q.inv_rms.t, t.shape[0] = 5, a.inv_rms = &t;
        fbad(&q, a, INV, "inv_rms dim 0");
        a = fdef(&q), t = q.h_pre.t, t.shape[0] = 7, a.h_pre = &t;
        fbad(&q, a, INV, "h_pre dim 0");
        a = fdef(&q), t = q.comb.t, t.data = q.logits.t.data, a.comb = &t;
        fbad(&q, a, INV, "overlaps");
        a = fdef(&q), t = q.h_in.t, t.data = q.x.t.data, a.h_in = &t;
        fbad(&q, a, INV, "overlaps");
        a = fdef(&q), t = q.h_in.t, t.strides[2] = 2, a.h_in = &t;
        fbad(&q, a, INV, "stride");
        a = fdef(&q), t = q.x.t, t.strides[3] = 2, t.shape[3] = 8, a.x = &t;
        fbad(&q, a, INV, "unit stride");
        p = q.p, p.sinkhorn_repeat = 0, a = fdef(&q), a.p = &p;
        fbad(&q, a, INV, "sinkhorn_repeat");
        p = q.p, p.norm_eps = NAN, a = fdef(&q), a.p = &p;
        fbad(&q, a, INV, "norm_eps");
        p = q.p, p.hc_eps = -1, a = fdef(&q), a.p = &p;
        fbad(&q, a, INV, "hc_eps");
        p = q.p, p.post_mult = INFINITY, a = fdef(&q), a.p = &p;
        fbad(&q, a, INV, "post_mult");
        p = q.p, p.sinkhorn_eps = -1e-3f, a = fdef(&q), a.p = &p;
        fbad(&q, a, INV, "sinkhorn_eps");
        if (devs[di].type == OMPK_TARGET) {
            pre_prob h;
            pre_new(&h, ompk_device_host(), OMPK_BF16, 2, 3, 4, 16, 1, 7, 1.0);
            a = fdef(&q), a.phi = &h.phi.t;
            fbad(&q, a, OMPK_ERR_DEVICE_MISMATCH, "phi is on");
            pre_free(&h);
        }
        pre_free(&q);
    }
}

typedef struct bargs {
    const ompk_tensor *x, *phi, *gamma, *alpha;
    const ompk_mhc_params *p;
    const ompk_tensor *dh_in, *dh_post, *dh_res, *gxp, *h_mix, *inv_rms, *h_pre, *h_post;
    ompk_tensor *dx, *dphi, *dalpha, *dbias, *dgamma;
} bargs;

static bargs bdef(pre_prob *q) {
    bargs a = {&q->x.t,       &q->phi.t,    &q->gamma.t, &q->alpha.t,  &q->p,         &q->dh_in.t,
               &q->dh_post.t, &q->dh_res.t, &q->gxp.t,   &q->h_mix.t,  &q->inv_rms.t, &q->h_pre.t,
               &q->h_post.t,  &q->dx.t,     &q->dphi.t,  &q->dalpha.t, &q->dbias.t,   &q->dgamma.t};
    return a;
}

static void bbad(pre_prob *q, bargs a, ompk_status want, const char *part) {
    ompk_clear_error();
    ompk_status st = ompk_mhc_pre_bwd(&(ompk_mhc_pre_bwd_args){.x = a.x,
                                                               .phi = a.phi,
                                                               .gamma = a.gamma,
                                                               .alpha = a.alpha,
                                                               .dh_in = a.dh_in,
                                                               .dh_post = a.dh_post,
                                                               .dh_res = a.dh_res,
                                                               .grad_x_post = a.gxp,
                                                               .h_mix = a.h_mix,
                                                               .inv_rms = a.inv_rms,
                                                               .h_pre = a.h_pre,
                                                               .h_post = a.h_post,
                                                               .dx = a.dx,
                                                               .dphi = a.dphi,
                                                               .dalpha = a.dalpha,
                                                               .dbias = a.dbias,
                                                               .dgamma = a.dgamma},
                                      a.p);
    cr_expect_eq(st, want, "'%s': want %s got %s (%s)", part, ompk_status_str(want),
                 ompk_status_str(st), ompk_last_error());
    cr_expect(strstr(ompk_last_error(), part) != NULL, "message '%s' lacks '%s'", ompk_last_error(),
              part);
    cr_expect(bwd_outputs_untouched(q), "pre_bwd wrote outputs on a rejected call ('%s')", part);
}

Test(mhc_pre_bad, backward_rejects_and_writes_nothing) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    const ompk_status INV = OMPK_ERR_INVALID_ARGUMENT;
    for (int di = 0; di < nd; di++) {
        pre_prob q;
        pre_new(&q, devs[di], OMPK_F32, 2, 3, 4, 16, 1, 8, 1.0);
        /* valid saved tensors from a forward, then poison the outputs of the backward */
        cr_assert_eq(pre_run_fwd(&q), OMPK_OK);
        bargs a;
        ompk_tensor t;
        /* missing saved tensors */
        a = bdef(&q), a.h_mix = NULL;
        bbad(&q, a, INV, "h_mix is NULL");
        a = bdef(&q), a.inv_rms = NULL;
        bbad(&q, a, INV, "inv_rms is NULL");
        a = bdef(&q), a.h_pre = NULL;
        bbad(&q, a, INV, "h_pre is NULL");
        a = bdef(&q), a.h_post = NULL;
        bbad(&q, a, INV, "h_post is NULL");
        a = bdef(&q), a.dh_in = NULL;
        bbad(&q, a, INV, "dh_in is NULL");
        a = bdef(&q), a.dh_res = NULL;
        bbad(&q, a, INV, "dh_res is NULL");
        a = bdef(&q), a.dx = NULL;
        bbad(&q, a, INV, "dx is NULL");
        a = bdef(&q), a.dphi = NULL;
        bbad(&q, a, INV, "dphi is NULL");
        a = bdef(&q), a.dgamma = NULL;
        bbad(&q, a, INV, "dgamma is NULL");
        a = bdef(&q), a.gamma = NULL;
        bbad(&q, a, INV, "dgamma must be NULL");
        /* shapes, dtypes */
        a = bdef(&q), t = q.x.t, t.shape[2] = 9, t.shape[3] = 1, a.x = &t;
        bbad(&q, a, INV, "n = 9");
        a = bdef(&q), t = q.x.t, t.shape[2] = 0, a.x = &t;
        bbad(&q, a, INV, "n = 0");
        a = bdef(&q), t = q.h_mix.t, t.shape[0] = 5, a.h_mix = &t;
        bbad(&q, a, INV, "h_mix dim 0");
        a = bdef(&q), t = q.inv_rms.t, t.dtype = OMPK_BF16, a.inv_rms = &t;
        bbad(&q, a, INV, "inv_rms has unsupported dtype");
        a = bdef(&q), t = q.h_pre.t, t.shape[1] = 3, a.h_pre = &t;
        bbad(&q, a, INV, "h_pre dim 1");
        a = bdef(&q), t = q.dh_in.t, t.shape[2] = 15, a.dh_in = &t;
        bbad(&q, a, INV, "dh_in dim 2");
        a = bdef(&q), t = q.dh_post.t, t.shape[2] = 5, t.strides[1] = 5, t.strides[0] = 15,
        a.dh_post = &t;
        bbad(&q, a, INV, "dh_post dim 2");
        a = bdef(&q), t = q.dh_res.t, t.shape[3] = 3, a.dh_res = &t;
        bbad(&q, a, INV, "dh_res dim 3");
        a = bdef(&q), t = q.gxp.t, t.shape[3] = 15, a.gxp = &t;
        bbad(&q, a, INV, "grad_x_post dim 3");
        a = bdef(&q), t = q.dx.t, t.dtype = OMPK_BF16, a.dx = &t;
        bbad(&q, a, INV, "same dtype");
        a = bdef(&q), t = q.dphi.t, t.shape[0] = 8, a.dphi = &t;
        bbad(&q, a, INV, "dphi dim 0");
        a = bdef(&q), t = q.dalpha.t, t.shape[0] = 4, a.dalpha = &t;
        bbad(&q, a, INV, "dalpha dim 0");
        a = bdef(&q), t = q.dbias.t, t.shape[0] = 20, a.dbias = &t;
        bbad(&q, a, INV, "dbias dim 0");
        /* aliasing */
        a = bdef(&q), t = q.dphi.t, t.data = q.phi.t.data, a.dphi = &t;
        bbad(&q, a, INV, "overlaps");
        a = bdef(&q), t = q.dbias.t, t.data = q.dphi.t.data, a.dbias = &t;
        bbad(&q, a, INV, "overlaps");
        a = bdef(&q), t = q.dx.t, t.data = q.gxp.t.data, a.dx = &t;
        bbad(&q, a, INV, "overlaps");
        a = bdef(&q), t = q.dalpha.t, t.strides[0] = 0, a.dalpha = &t;
        bbad(&q, a, INV, "overlap");
        if (devs[di].type == OMPK_TARGET) {
            pre_prob h;
            pre_new(&h, ompk_device_host(), OMPK_F32, 2, 3, 4, 16, 1, 8, 1.0);
            a = bdef(&q), a.h_mix = &h.h_mix.t;
            bbad(&q, a, OMPK_ERR_DEVICE_MISMATCH, "h_mix is on");
            pre_free(&h);
        }
        pre_free(&q);
    }
}
