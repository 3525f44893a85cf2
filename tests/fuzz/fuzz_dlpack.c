/* ompk_tensor_from_dlpack / ompk_tensor_to_dlpack: DLTensors with any dtype code, bits and
 * lanes, device types and ids, NULL shape or strides, byte offsets up to 2^64 - 1. A successful
 * import must not wrap the data pointer and must round-trip through to_dlpack. */
#include <dlpack/dlpack.h>

#include "fuzz_common.h"

static const int32_t devtypes[] = {kDLCPU, kDLCUDA, kDLCUDAHost, kDLROCM, 0, 99, -1};
static const uint64_t offsets[] = {
    0, 1, 4, 64, UINT64_MAX, UINT64_MAX - 63, (uint64_t)1 << 63, (uint64_t)1 << 40};

FZ_INIT {
    fz_begin(data, size);
    int64_t shape[OMPK_MAX_NDIM + 2], strides[OMPK_MAX_NDIM + 2];
    for (int d = 0; d < OMPK_MAX_NDIM + 2; d++) {
        uint8_t b = fz_u8(), c = fz_u8();
        shape[d] = b < 160 ? (int64_t)(b % 9) : fz_special_i64[b % FZ_NSPECIAL];
        strides[d] = c < 160 ? (int64_t)(c % 9) : fz_special_i64[c % FZ_NSPECIAL];
    }
    fz_buf *buf = fz_alloc(256);
    DLTensor src;
    memset(&src, 0, sizeof src);
    uint8_t opt = fz_u8();
    src.data = (opt & 1) ? NULL : buf->data + (fz_u8() & 0x3c);
    src.device.device_type = (DLDeviceType)devtypes[fz_u8() % 7];
    src.device.device_id = fz_bad_ids[fz_u8() % 5];
    src.ndim = fz_bad_ndims[fz_u8() % 11];
    src.dtype.code = fz_u8() % 8;
    static const uint8_t bits[] = {32, 16, 8, 4, 64, 0, 1, 128};
    src.dtype.bits = bits[fz_u8() % 8];
    src.dtype.lanes = (opt & 2) ? (uint16_t)fz_range(0, 4) : 1;
    src.shape = (opt & 4) ? NULL : shape;
    src.strides = (opt & 8) ? NULL : strides;
    src.byte_offset = offsets[fz_u8() % 8];

    ompk_tensor t, t0;
    memset(&t, 0xa5, sizeof t);
    t0 = t;
    ompk_status st = ompk_tensor_from_dlpack((opt & 16) ? NULL : &src, (opt & 32) ? NULL : &t);
    if (st != OMPK_OK) {
        if (memcmp(&t, &t0, sizeof t)) fz_fail("failed from_dlpack wrote *out");
        if (!ompk_last_error()[0]) fz_fail("failed call left no message");
    } else {
        uintptr_t base = (uintptr_t)src.data, got = (uintptr_t)t.data;
        if (got < base || got - base != src.byte_offset)
            fz_fail("from_dlpack wrapped the data pointer");
        DLTensor back;
        if (ompk_tensor_to_dlpack(&t, &back) != OMPK_OK) fz_fail("round trip failed");
        if (back.ndim != src.ndim || back.dtype.bits != src.dtype.bits ||
            back.dtype.code != src.dtype.code || back.byte_offset != 0 || back.data != t.data)
            fz_fail("round trip changed the tensor");
        for (int d = 0; d < back.ndim; d++)
            if (back.shape[d] != src.shape[d] || (src.strides && back.strides[d] != src.strides[d]))
                fz_fail("round trip changed shape or strides");
    }
    /* to_dlpack of an arbitrary descriptor */
    ompk_tensor any;
    memset(&any, 0, sizeof any);
    any.data = buf->data;
    any.dtype = (ompk_dtype)fz_bad_dtypes[fz_u8() % 11];
    any.ndim = fz_bad_ndims[fz_u8() % 11];
    any.device.type = (ompk_device_type)fz_bad_types[fz_u8() % 4];
    any.device.id = fz_bad_ids[fz_u8() % 5];
    DLTensor out, out0;
    memset(&out, 0xa5, sizeof out);
    out0 = out;
    st = ompk_tensor_to_dlpack((opt & 64) ? NULL : &any, (opt & 128) ? NULL : &out);
    if (st != OMPK_OK && memcmp(&out, &out0, sizeof out)) fz_fail("failed to_dlpack wrote *out");
    fz_end();
    return 0;
}
