/* The descriptor, DLPack interop, memory helpers and status strings. */
#include <criterion/criterion.h>
#include <dlpack/dlpack.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "check.h"
#include "gpu_stack.h"
#include "gpu_wait.h"
#include "scratch.h"
#include "test_util.h"
#include "verify.h"

Test(core, status_strings_are_distinct) {
    for (int a = 0; a <= OMPK_ERR_RUNTIME; a++)
        for (int b = a + 1; b <= OMPK_ERR_RUNTIME; b++)
            cr_assert_str_neq(ompk_status_str((ompk_status)a), ompk_status_str((ompk_status)b));
    cr_assert_str_eq(ompk_status_str(OMPK_ERR_DEVICE_MISMATCH), "OMPK_ERR_DEVICE_MISMATCH");
    cr_assert_not_null(ompk_status_str((ompk_status)1234));
}

Test(core, version_and_devices) {
    cr_assert_str_eq(ompk_version(), "0.1.0");
    cr_assert(ompk_device_count() >= 0);
    cr_assert_not_null(ompk_compiler());
}

Test(core, tensor_init_validates) {
    float buf[24];
    int64_t shape[3] = {2, 3, 4};
    ompk_tensor t;
    cr_assert_eq(ompk_tensor_init(&t, buf, OMPK_F32, 3, shape, NULL, ompk_device_host()), OMPK_OK);
    cr_assert_eq(t.strides[0], 12);
    cr_assert_eq(t.strides[2], 1);
    cr_assert(ompk_tensor_is_contiguous(&t));
    cr_assert_eq(ompk_tensor_numel(&t), 24);
    int64_t neg[3] = {2, -3, 4};
    ompk_tensor u = t;
    cr_assert_eq(ompk_tensor_init(&u, buf, OMPK_F32, 3, neg, NULL, ompk_device_host()),
                 OMPK_ERR_INVALID_ARGUMENT);
    cr_assert_eq(memcmp(&u, &t, sizeof t), 0, "failed init must leave the descriptor untouched");
    int64_t nstr[3] = {12, -4, 1};
    cr_assert_eq(ompk_tensor_init(&u, buf, OMPK_F32, 3, shape, nstr, ompk_device_host()),
                 OMPK_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(ompk_last_error(), "negative") != NULL);
    cr_assert_eq(ompk_tensor_init(&u, buf, OMPK_F32, 9, shape, NULL, ompk_device_host()),
                 OMPK_ERR_INVALID_ARGUMENT);
    cr_assert_eq(ompk_tensor_init(&u, buf, (ompk_dtype)77, 3, shape, NULL, ompk_device_host()),
                 OMPK_ERR_INVALID_ARGUMENT);
    int64_t tstr[3] = {1, 2, 6}; /* a permuted view */
    cr_assert_eq(ompk_tensor_init(&u, buf, OMPK_F32, 3, shape, tstr, ompk_device_host()), OMPK_OK);
    cr_assert(!ompk_tensor_is_contiguous(&u));
}

Test(core, dtype_sizes) {
    cr_assert_eq(ompk_dtype_bits(OMPK_I4), 4);
    cr_assert_eq(ompk_dtype_bits(OMPK_BF16), 16);
    cr_assert_eq(ompk_dtype_bits(OMPK_I64), 64);
    cr_assert_str_eq(ompk_dtype_name(OMPK_BF16), "bf16");
}

Test(core, dlpack_round_trip) {
    uint16_t buf[6 * 5];
    int64_t shape[2] = {3, 5}, strides[2] = {10, 1};
    DLTensor d;
    memset(&d, 0, sizeof d);
    d.data = buf;
    d.device.device_type = kDLCPU;
    d.ndim = 2;
    d.dtype.code = kDLBfloat;
    d.dtype.bits = 16;
    d.dtype.lanes = 1;
    d.shape = shape;
    d.strides = strides;
    d.byte_offset = 4;
    ompk_tensor t;
    cr_assert_eq(ompk_tensor_from_dlpack(&d, &t), OMPK_OK, "%s", ompk_last_error());
    cr_assert_eq(t.dtype, OMPK_BF16);
    cr_assert_eq((char *)t.data, (char *)buf + 4);
    cr_assert_eq(t.strides[0], 10);
    cr_assert_eq(t.device.type, OMPK_HOST);
    DLTensor back;
    cr_assert_eq(ompk_tensor_to_dlpack(&t, &back), OMPK_OK);
    cr_assert_eq(back.dtype.code, kDLBfloat);
    cr_assert_eq(back.shape[1], 5);
    cr_assert_eq(back.strides[0], 10);
    d.device.device_type = kDLCUDA;
    d.device.device_id = 1;
    cr_assert_eq(ompk_tensor_from_dlpack(&d, &t), OMPK_OK);
    cr_assert_eq(t.device.type, OMPK_TARGET);
    cr_assert_eq(t.device.id, 1);
    cr_assert_eq(ompk_tensor_to_dlpack(&t, &back), OMPK_OK);
    cr_assert_eq(back.device.device_type, kDLCUDA);
    d.dtype.lanes = 4;
    cr_assert_eq(ompk_tensor_from_dlpack(&d, &t), OMPK_ERR_UNSUPPORTED);
    d.dtype.lanes = 1;
    d.device.device_type = kDLOpenCL;
    cr_assert_eq(ompk_tensor_from_dlpack(&d, &t), OMPK_ERR_UNSUPPORTED);
}

Test(core, memory_round_trip_every_device) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    for (int i = 0; i < nd; i++) {
        const size_t n = 1003; /* odd: exercises the memset head/tail */
        unsigned char *src = malloc(n), *dst = malloc(n);
        for (size_t k = 0; k < n; k++) src[k] = (unsigned char)(k * 7);
        unsigned char *d = ompk_malloc(devs[i], n);
        cr_assert_not_null(d, "%s", ompk_last_error());
        cr_assert_eq(ompk_memcpy(d, devs[i], src, ompk_device_host(), n), OMPK_OK);
        cr_assert_eq(ompk_memcpy(dst, ompk_device_host(), d, devs[i], n), OMPK_OK);
        cr_assert_eq(memcmp(src, dst, n), 0);
        cr_assert_eq(ompk_memset(d + 1, devs[i], 0x3C, n - 2), OMPK_OK);
        cr_assert_eq(ompk_memcpy(dst, ompk_device_host(), d, devs[i], n), OMPK_OK);
        cr_assert_eq(dst[0], src[0]);
        cr_assert_eq(dst[n - 1], src[n - 1]);
        for (size_t k = 1; k < n - 1; k++) cr_assert_eq(dst[k], 0x3C);
        ompk_free(devs[i], d);
        free(src);
        free(dst);
    }
    cr_assert_null(ompk_malloc(ompk_device_target(ompk_device_count() + 1), 16));
    cr_assert_eq(ompk_memset(NULL, ompk_device_host(), 0, 4), OMPK_ERR_INVALID_ARGUMENT);
}

/* After a GPU call the context spins while waiting (gpu_wait.c), or does what OMPK_GPU_WAIT says */
Test(core, gpu_wait_mode_is_set) {
    const char *env = getenv("OMPK_GPU_WAIT");
    for (int d = 0; d < ompk_device_count(); d++) {
        unsigned char *p = ompk_malloc(ompk_device_target(d), 64);
        cr_assert_not_null(p);
        cr_assert_eq(ompk_memset(p, ompk_device_target(d), 0, 64), OMPK_OK);
        ompk_free(ompk_device_target(d), p);
        const char *mode = ompk_gpu_wait_mode(d);
        if (!strncmp(mode, "unknown", 7)) continue; /* not the CUDA plugin */
        if (!env || !strcmp(env, "spin"))
            cr_assert_str_eq(mode, "spin");
        else if (!strcmp(env, "yield"))
            cr_assert_str_eq(mode, "yield");
    }
}

/* After a GPU call, a GCC offload build's context has the GPU thread stack ompk gives it
 * (gpu_stack.c); other builds keep the runtime's */
Test(core, gpu_stack_limit_is_set) {
    for (int d = 0; d < ompk_device_count(); d++) {
        unsigned char *p = ompk_malloc(ompk_device_target(d), 64);
        cr_assert_not_null(p);
        cr_assert_eq(ompk_memset(p, ompk_device_target(d), 0, 64), OMPK_OK);
        ompk_free(ompk_device_target(d), p);
        const long long limit = ompk_gpu_stack_limit(d);
        if (limit < 0) continue; /* not the CUDA plugin */
        cr_assert_geq(limit, ompk_gpu_stack_wanted());
    }
}

Test(core, bf16_rounding_is_nearest_even) {
    cr_assert_eq(ompk_f32_to_bf16(1.0f), 0x3F80);
    /* 1 + 2^-8 is a tie between 1 and 1 + 2^-7: rounds to even (1.0) */
    cr_assert_eq(ompk_f32_to_bf16(1.00390625f), 0x3F80);
    /* 1 + 3*2^-8 is a tie between 1+2^-7 and 1+2^-6: rounds to even (1 + 2^-6) */
    cr_assert_eq(ompk_f32_to_bf16(1.01171875f), 0x3F82);
    cr_assert_eq(ompk_f32_to_bf16(-2.0f), 0xC000);
    ompk_f32_bits nan;
    nan.u = 0x7f800001u; /* signalling NaN with payload only in low bits stays NaN */
    uint16_t h = ompk_f32_to_bf16(nan.f);
    cr_assert((h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0);
}

Test(core, output_overlap_rules) {
    float buf[64];
    int64_t shape[2] = {4, 4};
    ompk_tensor a = ompk_tensor_make(buf, OMPK_F32, 2, shape, ompk_device_host());
    ompk_tensor b = ompk_tensor_make(buf + 16, OMPK_F32, 2, shape, ompk_device_host());
    ompk_tensor c = ompk_tensor_make(buf + 8, OMPK_F32, 2, shape, ompk_device_host());
    ompk_call call;
    ompk_call_begin(&call, "t");
    ompk_call_input(&call, "a", &a, 2, OMPK_DT_FLOAT);
    ompk_call_output(&call, "b", &b, 2, OMPK_DT_FLOAT);
    cr_assert_eq(ompk_call_end(&call), OMPK_OK);
    ompk_call_begin(&call, "t");
    ompk_call_input(&call, "a", &a, 2, OMPK_DT_FLOAT);
    ompk_call_output(&call, "c", &c, 2, OMPK_DT_FLOAT);
    cr_assert_eq(ompk_call_end(&call), OMPK_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(ompk_last_error(), "output c overlaps input a") != NULL, "%s",
              ompk_last_error());
    /* two inputs may share memory */
    ompk_call_begin(&call, "t");
    ompk_call_input(&call, "a", &a, 2, OMPK_DT_FLOAT);
    ompk_call_input(&call, "c", &c, 2, OMPK_DT_FLOAT);
    cr_assert_eq(ompk_call_end(&call), OMPK_OK);
    /* a broadcast (stride 0) output overlaps itself */
    ompk_tensor z = b;
    z.strides[0] = 0;
    ompk_call_begin(&call, "t");
    ompk_call_output(&call, "z", &z, 2, OMPK_DT_FLOAT);
    cr_assert_eq(ompk_call_end(&call), OMPK_ERR_INVALID_ARGUMENT);
}

/* Scratch blocks are reused on GPUs (no cudaMalloc/cudaFree per call) and always usable. */
Test(core, scratch_cache) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    for (int i = 0; i < nd; i++) {
        unsigned char *p = ompk_scratch_alloc(devs[i], 100000);
        cr_assert_not_null(p, "%s", ompk_last_error());
        cr_assert_eq(ompk_memset(p, devs[i], 0x11, 100000), OMPK_OK);
        ompk_scratch_free(devs[i], p);
        unsigned char *q = ompk_scratch_alloc(devs[i], 90000);
        cr_assert_not_null(q);
        if (devs[i].type == OMPK_TARGET) cr_expect_eq(q, p, "a cached block was not reused");
        unsigned char *r = ompk_scratch_alloc(devs[i], 90000); /* q is live: r must differ */
        cr_assert_not_null(r);
        cr_expect_neq(q, r);
        unsigned char h[16];
        cr_assert_eq(ompk_memset(r, devs[i], 0x22, 90000), OMPK_OK);
        cr_assert_eq(ompk_memcpy(h, ompk_device_host(), r + 89984, devs[i], 16), OMPK_OK);
        for (int k = 0; k < 16; k++) cr_assert_eq(h[k], 0x22);
        ompk_scratch_free(devs[i], q);
        ompk_scratch_free(devs[i], r);
    }
    ompk_scratch_trim();
}

/* verify's flip allowance: a few elements within flip_mult bands pass, one beyond it or too many
 * do not, and without the allowance any element beyond the band is a mismatch */
Test(core, verify_flip_allowance) {
    enum { N = 400 };
    float o[N];
    double r[N];
    for (int i = 0; i < N; i++) o[i] = (float)(r[i] = 1.0 + i);
    const int64_t sh[1] = {N};
    const ompk_tensor t = ompk_tensor_make(o, OMPK_F32, 1, sh, ompk_device_host());
    const ompk_tol plain = {.atol = 0.5, .rtol = 0.0};
    const ompk_tol flips = {.atol = 0.5, .rtol = 0.0, .flip_mult = 8.0, .flip_div = 200};
    cr_expect_eq(ompk_verify_report("t", "o", NULL, &t, r, 0, -1, flips), 0);
    o[3] += 3.0f; /* 6 bands */
    cr_expect_eq(ompk_verify_report("t", "o", NULL, &t, r, 0, -1, plain), 1);
    cr_expect_eq(ompk_verify_report("t", "o", NULL, &t, r, 0, -1, flips), 0);
    o[9] += 1.0f; /* a second flip: max(2, 400 / 200) allowed */
    cr_expect_eq(ompk_verify_report("t", "o", NULL, &t, r, 0, -1, flips), 0);
    o[20] += 1.0f; /* a third: too many */
    cr_expect_eq(ompk_verify_report("t", "o", NULL, &t, r, 0, -1, flips), 3);
    o[20] -= 1.0f;
    o[9] += 4.0f; /* 10 bands: beyond the allowance */
    cr_expect_eq(ompk_verify_report("t", "o", NULL, &t, r, 0, -1, flips), 2);
}
