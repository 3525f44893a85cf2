/* Op descriptors for the suites: every public call that takes tensors, with each argument's role
 * (input or output, optional or required), dims (one symbol per dim, sizes in the op's symbol
 * table), dtype (fixed, or following one of the case's dtype groups), index range, the shapes the
 * reference driver runs, a builder of a valid case on a device (seeded random inputs, outputs
 * poisoned) and the call through an array of argument pointers. test_bad_generated.c derives the
 * bad inputs from them, test_ops.c runs every op x device x implementation x dtype x shape in
 * verify mode against the reference. */
#ifndef OMPK_TEST_OP_CASES_H
#define OMPK_TEST_OP_CASES_H

#include "ompk/ompk.h"
#include "test_util.h"

#define TU_OP_MAX_ARGS 20
#define TU_OP_MAX_SETS 12
#define TU_OP_GROUPS 3

typedef struct tu_op_arg {
    const char *name;
    int out;          /* written by the call */
    int optional;     /* NULL is a valid value */
    int host;         /* a host tensor whatever the case's device (MoE parameter gradients) */
    const char *dims; /* one symbol per dim */
    ompk_dtype dtype; /* a grouped argument's where the case sets none for its group */
    /* index_hi != NULL: integer data, valid in [index_lo, product of index_hi's symbols) */
    int64_t index_lo;
    const char *index_hi;
    int group; /* 1..TU_OP_GROUPS: a float argument whose dtype is the case's dtype of that group */
    double scale; /* random inputs: N(0, scale^2); 0: 0.5 */
} tu_op_arg;

struct tu_op_case;

typedef struct tu_op_spec {
    const char *name;    /* the public call */
    const char *variant; /* its implementation table (variant.h), as OMPK_VARIANT names it */
    int nargs;
    tu_op_arg args[TU_OP_MAX_ARGS];
    /* symbol sizes, "B2 S3 n4 D16"; a symbol that scalar arguments or the layer's config fix is
     * listed in bound (it then counts as shared even where one argument holds it). Symbols that
     * no argument holds are parameters of the call (a mask, a flag, a format). */
    const char *syms;
    const char *bound;
    int (*setup)(struct tu_op_case *c); /* state of the case (a MoE layer); 1 = ok */
    ompk_status (*call)(struct tu_op_case *c, ompk_tensor *const *t);
    int (*state_same)(struct tu_op_case *c); /* 1 when the call changed no state */
    void (*teardown)(struct tu_op_case *c);
    /* an index outside its range is found while the kernel runs: the call returns
     * OMPK_ERR_INDEX_OUT_OF_RANGE with every output zero (the contract's choice) */
    int index_zeroes;
    int host_only;    /* host kernels (MoE): the reference driver runs them on the host only */
    int host_tensors; /* the call takes host tensors only (GPU tensors: OMPK_ERR_DEVICE_MISMATCH) */
    /* the shape sets test_ops runs, each over syms: "n1-8 D1,7,130" is every n in 1..8 with
     * every listed D, with every dtype group f32 and every group bf16; "bf16: ..." in bf16 only
     * (large shapes), "mix: ..." in every mix of the groups, as the first set (a tiny one) */
    const char *sets[TU_OP_MAX_SETS];
    void (*derive)(int64_t *sym);       /* symbols that follow from others (T = B*S) */
    int (*valid)(const int64_t *sym);   /* a combination of a set the call accepts */
    void (*fill)(struct tu_op_case *c); /* inputs the plain random fill cannot give */
    /* after fill: inputs that come from another call (a forward's saved tensors); 1 = ok */
    int (*prepare)(struct tu_op_case *c);
} tu_op_spec;

/* How tu_op_case_make builds a case. */
typedef struct tu_op_opts {
    const char *syms;                   /* concrete sizes over the op's syms ("n3 D7"), or NULL */
    ompk_dtype dtype[TU_OP_GROUPS + 1]; /* per group, [0] unused; 0 entries: the args' dtype */
    uint64_t seed;
    int poison; /* the byte outputs are filled with */
} tu_op_opts;

typedef struct tu_op_case {
    const tu_op_spec *op;
    ompk_device dev;
    tu_buf buf[TU_OP_MAX_ARGS];
    ompk_tensor t[TU_OP_MAX_ARGS];
    int64_t index_hi[TU_OP_MAX_ARGS]; /* index arguments: the resolved upper end */
    int64_t sym[128];
    tu_rng rng;
    int poison;
    void *state;
} tu_op_case;

int tu_op_count(void);
const tu_op_spec *tu_op_get(int i);
/* Builds a valid case of op on dev (opts NULL: the op's syms, every argument of its listed
 * dtype, seed 17, poison 0xA5): 1 on success. */
int tu_op_case_make(const tu_op_spec *op, ompk_device dev, const tu_op_opts *opts, tu_op_case *c);
int tu_op_case_new(const tu_op_spec *op, ompk_device dev, tu_op_case *c);
void tu_op_case_free(tu_op_case *c);
/* 1 when every output's bytes still hold the poison (downloads them) */
int tu_op_outputs_poisoned(tu_op_case *c);
/* 1 when every output is all zero bytes (downloads them) */
int tu_op_outputs_zero(tu_op_case *c);
/* poisons every output again */
void tu_op_poison(tu_op_case *c);
/* 1 when the dim's symbol is fixed by another argument or by a bound symbol, so that changing it
 * in one argument alone makes the call invalid */
int tu_op_dim_shared(const tu_op_spec *op, int arg, int dim);
/* The sizes of a case of op: its syms, then shape's ("n3 D7", may be NULL), then derive. */
void tu_op_syms(const tu_op_spec *op, const char *shape, int64_t *sym);
/* The highest dtype group op's arguments use (0: none). */
int tu_op_groups(const tu_op_spec *op);
/* Shapes of a set (see sets): the count, and shape i as concrete sizes "n3 D7" into out. */
int tu_op_set_count(const char *set);
void tu_op_set_shape(const char *set, int i, char *out, size_t len);

#endif
