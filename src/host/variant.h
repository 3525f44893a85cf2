/* Internal: one implementation list per op and the selector that picks from it.
 *
 * Each op has an ordered table of implementations (oneDNN's impl lists): the most specialised
 * first, the portable kernel last (always correct, always able to serve a validated call). The
 * API layer takes the first entry that is available in this build and on this machine and whose
 * `ok` holds for the call, unless a selection names an entry: OMPK_VARIANT=op:name,... (read once
 * per process), OMPK_ISA for the MoE CPU path, or, in tests and benchmarks, a per-thread
 * ompk_variant_force. A named entry that cannot serve a call leaves the call to the default order.
 * A selection with an unknown op or name makes every call that consults the selector fail with
 * OMPK_ERR_INVALID_ARGUMENT and a message naming the bad token and the valid names. */
#ifndef OMPK_VARIANT_H
#define OMPK_VARIANT_H

#include <stddef.h>
#include <stdint.h>

#include "ompk/moe.h"
#include "ompk/status.h"
#include "ompk/tensor.h"

typedef enum ompk_op {
    OMPK_OP_MHC_PRE_FWD,
    OMPK_OP_MHC_PRE_BWD,
    OMPK_OP_MHC_SINKHORN_FWD,
    OMPK_OP_MHC_SINKHORN_BWD,
    OMPK_OP_MHC_POST_FWD,
    OMPK_OP_MHC_POST_BWD,
    OMPK_OP_ATTENTION_FWD,
    OMPK_OP_ATTENTION_BWD,
    OMPK_OP_ROUTER_FWD,
    OMPK_OP_ROUTER_BWD,
    OMPK_OP_MOE,
    OMPK_OP_COUNT_
} ompk_op;

/* One implementation. args points to the op's own argument struct (its impl file says which). */
typedef struct ompk_impl {
    const char *name;
    int named_only;                         /* taken only when a selection names it */
    int (*available)(void);                 /* this build and machine (NULL: always) */
    int (*ok)(const void *args);            /* serves this call (NULL: always) */
    int64_t (*workspace)(const void *args); /* bytes on the call's device (NULL: none) */
    /* OMPK_OK: done; OMPK_ERR_UNSUPPORTED: declined, nothing written (the next entry runs);
     * anything else: the call's error */
    ompk_status (*run)(const void *args, void *ws);
} ompk_impl;

typedef struct ompk_impl_list {
    const ompk_impl *impl;
    int count;
} ompk_impl_list;

/* The op's table; count 0 when the op's family is not in this build. */
ompk_impl_list ompk_impl_table(ompk_op op);
const char *ompk_op_name(ompk_op op);

/* Runs op on args: picks an entry as above, allocates its workspace on device through the
 * scratch cache, runs it, and on a decline runs the next entry of the default order. fn names
 * the public call in error messages. *ran (may be NULL) gets the entry that ran. */
ompk_status ompk_impl_run(ompk_op op, const void *args, ompk_device device, const char *fn,
                          const ompk_impl **ran);

/* The entry ompk_impl_run would run first for args (*pick NULL: none serves them); an entry that
 * then declines hands over to the next, so this is the entry that runs unless it declines. */
ompk_status ompk_impl_pick(ompk_op op, const void *args, const char *fn, const ompk_impl **pick);

/* Runs entry e (one that serves args) with its workspace: what ompk_impl_run does with the entry
 * it picks, without the decline hand-over. */
ompk_status ompk_impl_run_entry(const ompk_impl *e, const void *args, ompk_device device,
                                const char *fn);

/* The entry a selection names for op (NULL: none) after the process-wide selection has been
 * checked; a bad selection returns OMPK_ERR_INVALID_ARGUMENT with the message recorded for fn. */
ompk_status ompk_variant_selected(ompk_op op, const char *fn, const ompk_impl **named);

/* Whether entry e is available in this build and on this machine. */
int ompk_impl_available(const ompk_impl *e);

#ifdef OMPK_LAB
/* Lab builds: numeric tuning knobs of benchmark sweeps, read once from their environment
 * variables (or forced per thread); 0 = unset, the kernel's default. */
typedef enum ompk_knob {
    OMPK_KNOB_MHC_PRE_TCW_TEAMS, /* OMPK_MHC_PRE_TCW_TEAMS: wide-load GEMM teams aimed at */
    OMPK_KNOB_MHC_POST_THREADS,  /* OMPK_MHC_POST_THREADS: streaming post team size */
    OMPK_KNOB_COUNT_
} ompk_knob;
int64_t ompk_variant_knob(ompk_knob k);
/* Tests and benchmarks: sets knob k for the calling thread (0: back to the environment's). */
void ompk_variant_knob_force(ompk_knob k, int64_t value);
#endif

/* ---- tests, benchmarks and tools: not part of the public API ---- */

/* Names entry `name` of op `op` (op names as in OMPK_VARIANT) for the calling thread's later
 * calls, over any environment selection; name NULL clears it. Unknown names return
 * OMPK_ERR_INVALID_ARGUMENT (message in ompk_last_error) and change nothing. */
ompk_status ompk_variant_force(const char *op, const char *name);
/* The name of the entry that ran the calling thread's last call of op (NULL: none yet, or an
 * unknown op); for benchmark records. */
const char *ompk_variant_ran(const char *op);
/* The i-th entry of op's table (NULL past the end or for an unknown op). */
const ompk_impl *ompk_variant_list(const char *op, int i);
/* Parses a selection as the environment would be (spec: OMPK_VARIANT's value, isa: OMPK_ISA's;
 * either may be NULL) into chosen[op] (entry index, -1 for none). On a bad token returns
 * OMPK_ERR_INVALID_ARGUMENT and writes the message into err. */
ompk_status ompk_variant_parse(const char *spec, const char *isa, int chosen[OMPK_OP_COUNT_],
                               char *err, size_t errlen);
/* The process-wide selection's error message, or NULL when it is valid. */
const char *ompk_variant_env_error(void);

/* MoE tile-kernel tuning of benchmark sweeps, for the object's later forwards (results are
 * bit-identical in every mode). kblock, AMX K-blocking: 0 = the format's default (off for bf16,
 * on for the int formats), 1 = on, -1 = off. prefetch of the weights: 0 = pipelined (the default:
 * each kernel call spreads the prefetch of the next work item's weights, and of its expert's
 * activations when the expert changes, over its k-steps, one line in four, the L2 streamer
 * fetching the rest), 1 = each call prefetches its own tiles a few k-steps ahead, 2 = none
 * (hardware prefetchers only), 3 = pipelined on every line. Out of range:
 * OMPK_ERR_INVALID_ARGUMENT, nothing changed. */
ompk_status ompk_moe_tuning_set(ompk_moe *moe, int kblock, int prefetch);

#endif
