/* Size validation: shapes and strides whose element counts, spans or byte offsets overflow
 * int64 (or the address space) are rejected before any arithmetic on them, through every
 * public path that forms a size; empty views with NULL data run without undefined behaviour. */
#include <criterion/criterion.h>
#include <dlpack/dlpack.h>
#include <stdint.h>
#include <string.h>

#include "ompk/ompk.h"

#define P2(e) ((int64_t)1 << (e))
#define INV OMPK_ERR_INVALID_ARGUMENT

/* A descriptor built field by field: ompk_tensor_init would refuse these shapes itself. */
static ompk_tensor raw(void *data, ompk_dtype dt, int ndim, const int64_t *shape,
                       const int64_t *strides) {
    ompk_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dt;
    t.ndim = ndim;
    t.device = ompk_device_host();
    for (int d = 0; d < ndim; d++) t.shape[d] = shape[d], t.strides[d] = strides[d];
    return t;
}

/* Contiguous strides of shape, saturated where they would overflow (those views are rejected
 * whatever the strides). */
static ompk_tensor raw_c(void *data, ompk_dtype dt, int ndim, const int64_t *shape) {
    int64_t st[OMPK_MAX_NDIM], s = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        st[d] = s < P2(40) ? s : P2(40);
        if (__builtin_mul_overflow(s, shape[d], &s)) s = INT64_MAX;
    }
    return raw(data, dt, ndim, shape, st);
}

static void expect_invalid(ompk_status st, const char *what) {
    cr_assert_eq(st, INV, "%s: got %s (%s)", what, ompk_status_str(st), ompk_last_error());
}

/* [2^40, 2^23, 1, 1] has 2^63 elements: the count wraps to INT64_MIN if formed unchecked */
Test(sizes, post_fwd_count_overflow) {
    const int64_t x4[4] = {P2(40), P2(23), 1, 1}, x3[3] = {P2(40), P2(23), 1};
    ompk_tensor x = raw_c(NULL, OMPK_F32, 4, x4), comb = raw_c(NULL, OMPK_F32, 4, x4);
    ompk_tensor post = raw_c(NULL, OMPK_F32, 3, x3), f = raw_c(NULL, OMPK_F32, 3, x3);
    ompk_tensor out = raw_c(NULL, OMPK_F32, 4, x4);
    expect_invalid(ompk_mhc_post_fwd(&x, &comb, &post, &f, &out), "post_fwd 2^63 elements");
}

Test(sizes, sinkhorn_fwd_count_overflow) {
    const int64_t s4[4] = {P2(40), P2(23), 1, 1};
    ompk_tensor lg = raw_c(NULL, OMPK_F32, 4, s4), comb = raw_c(NULL, OMPK_F32, 4, s4);
    expect_invalid(ompk_mhc_sinkhorn_fwd(&lg, &comb, NULL), "sinkhorn_fwd 2^63 elements");
}

Test(sizes, attention_fwd_count_overflow) {
    /* the count wraps to INT64_MIN at dim 1, then to 0 at dim 3: NULL data looked empty */
    const int64_t s4[4] = {P2(40), P2(23), 1, 32};
    ompk_tensor q = raw_c(NULL, OMPK_F32, 4, s4), k = raw_c(NULL, OMPK_F32, 4, s4);
    ompk_tensor v = raw_c(NULL, OMPK_F32, 4, s4), out = raw_c(NULL, OMPK_F32, 4, s4);
    expect_invalid(ompk_attention_fwd(&q, &k, &v, &out, NULL, NULL), "attention 2^63 elements");
}

/* out's span (2^24 - 1) * 2^40 passes 2^63; the inputs broadcast one element each. Nothing may
 * be written to out's (real, poisoned) first element. */
Test(sizes, post_fwd_span_overflow_writes_nothing) {
    static float in[4] = {1, 1, 1, 1};
    float out_buf[4];
    memset(out_buf, 0xFF, sizeof out_buf);
    const int64_t x4[4] = {P2(24), 1, 1, 1}, x3[3] = {P2(24), 1, 1};
    const int64_t z4[4] = {0, 0, 0, 0}, z3[3] = {0, 0, 0}, o4[4] = {P2(40), 1, 1, 1};
    ompk_tensor x = raw(in, OMPK_F32, 4, x4, z4), comb = raw(in, OMPK_F32, 4, x4, z4);
    ompk_tensor post = raw(in, OMPK_F32, 3, x3, z3), f = raw(in, OMPK_F32, 3, x3, z3);
    ompk_tensor out = raw(out_buf, OMPK_F32, 4, x4, o4);
    expect_invalid(ompk_mhc_post_fwd(&x, &comb, &post, &f, &out), "out span past 2^63");
    const unsigned char *b = (const unsigned char *)out_buf;
    for (size_t i = 0; i < sizeof out_buf; i++) cr_assert_eq(b[i], 0xFF, "out byte %zu written", i);
}

/* A span that fits int64 but exceeds the 2^46-element limit on what a view may address. */
Test(sizes, sinkhorn_span_past_limit) {
    static float in[4];
    float out_buf[4];
    memset(out_buf, 0xFF, sizeof out_buf);
    const int64_t s4[4] = {P2(8), 1, 1, 1}, z4[4] = {0, 0, 0, 0}, o4[4] = {P2(40), 1, 1, 1};
    ompk_tensor lg = raw(in, OMPK_F32, 4, s4, z4), comb = raw(out_buf, OMPK_F32, 4, s4, o4);
    expect_invalid(ompk_mhc_sinkhorn_fwd(&lg, &comb, NULL), "span 2^48 elements");
    const unsigned char *b = (const unsigned char *)out_buf;
    for (size_t i = 0; i < sizeof out_buf; i++) cr_assert_eq(b[i], 0xFF, "out byte %zu written", i);
}

/* The self-overlap test multiplies a stride by its dim: 2^40 * 2^24 = 2^64 wraps to 0, which
 * used to hide that both dims step by the same stride. */
Test(sizes, self_overlap_product_overflow) {
    static float in[4];
    float out_buf[4];
    memset(out_buf, 0xFF, sizeof out_buf);
    const int64_t s4[4] = {P2(24), 2, 1, 1}, z4[4] = {0, 0, 0, 0};
    const int64_t o4[4] = {P2(40), P2(40), 1, 1};
    ompk_tensor lg = raw(in, OMPK_F32, 4, (int64_t[]){P2(24), 2, 1, 1}, z4);
    ompk_tensor comb = raw(out_buf, OMPK_F32, 4, s4, o4);
    expect_invalid(ompk_mhc_sinkhorn_fwd(&lg, &comb, NULL), "stride * dim = 2^64");
    const unsigned char *b = (const unsigned char *)out_buf;
    for (size_t i = 0; i < sizeof out_buf; i++) cr_assert_eq(b[i], 0xFF, "out byte %zu written", i);
}

/* data + span must not wrap the address space */
Test(sizes, span_wraps_address_space) {
    static float in[4];
    const int64_t s4[4] = {1, 64, 1, 1}, z4[4] = {0, 0, 0, 0}, c4[4] = {64, 1, 1, 1};
    ompk_tensor lg = raw(in, OMPK_F32, 4, s4, z4);
    ompk_tensor comb = raw((void *)(UINTPTR_MAX - 63), OMPK_F32, 4, s4, c4);
    expect_invalid(ompk_mhc_sinkhorn_fwd(&lg, &comb, NULL), "comb near the top of memory");
}

Test(sizes, tensor_init_contiguous_stride_overflow) {
    const int64_t shape[3] = {P2(40), P2(40), P2(40)};
    ompk_tensor t, before;
    memset(&t, 0x5A, sizeof t);
    before = t;
    expect_invalid(ompk_tensor_init(&t, NULL, OMPK_F32, 3, shape, NULL, ompk_device_host()),
                   "init 2^120 elements");
    cr_assert_eq(memcmp(&t, &before, sizeof t), 0, "a failed init must not touch *out");
    /* the limits themselves are accepted: 2^46 elements with a row stride of 2^40 */
    const int64_t edge[2] = {P2(6), P2(40)};
    cr_assert_eq(ompk_tensor_init(&t, NULL, OMPK_F32, 2, edge, NULL, ompk_device_host()), OMPK_OK,
                 "%s", ompk_last_error());
    cr_assert_eq(ompk_tensor_numel(&t), P2(46));
    const int64_t over[2] = {P2(6) + 1, P2(40)};
    expect_invalid(ompk_tensor_init(&t, NULL, OMPK_F32, 2, over, NULL, ompk_device_host()),
                   "2^46 + 2^40 elements");
}

Test(sizes, numel_overflow) {
    const int64_t shape[3] = {P2(40), P2(40), P2(40)};
    ompk_tensor t = ompk_tensor_make(NULL, OMPK_F32, 3, shape, ompk_device_host());
    cr_assert_eq(ompk_tensor_numel(&t), -1, "2^120 elements: got %lld",
                 (long long)ompk_tensor_numel(&t));
    const int64_t big[2] = {P2(31), P2(31)};
    t = ompk_tensor_make(NULL, OMPK_F32, 2, big, ompk_device_host());
    cr_assert_eq(ompk_tensor_numel(&t), P2(62));
    /* contiguous strides of 2^120 elements do not exist: such a view is not contiguous */
    t = ompk_tensor_make(NULL, OMPK_F32, 3, shape, ompk_device_host());
    cr_assert(!ompk_tensor_is_contiguous(&t));
}

/* n = 2^40 streams on an empty x: K = n*D and M = 2n + n^2 must not be formed before n is
 * rejected (UBSan reports the signed overflow otherwise). */
Test(sizes, mhc_pre_unchecked_n) {
    static float phi_b[64], alpha_b[3], bias_b[64];
    const int64_t x4[4] = {0, 1, P2(40), P2(40)};
    ompk_tensor x = raw_c(NULL, OMPK_F32, 4, x4);
    ompk_tensor phi = raw_c(phi_b, OMPK_F32, 2, (int64_t[]){8, 8});
    ompk_tensor alpha = raw_c(alpha_b, OMPK_F32, 1, (int64_t[]){3});
    ompk_tensor bias = raw_c(bias_b, OMPK_F32, 1, (int64_t[]){8});
    ompk_tensor h_in = raw_c(NULL, OMPK_F32, 3, (int64_t[]){0, 1, P2(40)});
    ompk_tensor h_post = raw_c(NULL, OMPK_F32, 3, (int64_t[]){0, 1, P2(40)});
    ompk_tensor comb = raw_c(NULL, OMPK_F32, 4, (int64_t[]){0, 1, P2(40), P2(40)});
    expect_invalid(ompk_mhc_pre_fwd(&(ompk_mhc_pre_fwd_args){.x = &x,
                                                             .phi = &phi,
                                                             .alpha = &alpha,
                                                             .bias = &bias,
                                                             .h_in = &h_in,
                                                             .h_post = &h_post,
                                                             .comb = &comb},
                                    NULL),
                   "pre fwd n = 2^40");
    cr_assert(strstr(ompk_last_error(), "n = ") != NULL, "%s", ompk_last_error());
}

Test(sizes, dlpack_byte_offset_wraps) {
    float buf[16];
    int64_t shape[1] = {16};
    DLTensor d;
    memset(&d, 0, sizeof d);
    d.data = buf;
    d.device.device_type = kDLCPU;
    d.ndim = 1;
    d.dtype.code = kDLFloat;
    d.dtype.bits = 32;
    d.dtype.lanes = 1;
    d.shape = shape;
    d.byte_offset = UINT64_MAX - 63; /* data - 64 after wrapping */
    ompk_tensor t, before;
    memset(&t, 0x5A, sizeof t);
    before = t;
    expect_invalid(ompk_tensor_from_dlpack(&d, &t), "byte_offset wrapping the pointer");
    cr_assert_eq(memcmp(&t, &before, sizeof t), 0);
    /* a huge DLPack shape is refused by the same size limits */
    int64_t huge[3] = {P2(40), P2(40), P2(40)};
    d.byte_offset = 0;
    d.ndim = 3;
    d.shape = huge;
    expect_invalid(ompk_tensor_from_dlpack(&d, &t), "2^120 elements");
}

/* An empty DLPack tensor with NULL data converts without arithmetic on the NULL pointer. */
Test(sizes, dlpack_null_data_empty) {
    int64_t shape[2] = {0, 4};
    DLTensor d;
    memset(&d, 0, sizeof d);
    d.device.device_type = kDLCPU;
    d.ndim = 2;
    d.dtype.code = kDLFloat;
    d.dtype.bits = 32;
    d.dtype.lanes = 1;
    d.shape = shape;
    ompk_tensor t;
    cr_assert_eq(ompk_tensor_from_dlpack(&d, &t), OMPK_OK, "%s", ompk_last_error());
    cr_assert_null(t.data);
    cr_assert_eq(ompk_tensor_numel(&t), 0);
}

/* pre backward over T = 0 tokens with NULL token data: the weight gradients are sums over no
 * tokens, so dphi, dalpha, dbias and dgamma come back zero, with no offset applied to NULL. */
Test(sizes, mhc_pre_bwd_empty_tokens) {
    enum { n = 4, D = 16, K = n * D, M = 2 * n + n * n };
    static float phi_b[M * K], gamma_b[K], alpha_b[3];
    float dphi_b[M * K], dalpha_b[3], dbias_b[M], dgamma_b[K];
    for (int i = 0; i < M * K; i++) phi_b[i] = 0.01f * (float)(i % 7);
    for (int i = 0; i < K; i++) gamma_b[i] = 1;
    alpha_b[0] = alpha_b[1] = alpha_b[2] = 1;
    memset(dphi_b, 0xFF, sizeof dphi_b);
    memset(dalpha_b, 0xFF, sizeof dalpha_b);
    memset(dbias_b, 0xFF, sizeof dbias_b);
    memset(dgamma_b, 0xFF, sizeof dgamma_b);
    ompk_tensor x = raw_c(NULL, OMPK_F32, 4, (int64_t[]){0, 3, n, D});
    ompk_tensor phi = raw_c(phi_b, OMPK_F32, 2, (int64_t[]){M, K});
    ompk_tensor gamma = raw_c(gamma_b, OMPK_F32, 1, (int64_t[]){K});
    ompk_tensor alpha = raw_c(alpha_b, OMPK_F32, 1, (int64_t[]){3});
    ompk_tensor dh_in = raw_c(NULL, OMPK_F32, 3, (int64_t[]){0, 3, D});
    ompk_tensor dh_post = raw_c(NULL, OMPK_F32, 3, (int64_t[]){0, 3, n});
    ompk_tensor dh_res = raw_c(NULL, OMPK_F32, 4, (int64_t[]){0, 3, n, n});
    ompk_tensor h_mix = raw_c(NULL, OMPK_F32, 2, (int64_t[]){0, M});
    ompk_tensor inv_rms = raw_c(NULL, OMPK_F32, 1, (int64_t[]){0});
    ompk_tensor h_pre = raw_c(NULL, OMPK_F32, 2, (int64_t[]){0, n});
    ompk_tensor h_post = raw_c(NULL, OMPK_F32, 3, (int64_t[]){0, 3, n});
    ompk_tensor dx = raw_c(NULL, OMPK_F32, 4, (int64_t[]){0, 3, n, D});
    ompk_tensor dphi = raw_c(dphi_b, OMPK_F32, 2, (int64_t[]){M, K});
    ompk_tensor dalpha = raw_c(dalpha_b, OMPK_F32, 1, (int64_t[]){3});
    ompk_tensor dbias = raw_c(dbias_b, OMPK_F32, 1, (int64_t[]){M});
    ompk_tensor dgamma = raw_c(dgamma_b, OMPK_F32, 1, (int64_t[]){K});
    ompk_status st = ompk_mhc_pre_bwd(&(ompk_mhc_pre_bwd_args){.x = &x,
                                                               .phi = &phi,
                                                               .gamma = &gamma,
                                                               .alpha = &alpha,
                                                               .dh_in = &dh_in,
                                                               .dh_post = &dh_post,
                                                               .dh_res = &dh_res,
                                                               .h_mix = &h_mix,
                                                               .inv_rms = &inv_rms,
                                                               .h_pre = &h_pre,
                                                               .h_post = &h_post,
                                                               .dx = &dx,
                                                               .dphi = &dphi,
                                                               .dalpha = &dalpha,
                                                               .dbias = &dbias,
                                                               .dgamma = &dgamma},
                                      NULL);
    cr_assert_eq(st, OMPK_OK, "%s", ompk_last_error());
    for (int i = 0; i < M * K; i++) cr_assert_eq(dphi_b[i], 0.0f, "dphi[%d]", i);
    for (int i = 0; i < 3; i++) cr_assert_eq(dalpha_b[i], 0.0f, "dalpha[%d]", i);
    for (int i = 0; i < M; i++) cr_assert_eq(dbias_b[i], 0.0f, "dbias[%d]", i);
    for (int i = 0; i < K; i++) cr_assert_eq(dgamma_b[i], 0.0f, "dgamma[%d]", i);
}

/* The same empty-token case for every forward: T = 0 (or B*Hq*N = 0) with NULL data is OK. */
Test(sizes, empty_forwards_null_data) {
    const int64_t x4[4] = {0, 2, 4, 8}, x3[3] = {0, 2, 8}, c4[4] = {0, 2, 4, 4};
    const int64_t p3[3] = {0, 2, 4};
    ompk_tensor x = raw_c(NULL, OMPK_F32, 4, x4), comb = raw_c(NULL, OMPK_F32, 4, c4);
    ompk_tensor post = raw_c(NULL, OMPK_F32, 3, p3), f = raw_c(NULL, OMPK_F32, 3, x3);
    ompk_tensor out = raw_c(NULL, OMPK_F32, 4, x4);
    cr_assert_eq(ompk_mhc_post_fwd(&x, &comb, &post, &f, &out), OMPK_OK, "%s", ompk_last_error());
    ompk_tensor lg = raw_c(NULL, OMPK_F32, 4, c4), cb = raw_c(NULL, OMPK_F32, 4, c4);
    cr_assert_eq(ompk_mhc_sinkhorn_fwd(&lg, &cb, NULL), OMPK_OK, "%s", ompk_last_error());
    ompk_tensor sx = raw_c(NULL, OMPK_F32, 2, (int64_t[]){0, 8});
    ompk_tensor sy = raw_c(NULL, OMPK_F32, 2, (int64_t[]){0, 8});
    ompk_tensor sc = raw_c(NULL, OMPK_F32, 2, (int64_t[]){0, 4});
    ompk_tensor ix = raw_c(NULL, OMPK_I32, 2, (int64_t[]){0, 4});
    cr_assert_eq(ompk_router_topk_fwd(&sx, &sy, 4, &sc, &ix), OMPK_OK, "%s", ompk_last_error());
}

/* The backward entries over no tokens, NULL data everywhere. */
Test(sizes, empty_backwards_null_data) {
    const int64_t x4[4] = {0, 2, 4, 8}, x3[3] = {0, 2, 8}, c4[4] = {0, 2, 4, 4};
    const int64_t p3[3] = {0, 2, 4};
    ompk_tensor x = raw_c(NULL, OMPK_F32, 4, x4), comb = raw_c(NULL, OMPK_F32, 4, c4);
    ompk_tensor post = raw_c(NULL, OMPK_F32, 3, p3), f = raw_c(NULL, OMPK_F32, 3, x3);
    ompk_tensor dout = raw_c(NULL, OMPK_F32, 4, x4), dx = raw_c(NULL, OMPK_F32, 4, x4);
    ompk_tensor df = raw_c(NULL, OMPK_F32, 3, x3), dpost = raw_c(NULL, OMPK_F32, 3, p3);
    ompk_tensor dcomb = raw_c(NULL, OMPK_F32, 4, c4);
    cr_assert_eq(ompk_mhc_post_bwd(&x, &comb, &post, &f, &dout, &dx, &df, &dpost, &dcomb), OMPK_OK,
                 "%s", ompk_last_error());
    ompk_tensor lg = raw_c(NULL, OMPK_F32, 4, c4), dc = raw_c(NULL, OMPK_F32, 4, c4);
    ompk_tensor dl = raw_c(NULL, OMPK_F32, 4, c4);
    cr_assert_eq(ompk_mhc_sinkhorn_bwd(&lg, &dc, &dl, NULL), OMPK_OK, "%s", ompk_last_error());
    ompk_tensor ds = raw_c(NULL, OMPK_F32, 2, (int64_t[]){0, 4});
    ompk_tensor ix = raw_c(NULL, OMPK_I32, 2, (int64_t[]){0, 4});
    ompk_tensor dsx = raw_c(NULL, OMPK_F32, 2, (int64_t[]){0, 8});
    ompk_tensor dsy = raw_c(NULL, OMPK_F32, 2, (int64_t[]){0, 8});
    cr_assert_eq(ompk_router_topk_bwd(&ds, &ix, 8, &dsx, &dsy), OMPK_OK, "%s", ompk_last_error());
}
