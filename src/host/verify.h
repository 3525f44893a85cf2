/* Internal: OMPK_VERIFY / OMPK_TRACE support and host-side element access.
 *
 * Verify mode: after a kernel ran, the entry point copies inputs and outputs to the host, runs
 * the reference (double accumulation) and reports, per output and per named section, one line:
 *   ompk verify <fn> <output>[<section>] n=.. max_abs=.. max_rel=.. mismatches=.. tol=(a,r)
 * OK|MISMATCH Trace mode prints per-stage norms: ompk trace <fn> <stage> n=.. l2=.. max_abs=..
 * nonfinite=..  */
#ifndef OMPK_VERIFY_H
#define OMPK_VERIFY_H

#include <stdint.h>

#include "ompk/tensor.h"

typedef struct ompk_tol {
    double atol;
    double rtol;
    /* isolated quantisation flips (an operand within fp32 noise of a rounding boundary rounds the
     * other way in the reference): up to max(2, n / flip_div) elements may reach flip_mult times
     * the band; 0 allows none */
    double flip_mult;
    int64_t flip_div;
} ompk_tol;

int ompk_verify_enabled(void); /* OMPK_VERIFY=1 */
int ompk_trace_enabled(void);  /* OMPK_TRACE=1 */
/* Tests: verify and trace mode for the calling thread's later calls, over the environment
 * (1 on, 0 off, -1 back to OMPK_VERIFY / OMPK_TRACE). */
void ompk_verify_force(int verify, int trace);

/* A host copy of t: *host gets the same shape/strides over a fresh host buffer holding t's
 * whole span (*owned, release with ompk_host_view_free). Host tensors are copied too, so a
 * later in-place kernel cannot change the snapshot. */
ompk_status ompk_host_view(const ompk_tensor *t, ompk_tensor *host, void **owned);
void ompk_host_view_free(void *owned);

/* Element of a host tensor at logical row-major index `linear`, as double. */
double ompk_host_get(const ompk_tensor *t, int64_t linear);
/* All of a host tensor as doubles, logical row-major (out holds numel(t)). */
void ompk_host_gather(const ompk_tensor *t, double *out);
/* Element offset (in elements) of logical row-major index `linear`. */
int64_t ompk_tensor_offset(const ompk_tensor *t, int64_t linear);

/* Compare host view `out` against ref (numel doubles, logical row-major). Only elements whose
 * innermost index lies in [col_lo, col_hi) count (col_hi < 0: all). Element passes when
 * |out-ref| <= atol + rtol*|ref|; non-finite out with finite ref always fails. Prints one line,
 * returns the mismatch count. */
int64_t ompk_verify_report(const char *fn, const char *output, const char *section,
                           const ompk_tensor *out, const double *ref, int64_t col_lo,
                           int64_t col_hi, ompk_tol tol);

/* MISMATCH elements reported so far by ompk_verify_report on the calling thread (tests read it
 * around a call). */
int64_t ompk_verify_mismatches(void);
/* Lines ompk_verify_report has printed so far on the calling thread: a test reads it around a
 * call to know that the call compared something, so that zero mismatches cannot be vacuous. */
int64_t ompk_verify_reports(void);

/* Print the norms of a host view (trace mode). */
void ompk_trace_tensor(const char *fn, const char *stage, const ompk_tensor *host);

/* One line for columns [col_lo, col_hi) of out (col_hi < 0: all) at ompk_tol_for(out's dtype,
 * the section's largest |ref|, 1 when that is 0): the band of an output whose magnitude the
 * reference sets. Returns the mismatch count. */
int64_t ompk_verify_report_scaled(const char *fn, const char *output, const char *section,
                                  const ompk_tensor *out, const double *ref, int64_t col_lo,
                                  int64_t col_hi);

/* ---- one verify / trace path for every call ------------------------------------------------ */

/* The most tensors one call hands to ompk_verify_run. */
#define OMPK_VERIFY_MAX_ARGS 20

/* One tensor of a call under verify / trace. */
typedef struct ompk_verify_arg {
    const char *name;
    const ompk_tensor *t; /* NULL: absent (no snapshot, trace line or report) */
    int traced;           /* trace mode prints its norms */
    int output;           /* gets a reference array and, when present, a report */
    /* outputs: elements of the reference array, allocated even when t is absent (for references
     * that always write it); 0: numel of t, none when t is absent */
    int64_t ref_numel;
    const char *section; /* outputs: the default report's section, or NULL */
} ompk_verify_arg;

/* What the callbacks see, indexed like the op's args. */
typedef struct ompk_verify_io {
    const char *fn;
    const ompk_verify_arg *args;
    const ompk_tensor *h; /* host views (zeroed where absent) */
    double *const *d;     /* with gather: each present tensor as logical row-major doubles */
    double *const *ref;   /* outputs' reference arrays (zeroed), NULL elsewhere */
    const int64_t *ref_n; /* their lengths */
    const void *ctx;      /* the op's */
} ompk_verify_io;

/* A call's verify description, filled by its API file. */
typedef struct ompk_verify_op {
    const char *fn; /* the name in the verify / trace lines */
    const ompk_verify_arg *args;
    int nargs;
    int gather;      /* fill io->d before the reference runs */
    const void *ctx; /* the call's parameters, for the callbacks */
    /* fills io->ref from the views; returns 0 to skip the reports */
    int (*ref)(const ompk_verify_io *io);
    /* the band of present output i (default report) */
    ompk_tol (*tol)(const ompk_verify_io *io, int i);
    /* NULL: one line per present output, its section and tol; else this prints output i's */
    void (*report)(const ompk_verify_io *io, int i);
} ompk_verify_op;

/* After a kernel ran, in verify or trace mode: host snapshots of the present args, a trace line
 * per traced arg (trace mode), then (verify mode) the reference and one report per present
 * output, in args order. Nothing is printed when a snapshot fails, and "out of memory, skipped"
 * when the reference arrays can't be had. */
void ompk_verify_run(const ompk_verify_op *op);

/* A tol callback: ompk_tol_for(output's dtype, its largest |ref|, 1 when that is 0). */
ompk_tol ompk_verify_tol_ref_max(const ompk_verify_io *io, int i);

#endif
