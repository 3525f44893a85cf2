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

/* Print the norms of a host view (trace mode). */
void ompk_trace_tensor(const char *fn, const char *stage, const ompk_tensor *host);

#endif
