/* OMPK_VERIFY / OMPK_TRACE: host snapshots of tensors, element access, error reports. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "check.h"
#include "error.h"
#include "verify.h"

/* Read at each call, so that a program may switch them while it runs. */
static int env_flag(const char *name) {
    const char *v = getenv(name);
    return v && v[0] && strcmp(v, "0") != 0;
}

/* ompk_verify_force's per-thread settings: -1 (the environment's), 0 or 1 */
static _Thread_local int forced_verify = -1, forced_trace = -1;

void ompk_verify_force(int verify, int trace) {
    forced_verify = verify < 0 ? -1 : verify != 0;
    forced_trace = trace < 0 ? -1 : trace != 0;
}

int ompk_verify_enabled(void) {
    return forced_verify >= 0 ? forced_verify : env_flag("OMPK_VERIFY");
}
int ompk_trace_enabled(void) {
    return forced_trace >= 0 ? forced_trace : env_flag("OMPK_TRACE");
}

ompk_status ompk_host_view(const ompk_tensor *t, ompk_tensor *host, void **owned) {
    uintptr_t lo, hi;
    ompk_tensor_span(t, &lo, &hi);
    size_t bytes = (size_t)(hi - lo);
    void *buf = malloc(bytes ? bytes : 1);
    if (!buf) return ompk_fail(OMPK_ERR_OUT_OF_MEMORY, "ompk_host_view", "%zu bytes", bytes);
    ompk_status st = ompk_memcpy(buf, ompk_device_host(), (const void *)lo, t->device, bytes);
    if (st != OMPK_OK) {
        free(buf);
        return st;
    }
    *host = *t;
    host->data = buf;
    host->device = ompk_device_host();
    *owned = buf;
    return OMPK_OK;
}

void ompk_host_view_free(void *owned) {
    free(owned);
}

int64_t ompk_tensor_offset(const ompk_tensor *t, int64_t linear) {
    int64_t off = 0;
    for (int d = t->ndim - 1; d >= 0; d--) {
        int64_t n = t->shape[d];
        int64_t i = n ? linear % n : 0;
        linear = n ? linear / n : 0;
        off += i * t->strides[d];
    }
    return off;
}

double ompk_host_get(const ompk_tensor *t, int64_t linear) {
    int64_t o = ompk_tensor_offset(t, linear);
    switch (t->dtype) {
    case OMPK_F32:
        return ((const float *)t->data)[o];
    case OMPK_BF16:
        return ompk_bf16_to_f32(((const uint16_t *)t->data)[o]);
    case OMPK_I8:
        return ((const int8_t *)t->data)[o];
    case OMPK_I32:
        return ((const int32_t *)t->data)[o];
    case OMPK_I64:
        return (double)((const int64_t *)t->data)[o];
    case OMPK_I4: {
        uint8_t b = ((const uint8_t *)t->data)[o / 2];
        int v = (o & 1) ? (b >> 4) : (b & 15);
        return v >= 8 ? v - 16 : v;
    }
    case OMPK_F16: {
        uint16_t h = ((const uint16_t *)t->data)[o];
        int e = (h >> 10) & 31, m = h & 1023;
        double s = (h & 0x8000) ? -1.0 : 1.0;
        if (e == 0) return s * ldexp(m, -24);
        if (e == 31) return m ? NAN : s * INFINITY;
        return s * ldexp(1024 + m, e - 25);
    }
    default:
        return NAN;
    }
}

/* Per thread: a call's verify lines come from the thread that made the call. */
static _Thread_local int64_t verify_mismatches;

int64_t ompk_verify_mismatches(void) {
    return verify_mismatches;
}

int64_t ompk_verify_report(const char *fn, const char *output, const char *section,
                           const ompk_tensor *out, const double *ref, int64_t col_lo,
                           int64_t col_hi, ompk_tol tol) {
    int64_t n = ompk_tensor_numel(out);
    int64_t inner = out->ndim ? out->shape[out->ndim - 1] : 1;
    double max_abs = 0, max_rel = 0;
    int64_t mism = 0, count = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t col = inner ? i % inner : 0;
        if (col_hi >= 0 && (col < col_lo || col >= col_hi)) continue;
        count++;
        double o = ompk_host_get(out, i), r = ref[i];
        double err = fabs(o - r);
        int bad;
        if (!isfinite(r)) {
            bad = !(o == r || (isnan(o) && isnan(r)));
            err = bad ? INFINITY : 0;
        } else {
            bad = !isfinite(o) || err > tol.atol + tol.rtol * fabs(r);
        }
        if (err > max_abs) max_abs = err;
        if (isfinite(r) && fabs(r) > 0 && err / fabs(r) > max_rel) max_rel = err / fabs(r);
        mism += bad;
    }
    fprintf(stderr,
            "ompk verify %s %s%s%s%s n=%lld max_abs=%.3e max_rel=%.3e mismatches=%lld "
            "tol=(%.1e,%.1e) %s\n",
            fn, output, section ? "[" : "", section ? section : "", section ? "]" : "",
            (long long)count, max_abs, max_rel, (long long)mism, tol.atol, tol.rtol,
            mism ? "MISMATCH" : "OK");
    verify_mismatches += mism;
    return mism;
}

void ompk_trace_tensor(const char *fn, const char *stage, const ompk_tensor *host) {
    int64_t n = ompk_tensor_numel(host), nonfinite = 0;
    double ss = 0, mx = 0;
    for (int64_t i = 0; i < n; i++) {
        double v = ompk_host_get(host, i);
        if (!isfinite(v)) {
            nonfinite++;
            continue;
        }
        ss += v * v;
        if (fabs(v) > mx) mx = fabs(v);
    }
    fprintf(stderr, "ompk trace %s %s n=%lld l2=%.6e max_abs=%.6e nonfinite=%lld\n", fn, stage,
            (long long)n, sqrt(ss), mx, (long long)nonfinite);
}
