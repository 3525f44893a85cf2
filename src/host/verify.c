/* OMPK_VERIFY / OMPK_TRACE: host snapshots of tensors, element access, error reports, and the one
 * verify / trace path the API entry points describe their calls to. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "check.h"
#include "error.h"
#include "tolerance.h"
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

void ompk_host_gather(const ompk_tensor *t, double *out) {
    int64_t n = ompk_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) out[i] = ompk_host_get(t, i);
}

/* Per thread: a call's verify lines come from the thread that made the call. */
static _Thread_local int64_t verify_mismatches, verify_reports;

int64_t ompk_verify_mismatches(void) {
    return verify_mismatches;
}

int64_t ompk_verify_reports(void) {
    return verify_reports;
}

int64_t ompk_verify_report(const char *fn, const char *output, const char *section,
                           const ompk_tensor *out, const double *ref, int64_t col_lo,
                           int64_t col_hi, ompk_tol tol) {
    int64_t n = ompk_tensor_numel(out);
    int64_t inner = out->ndim ? out->shape[out->ndim - 1] : 1;
    double max_abs = 0, max_rel = 0;
    int64_t mism = 0, count = 0, far = 0;
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
            const double band = tol.atol + tol.rtol * fabs(r);
            bad = !isfinite(o) || err > band;
            far += bad && !(err <= tol.flip_mult * band);
        }
        if (err > max_abs) max_abs = err;
        if (isfinite(r) && fabs(r) > 0 && err / fabs(r) > max_rel) max_rel = err / fabs(r);
        mism += bad;
    }
    const int64_t flips_max =
        tol.flip_div > 0 && count / tol.flip_div > 2 ? count / tol.flip_div : 2;
    const int64_t flips = tol.flip_mult > 0 && !far && mism <= flips_max ? mism : 0;
    mism -= flips;
    fprintf(stderr,
            "ompk verify %s %s%s%s%s n=%lld max_abs=%.3e max_rel=%.3e mismatches=%lld "
            "tol=(%.1e,%.1e) %s",
            fn, output, section ? "[" : "", section ? section : "", section ? "]" : "",
            (long long)count, max_abs, max_rel, (long long)mism, tol.atol, tol.rtol,
            mism ? "MISMATCH" : "OK");
    if (flips)
        fprintf(stderr, " (%lld rounding flip(s) within %gx)", (long long)flips, tol.flip_mult);
    fputc('\n', stderr);
    verify_mismatches += mism;
    verify_reports++;
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

/* Largest |ref| over the elements whose innermost index lies in [lo, hi). */
static double ref_max(const double *ref, int64_t n, int64_t inner, int64_t lo, int64_t hi) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t col = i % inner;
        if (col >= lo && col < hi && fabs(ref[i]) > m) m = fabs(ref[i]);
    }
    return m;
}

int64_t ompk_verify_report_scaled(const char *fn, const char *output, const char *section,
                                  const ompk_tensor *out, const double *ref, int64_t col_lo,
                                  int64_t col_hi) {
    int64_t n = ompk_tensor_numel(out), inner = out->ndim ? out->shape[out->ndim - 1] : 1;
    if (inner < 1) inner = 1;
    double s = ref_max(ref, n, inner, col_lo, col_hi < 0 ? inner : col_hi);
    return ompk_verify_report(fn, output, section, out, ref, col_lo, col_hi,
                              ompk_tol_for(out->dtype, s > 0 ? s : 1));
}

ompk_tol ompk_verify_tol_ref_max(const ompk_verify_io *io, int i) {
    double s = ref_max(io->ref[i], io->ref_n[i], 1, 0, 1);
    return ompk_tol_for(io->h[i].dtype, s > 0 ? s : 1);
}

/* Verify mode after the snapshots: optional gather, reference arrays, reference, reports. */
static void verify_outputs(const ompk_verify_op *op, ompk_verify_io *io, double **d, double **ref,
                           int64_t *ref_n) {
    const ompk_verify_arg *a = op->args;
    int ok = 1;
    for (int i = 0; i < op->nargs; i++) {
        const int64_t n = a[i].t ? ompk_tensor_numel(a[i].t) : 0;
        if (op->gather && a[i].t) {
            d[i] = malloc(sizeof(double) * (size_t)(n ? n : 1));
            if (d[i]) ompk_host_gather(&io->h[i], d[i]);
            ok = ok && d[i];
        }
        if (a[i].output && (a[i].t || a[i].ref_numel > 0)) {
            ref_n[i] = a[i].ref_numel > 0 ? a[i].ref_numel : n;
            ref[i] = calloc((size_t)(ref_n[i] ? ref_n[i] : 1), sizeof(double));
            ok = ok && ref[i];
        }
    }
    if (!ok) {
        fprintf(stderr, "ompk verify %s: out of memory, skipped\n", op->fn);
        return;
    }
    if (!op->ref(io)) return;
    for (int i = 0; i < op->nargs; i++) {
        if (!a[i].output || !a[i].t) continue;
        if (op->report)
            op->report(io, i);
        else
            ompk_verify_report(op->fn, a[i].name, a[i].section, &io->h[i], ref[i], 0, -1,
                               op->tol(io, i));
    }
}

void ompk_verify_run(const ompk_verify_op *op) {
    const int n = op->nargs;
    if (n < 0 || n > OMPK_VERIFY_MAX_ARGS) return;
    ompk_tensor h[OMPK_VERIFY_MAX_ARGS];
    void *own[OMPK_VERIFY_MAX_ARGS];
    double *d[OMPK_VERIFY_MAX_ARGS], *ref[OMPK_VERIFY_MAX_ARGS];
    int64_t ref_n[OMPK_VERIFY_MAX_ARGS];
    memset(h, 0, sizeof h);
    memset(own, 0, sizeof own);
    memset(d, 0, sizeof d);
    memset(ref, 0, sizeof ref);
    memset(ref_n, 0, sizeof ref_n);
    int ok = 1;
    for (int i = 0; i < n && ok; i++)
        if (op->args[i].t) ok = ompk_host_view(op->args[i].t, &h[i], &own[i]) == OMPK_OK;
    if (ok && ompk_trace_enabled())
        for (int i = 0; i < n; i++)
            if (op->args[i].t && op->args[i].traced)
                ompk_trace_tensor(op->fn, op->args[i].name, &h[i]);
    if (ok && ompk_verify_enabled()) {
        ompk_verify_io io = {op->fn, op->args, h, d, ref, ref_n, op->ctx};
        verify_outputs(op, &io, d, ref, ref_n);
    }
    for (int i = 0; i < n; i++) {
        free(d[i]);
        free(ref[i]);
        ompk_host_view_free(own[i]);
    }
}
