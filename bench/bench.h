/* ompk-bench: the benchmark matrix. Each bench_<family>.c registers entries with OMPK_BENCH;
 * ompk-bench runs them on the host and on every OpenMP device, times with a host clock around
 * synchronous calls (every ompk call completes before it returns), and writes one JSON record
 * per measurement. The copy bandwidth of the same device, measured at start in the same run,
 * is the memory roofline each record is compared with. */
#ifndef OMPK_BENCH_H
#define OMPK_BENCH_H

#include <stdint.h>
#include <stdio.h>

#include "ompk/ompk.h"

typedef struct ompk_bench_ctx {
    ompk_device dev;         /* where tensors live for this pass */
    const char *backend;     /* "host" or "gpu" */
    int quick;               /* --quick: small shapes, few reps (CI machine) */
    int reps;                /* timed repetitions (median reported) */
    int warmup;              /* untimed repetitions */
    double copy_gbs;         /* device copy bandwidth measured in this run (read+write bytes) */
    double peak_fp32_tflops; /* FP32 FMA peak of this backend (0 = unknown) */
    double peak_bf16_tflops; /* bf16 matrix peak (0 = unknown) */
    const char *filter;      /* substring filter on entry names, NULL = all */
    double fp32_probe;       /* FP32 TFLOP/s the peak probe measured in this pass (0 = none) */
    const char *impl;        /* implementation named for every op (--impl), NULL = none */
} ompk_bench_ctx;

typedef struct ompk_bench_record {
    const char *kernel;  /* e.g. "mhc_post_fwd" */
    const char *dtype;   /* e.g. "bf16" */
    const char *shape;   /* e.g. "B4 S4096 n4 D4096" */
    const char *variant; /* e.g. "portable", "amx"; NULL = default */
    double ms;           /* median time */
    double ms_min;
    double bytes; /* minimal bytes moved (each input read once, each output written once) */
    double flops; /* 0 for memory-bound kernels */
    double extra_mem_bytes; /* workspace beyond inputs/outputs, -1 = not reported */
    const char *peak;       /* which peak flops is compared with: "fp32", "bf16" or NULL */
    const char *extra_json; /* further members, `"key": value, ...`, appended as is; NULL = none */
} ompk_bench_record;

typedef int (*ompk_bench_fn)(ompk_bench_ctx *ctx);

typedef struct ompk_bench_entry {
    const char *name;  /* unique, e.g. "mhc_post_fwd" */
    ompk_bench_fn run; /* returns 0 on success; emits records with ompk_bench_emit */
    int gpu_ok;        /* run when ctx->dev is a target device */
    int host_ok;       /* run on the host */
} ompk_bench_entry;

void ompk_bench_register(const ompk_bench_entry *e);

#define OMPK_BENCH_REGISTER(fn_, name_, host_ok_, gpu_ok_)                                         \
    static void __attribute__((constructor)) ompk_bench_reg_##fn_(void) {                          \
        static const ompk_bench_entry e_ = {name_, fn_, gpu_ok_, host_ok_};                        \
        ompk_bench_register(&e_);                                                                  \
    }

/* Time `call(arg)`: ctx->warmup untimed calls, then ctx->reps timed ones. Returns the median in
 * ms (and the minimum in *min_ms if non-NULL); a negative value when a call returned non-OK
 * (the status message is printed). */
double ompk_bench_time(ompk_bench_ctx *ctx, ompk_status (*call)(void *), void *arg, double *min_ms);

/* Print one line and append one JSON record. */
void ompk_bench_emit(ompk_bench_ctx *ctx, const ompk_bench_record *r);

/* Device buffers filled with reproducible random data (uniform in [-1,1) for floats). */
void *ompk_bench_alloc_random(ompk_bench_ctx *ctx, ompk_dtype dtype, int64_t numel, uint64_t seed);
void ompk_bench_free(ompk_bench_ctx *ctx, void *p);

/* After an entry named implementations of op itself: op back to what --impl named (or to the
 * default order), so the entry's later records run what the pass says. */
void ompk_bench_variant_restore(ompk_bench_ctx *ctx, const char *op);

#endif
