/* Shared pieces of the libFuzzer harnesses: a byte reader, a descriptor builder that allocates
 * exactly what each descriptor claims, and the contract check around a call (a failed call
 * leaves every buffer byte unchanged and sets a message; an OK call leaves its inputs unchanged).
 *
 * Every reader returns 0 once the input is exhausted, and 0 always selects the canonical choice
 * (valid descriptor, contiguous, finite data), so short inputs exercise the kernels and longer
 * ones the validation. */
#ifndef OMPK_FUZZ_COMMON_H
#define OMPK_FUZZ_COMMON_H

#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ompk/ompk.h"

#define FZ_MAX_BUFS 40
#define FZ_MAX_ALLOC ((size_t)1 << 20) /* larger valid spans get NULL data */
#define FZ_SMALL_BUF 64
#define FZ_LIMIT ((int64_t)1 << 62)

typedef struct fz_buf {
    unsigned char *data; /* malloc'd here, freed by fz_end */
    size_t size;
    unsigned char *snap; /* bytes before the call */
    int written;         /* an output view lies in it */
} fz_buf;

typedef struct fz {
    const uint8_t *p;
    size_t n;
    uint64_t rng;
    int nbufs;
    fz_buf bufs[FZ_MAX_BUFS];
} fz;

static fz fz_g;

/* The library's host kernels start OpenMP work on every call; one thread keeps each call cheap
 * and the runs reproducible. */
static inline void fz_init_process(void) {
    omp_set_num_threads(1);
}

#define FZ_INIT                                                                                    \
    int LLVMFuzzerInitialize(int *argc, char ***argv);                                             \
    int LLVMFuzzerInitialize(int *argc, char ***argv) {                                            \
        (void)argc, (void)argv;                                                                    \
        fz_init_process();                                                                         \
        return 0;                                                                                  \
    }                                                                                              \
    int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)

static inline void fz_fail(const char *what) {
    fprintf(stderr, "fuzz contract violated: %s (last error: \"%s\")\n", what, ompk_last_error());
    abort();
}

/* ---- byte reader ------------------------------------------------------------------------- */

static inline void fz_begin(const uint8_t *data, size_t size) {
    fz_g.p = data;
    fz_g.n = size;
    fz_g.nbufs = 0;
    fz_g.rng = 0x9e3779b97f4a7c15ull;
    ompk_clear_error();
}

static inline uint8_t fz_u8(void) {
    if (!fz_g.n) return 0;
    fz_g.n--;
    return *fz_g.p++;
}

static inline uint32_t fz_u32(void) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)fz_u8() << (8 * i);
    return v;
}

/* lo + (byte % (hi - lo + 1)): small ranges only */
static inline int fz_range(int lo, int hi) {
    return lo + (int)(fz_u8() % (unsigned)(hi - lo + 1));
}

static const int64_t fz_special_i64[] = {
    0,
    1,
    -1,
    2,
    3,
    7,
    8,
    9,
    64,
    65,
    256,
    INT_MAX,
    INT_MIN,
    (int64_t)1 << 31,
    (int64_t)1 << 32,
    (int64_t)1 << 23,
    (int64_t)1 << 40,
    ((int64_t)1 << 40) + 1,
    (int64_t)1 << 46,
    (int64_t)1 << 62,
    INT64_MAX,
    INT64_MIN,
    46341,
    65536,
    -2,
};
#define FZ_NSPECIAL ((int)(sizeof fz_special_i64 / sizeof fz_special_i64[0]))

/* An integer parameter: canonical unless the byte asks for an edge value (-1, 0, INT_MIN,
 * 2^31, 2^40, INT64_MAX, ...) or one of `extra` (e.g. N*N, N*N + 1). */
static inline int64_t fz_int(int64_t canonical, int64_t extra0, int64_t extra1) {
    uint8_t b = fz_u8();
    if (b < 200) return canonical;
    if (b < 210) return extra0;
    if (b < 220) return extra1;
    return fz_special_i64[(b - 220) % FZ_NSPECIAL];
}

static const float fz_special_f32[] = {NAN,      -NAN,  INFINITY, -INFINITY, 0.0f,  -0.0f, 3.0e38f,
                                       -3.0e38f, 1e30f, 1e-40f,   1e-20f,    1e20f, -1.0f};
#define FZ_NSPECIAL_F ((int)(sizeof fz_special_f32 / sizeof fz_special_f32[0]))

/* A float parameter: canonical, or an edge value (NaN, inf, 3e38, subnormal, negative). */
static inline float fz_float(float canonical) {
    uint8_t b = fz_u8();
    if (b < 220) return canonical;
    return fz_special_f32[(b - 220) % FZ_NSPECIAL_F];
}

/* ---- buffers --------------------------------------------------------------------------- */

__attribute__((no_sanitize("coverage"))) static inline uint64_t fz_next(void) {
    uint64_t x = fz_g.rng;
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return fz_g.rng = x;
}

__attribute__((no_sanitize("coverage"))) static inline uint16_t fz_to_bf16(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    return (uint16_t)(u >> 16);
}

/* Data of a buffer as `dtype`: floats in [-2, 2) from a seed the input picks, then a few edge
 * values at input-chosen positions; integer types get raw random bytes (harnesses write index
 * tensors themselves). Its per-element loop carries no coverage tracing: data is no branch to
 * learn, and tracing it took a fifth of an attention input's time. */
__attribute__((no_sanitize("coverage"))) static inline void fz_fill(fz_buf *b, ompk_dtype dtype) {
    fz_g.rng ^= (uint64_t)fz_u32() * 0x2545f4914f6cdd1dull + 1;
    if (dtype == OMPK_F32 || dtype == OMPK_BF16) {
        size_t es = dtype == OMPK_F32 ? 4 : 2, n = b->size / es;
        /* malloc'd: aligned for either type (stores, not a memcpy call an element) */
        float *f = (float *)(void *)b->data;
        uint16_t *h = (uint16_t *)(void *)b->data;
        for (size_t i = 0; i < n; i++) {
            float v = (float)((int64_t)(fz_next() >> 40) - (1 << 23)) * (1.0f / (1 << 22));
            if (es == 4)
                f[i] = v;
            else
                h[i] = fz_to_bf16(v);
        }
        int specials = fz_u8() & 3;
        for (int s = 0; s < specials && n; s++) {
            size_t i = fz_u32() % n;
            float v = fz_special_f32[fz_u8() % FZ_NSPECIAL_F];
            if (es == 4)
                memcpy(b->data + 4 * i, &v, 4);
            else {
                uint16_t h = fz_to_bf16(v);
                memcpy(b->data + 2 * i, &h, 2);
            }
        }
    } else {
        for (size_t i = 0; i < b->size; i++) b->data[i] = (unsigned char)fz_next();
    }
}

static inline fz_buf *fz_alloc(size_t bytes) {
    if (fz_g.nbufs >= FZ_MAX_BUFS) return NULL;
    fz_buf *b = &fz_g.bufs[fz_g.nbufs++];
    b->size = bytes;
    b->data = malloc(bytes ? bytes : 1);
    b->snap = NULL;
    b->written = 0;
    if (!b->data) abort();
    return b;
}

/* A host buffer of `bytes` the harness fills itself (index tensors). */
static inline void *fz_raw(size_t bytes) {
    fz_buf *b = fz_alloc(bytes);
    return b ? b->data : NULL;
}

/* ---- descriptors ------------------------------------------------------------------------ */

/* Bytes [0, *bytes) the view claims from its data pointer; 0 when a product leaves
 * [0, FZ_LIMIT) (then *bytes is meaningless). */
static inline int fz_span(const ompk_tensor *t, size_t *bytes) {
    int64_t bits = ompk_dtype_bits(t->dtype);
    if (bits == 0) bits = 32;
    int64_t last = 0, numel = 1;
    *bytes = 0;
    if (t->ndim < 0 || t->ndim > OMPK_MAX_NDIM) return 1;
    for (int d = 0; d < t->ndim; d++) {
        int64_t p;
        if (t->shape[d] < 0 || t->strides[d] < 0) return 0;
        if (__builtin_mul_overflow(numel, t->shape[d], &numel) || numel > FZ_LIMIT) return 0;
        if (t->shape[d] == 0) continue;
        if (__builtin_mul_overflow(t->shape[d] - 1, t->strides[d], &p) ||
            __builtin_add_overflow(last, p, &last) || last > FZ_LIMIT)
            return 0;
        if (__builtin_mul_overflow(t->shape[d], t->strides[d], &p) || p > FZ_LIMIT) return 0;
    }
    if (numel == 0) return 1;
    if (last + 1 > FZ_LIMIT / 64) return 0;
    *bytes = (size_t)(((last + 1) * bits + 7) / 8);
    return 1;
}

static const int32_t fz_bad_dtypes[] = {0, 1, 2, 3, 4, 5, 6, 7, -1, 255, INT_MIN};
static const int32_t fz_bad_ndims[] = {0, 1, 2, 3, 4, 5, 8, 9, -1, INT_MIN, INT_MAX};
static const int32_t fz_bad_ids[] = {0, 1, -1, INT_MAX, INT_MIN};
static const int32_t fz_bad_types[] = {OMPK_HOST, OMPK_TARGET, 2, -1};

static inline void fz_contiguous(ompk_tensor *t) {
    int64_t s = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        t->strides[d] = s;
        /* saturate: a huge dim makes the outer strides huge, never wrapped */
        if (__builtin_mul_overflow(s, t->shape[d] > 0 ? t->shape[d] : 1, &s)) s = INT64_MAX;
    }
}

/* A descriptor of nominal dtype, rank and shape, in *t, possibly mutated by the input (dtype,
 * rank, one dim, strides: padded, zero, overlapping, transposed, huge; NULL data; a bad device;
 * aliasing an earlier buffer), with a host buffer of exactly its span (NULL data when the span
 * is valid but over 1 MiB; a small buffer or NULL when it passes 2^62 bytes). Returns t, or NULL
 * when the input asks for a NULL descriptor. */
static inline ompk_tensor *fz_tensor(ompk_tensor *t, ompk_dtype dtype, int ndim,
                                     const int64_t *shape, int is_output) {
    memset(t, 0, sizeof *t);
    t->dtype = dtype;
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
    fz_contiguous(t);
    t->device = ompk_device_host();
    uint8_t m = fz_u8(), k = m >= 192 ? fz_u8() : 0;
    if (k & 64) return NULL;
    if (k & 1) t->dtype = (ompk_dtype)fz_bad_dtypes[fz_u8() % 11];
    if (k & 2) {
        t->ndim = fz_bad_ndims[fz_u8() % 11];
        if (t->ndim >= 0 && t->ndim <= OMPK_MAX_NDIM) {
            for (int d = ndim; d < t->ndim; d++) t->shape[d] = fz_range(0, 3);
            fz_contiguous(t);
        }
    }
    int nd = t->ndim >= 0 && t->ndim <= OMPK_MAX_NDIM ? t->ndim : 0;
    if ((k & 4) && nd) {
        /* one or two dims: two huge ones make the element count wrap */
        for (int r = 0, nr = 1 + (fz_u8() & 1); r < nr; r++) {
            int d = fz_u8() % nd;
            uint8_t b = fz_u8();
            t->shape[d] = b < 128 ? (int64_t)(b % 20) : fz_special_i64[b % FZ_NSPECIAL];
        }
        fz_contiguous(t);
    }
    if ((k & 8) && nd) {
        int mode = fz_u8() % 6, d = fz_u8() % nd, e = fz_u8() % nd;
        int64_t tmp;
        switch (mode) {
        case 0: /* padded rows */
            for (int i = nd - 2; i >= 0; i--) {
                int64_t s = t->shape[i + 1] > 0 ? t->shape[i + 1] : 1;
                if (__builtin_mul_overflow(t->strides[i + 1], s, &s) ||
                    __builtin_add_overflow(s, fz_range(0, 5), &s))
                    s = INT64_MAX;
                t->strides[i] = s;
            }
            break;
        case 1:
            t->strides[d] = 0;
            break;
        case 2: /* overlapping rows */
            t->strides[d] = t->strides[d] > 1 ? t->strides[d] / 2 : 1;
            break;
        case 3: /* transposed */
            tmp = t->strides[d], t->strides[d] = t->strides[e], t->strides[e] = tmp;
            break;
        case 4:
            t->strides[d] = fz_special_i64[fz_u8() % FZ_NSPECIAL];
            break;
        default:
            for (int i = 0; i < nd; i++) t->strides[i] = fz_range(0, 7);
            break;
        }
    }
    if (k & 32) {
        t->device.type = (ompk_device_type)fz_bad_types[fz_u8() % 4];
        t->device.id = fz_bad_ids[fz_u8() % 5];
    }
    size_t bytes;
    int fits = fz_span(t, &bytes);
    if ((k & 128) && fz_g.nbufs > 0 && fits) {
        /* alias an earlier buffer (an output over an input, or two outputs) where the whole
         * span lies inside it */
        fz_buf *b = &fz_g.bufs[fz_u8() % fz_g.nbufs];
        size_t off = b->size ? (fz_u8() % b->size) & ~(size_t)3 : 0;
        if (bytes <= b->size && off <= b->size - bytes) {
            t->data = b->data + off;
            if (is_output) b->written = 1;
            return t;
        }
    }
    if (fits && bytes > FZ_MAX_ALLOC) {
        /* a valid span too large to allocate here: NULL data, which the call must reject */
        t->data = NULL;
        return t;
    }
    if (!fits) {
        /* a span past 2^62 bytes cannot exist: the call must reject the descriptor, and a
         * sanitizer report from the small buffer is a real finding */
        fz_buf *b = fz_alloc(FZ_SMALL_BUF);
        if (!b) return t;
        fz_fill(b, t->dtype);
        b->written = is_output;
        t->data = (fz_u8() & 1) ? NULL : b->data;
        return t;
    }
    int want_null = (k & 16) || (bytes == 0 && (m & 1));
    if (want_null) {
        t->data = NULL;
        return t;
    }
    fz_buf *b = fz_alloc(bytes);
    if (!b) return t;
    fz_fill(b, t->dtype);
    b->written = is_output;
    t->data = b->data;
    return t;
}

#define fz_in(t, dt, nd, ...) fz_tensor(t, dt, nd, (const int64_t[]){__VA_ARGS__}, 0)
#define fz_out(t, dt, nd, ...) fz_tensor(t, dt, nd, (const int64_t[]){__VA_ARGS__}, 1)

/* A float dtype: f32 or bf16 from one bit. */
static inline ompk_dtype fz_float_dtype(void) {
    return (fz_u8() & 1) ? OMPK_BF16 : OMPK_F32;
}

/* Overwrite the index tensor t (i8, i32 or i64) from its data pointer to the end of its buffer:
 * mostly values in [lo, hi), else -1, hi, INT_MIN, INT_MAX, or a value given by the caller. */
static inline void fz_indices(const ompk_tensor *t, int64_t lo, int64_t hi, int64_t extra) {
    if (!t || !t->data || (t->dtype != OMPK_I32 && t->dtype != OMPK_I64 && t->dtype != OMPK_I8))
        return;
    for (int i = 0; i < fz_g.nbufs; i++) {
        fz_buf *b = &fz_g.bufs[i];
        unsigned char *p = t->data;
        if (p < b->data || p >= b->data + b->size) continue;
        size_t es = t->dtype == OMPK_I8 ? 1 : t->dtype == OMPK_I32 ? 4 : 8;
        size_t n = (size_t)(b->data + b->size - p) / es;
        uint8_t mode = fz_u8();
        for (size_t j = 0; j < n; j++) {
            int64_t v = hi > lo ? lo + (int64_t)(fz_next() % (uint64_t)(hi - lo)) : 0;
            if (mode >= 128 && (fz_next() & 7) == 0) {
                static const int64_t odd[] = {-1, -1, 0, INT_MIN, INT_MAX, -2};
                uint64_t r = fz_next() % 8;
                v = r < 6 ? odd[r] : r == 6 ? hi : extra;
            }
            if (es == 1) {
                p[j] = (unsigned char)(int8_t)v;
            } else if (es == 4) {
                int32_t w = (int32_t)v;
                memcpy(p + 4 * j, &w, 4);
            } else {
                memcpy(p + 8 * j, &v, 8);
            }
        }
        return;
    }
}

/* ---- the call --------------------------------------------------------------------------- */

/* Snapshot every buffer before the call. */
static inline void fz_arm(void) {
    for (int i = 0; i < fz_g.nbufs; i++) {
        fz_buf *b = &fz_g.bufs[i];
        free(b->snap);
        b->snap = malloc(b->size ? b->size : 1);
        if (!b->snap) abort();
        memcpy(b->snap, b->data, b->size);
    }
}

/* The contract after a call: a valid status; a failure sets a message and leaves every byte of
 * every buffer as it was (unless `may_write` names that status as one that documents writes);
 * success leaves every buffer no output lies in unchanged. */
static inline void fz_check(ompk_status st, ompk_status may_write) {
    if ((unsigned)st > (unsigned)OMPK_ERR_RUNTIME) fz_fail("status out of range");
    if (st != OMPK_OK && !ompk_last_error()[0]) fz_fail("failed call left no message");
    for (int i = 0; i < fz_g.nbufs; i++) {
        fz_buf *b = &fz_g.bufs[i];
        if (!b->snap) continue;
        if (st == OMPK_OK || st == may_write) {
            if (b->written) continue;
            if (memcmp(b->snap, b->data, b->size)) fz_fail("an OK call changed an input");
        } else if (memcmp(b->snap, b->data, b->size)) {
            fz_fail("a failed call changed a buffer");
        }
    }
}

static inline void fz_end(void) {
    for (int i = 0; i < fz_g.nbufs; i++) {
        free(fz_g.bufs[i].data);
        free(fz_g.bufs[i].snap);
    }
    fz_g.nbufs = 0;
}

#endif
