/* Bad inputs generated from the op descriptors (op_cases.h), for every public call that takes
 * tensors, on every device: starting from a valid case, each argument in turn is made NULL
 * (where required), given NULL data, one rank more and one less, an unsupported dtype, one more
 * element in each dim another argument shares, a negative stride, a zero stride (outputs:
 * overlapping itself), the memory of every other argument (outputs), another device and a device
 * that does not exist; index data one past either end of its range; and each symbol of the
 * shapes made huge in every argument at once (sizes that overflow). Each call must return an
 * error with a message, leave every output's poison and the call's state (a MoE layer's cache)
 * as they were. Last, the valid case itself must succeed and write its outputs, so that no
 * rejection above comes from a broken case. The hand-written *_bad suites keep the scalar
 * parameters and the cases specific to one call. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "op_cases.h"

typedef struct gen {
    tu_op_case *c;
    ompk_tensor m[TU_OP_MAX_ARGS];
    ompk_tensor *p[TU_OP_MAX_ARGS];
    int tried;
} gen;

static void reset(gen *g) {
    for (int i = 0; i < g->c->op->nargs; i++) {
        g->m[i] = g->c->t[i];
        g->p[i] = &g->m[i];
    }
}

/* index: the mutation is index data (outputs zeroed where the op's contract says so) */
static void expect_rejected_as(gen *g, const char *arg, const char *what, int index) {
    tu_op_case *c = g->c;
    ompk_clear_error();
    const ompk_status st = c->op->call(c, g->p);
    const char *dev = tu_device_name(c->dev);
    cr_expect_neq(st, OMPK_OK, "%s on %s: %s %s accepted", c->op->name, dev, arg, what);
    cr_expect(strlen(ompk_last_error()) > 0, "%s on %s: %s %s: no message", c->op->name, dev, arg,
              what);
    if (index && c->op->index_zeroes) {
        cr_expect_eq(st, OMPK_ERR_INDEX_OUT_OF_RANGE, "%s on %s: %s %s: %s", c->op->name, dev, arg,
                     what, ompk_status_str(st));
        cr_expect(tu_op_outputs_zero(c), "%s on %s: %s %s: outputs not zeroed", c->op->name, dev,
                  arg, what);
        tu_op_poison(c);
    } else {
        cr_expect(tu_op_outputs_poisoned(c), "%s on %s: %s %s: an output was written", c->op->name,
                  dev, arg, what);
    }
    if (c->op->state_same)
        cr_expect(c->op->state_same(c), "%s on %s: %s %s: state changed", c->op->name, dev, arg,
                  what);
    g->tried++;
    reset(g);
}

static void expect_rejected(gen *g, const char *arg, const char *what) {
    expect_rejected_as(g, arg, what, 0);
}

static void mutate_arg(gen *g, int i) {
    const tu_op_arg *a = &g->c->op->args[i];
    ompk_tensor *t = &g->m[i];
    const int nd = t->ndim;
    char what[64];
    if (!a->optional) {
        g->p[i] = NULL;
        expect_rejected(g, a->name, "NULL");
    }
    t->data = NULL;
    expect_rejected(g, a->name, "with NULL data");
    if (nd < OMPK_MAX_NDIM) {
        t->shape[nd] = 1, t->strides[nd] = 1, t->ndim = nd + 1;
        expect_rejected(g, a->name, "one rank more");
    }
    if (nd > 0) {
        t->ndim = nd - 1;
        expect_rejected(g, a->name, "one rank less");
    }
    t->dtype = a->dtype == OMPK_F32 || a->dtype == OMPK_BF16 ? OMPK_F16 : OMPK_F32;
    expect_rejected(g, a->name, "of an unsupported dtype");
    for (int d = 0; d < nd; d++) {
        if (tu_op_dim_shared(g->c->op, i, d)) {
            t->shape[d]++;
            snprintf(what, sizeof what, "with dim %d one larger", d);
            expect_rejected(g, a->name, what);
        }
        if (t->shape[d] > 1) {
            t->strides[d] = -t->strides[d];
            snprintf(what, sizeof what, "with a negative stride in dim %d", d);
            expect_rejected(g, a->name, what);
            if (a->out) {
                t->strides[d] = 0;
                snprintf(what, sizeof what, "with stride 0 in dim %d (overlapping itself)", d);
                expect_rejected(g, a->name, what);
            }
        }
    }
    if (a->out)
        for (int j = 0; j < g->c->op->nargs; j++) {
            if (j == i || g->c->buf[j].bytes == 0) continue;
            if (ompk_device_equal(g->c->t[j].device, t->device) == 0) continue;
            t->data = g->c->t[j].data;
            snprintf(what, sizeof what, "over %s", g->c->op->args[j].name);
            expect_rejected(g, a->name, what);
        }
    t->device = t->device.type == OMPK_HOST ? ompk_device_target(0) : ompk_device_host();
    expect_rejected(g, a->name, "on another device");
    t->device = ompk_device_target(99);
    expect_rejected(g, a->name, "on a device that does not exist");
}

/* index data one past each end of its range, in one element */
static void mutate_index(gen *g, int i) {
    const tu_op_arg *a = &g->c->op->args[i];
    tu_buf *b = &g->c->buf[i];
    if (a->out || !a->index_hi || b->numel == 0) return;
    const double keep = tu_buf_get(b, b->numel / 2);
    const int64_t bad[2] = {g->c->index_hi[i], a->index_lo - 1};
    for (int k = 0; k < 2; k++) {
        tu_buf_set(b, b->numel / 2, (double)bad[k]);
        tu_buf_upload(b);
        expect_rejected_as(
            g, a->name, k ? "holding an index below its range" : "holding an index past its range",
            1);
    }
    tu_buf_set(b, b->numel / 2, keep);
    tu_buf_upload(b);
}

/* symbol s at 2^40 in every argument that has it */
static void mutate_huge(gen *g, char s) {
    const tu_op_spec *op = g->c->op;
    int any = 0;
    for (int i = 0; i < op->nargs; i++)
        for (int d = 0; op->args[i].dims[d]; d++)
            if (op->args[i].dims[d] == s) {
                g->m[i].shape[d] = (int64_t)1 << 40;
                any = 1;
            }
    char what[64];
    snprintf(what, sizeof what, "symbol %c = 2^40 in every argument", s);
    if (any)
        expect_rejected(g, "", what);
    else
        reset(g);
}

static void run_op(const tu_op_spec *op) {
    ompk_device devs[4];
    const int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++) {
        tu_op_case c;
        cr_assert(tu_op_case_new(op, devs[di], &c), "%s on %s: the valid case: %s", op->name,
                  tu_device_name(devs[di]), ompk_last_error());
        gen g = {.c = &c};
        reset(&g);
        if (op->host_tensors && devs[di].type != OMPK_HOST) { /* GPU tensors are refused */
            const ompk_status st = op->call(&c, g.p);
            cr_expect_eq(st, OMPK_ERR_DEVICE_MISMATCH, "%s on %s: %s", op->name,
                         tu_device_name(devs[di]), ompk_status_str(st));
            cr_expect(tu_op_outputs_poisoned(&c), "%s on %s: refused call wrote", op->name,
                      tu_device_name(devs[di]));
            tu_op_case_free(&c);
            continue;
        }
        for (int i = 0; i < op->nargs; i++) {
            mutate_arg(&g, i);
            mutate_index(&g, i);
        }
        for (const char *s = op->syms; *s; s++)
            if (*s != ' ' && (*s < '0' || *s > '9')) mutate_huge(&g, *s);
        cr_expect_gt(g.tried, 10, "%s: %d bad calls", op->name, g.tried);
        printf("bad_generated: %s on %s: %d bad calls rejected\n", op->name,
               tu_device_name(devs[di]), g.tried);
        /* the valid case succeeds and writes */
        const ompk_status st = op->call(&c, g.p);
        cr_expect_eq(st, OMPK_OK, "%s on %s: the valid case failed: %s", op->name,
                     tu_device_name(devs[di]), ompk_last_error());
        cr_expect(!tu_op_outputs_poisoned(&c), "%s on %s: the valid case wrote nothing", op->name,
                  tu_device_name(devs[di]));
        tu_op_case_free(&c);
    }
}

/* every call whose name contains one of the words */
static void run_ops(const char *w1, const char *w2) {
    int n = 0;
    for (int i = 0; i < tu_op_count(); i++) {
        const char *name = tu_op_get(i)->name;
        if (strstr(name, w1) || (w2 && strstr(name, w2))) {
            run_op(tu_op_get(i));
            n++;
        }
    }
    cr_expect_gt(n, 0, "no call matches %s", w1);
}

#if OMPK_HAVE_ROUTER
Test(bad_generated, router) {
    run_ops("_router_", NULL);
}
#endif
#if OMPK_HAVE_MHC
Test(bad_generated, mhc) {
    run_ops("_mhc_", "_sinkhorn_");
}
#endif
#if OMPK_HAVE_ATTENTION
Test(bad_generated, attention) {
    run_ops("_attention_", NULL);
}
#endif
#if OMPK_HAVE_MOE
Test(bad_generated, moe) {
    run_ops("_moe_", NULL);
}
#endif
