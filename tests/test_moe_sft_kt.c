/* Named regressions, one per bug class of kt-kernel's SFT MoE debugging log (its cache, layout,
 * partition and dispatch mistakes), each against the double reference or an exact invariant. */
#include <criterion/criterion.h>

#include "moe_sft_common.h"

static sft_shape shape(ompk_moe_format fmt, ompk_moe_isa isa, int r) {
    sft_shape s = {5, 72, 100, 37, 3, r, 2, 4, fmt, isa, 2, OMPK_MOE_GRAD_SPLIT};
    return s;
}

static void check_step(const char *tag, sft_layer *L, const sft_batch *b) {
    sft_out o;
    sft_out_alloc(&L->sh, &o);
    sft_step(L, b, &o);
    sft_ref R;
    sft_ref_run(L, b, 0.0f, 0, &R);
    sft_check(tag, L, b->T, &o, &R);
    sft_ref_free(&R);
    sft_out_free(&o);
}

static void expect_same(const sft_shape *s, int64_t T, const sft_out *a, const sft_out *c) {
    cr_expect(!memcmp(a->dx, c->dx, (size_t)(T * s->H) * 4), "dx differs");
    cr_expect(!memcmp(a->dw, c->dw, (size_t)(T * s->k) * 4), "dw differs");
    for (int p = 0; p < 3; p++) {
        cr_expect(!memcmp(a->da[p], c->da[p], (size_t)(s->E * s->r * sft_in(s, p)) * 4), "dA");
        cr_expect(!memcmp(a->db[p], c->db[p], (size_t)(s->E * s->r * sft_outd(s, p)) * 4), "dB");
        if (a->dW[p])
            cr_expect(!memcmp(a->dW[p], c->dW[p], (size_t)(s->E * s->H * s->I) * 4), "dW");
    }
}

/* kt bugs 15/18: a later forward (inference or saving) must not touch a saved entry */
Test(moe_sft_kt, cache_not_overwritten_by_later_forward) {
    sft_shape s = shape(OMPK_MOE_BF16, OMPK_MOE_ISA_AMX_EMULATED, 8);
    sft_layer L;
    cr_assert(sft_new(&L, s));
    sft_batch a = sft_batch_new(&L.sh, s.T, 1), b = sft_batch_new(&L.sh, s.T, 2);
    sft_out solo, o, tmp;
    sft_out_alloc(&L.sh, &solo);
    sft_out_alloc(&L.sh, &o);
    sft_out_alloc(&L.sh, &tmp);
    sft_step(&L, &a, &solo);
    cr_assert_eq(sft_forward(&L, &a, o.y, OMPK_MOE_CACHE_PUSH), OMPK_OK);
    cr_assert_eq(sft_forward(&L, &b, tmp.y, OMPK_MOE_CACHE_NONE), OMPK_OK);
    cr_assert_eq(sft_forward(&L, &b, tmp.y, OMPK_MOE_CACHE_PUSH), OMPK_OK);
    cr_assert_eq(sft_backward(&L, &b, &tmp, 0), OMPK_OK);
    cr_assert_eq(sft_backward(&L, &a, &o, 0), OMPK_OK, "%s", ompk_last_error());
    expect_same(&L.sh, s.T, &solo, &o);
    sft_out_free(&solo);
    sft_out_free(&o);
    sft_out_free(&tmp);
    sft_batch_free(&a);
    sft_batch_free(&b);
    sft_free(&L);
}

/* the SiLU backward needs the pre-activation g (and u), not a: large |g| makes a mix-up gross */
Test(moe_sft_kt, pre_activation_in_cache) {
    sft_shape s = shape(OMPK_MOE_BF16, OMPK_MOE_ISA_PORTABLE, 8);
    sft_layer L;
    cr_assert(sft_new(&L, s));
    sft_batch b = sft_batch_new(&L.sh, s.T, 3);
    for (int64_t i = 0; i < s.T * s.H; i++) b.x[i] = ompk_round_bf16(3.0f * b.x[i]);
    check_step("pre-activation", &L, &b);
    sft_batch_free(&b);
    sft_free(&L);
}

/* cache rows are token order: tokens routed to experts in descending order, so the kernels'
 * expert-sorted order is the reverse of token order; dw is per (token, slot) */
Test(moe_sft_kt, token_order_rows) {
    sft_shape s = shape(OMPK_MOE_INT8, OMPK_MOE_ISA_AMX_EMULATED, 8);
    sft_layer L;
    cr_assert(sft_new(&L, s));
    sft_batch b = sft_batch_new(&L.sh, s.T, 4);
    for (int64_t t = 0; t < s.T; t++)
        for (int j = 0; j < s.k; j++) b.ids[t * s.k + j] = (s.E - 1 - (t * s.E / s.T) + j) % s.E;
    check_step("token order", &L, &b);
    sft_batch_free(&b);
    sft_free(&L);
}

/* the layer copies the caller's LoRA descriptors: the struct and descriptors may die */
Test(moe_sft_kt, lora_descriptors_copied) {
    sft_shape s = shape(OMPK_MOE_BF16, OMPK_MOE_ISA_AMX_EMULATED, 8);
    sft_layer L;
    cr_assert(sft_new(&L, s));
    sft_batch b = sft_batch_new(&L.sh, s.T, 5);
    ompk_tensor keep_a[3], keep_b[3];
    memcpy(keep_a, L.ta, sizeof keep_a);
    memcpy(keep_b, L.tb, sizeof keep_b);
    memset(L.ta, 0xAB, sizeof L.ta);
    memset(L.tb, 0xAB, sizeof L.tb);
    check_step("descriptors gone", &L, &b);
    memcpy(L.ta, keep_a, sizeof keep_a);
    memcpy(L.tb, keep_b, sizeof keep_b);
    sft_batch_free(&b);
    sft_free(&L);
}

/* NUMA split of I into 2 and 3 partitions (I = 200: uneven, the last partial): LoRA and base
 * gradients with an I dimension at their partition's offsets, dx and the rank-space vectors
 * summed over partitions */
Test(moe_sft_kt, numa_partition_offsets_and_sums) {
    for (int split = 2; split <= 3; split++)
        for (int f = 0; f < 2; f++) {
            sft_shape s = shape(f ? OMPK_MOE_INT4 : OMPK_MOE_BF16, OMPK_MOE_ISA_AMX_EMULATED, 8);
            s.I = 200;
            s.H = 128;
            s.split = split;
            sft_layer L;
            cr_assert(sft_new(&L, s));
            sft_batch b = sft_batch_new(&L.sh, s.T, 6);
            char tag[64];
            snprintf(tag, sizeof tag, "split %d fmt %d", split, f);
            check_step(tag, &L, &b);
            sft_batch_free(&b);
            sft_free(&L);
        }
}

/* weights may not be replaced while a saved forward waits for its backward; LoRA may not be
 * re-attached or detached either (in-place value updates are read at the next call) */
Test(moe_sft_kt, weights_replaced_between_forward_and_backward) {
    sft_shape s = shape(OMPK_MOE_BF16, OMPK_MOE_ISA_PORTABLE, 8);
    sft_layer L;
    cr_assert(sft_new(&L, s));
    sft_batch b = sft_batch_new(&L.sh, s.T, 7);
    sft_out o;
    sft_out_alloc(&L.sh, &o);
    cr_assert_eq(sft_forward(&L, &b, o.y, OMPK_MOE_CACHE_PUSH), OMPK_OK);
    int64_t s1[3] = {s.E, s.I, s.H}, s2[3] = {s.E, s.H, s.I};
    float *junk = calloc((size_t)(s.E * s.H * s.I), 4);
    ompk_tensor tg = ompk_tensor_make(junk, OMPK_F32, 3, s1, ompk_device_host());
    ompk_tensor td = ompk_tensor_make(junk, OMPK_F32, 3, s2, ompk_device_host());
    cr_expect_eq(ompk_moe_load_weights(L.moe, &tg, &tg, &td), OMPK_ERR_INVALID_ARGUMENT);
    cr_expect_eq(ompk_moe_set_lora(L.moe, NULL), OMPK_ERR_INVALID_ARGUMENT);
    ompk_moe_info info;
    ompk_moe_get_info(L.moe, &info);
    cr_expect_eq(info.cache_entries, 1);
    cr_assert_eq(sft_backward(&L, &b, &o, 0), OMPK_OK);
    sft_ref R;
    sft_ref_run(&L, &b, 0.0f, 0, &R);
    sft_check("after refused loads", &L, s.T, &o, &R);
    /* after the backward the load goes through */
    cr_expect_eq(ompk_moe_load_weights(L.moe, &tg, &tg, &td), OMPK_OK);
    free(junk);
    sft_ref_free(&R);
    sft_out_free(&o);
    sft_batch_free(&b);
    sft_free(&L);
}

/* tokens are the K dimension of dW: experts with 1, 17 and 33 routed rows (not multiples of any
 * row block), unreached experts exactly 0 */
Test(moe_sft_kt, weight_grad_row_counts) {
    sft_shape s = shape(OMPK_MOE_BF16, OMPK_MOE_ISA_AMX_EMULATED, 0);
    s.T = 33;
    s.k = 2;
    sft_layer L;
    cr_assert(sft_new(&L, s));
    sft_batch b = sft_batch_new(&L.sh, s.T, 8);
    for (int64_t t = 0; t < s.T; t++) {
        b.ids[t * 2] = 1;
        b.ids[t * 2 + 1] = t < 17 ? 2 : (t == 20 ? 4 : -1);
    }
    sft_out o;
    sft_out_alloc(&L.sh, &o);
    for (int p = 0; p < 3; p++) memset(o.dW[p], 0x7F, (size_t)(s.E * s.H * s.I) * 4);
    sft_step(&L, &b, &o);
    sft_ref R;
    sft_ref_run(&L, &b, 0.0f, 0, &R);
    sft_check("row counts", &L, s.T, &o, &R);
    for (int p = 0; p < 3; p++)
        for (int64_t i = 0; i < s.H * s.I; i++) {
            cr_assert_eq(o.dW[p][i], 0.0f); /* expert 0 */
            cr_assert_eq(o.dW[p][3 * s.H * s.I + i], 0.0f);
        }
    sft_ref_free(&R);
    sft_out_free(&o);
    sft_batch_free(&b);
    sft_free(&L);
}

/* the kernel of each expert follows this call's row counts: a big step (AMX tiles for the hot
 * expert), then a 2-token step whose experts are all below amx_min_rows */
Test(moe_sft_kt, dispatch_from_this_calls_rows) {
    sft_shape s = shape(OMPK_MOE_INT8, OMPK_MOE_ISA_AMX_EMULATED, 8);
    sft_layer L;
    cr_assert(sft_new(&L, s));
    sft_batch big = sft_batch_new(&L.sh, s.T, 9), small = sft_batch_new(&L.sh, 1, 10);
    check_step("big", &L, &big);
    ompk_moe_stats st;
    ompk_moe_get_stats(L.moe, &st);
    cr_expect_gt(st.experts_amx, 0);
    sft_out o;
    sft_out_alloc(&L.sh, &o);
    cr_assert_eq(sft_forward(&L, &small, o.y, OMPK_MOE_CACHE_PUSH), OMPK_OK);
    ompk_moe_get_stats(L.moe, &st);
    cr_expect_eq(st.experts_amx, 0, "a 1-token forward ran %d experts on tiles", st.experts_amx);
    cr_assert_eq(sft_backward(&L, &small, &o, 0), OMPK_OK);
    sft_ref R;
    sft_ref_run(&L, &small, 0.0f, 0, &R);
    sft_check("small after big", &L, 1, &o, &R);
    sft_ref_free(&R);
    sft_out_free(&o);
    sft_batch_free(&big);
    sft_batch_free(&small);
    sft_free(&L);
}

/* four micro-batches pushed, popped with "+=" (the first "="), equal one batch of all their
 * tokens within fp32 reassociation; dx and dw per token bit-identical */
Test(moe_sft_kt, accumulation_over_micro_batches) {
    sft_shape s = shape(OMPK_MOE_BF16, OMPK_MOE_ISA_PORTABLE, 8);
    s.T = 4 * 9;
    sft_layer L;
    cr_assert(sft_new(&L, s));
    sft_batch all = sft_batch_new(&L.sh, s.T, 11);
    sft_out one, acc;
    sft_out_alloc(&L.sh, &one);
    sft_out_alloc(&L.sh, &acc);
    sft_step(&L, &all, &one);
    sft_batch mb[4];
    for (int i = 0; i < 4; i++) {
        mb[i] = all;
        mb[i].T = 9;
        mb[i].x = all.x + i * 9 * s.H;
        mb[i].dy = all.dy + i * 9 * s.H;
        mb[i].ids = all.ids + i * 9 * s.k;
        mb[i].w = all.w + i * 9 * s.k;
        cr_assert_eq(sft_forward(&L, &mb[i], acc.y + i * 9 * s.H, OMPK_MOE_CACHE_PUSH), OMPK_OK);
    }
    cr_assert_eq(sft_forward(&L, &mb[0], one.y, OMPK_MOE_CACHE_PUSH), OMPK_ERR_CACHE_FULL);
    for (int i = 3; i >= 0; i--) {
        sft_out part = acc;
        part.dx = acc.dx + i * 9 * s.H;
        part.dw = acc.dw + i * 9 * s.k;
        cr_assert_eq(sft_backward(&L, &mb[i], &part, i != 3), OMPK_OK, "%s", ompk_last_error());
    }
    cr_expect(!memcmp(one.dx, acc.dx, (size_t)(s.T * s.H) * 4), "dx per token");
    cr_expect(!memcmp(one.dw, acc.dw, (size_t)(s.T * s.k) * 4), "dw per token");
    for (int p = 0; p < 3; p++) {
        int64_t n = s.E * s.r * sft_in(&s, p);
        double *d = malloc((size_t)n * 8);
        for (int64_t i = 0; i < n; i++) d[i] = one.da[p][i];
        cr_expect(sft_cmp("accumulated dA", acc.da[p], d, n, 1e-5, 1e-5) <= 1);
        free(d);
        n = s.E * s.H * s.I;
        d = malloc((size_t)n * 8);
        for (int64_t i = 0; i < n; i++) d[i] = one.dW[p][i];
        cr_expect(sft_cmp("accumulated dW", acc.dW[p], d, n, 1e-5, 1e-5) <= 1);
        free(d);
    }
    sft_out_free(&one);
    sft_out_free(&acc);
    sft_batch_free(&all);
    sft_free(&L);
}

/* overflow (PUSH on a full stack), underflow (backward or RECOMPUTE on an empty one): a status,
 * y and the stack unchanged; RECOMPUTE replaces the top entry */
Test(moe_sft_kt, stack_overflow_underflow) {
    sft_shape s = shape(OMPK_MOE_BF16, OMPK_MOE_ISA_PORTABLE, 8);
    s.depth = 2;
    sft_layer L;
    cr_assert(sft_new(&L, s));
    sft_batch a = sft_batch_new(&L.sh, s.T, 12), b = sft_batch_new(&L.sh, s.T, 13);
    sft_out o, ref;
    sft_out_alloc(&L.sh, &o);
    sft_out_alloc(&L.sh, &ref);
    cr_assert_eq(sft_backward(&L, &a, &o, 0), OMPK_ERR_CACHE_EMPTY);
    cr_assert_eq(sft_forward(&L, &a, o.y, OMPK_MOE_CACHE_RECOMPUTE), OMPK_ERR_CACHE_EMPTY);
    sft_step(&L, &a, &ref);
    cr_assert_eq(sft_forward(&L, &b, o.y, OMPK_MOE_CACHE_PUSH), OMPK_OK);
    cr_assert_eq(sft_forward(&L, &b, o.y, OMPK_MOE_CACHE_PUSH), OMPK_OK);
    memset(o.y, 0x5A, (size_t)(s.T * s.H) * 4);
    cr_assert_eq(sft_forward(&L, &a, o.y, OMPK_MOE_CACHE_PUSH), OMPK_ERR_CACHE_FULL);
    for (int64_t i = 0; i < s.T * s.H; i++) cr_assert_eq(((uint32_t *)o.y)[i], 0x5A5A5A5Au);
    /* checkpointing: the top entry (b) recomputed as a */
    cr_assert_eq(sft_forward(&L, &a, o.y, OMPK_MOE_CACHE_RECOMPUTE), OMPK_OK);
    ompk_moe_info info;
    ompk_moe_get_info(L.moe, &info);
    cr_expect_eq(info.cache_entries, 2);
    cr_assert_eq(sft_backward(&L, &a, &o, 0), OMPK_OK);
    expect_same(&L.sh, s.T, &ref, &o);
    cr_assert_eq(sft_backward(&L, &b, &o, 0), OMPK_OK);
    cr_assert_eq(sft_backward(&L, &b, &o, 0), OMPK_ERR_CACHE_EMPTY);
    sft_out_free(&o);
    sft_out_free(&ref);
    sft_batch_free(&a);
    sft_batch_free(&b);
    sft_free(&L);
}

/* the backward's sums run over fixed 64-column chunks of I in ascending order, which never
 * straddle a partition: every gradient is bit-identical for numa_split 1, 2 and 3 */
Test(moe_sft_kt, gradients_independent_of_split) {
    sft_out o[3];
    for (int split = 1; split <= 3; split++) {
        sft_shape s = shape(OMPK_MOE_INT4_ZP, OMPK_MOE_ISA_AMX_EMULATED, 8);
        s.I = 200;
        s.H = 128;
        s.split = split;
        sft_layer L;
        cr_assert(sft_new(&L, s));
        sft_batch b = sft_batch_new(&L.sh, s.T, 14);
        sft_out_alloc(&L.sh, &o[split - 1]);
        sft_step(&L, &b, &o[split - 1]);
        if (split > 1) expect_same(&L.sh, s.T, &o[0], &o[split - 1]);
        sft_batch_free(&b);
        sft_free(&L);
    }
    for (int i = 0; i < 3; i++) sft_out_free(&o[i]);
}

/* the bf16 backward's transposed weight copies are rebuilt after a load: a step after replacing
 * the weights (negated) matches the reference of the new weights, not the old copy */
Test(moe_sft_kt, transposed_copy_follows_reload) {
    sft_shape s = shape(OMPK_MOE_BF16, OMPK_MOE_ISA_AMX_EMULATED, 8);
    sft_layer L;
    cr_assert(sft_new(&L, s));
    sft_batch b = sft_batch_new(&L.sh, s.T, 11);
    check_step("before reload", &L, &b);
    ompk_moe_info info;
    ompk_moe_get_info(L.moe, &info);
    cr_expect_gt(info.backward_weight_bytes, 0);
    int64_t s1[3] = {s.E, s.I, s.H}, s2[3] = {s.E, s.H, s.I};
    ompk_tensor t[3];
    for (int p = 0; p < 3; p++) {
        for (int64_t i = 0; i < s.E * s.H * s.I; i++) L.W[p][i] = -L.W[p][i];
        t[p] = ompk_tensor_make(L.W[p], OMPK_F32, 3, p < 2 ? s1 : s2, ompk_device_host());
    }
    cr_assert_eq(ompk_moe_load_weights(L.moe, &t[0], &t[1], &t[2]), OMPK_OK, "%s",
                 ompk_last_error());
    check_step("after reload", &L, &b);
    sft_batch_free(&b);
    sft_free(&L);
}
