/* Shared test helpers (see test_util.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "test_util.h"

int tu_devices(ompk_device *devs, int max) {
    const char *sel = getenv("OMPK_TEST_DEVICES");
    int host = 1, target = 1, n = 0;
    if (sel && strcmp(sel, "host") == 0) target = 0;
    if (sel && strcmp(sel, "target") == 0) host = 0;
    if (host && n < max) devs[n++] = ompk_device_host();
    if (target)
        for (int i = 0; i < ompk_device_count() && n < max; i++) devs[n++] = ompk_device_target(i);
    return n;
}

const char *tu_device_name(ompk_device d) {
    static _Thread_local char buf[32];
    if (d.type == OMPK_HOST) return "host";
    snprintf(buf, sizeof buf, "gpu%d", d.id);
    return buf;
}

tu_rng tu_rng_make(uint64_t seed) {
    tu_rng r = {seed * 0x9E3779B97F4A7C15ull + 1};
    return r;
}

uint64_t tu_next(tu_rng *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double tu_uniform(tu_rng *r) {
    return (double)(tu_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

double tu_normal(tu_rng *r) {
    double u1 = tu_uniform(r), u2 = tu_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

tu_buf tu_buf_new(ompk_device d, ompk_dtype dtype, int64_t numel) {
    tu_buf b;
    b.device = d;
    b.dtype = dtype;
    b.numel = numel;
    b.bytes = (size_t)((numel * ompk_dtype_bits(dtype) + 7) / 8);
    b.host = calloc(b.bytes ? b.bytes : 1, 1);
    b.dev = d.type == OMPK_HOST ? b.host : ompk_malloc(d, b.bytes);
    if (!b.host || !b.dev) {
        fprintf(stderr, "tu_buf_new: allocation of %zu bytes failed\n", b.bytes);
        abort();
    }
    /* the device copy starts as the host one (zeros): a test that downloads a whole buffer of
     * which a call writes a view reads defined memory (compute-sanitizer initcheck) */
    tu_buf_upload(&b);
    return b;
}

void tu_buf_free(tu_buf *b) {
    if (b->dev != b->host) ompk_free(b->device, b->dev);
    free(b->host);
    b->host = b->dev = NULL;
}

void tu_buf_upload(tu_buf *b) {
    if (b->dev != b->host) ompk_memcpy(b->dev, b->device, b->host, ompk_device_host(), b->bytes);
}

void tu_buf_download(tu_buf *b) {
    if (b->dev != b->host) ompk_memcpy(b->host, ompk_device_host(), b->dev, b->device, b->bytes);
}

double tu_buf_get(const tu_buf *b, int64_t i) {
    switch (b->dtype) {
    case OMPK_F32:
        return ((const float *)b->host)[i];
    case OMPK_BF16:
        return ompk_bf16_to_f32(((const uint16_t *)b->host)[i]);
    case OMPK_I8:
        return ((const int8_t *)b->host)[i];
    case OMPK_I32:
        return ((const int32_t *)b->host)[i];
    case OMPK_I64:
        return (double)((const int64_t *)b->host)[i];
    default:
        return NAN;
    }
}

void tu_buf_set(tu_buf *b, int64_t i, double v) {
    switch (b->dtype) {
    case OMPK_F32:
        ((float *)b->host)[i] = (float)v;
        break;
    case OMPK_BF16:
        ((uint16_t *)b->host)[i] = ompk_f32_to_bf16((float)v);
        break;
    case OMPK_I8:
        ((int8_t *)b->host)[i] = (int8_t)v;
        break;
    case OMPK_I32:
        ((int32_t *)b->host)[i] = (int32_t)v;
        break;
    case OMPK_I64:
        ((int64_t *)b->host)[i] = (int64_t)v;
        break;
    default:
        break;
    }
}

void tu_buf_randn(tu_buf *b, tu_rng *r, double scale) {
    for (int64_t i = 0; i < b->numel; i++) tu_buf_set(b, i, scale * tu_normal(r));
    tu_buf_upload(b);
}

void tu_buf_fill_bytes(tu_buf *b, int byte) {
    memset(b->host, byte, b->bytes);
    if (b->dev != b->host) ompk_memset(b->dev, b->device, byte, b->bytes);
}

int tu_buf_all_bytes(tu_buf *b, int byte) {
    tu_buf_download(b);
    const unsigned char *p = (const unsigned char *)b->host;
    for (size_t i = 0; i < b->bytes; i++)
        if (p[i] != (unsigned char)byte) return 0;
    return 1;
}

ompk_tensor tu_view(const tu_buf *b, int ndim, const int64_t *shape) {
    return ompk_tensor_make(b->dev, b->dtype, ndim, shape, b->device);
}

double tu_compare(const char *what, const tu_buf *out, const double *ref, int64_t n, double atol,
                  double rtol) {
    double worst = 0;
    int64_t wi = -1;
    for (int64_t i = 0; i < n; i++) {
        double o = tu_buf_get(out, i);
        double q = fabs(o - ref[i]) / (atol + rtol * fabs(ref[i]));
        if (!(q <= worst)) { /* NaN-safe: NaN always becomes the worst */
            worst = isnan(q) ? INFINITY : q;
            wi = i;
        }
    }
    if (worst > 1)
        fprintf(stderr, "tu_compare %s: worst at %lld: got %.9g want %.9g (ratio %.3g)\n", what,
                (long long)wi, tu_buf_get(out, wi), ref[wi], worst);
    return worst;
}
