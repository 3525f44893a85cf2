/* Op descriptors for the suites: every public call that takes tensors, with each argument's role
 * (input or output, optional or required), dims (one symbol per dim, sizes in the op's symbol
 * table), dtype and index range, a builder of a small valid case on a device (outputs poisoned
 * with 0xA5 bytes) and the call through an array of argument pointers. test_bad_generated.c
 * derives the bad inputs from them. */
#ifndef OMPK_TEST_OP_CASES_H
#define OMPK_TEST_OP_CASES_H

#include "ompk/ompk.h"
#include "test_util.h"

#define TU_OP_MAX_ARGS 20

typedef struct tu_op_arg {
    const char *name;
    int out;          /* written by the call */
    int optional;     /* NULL is a valid value */
    int host;         /* a host tensor whatever the case's device (MoE parameter gradients) */
    const char *dims; /* one symbol per dim */
    ompk_dtype dtype;
    int64_t index_lo, index_hi; /* index_hi > 0: integer data, valid in [index_lo, index_hi) */
} tu_op_arg;

struct tu_op_case;

typedef struct tu_op_spec {
    const char *name; /* the public call */
    int nargs;
    tu_op_arg args[TU_OP_MAX_ARGS];
    /* symbol sizes, "B2 S3 n4 D16"; a symbol that scalar arguments or the layer's config fix is
     * listed in bound (it then counts as shared even where one argument holds it) */
    const char *syms;
    const char *bound;
    int (*setup)(struct tu_op_case *c); /* state of the case (a MoE layer); 1 = ok */
    ompk_status (*call)(struct tu_op_case *c, ompk_tensor *const *t);
    int (*state_same)(struct tu_op_case *c); /* 1 when the call changed no state */
    void (*teardown)(struct tu_op_case *c);
    /* an index outside its range is found while the kernel runs: the call returns
     * OMPK_ERR_INDEX_OUT_OF_RANGE with every output zero (the contract's choice) */
    int index_zeroes;
} tu_op_spec;

typedef struct tu_op_case {
    const tu_op_spec *op;
    ompk_device dev;
    tu_buf buf[TU_OP_MAX_ARGS];
    ompk_tensor t[TU_OP_MAX_ARGS];
    int64_t sym[128];
    void *state;
} tu_op_case;

int tu_op_count(void);
const tu_op_spec *tu_op_get(int i);
/* Builds a valid case of op on dev: 1 on success. */
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

#endif
