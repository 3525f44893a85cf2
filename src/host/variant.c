/* The selector: OMPK_VARIANT and OMPK_ISA read once per process, the per-thread test hook, and
 * the pick over an op's implementation list (variant.h). */
#include "variant.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "scratch.h"

/* Each family's impl file defines its tables; a family left out of the build leaves them NULL. */
#define OMPK_TABLE(sym) extern const ompk_impl_list sym __attribute__((weak));
OMPK_TABLE(ompk_impls_mhc_pre_fwd)
OMPK_TABLE(ompk_impls_mhc_pre_bwd)
OMPK_TABLE(ompk_impls_mhc_sinkhorn_fwd)
OMPK_TABLE(ompk_impls_mhc_sinkhorn_bwd)
OMPK_TABLE(ompk_impls_mhc_post_fwd)
OMPK_TABLE(ompk_impls_mhc_post_bwd)
OMPK_TABLE(ompk_impls_attention_fwd)
OMPK_TABLE(ompk_impls_attention_bwd)
OMPK_TABLE(ompk_impls_router_fwd)
OMPK_TABLE(ompk_impls_router_bwd)
OMPK_TABLE(ompk_impls_moe)
#undef OMPK_TABLE

static const struct {
    const char *name;
    const ompk_impl_list *table;
} ops[OMPK_OP_COUNT_] = {
    [OMPK_OP_MHC_PRE_FWD] = {"mhc_pre_fwd", &ompk_impls_mhc_pre_fwd},
    [OMPK_OP_MHC_PRE_BWD] = {"mhc_pre_bwd", &ompk_impls_mhc_pre_bwd},
    [OMPK_OP_MHC_SINKHORN_FWD] = {"mhc_sinkhorn_fwd", &ompk_impls_mhc_sinkhorn_fwd},
    [OMPK_OP_MHC_SINKHORN_BWD] = {"mhc_sinkhorn_bwd", &ompk_impls_mhc_sinkhorn_bwd},
    [OMPK_OP_MHC_POST_FWD] = {"mhc_post_fwd", &ompk_impls_mhc_post_fwd},
    [OMPK_OP_MHC_POST_BWD] = {"mhc_post_bwd", &ompk_impls_mhc_post_bwd},
    [OMPK_OP_ATTENTION_FWD] = {"attention_fwd", &ompk_impls_attention_fwd},
    [OMPK_OP_ATTENTION_BWD] = {"attention_bwd", &ompk_impls_attention_bwd},
    [OMPK_OP_ROUTER_FWD] = {"router_fwd", &ompk_impls_router_fwd},
    [OMPK_OP_ROUTER_BWD] = {"router_bwd", &ompk_impls_router_bwd},
    [OMPK_OP_MOE] = {"moe", &ompk_impls_moe},
};

ompk_impl_list ompk_impl_table(ompk_op op) {
    const ompk_impl_list none = {NULL, 0};
    if ((unsigned)op >= (unsigned)OMPK_OP_COUNT_ || !ops[op].table) return none;
    return *ops[op].table;
}

const char *ompk_op_name(ompk_op op) {
    return (unsigned)op < (unsigned)OMPK_OP_COUNT_ ? ops[op].name : "?";
}

int ompk_impl_available(const ompk_impl *e) {
    return !e->available || e->available();
}

static int op_find(const char *name, size_t len) {
    for (int o = 0; o < OMPK_OP_COUNT_; o++)
        if (strlen(ops[o].name) == len && strncmp(ops[o].name, name, len) == 0) return o;
    return -1;
}

static int impl_find(ompk_op op, const char *name, size_t len) {
    const ompk_impl_list t = ompk_impl_table(op);
    for (int i = 0; i < t.count; i++)
        if (strlen(t.impl[i].name) == len && strncmp(t.impl[i].name, name, len) == 0) return i;
    return -1;
}

/* "a, b, c" into out: the op names of this build, or the entry names of op */
static void list_names(int op, char *out, size_t len) {
    size_t used = 0;
    out[0] = '\0';
    const int count = op < 0 ? OMPK_OP_COUNT_ : ompk_impl_table((ompk_op)op).count;
    for (int i = 0; i < count; i++) {
        const char *nm;
        if (op < 0) {
            if (ompk_impl_table((ompk_op)i).count == 0) continue;
            nm = ops[i].name;
        } else
            nm = ompk_impl_table((ompk_op)op).impl[i].name;
        int w = snprintf(out + used, len - used, "%s%s", used ? ", " : "", nm);
        if (w < 0 || (size_t)w >= len - used) return;
        used += (size_t)w;
    }
}

ompk_status ompk_variant_parse(const char *spec, const char *isa, int chosen[OMPK_OP_COUNT_],
                               char *err, size_t errlen) {
    char names[512];
    for (int o = 0; o < OMPK_OP_COUNT_; o++) chosen[o] = -1;
    const char *p = spec ? spec : "";
    while (*p) {
        const char *end = strchr(p, ',');
        const size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *colon = memchr(p, ':', len);
        if (len == 0) { /* tolerate "a:b," and ",a:b" */
            p += end ? 1 : 0;
            continue;
        }
        if (!colon) {
            list_names(-1, names, sizeof names);
            snprintf(err, errlen, "OMPK_VARIANT: '%.*s' is not op:name (ops: %s)", (int)len, p,
                     names);
            return OMPK_ERR_INVALID_ARGUMENT;
        }
        const int op = op_find(p, (size_t)(colon - p));
        if (op < 0 || ompk_impl_table((ompk_op)op).count == 0) {
            list_names(-1, names, sizeof names);
            snprintf(err, errlen, "OMPK_VARIANT: unknown op '%.*s' in '%.*s' (ops: %s)",
                     (int)(colon - p), p, (int)len, p, names);
            return OMPK_ERR_INVALID_ARGUMENT;
        }
        const size_t nlen = len - (size_t)(colon + 1 - p);
        const int i = impl_find((ompk_op)op, colon + 1, nlen);
        if (i < 0) {
            list_names(op, names, sizeof names);
            snprintf(err, errlen, "OMPK_VARIANT: unknown %s variant '%.*s' (%s: %s)", ops[op].name,
                     (int)nlen, colon + 1, ops[op].name, names);
            return OMPK_ERR_INVALID_ARGUMENT;
        }
        if (chosen[op] >= 0 && chosen[op] != i) {
            snprintf(err, errlen, "OMPK_VARIANT: %s named twice ('%s' and '%s')", ops[op].name,
                     ompk_impl_table((ompk_op)op).impl[chosen[op]].name,
                     ompk_impl_table((ompk_op)op).impl[i].name);
            return OMPK_ERR_INVALID_ARGUMENT;
        }
        chosen[op] = i;
        p += len + (end ? 1 : 0);
    }
    if (isa && *isa && strcmp(isa, "auto") != 0) {
        const int i = impl_find(OMPK_OP_MOE, isa, strlen(isa));
        if (i < 0) {
            list_names(OMPK_OP_MOE, names, sizeof names);
            snprintf(err, errlen, "OMPK_ISA: unknown value '%s' (%s or auto)", isa, names);
            return OMPK_ERR_INVALID_ARGUMENT;
        }
        if (chosen[OMPK_OP_MOE] >= 0 && chosen[OMPK_OP_MOE] != i) {
            snprintf(err, errlen, "OMPK_ISA=%s and OMPK_VARIANT=moe:%s disagree", isa,
                     ompk_impl_table(OMPK_OP_MOE).impl[chosen[OMPK_OP_MOE]].name);
            return OMPK_ERR_INVALID_ARGUMENT;
        }
        chosen[OMPK_OP_MOE] = i;
    }
    return OMPK_OK;
}

/* ---- the process-wide selection ---- */

static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static int env_chosen[OMPK_OP_COUNT_];
static char env_err[768];
static int env_bad;

#ifdef OMPK_LAB
static const char *const knob_env[OMPK_KNOB_COUNT_] = {"OMPK_MHC_PRE_TCW_TEAMS",
                                                       "OMPK_MHC_POST_THREADS"};
static int64_t env_knob[OMPK_KNOB_COUNT_];
#endif

/* The per-family selectors OMPK_VARIANT replaced, and outside lab builds the lab knobs: set, they
 * are an error naming the replacement, so that a script written for them does not silently run
 * the default. */
static const struct {
    const char *env, *use;
} removed[] = {
    {"OMPK_MHC_PRE_VARIANT",
     "use OMPK_VARIANT=mhc_pre_fwd:<name> (ompk-info --variants lists the names)"},
    {"OMPK_MHC_PRE_BWD_VARIANT",
     "use OMPK_VARIANT=mhc_pre_bwd:<name> (ompk-info --variants lists the names)"},
    {"OMPK_MHC_SK_VARIANT",
     "use OMPK_VARIANT=mhc_sinkhorn_bwd:<name> (ompk-info --variants lists the names)"},
    {"OMPK_MHC_POST_VARIANT",
     "use OMPK_VARIANT=mhc_post_fwd:<name> (ompk-info --variants lists the names)"},
    {"OMPK_ATTN_VARIANT", "use OMPK_VARIANT=attention_fwd:<name>,attention_bwd:<name> (ompk-info "
                          "--variants lists the names)"},
    {"OMPK_ROUTER_VARIANT",
     "use OMPK_VARIANT=router_fwd:<name> (ompk-info --variants lists the names)"},
    {"OMPK_MHC_PRE_TCW_RING", "use OMPK_VARIANT=mhc_pre_fwd:tc-wide-ring2 in a lab build "
                              "(ompk-info --variants lists the names)"},
#ifndef OMPK_LAB
    {"OMPK_MHC_PRE_TCW_TEAMS", "a benchmark knob of lab builds (-DOMPK_LAB=ON)"},
    {"OMPK_MHC_POST_THREADS", "a benchmark knob of lab builds (-DOMPK_LAB=ON)"},
#endif
};

static void env_read(void) {
#ifdef OMPK_LAB
    for (int k = 0; k < OMPK_KNOB_COUNT_; k++) {
        const char *v = getenv(knob_env[k]);
        env_knob[k] = v && *v ? strtoll(v, NULL, 10) : 0;
    }
#endif
    env_bad = ompk_variant_parse(getenv("OMPK_VARIANT"), getenv("OMPK_ISA"), env_chosen, env_err,
                                 sizeof env_err) != OMPK_OK;
    for (size_t i = 0; i < sizeof removed / sizeof removed[0] && !env_bad; i++) {
        const char *v = getenv(removed[i].env);
        if (!v) continue;
        snprintf(env_err, sizeof env_err, "%s=%s: this variable is not read: %s", removed[i].env, v,
                 removed[i].use);
        env_bad = 1;
    }
}

const char *ompk_variant_env_error(void) {
    pthread_once(&env_once, env_read);
    return env_bad ? env_err : NULL;
}

/* entry index + 1 named by ompk_variant_force on this thread (0: none) */
static _Thread_local int forced[OMPK_OP_COUNT_];
/* the entry that ran this thread's last call of each op, for benchmark records */
static _Thread_local const ompk_impl *last_ran[OMPK_OP_COUNT_];

#ifdef OMPK_LAB
static _Thread_local int64_t forced_knob[OMPK_KNOB_COUNT_];

int64_t ompk_variant_knob(ompk_knob k) {
    pthread_once(&env_once, env_read);
    return forced_knob[k] ? forced_knob[k] : env_knob[k];
}

void ompk_variant_knob_force(ompk_knob k, int64_t value) {
    forced_knob[k] = value;
}
#endif

ompk_status ompk_variant_force(const char *op, const char *name) {
    const int o = op ? op_find(op, strlen(op)) : -1;
    if (o < 0 || ompk_impl_table((ompk_op)o).count == 0)
        return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, "ompk_variant_force", "unknown op '%s'",
                         op ? op : "(null)");
    if (!name) {
        forced[o] = 0;
        return OMPK_OK;
    }
    const int i = impl_find((ompk_op)o, name, strlen(name));
    if (i < 0) {
        char names[512];
        list_names(o, names, sizeof names);
        return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, "ompk_variant_force",
                         "unknown %s variant '%s' (%s: %s)", op, name, op, names);
    }
    forced[o] = i + 1;
    return OMPK_OK;
}

const char *ompk_variant_ran(const char *op) {
    const int o = op ? op_find(op, strlen(op)) : -1;
    return o >= 0 && last_ran[o] ? last_ran[o]->name : NULL;
}

const ompk_impl *ompk_variant_list(const char *op, int i) {
    const int o = op ? op_find(op, strlen(op)) : -1;
    if (o < 0) return NULL;
    const ompk_impl_list t = ompk_impl_table((ompk_op)o);
    return i >= 0 && i < t.count ? &t.impl[i] : NULL;
}

ompk_status ompk_variant_selected(ompk_op op, const char *fn, const ompk_impl **named) {
    *named = NULL;
    const char *bad = ompk_variant_env_error();
    if (bad) return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "%s", bad);
    const ompk_impl_list t = ompk_impl_table(op);
    const int i = forced[op] ? forced[op] - 1 : env_chosen[op];
    if (i >= 0 && i < t.count) *named = &t.impl[i];
    return OMPK_OK;
}

static int impl_serves(const ompk_impl *e, const void *args) {
    return ompk_impl_available(e) && (!e->ok || e->ok(args));
}

ompk_status ompk_impl_run_entry(const ompk_impl *e, const void *args, ompk_device device,
                                const char *fn) {
    const int64_t bytes = e->workspace ? e->workspace(args) : 0;
    void *ws = NULL;
    if (bytes > 0) {
        ws = ompk_scratch_alloc(device, (size_t)bytes);
        if (!ws)
            return ompk_fail(OMPK_ERR_OUT_OF_MEMORY, fn, "workspace of %lld bytes",
                             (long long)bytes);
    }
    const ompk_status st = e->run(args, ws);
    if (ws) ompk_scratch_free(device, ws);
    return st;
}

ompk_status ompk_impl_pick(ompk_op op, const void *args, const char *fn, const ompk_impl **pick) {
    const ompk_impl *named;
    *pick = NULL;
    const ompk_status st = ompk_variant_selected(op, fn, &named);
    if (st != OMPK_OK) return st;
    if (named && impl_serves(named, args)) {
        *pick = named;
        return OMPK_OK;
    }
    const ompk_impl_list t = ompk_impl_table(op);
    for (int i = 0; i < t.count && !*pick; i++) {
        const ompk_impl *e = &t.impl[i];
        if (!e->named_only && e != named && impl_serves(e, args)) *pick = e;
    }
    return OMPK_OK;
}

ompk_status ompk_impl_run(ompk_op op, const void *args, ompk_device device, const char *fn,
                          const ompk_impl **ran) {
    const ompk_impl *named;
    ompk_status st = ompk_variant_selected(op, fn, &named);
    if (st != OMPK_OK) return st;
    if (named && impl_serves(named, args)) {
        st = ompk_impl_run_entry(named, args, device, fn);
        if (st != OMPK_ERR_UNSUPPORTED) {
            if (ran) *ran = named;
            last_ran[op] = named;
            return st;
        }
    }
    const ompk_impl_list t = ompk_impl_table(op);
    for (int i = 0; i < t.count; i++) {
        const ompk_impl *e = &t.impl[i];
        if (e->named_only || e == named || !impl_serves(e, args)) continue;
        st = ompk_impl_run_entry(e, args, device, fn);
        if (st != OMPK_ERR_UNSUPPORTED) {
            if (ran) *ran = e;
            last_ran[op] = e;
            return st;
        }
    }
    return ompk_fail(OMPK_ERR_UNSUPPORTED, fn, "no %s implementation serves this call",
                     ompk_op_name(op));
}
