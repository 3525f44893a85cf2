/* Descriptor helpers and memory functions: ompk_tensor_init / make / numel / is_contiguous,
 * dtype and device queries, ompk_malloc / free / memcpy / memset on the host (bad devices
 * included). ompk_tensor_init must leave *out untouched on failure and copy its arguments on
 * success; numel of a view the library accepted must be computable. */
#include "fuzz_common.h"

static const int32_t dts[] = {0, 1, 2, 3, 4, 5, 6, 7, -1, INT_MIN};

static int64_t dim(void) {
    uint8_t b = fz_u8();
    return b < 160 ? (int64_t)(b % 9) : fz_special_i64[b % FZ_NSPECIAL];
}

FZ_INIT {
    fz_begin(data, size);
    int64_t shape[OMPK_MAX_NDIM + 2], strides[OMPK_MAX_NDIM + 2];
    int ndim = fz_bad_ndims[fz_u8() % 11];
    for (int d = 0; d < OMPK_MAX_NDIM + 2; d++) shape[d] = dim(), strides[d] = dim();
    ompk_dtype dt = (ompk_dtype)dts[fz_u8() % 10];
    ompk_device dev = {(ompk_device_type)fz_bad_types[fz_u8() % 4], fz_bad_ids[fz_u8() % 5]};
    uint8_t opt = fz_u8();
    char buf[64];
    void *ptr = (opt & 1) ? NULL : buf;
    ompk_tensor t, t0;
    memset(&t, 0xa5, sizeof t);
    t0 = t;
    const int64_t *sh = (opt & 2) ? NULL : shape, *st = (opt & 4) ? NULL : strides;
    ompk_status s = ompk_tensor_init((opt & 8) ? NULL : &t, ptr, dt, ndim, sh, st, dev);
    if (s != OMPK_OK) {
        if (memcmp(&t, &t0, sizeof t)) fz_fail("failed tensor_init wrote *out");
        if (!ompk_last_error()[0]) fz_fail("failed call left no message");
    } else {
        if (t.data != ptr || t.dtype != dt || t.ndim != ndim) fz_fail("tensor_init fields");
        for (int d = 0; d < ndim; d++)
            if (t.shape[d] != sh[d] || (st && t.strides[d] != st[d]))
                fz_fail("tensor_init shape or strides");
        (void)ompk_tensor_numel(&t);
        (void)ompk_tensor_is_contiguous(&t);
    }
    ompk_tensor m = ompk_tensor_make(ptr, dt, ndim, sh, dev);
    (void)ompk_tensor_numel(&m);
    (void)ompk_tensor_is_contiguous(&m);
    (void)ompk_dtype_bits(dt);
    if (!ompk_dtype_name(dt)) fz_fail("dtype name NULL");
    if (!ompk_status_str((ompk_status)dts[fz_u8() % 10])) fz_fail("status name NULL");
    (void)ompk_device_equal(dev, ompk_device_target(fz_bad_ids[fz_u8() % 5]));

    /* memory: host buffers of exact size, copies and fills inside them or with bad devices */
    size_t n = fz_u8() % 65;
    ompk_device d2 = (opt & 16) ? dev : ompk_device_host();
    void *p = ompk_malloc(d2, n);
    if (p) {
        if (d2.type != OMPK_HOST) fz_fail("malloc on a bad device succeeded");
        memset(p, 0, n);
        ompk_free(d2, p);
    } else if (!ompk_last_error()[0]) {
        fz_fail("malloc failed without a message");
    }
    fz_buf *a = fz_alloc(64), *b = fz_alloc(64);
    fz_fill(a, OMPK_I8);
    fz_fill(b, OMPK_I8);
    size_t off = fz_u8() % 64, len = fz_u8() % (65 - off);
    ompk_device da = (opt & 32) ? dev : ompk_device_host();
    fz_arm();
    ompk_clear_error();
    s = (opt & 64) ? ompk_memset(a->data + off, da, (int)fz_u32(), len)
                   : ompk_memcpy(a->data + off, da, b->data + fz_u8() % (65 - len), d2, len);
    a->written = 1; /* the destination, whatever the status */
    fz_check(s, OMPK_OK);
    (void)ompk_device_count();
    fz_end();
    return 0;
}
