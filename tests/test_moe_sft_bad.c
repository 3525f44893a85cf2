/* MoE fine-tuning, bad inputs: each is a status with nothing written (outputs keep their poison,
 * the cache stack keeps its entries). */
#include <criterion/criterion.h>

#include "moe_sft_common.h"

static sft_shape shape(void) {
    sft_shape s = {
        4, 40, 70, 9, 2, 8, 2, 2, OMPK_MOE_BF16, OMPK_MOE_ISA_PORTABLE, 2, OMPK_MOE_GRAD_SPLIT};
    return s;
}

static int entries(const sft_layer *L) {
    ompk_moe_info info;
    ompk_moe_get_info(L->moe, &info);
    return info.cache_entries;
}

static int all_bytes(const void *p, size_t n, int byte) {
    for (size_t i = 0; i < n; i++)
        if (((const uint8_t *)p)[i] != (uint8_t)byte) return 0;
    return 1;
}

static void poison(const sft_shape *s, sft_out *o) {
    memset(o->dx, 0x6B, (size_t)(s->T * s->H) * 4);
    memset(o->dw, 0x6B, (size_t)(s->T * s->k) * 4);
    for (int p = 0; p < 3; p++) {
        memset(o->da[p], 0x6B, (size_t)(s->E * s->r * sft_in(s, p)) * 4);
        memset(o->dW[p], 0x6B, (size_t)(s->E * s->H * s->I) * 4);
    }
}

static void untouched(const sft_shape *s, const sft_out *o) {
    cr_expect(all_bytes(o->dx, (size_t)(s->T * s->H) * 4, 0x6B), "dx written");
    cr_expect(all_bytes(o->dw, (size_t)(s->T * s->k) * 4, 0x6B), "dw written");
    for (int p = 0; p < 3; p++) {
        cr_expect(all_bytes(o->da[p], (size_t)(s->E * s->r * sft_in(s, p)) * 4, 0x6B), "dA");
        cr_expect(all_bytes(o->dW[p], (size_t)(s->E * s->H * s->I) * 4, 0x6B), "dW");
    }
}

Test(moe_sft_bad, backward_without_forward) {
    sft_shape s = shape();
    sft_layer L;
    cr_assert(sft_new(&L, s));
    sft_batch b = sft_batch_new(&L.sh, s.T, 1);
    sft_out o;
    sft_out_alloc(&L.sh, &o);
    poison(&s, &o);
    cr_expect_eq(sft_backward(&L, &b, &o, 0), OMPK_ERR_CACHE_EMPTY);
    untouched(&s, &o);
    sft_out_free(&o);
    sft_batch_free(&b);
    sft_free(&L);
}

Test(moe_sft_bad, backward_bad_tensors) {
    sft_shape s = shape();
    sft_layer L;
    cr_assert(sft_new(&L, s));
    sft_batch b = sft_batch_new(&L.sh, s.T, 2);
    sft_out o;
    sft_out_alloc(&L.sh, &o);
    cr_assert_eq(sft_forward(&L, &b, o.y, OMPK_MOE_CACHE_PUSH), OMPK_OK);
    poison(&s, &o);
    ompk_tensor v[12];
    ompk_moe_grads g = sft_grads(&s, s.T, &o, v, 0);
    int64_t good[2] = {s.T, s.H}, bad1[2] = {s.T + 1, s.H}, bad2[2] = {s.T, s.H - 1};
    ompk_tensor dy = ompk_tensor_make(b.dy, OMPK_F32, 2, good, ompk_device_host());
    ompk_tensor dy1 = ompk_tensor_make(b.dy, OMPK_F32, 2, bad1, ompk_device_host());
    ompk_tensor dy2 = ompk_tensor_make(b.dy, OMPK_F32, 2, bad2, ompk_device_host());
    ompk_tensor dyi = ompk_tensor_make(b.dy, OMPK_I32, 2, good, ompk_device_host());
    cr_expect_eq(ompk_moe_bwd(L.moe, &dy1, &g), OMPK_ERR_INVALID_ARGUMENT);
    cr_expect_eq(ompk_moe_bwd(L.moe, &dy2, &g), OMPK_ERR_INVALID_ARGUMENT);
    cr_expect_eq(ompk_moe_bwd(L.moe, &dyi, &g), OMPK_ERR_INVALID_ARGUMENT);
    cr_expect_eq(ompk_moe_bwd(L.moe, NULL, &g), OMPK_ERR_INVALID_ARGUMENT);
    /* dx of the wrong dtype (x was f32) */
    ompk_tensor dxb = v[0];
    dxb.dtype = OMPK_BF16;
    ompk_moe_grads g2 = g;
    g2.dx = &dxb;
    cr_expect_eq(ompk_moe_bwd(L.moe, &dy, &g2), OMPK_ERR_INVALID_ARGUMENT);
    /* a LoRA gradient of the wrong shape */
    ompk_tensor dab = v[2];
    dab.shape[1] = s.r + 1;
    g2 = g;
    g2.gate_da = &dab;
    cr_expect_eq(ompk_moe_bwd(L.moe, &dy, &g2), OMPK_ERR_INVALID_ARGUMENT);
    g2 = g;
    g2.accumulate = 2;
    cr_expect_eq(ompk_moe_bwd(L.moe, &dy, &g2), OMPK_ERR_INVALID_ARGUMENT);
    g2 = g;
    g2.dx = NULL;
    cr_expect_eq(ompk_moe_bwd(L.moe, &dy, &g2), OMPK_ERR_INVALID_ARGUMENT);
    untouched(&s, &o);
    cr_expect_eq(entries(&L), 1);
    cr_expect_eq(ompk_moe_bwd(L.moe, &dy, &g), OMPK_OK, "%s", ompk_last_error());
    cr_expect_eq(entries(&L), 0);
    sft_out_free(&o);
    sft_batch_free(&b);
    sft_free(&L);
}

/* LoRA gradients with no LoRA at the forward; base-weight gradients of an int base */
Test(moe_sft_bad, gradients_the_forward_cannot_give) {
    sft_shape s = shape();
    s.fmt = OMPK_MOE_INT8;
    sft_layer L;
    cr_assert(sft_new(&L, s));
    sft_batch b = sft_batch_new(&L.sh, s.T, 3);
    sft_out o;
    sft_shape sb = s;
    sb.fmt = OMPK_MOE_BF16; /* allocates dW buffers */
    sft_out_alloc(&sb, &o);
    cr_assert_eq(sft_forward(&L, &b, o.y, OMPK_MOE_CACHE_PUSH), OMPK_OK);
    poison(&s, &o);
    cr_expect_eq(sft_backward(&L, &b, &o, 0), OMPK_ERR_INVALID_ARGUMENT); /* dW on int8 */
    untouched(&s, &o);
    free(o.dW[0]);
    free(o.dW[1]);
    free(o.dW[2]);
    o.dW[0] = o.dW[1] = o.dW[2] = NULL;
    cr_expect_eq(sft_backward(&L, &b, &o, 0), OMPK_OK, "%s", ompk_last_error());
    /* detached: LoRA gradients refused */
    cr_assert_eq(ompk_moe_set_lora(L.moe, NULL), OMPK_OK);
    cr_assert_eq(sft_forward(&L, &b, o.y, OMPK_MOE_CACHE_PUSH), OMPK_OK);
    memset(o.dx, 0x6B, (size_t)(s.T * s.H) * 4);
    cr_expect_eq(sft_backward(&L, &b, &o, 0), OMPK_ERR_INVALID_ARGUMENT);
    cr_expect(all_bytes(o.dx, (size_t)(s.T * s.H) * 4, 0x6B));
    sft_out_free(&o);
    sft_batch_free(&b);
    sft_free(&L);
}

Test(moe_sft_bad, lora_attach) {
    sft_shape s = shape();
    sft_layer L;
    cr_assert(sft_new(&L, s));
    ompk_moe_lora lo;
    memset(&lo, 0, sizeof lo);
    lo.rank = 8;
    lo.alpha = 16.0f;
    lo.gate_a = &L.ta[0];
    lo.gate_b = &L.tb[0];
    lo.up_a = &L.ta[1];
    lo.up_b = &L.tb[1];
    lo.down_a = &L.ta[2];
    lo.down_b = &L.tb[2];
    cr_expect_eq(ompk_moe_set_lora(L.moe, &lo), OMPK_OK);
    ompk_moe_lora bad = lo;
    bad.rank = 0;
    cr_expect_eq(ompk_moe_set_lora(L.moe, &bad), OMPK_ERR_INVALID_ARGUMENT);
    bad.rank = 65; /* lora_max_rank 64 */
    cr_expect_eq(ompk_moe_set_lora(L.moe, &bad), OMPK_ERR_INVALID_ARGUMENT);
    bad = lo;
    bad.up_a = &L.ta[2]; /* [E,r,I] where [E,r,H] is due */
    cr_expect_eq(ompk_moe_set_lora(L.moe, &bad), OMPK_ERR_INVALID_ARGUMENT);
    bad = lo;
    bad.down_b = NULL;
    cr_expect_eq(ompk_moe_set_lora(L.moe, &bad), OMPK_ERR_INVALID_ARGUMENT);
    bad = lo;
    bad.dropout = 1.0f;
    cr_expect_eq(ompk_moe_set_lora(L.moe, &bad), OMPK_ERR_INVALID_ARGUMENT);
    bad = lo;
    ompk_tensor ti = L.ta[0];
    ti.dtype = OMPK_I32;
    bad.gate_a = &ti;
    cr_expect_eq(ompk_moe_set_lora(L.moe, &bad), OMPK_ERR_INVALID_ARGUMENT);
    /* a layer created without LoRA room */
    ompk_moe_config c = sft_cfg(&s);
    c.lora_max_rank = 0;
    ompk_moe *m2 = NULL;
    cr_assert_eq(ompk_moe_create(&c, &m2), OMPK_OK);
    cr_expect_eq(ompk_moe_set_lora(m2, &lo), OMPK_ERR_INVALID_ARGUMENT);
    ompk_moe_destroy(m2);
    c.cache_depth = 65;
    cr_expect_eq(ompk_moe_create(&c, &m2), OMPK_ERR_INVALID_ARGUMENT);
    sft_free(&L);
}

Test(moe_sft_bad, forward_train_bad) {
    sft_shape s = shape();
    sft_layer L;
    cr_assert(sft_new(&L, s));
    sft_batch b = sft_batch_new(&L.sh, s.T, 4);
    sft_out o;
    sft_out_alloc(&L.sh, &o);
    cr_assert_eq(sft_forward(&L, &b, o.y, OMPK_MOE_CACHE_PUSH), OMPK_OK);
    memset(o.y, 0x6B, (size_t)(s.T * s.H) * 4);
    b.ids[5] = s.E;
    cr_expect_eq(sft_forward(&L, &b, o.y, OMPK_MOE_CACHE_PUSH), OMPK_ERR_INDEX_OUT_OF_RANGE);
    cr_expect_eq(sft_forward(&L, &b, o.y, OMPK_MOE_CACHE_RECOMPUTE), OMPK_ERR_INDEX_OUT_OF_RANGE);
    b.ids[5] = -2;
    cr_expect_eq(sft_forward(&L, &b, o.y, OMPK_MOE_CACHE_PUSH), OMPK_ERR_INDEX_OUT_OF_RANGE);
    b.ids[5] = 0;
    cr_expect_eq(sft_forward(&L, &b, o.y, (ompk_moe_cache_mode)7), OMPK_ERR_INVALID_ARGUMENT);
    cr_expect(all_bytes(o.y, (size_t)(s.T * s.H) * 4, 0x6B), "y written");
    cr_expect_eq(entries(&L), 1);
    /* depth 0: no stack at all */
    ompk_moe_config c = sft_cfg(&s);
    c.cache_depth = 0;
    c.lora_max_rank = 0;
    sft_layer L0 = L;
    cr_assert_eq(ompk_moe_create(&c, &L0.moe), OMPK_OK);
    int64_t s1[3] = {s.E, s.I, s.H}, s2[3] = {s.E, s.H, s.I};
    ompk_tensor tg = ompk_tensor_make(L.W[0], OMPK_F32, 3, s1, ompk_device_host());
    ompk_tensor td = ompk_tensor_make(L.W[2], OMPK_F32, 3, s2, ompk_device_host());
    cr_assert_eq(ompk_moe_load_weights(L0.moe, &tg, &tg, &td), OMPK_OK);
    L0.sh.r = 0;
    cr_expect_eq(sft_forward(&L0, &b, o.y, OMPK_MOE_CACHE_PUSH), OMPK_ERR_CACHE_FULL);
    cr_expect(all_bytes(o.y, (size_t)(s.T * s.H) * 4, 0x6B), "y written");
    cr_expect_eq(sft_forward(&L0, &b, o.y, OMPK_MOE_CACHE_NONE), OMPK_OK);
    ompk_moe_destroy(L0.moe);
    sft_out_free(&o);
    sft_batch_free(&b);
    sft_free(&L);
}
