/* DLPack <-> ompk_tensor. kDLCUDA device n is OpenMP device n: with one CUDA context per GPU,
 * LLVM's CUDA plugin numbers devices in CUDA's order. */
#include <dlpack/dlpack.h>
#include <stdint.h>
#include <string.h>

#include "error.h"
#include "ompk/tensor.h"

static int dtype_from_dl(DLDataType t, ompk_dtype *out) {
    if (t.lanes != 1) return 0;
    if (t.code == kDLFloat && t.bits == 32)
        *out = OMPK_F32;
    else if (t.code == kDLFloat && t.bits == 16)
        *out = OMPK_F16;
    else if (t.code == kDLBfloat && t.bits == 16)
        *out = OMPK_BF16;
    else if (t.code == kDLInt && t.bits == 8)
        *out = OMPK_I8;
    else if (t.code == kDLInt && t.bits == 4)
        *out = OMPK_I4;
    else if (t.code == kDLInt && t.bits == 32)
        *out = OMPK_I32;
    else if (t.code == kDLInt && t.bits == 64)
        *out = OMPK_I64;
    else
        return 0;
    return 1;
}

ompk_status ompk_tensor_from_dlpack(const DLTensor *src, ompk_tensor *out) {
    static const char fn[] = "ompk_tensor_from_dlpack";
    if (!src || !out) return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "NULL argument");
    ompk_dtype dt;
    if (!dtype_from_dl(src->dtype, &dt))
        return ompk_fail(OMPK_ERR_UNSUPPORTED, fn, "DLPack dtype code %u bits %u lanes %u",
                         src->dtype.code, src->dtype.bits, src->dtype.lanes);
    ompk_device dev;
    switch (src->device.device_type) {
    case kDLCPU:
    case kDLCUDAHost:
        dev = ompk_device_host();
        break;
    case kDLCUDA:
        dev = ompk_device_target(src->device.device_id);
        break;
    default:
        return ompk_fail(OMPK_ERR_UNSUPPORTED, fn, "DLPack device type %d",
                         (int)src->device.device_type);
    }
    if (src->byte_offset != 0 && src->data == NULL)
        return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "byte_offset on a NULL data pointer");
    if (src->byte_offset > UINTPTR_MAX - (uintptr_t)src->data)
        return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "byte_offset %llu wraps the data pointer",
                         (unsigned long long)src->byte_offset);
    /* C gives NULL + 0 no meaning: NULL data passes through untouched */
    void *data = src->data ? (char *)src->data + src->byte_offset : NULL;
    return ompk_tensor_init(out, data, dt, src->ndim, src->shape, src->strides, dev);
}

ompk_status ompk_tensor_to_dlpack(const ompk_tensor *t, DLTensor *out) {
    static const char fn[] = "ompk_tensor_to_dlpack";
    if (!t || !out) return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "NULL argument");
    if (t->ndim < 0 || t->ndim > OMPK_MAX_NDIM)
        return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "ndim %d", t->ndim);
    DLTensor d;
    memset(&d, 0, sizeof d);
    d.data = t->data;
    d.ndim = t->ndim;
    d.shape = (int64_t *)t->shape;
    d.strides = (int64_t *)t->strides;
    d.byte_offset = 0;
    d.dtype.lanes = 1;
    d.dtype.bits = (uint8_t)ompk_dtype_bits(t->dtype);
    switch (t->dtype) {
    case OMPK_F32:
    case OMPK_F16:
        d.dtype.code = kDLFloat;
        break;
    case OMPK_BF16:
        d.dtype.code = kDLBfloat;
        break;
    case OMPK_I8:
    case OMPK_I4:
    case OMPK_I32:
    case OMPK_I64:
        d.dtype.code = kDLInt;
        break;
    default:
        return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "unknown dtype %d", (int)t->dtype);
    }
    if (t->device.type == OMPK_HOST) {
        d.device.device_type = kDLCPU;
        d.device.device_id = 0;
    } else {
        d.device.device_type = kDLCUDA;
        d.device.device_id = t->device.id;
    }
    *out = d;
    return OMPK_OK;
}
