/* The reference driver: every op of op_cases.h x device (tu_devices; host kernels on the host
 * only) x each entry of its implementation table available here, by name x dtype (the op's dtype
 * groups all f32 and all bf16; every mix of them at the tiny shape) x each shape of its sets, on
 * seeded random inputs with outputs poisoned with NaN bytes, in verify mode: the call must return
 * OMPK_OK, report at least one comparison with the double reference (the bands of
 * src/host/tolerance.h) and no mismatch. A failure names the op, device, implementation, dtype
 * and shape. The family suites keep the edge cases. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "op_cases.h"
#include "test_variant_util.h"
#include "verify.h"

/* One shape of one op on one device in one dtype mix, and the implementations it runs under. */
typedef struct combo {
    const tu_op_spec *op;
    ompk_device dev;
    const char *const *impls; /* NULL entry: the default order */
    int nimpl;
    ompk_dtype dt[TU_OP_GROUPS + 1];
    const char *shape;
    uint64_t seed;
} combo;

static void dtype_label(const combo *k, char *out, size_t len) {
    const int g = tu_op_groups(k->op);
    size_t used = 0;
    out[0] = '\0';
    if (g == 0) snprintf(out, len, "f32 (fixed)");
    for (int i = 1; i <= g && used < len; i++)
        used += (size_t)snprintf(out + used, len - used, "%s%s", i > 1 ? "/" : "",
                                 ompk_dtype_name(k->dt[i]));
}

static int build(const combo *k, tu_op_case *c, const char *label) {
    tu_op_opts o = {k->shape, {0}, k->seed, 0xFF};
    memcpy(o.dtype, k->dt, sizeof o.dtype);
    const int built = tu_op_case_make(k->op, k->dev, &o, c);
    cr_expect(built, "%s: building the case failed: %s", label, ompk_last_error());
    return built;
}

/* The call on c in verify mode under the implementation named (forced by the caller). */
static void verify_call(const combo *k, tu_op_case *c, const char *label) {
    ompk_tensor *p[TU_OP_MAX_ARGS];
    for (int i = 0; i < k->op->nargs; i++) p[i] = &c->t[i];
    const int64_t m0 = ompk_verify_mismatches(), r0 = ompk_verify_reports();
    ompk_verify_force(1, -1);
    const ompk_status st = k->op->call(c, p);
    ompk_verify_force(-1, -1);
    const int64_t mism = ompk_verify_mismatches() - m0, reps = ompk_verify_reports() - r0;
    cr_expect_eq(st, OMPK_OK, "%s: %s (%s)", label, ompk_status_str(st), ompk_last_error());
    if (st == OMPK_OK) {
        cr_expect_gt(reps, 0, "%s: no verify report, nothing was compared", label);
        cr_expect_eq(mism, 0, "%s: %lld elements off the reference (see the MISMATCH lines)", label,
                     (long long)mism);
    }
}

/* Every implementation of k; returns the calls made. The inputs are built once, outputs poisoned
 * again before each call, except where the op picks its implementation at setup (the MoE layer's
 * ISA at create): there the case is built under each. */
static int run_combo(const combo *k) {
    char dts[64], label[384];
    dtype_label(k, dts, sizeof dts);
    const int per_impl = k->op->setup != NULL;
    tu_op_case c;
    int calls = 0;
    for (int ii = 0; ii < k->nimpl; ii++) {
        const char *impl = k->impls[ii];
        snprintf(label, sizeof label, "%s on %s, impl %s, dtype %s, shape %s", k->op->name,
                 tu_device_name(k->dev), impl ? impl : "default", dts, k->shape);
        if (impl) tu_force(k->op->variant, impl);
        if (per_impl || ii == 0) {
            if (!build(k, &c, label)) {
                tu_op_case_free(&c);
                if (impl) tu_force(k->op->variant, NULL);
                if (per_impl) continue;
                return calls;
            }
        } else {
            tu_op_poison(&c);
        }
        verify_call(k, &c, label);
        calls++;
        if (per_impl || ii == k->nimpl - 1) tu_op_case_free(&c);
        if (impl) tu_force(k->op->variant, NULL);
    }
    return calls;
}

/* Every combination of op; only: one implementation by name instead of the table (NULL: all,
 * skip left out). Returns the calls made. */
static int run_op(const tu_op_spec *op, const char *only, const char *skip) {
    ompk_device devs[4];
    const int nd = tu_devices(devs, 4);
    const char *impls[32];
    int ni = 0;
    if (only) {
        impls[ni++] = only;
    } else {
        /* each available entry by name; the default order picks one of them (a named entry that
         * cannot serve a call runs the default order), so it runs on its own only when the table
         * has no available entry */
        const char *all[32];
        const int na = tu_variants(op->variant, all, 32);
        for (int i = 1; i < na; i++)
            if (!skip || strcmp(all[i], skip) != 0) impls[ni++] = all[i];
        if (ni == 0) impls[ni++] = NULL;
    }
    const int g = tu_op_groups(op);
    int calls = 0;
    for (int si = 0; si < TU_OP_MAX_SETS && op->sets[si]; si++) {
        /* dtype mixes: "mix: ..." (and the first set) every mix of the groups, "bf16: ..." all
         * bf16, the others all f32 and all bf16 */
        const char *set = op->sets[si], *colon = strchr(set, ':');
        const int bf16_only = colon && strncmp(set, "bf16:", 5) == 0;
        const int every = si == 0 || (colon && strncmp(set, "mix:", 4) == 0);
        if (colon) set = colon + 1;
        const int nshape = tu_op_set_count(set);
        const int nmix = every ? 1 << g : (g && !bf16_only ? 2 : 1);
        for (int shi = 0; shi < nshape; shi++) {
            char shape[256];
            tu_op_set_shape(set, shi, shape, sizeof shape);
            if (op->valid) {
                int64_t sym[128];
                tu_op_syms(op, shape, sym);
                if (!op->valid(sym)) continue;
            }
            for (int di = 0; di < nd; di++) {
                if (op->host_only && devs[di].type != OMPK_HOST) continue;
                for (int mix = 0; mix < nmix; mix++) {
                    combo k = {
                        op, devs[di], impls, ni, {0}, shape, (uint64_t)(si * 1000 + shi) + 1};
                    for (int gi = 1; gi <= g; gi++) {
                        const int bf = every ? (mix >> (gi - 1)) & 1 : mix || bf16_only;
                        k.dt[gi] = bf ? OMPK_BF16 : OMPK_F32;
                    }
                    calls += run_combo(&k);
                }
            }
        }
    }
    printf("test_ops: %s: %d calls\n", op->name, calls);
    return calls;
}

/* every op whose public name is `name` (skip: an implementation left to its own test) */
static void run_named(const char *name, const char *only, const char *skip) {
    for (int i = 0; i < tu_op_count(); i++)
        if (strcmp(tu_op_get(i)->name, name) == 0) {
            cr_expect_gt(run_op(tu_op_get(i), only, skip), 0, "%s: no call ran", name);
            return;
        }
    cr_assert_fail("%s has no op descriptor", name);
}

#if OMPK_HAVE_ROUTER
Test(ops, router_topk_fwd) {
    run_named("ompk_router_topk_fwd", NULL, NULL);
}
Test(ops, router_topk_bwd) {
    run_named("ompk_router_topk_bwd", NULL, NULL);
}
#endif
#if OMPK_HAVE_MHC
Test(ops, mhc_post_fwd) {
    run_named("ompk_mhc_post_fwd", NULL, NULL);
}
Test(ops, mhc_post_bwd) {
    run_named("ompk_mhc_post_bwd", NULL, NULL);
}
Test(ops, mhc_sinkhorn_fwd) {
    run_named("ompk_mhc_sinkhorn_fwd", NULL, NULL);
}
Test(ops, mhc_sinkhorn_bwd) {
    run_named("ompk_mhc_sinkhorn_bwd", NULL, NULL);
}
Test(ops, mhc_pre_fwd) {
    run_named("ompk_mhc_pre_fwd", NULL, NULL);
}
Test(ops, mhc_post_pre_fwd) {
    run_named("ompk_mhc_post_pre_fwd", NULL, NULL);
}
Test(ops, mhc_pre_bwd) {
    run_named("ompk_mhc_pre_bwd", NULL, NULL);
}
#endif
#if OMPK_HAVE_ATTENTION
Test(ops, attention_fwd) {
    run_named("ompk_attention_fwd", NULL, NULL);
}
Test(ops, attention_bwd) {
    run_named("ompk_attention_bwd", NULL, NULL);
}
#endif
#if OMPK_HAVE_MOE
/* real AMX has its own test, which says when this CPU cannot run it */
Test(ops, moe_fwd) {
    run_named("ompk_moe_fwd", NULL, "amx");
}
Test(ops, moe_fwd_train) {
    run_named("ompk_moe_fwd_train", NULL, "amx");
}
Test(ops, moe_bwd) {
    run_named("ompk_moe_bwd", NULL, "amx");
}
Test(ops, moe_combine) {
    run_named("ompk_moe_combine", NULL, "amx");
}
Test(ops, moe_amx) {
    if (!ompk_moe_isa_available(OMPK_MOE_ISA_AMX))
        cr_skip_test("ISA amx not available on this CPU: the real AMX tiles are not run here (the "
                     "tile code runs on its emulation in ops::moe_*)");
    run_named("ompk_moe_fwd", "amx", NULL);
    run_named("ompk_moe_fwd_train", "amx", NULL);
    run_named("ompk_moe_bwd", "amx", NULL);
    run_named("ompk_moe_combine", "amx", NULL);
}
#endif
