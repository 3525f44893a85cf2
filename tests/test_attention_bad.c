/* Bad inputs of ompk_attention_fwd / _bwd: each returns its documented status with a message and
 * leaves every output (out, lse, dq, dk, dv poisoned beforehand) untouched. */
#include <criterion/criterion.h>

#include "test_attention_common.h"

typedef struct bad_env {
    att_case c;
    ompk_tensor q, k, v, out, lse, dout, dq, dk, dv;
    ompk_tensor *plse; /* fwd lse argument */
    ompk_attention_params p;
    const ompk_attention_params *pp;
} bad_env;

typedef void (*mutate_fn)(bad_env *e);

static void env_reset(bad_env *e) {
    e->q = e->c.tq, e->k = e->c.tk, e->v = e->c.tv, e->out = e->c.tout, e->lse = e->c.tlse;
    e->dout = e->c.tdout, e->dq = e->c.tdq, e->dk = e->c.tdk, e->dv = e->c.tdv;
    e->plse = &e->lse;
    e->p = ompk_attention_params_default();
    e->pp = &e->p;
}

static int outputs_poisoned(bad_env *e) {
    tu_buf *o[] = {&e->c.out, &e->c.lse, &e->c.dq, &e->c.dk, &e->c.dv};
    for (int i = 0; i < 5; i++)
        if (!tu_buf_all_bytes(o[i], 0xA5)) return 0;
    return 1;
}

/* Mutations shared by forward and backward (they touch q, k, v or the params). */
static void m_dh48(bad_env *e) {
    e->q.shape[3] = e->k.shape[3] = e->v.shape[3] = 48;
}
static void m_dh_mismatch(bad_env *e) {
    e->k.shape[3] = 32;
}
static void m_heads(bad_env *e) {
    e->k.shape[1] = e->v.shape[1] = 3;
}
static void m_batch(bad_env *e) {
    e->k.shape[0] = e->v.shape[0] = 1;
}
static void m_v_len(bad_env *e) {
    e->v.shape[2] = 5;
}
static void m_q_stride(bad_env *e) {
    e->q.shape[3] = 32;
    e->q.strides[3] = 2;
    e->k.shape[3] = e->v.shape[3] = e->out.shape[3] = e->dout.shape[3] = 32;
}
static void m_k_dtype(bad_env *e) {
    e->k.dtype = OMPK_BF16;
}
static void m_f16(bad_env *e) {
    e->q.dtype = e->k.dtype = e->v.dtype = e->out.dtype = OMPK_F16;
    e->dout.dtype = e->dq.dtype = e->dk.dtype = e->dv.dtype = OMPK_F16;
}
static void m_rank(bad_env *e) {
    e->q.ndim = 3;
}
static void m_q_null(bad_env *e) {
    e->q.data = NULL;
}
static void m_mask(bad_env *e) {
    e->p.mask = (ompk_attention_mask)7;
}
static void m_scale_nan(bad_env *e) {
    e->p.scale = NAN;
}
static void m_neg_stride(bad_env *e) {
    e->k.strides[2] = -64;
}

/* forward-only */
static void m_out_shape(bad_env *e) {
    e->out.shape[2] = 7;
}
static void m_out_dtype(bad_env *e) {
    e->out.dtype = OMPK_BF16;
}
static void m_out_alias_q(bad_env *e) {
    e->out.data = e->q.data;
}
static void m_lse_dtype(bad_env *e) {
    e->lse.dtype = OMPK_BF16;
}
static void m_lse_shape(bad_env *e) {
    e->lse.shape[2] = 3;
}
static void m_lse_alias_out(bad_env *e) {
    e->lse.data = e->out.data;
}

/* backward-only */
static void m_bwd_no_lse(bad_env *e) {
    e->plse = NULL;
}
static void m_dq_alias_q(bad_env *e) {
    e->dq.data = e->q.data;
}
static void m_dk_alias_dv(bad_env *e) {
    e->dk.data = e->dv.data;
}
static void m_dv_alias_v(bad_env *e) {
    e->dv.data = e->v.data;
}
static void m_dout_shape(bad_env *e) {
    e->dout.shape[1] = 2;
}
static void m_dk_shape(bad_env *e) {
    e->dk.shape[2] = 3;
}
static void m_dq_dtype(bad_env *e) {
    e->dq.dtype = OMPK_BF16;
}
static void m_dq_stride(bad_env *e) {
    e->dq.strides[3] = 2;
}
static void m_overlapping_dq(bad_env *e) {
    e->dq.strides[2] = 1;
}

typedef struct bad_case {
    const char *name;
    mutate_fn f;
    ompk_status want;
} bad_case;

static const bad_case common_cases[] = {
    {"dh 48", m_dh48, OMPK_ERR_INVALID_ARGUMENT},
    {"dh mismatch", m_dh_mismatch, OMPK_ERR_INVALID_ARGUMENT},
    {"Hq % Hkv", m_heads, OMPK_ERR_INVALID_ARGUMENT},
    {"batch mismatch", m_batch, OMPK_ERR_INVALID_ARGUMENT},
    {"v length", m_v_len, OMPK_ERR_INVALID_ARGUMENT},
    {"non-unit dh stride", m_q_stride, OMPK_ERR_INVALID_ARGUMENT},
    {"k dtype", m_k_dtype, OMPK_ERR_INVALID_ARGUMENT},
    {"f16", m_f16, OMPK_ERR_INVALID_ARGUMENT},
    {"rank", m_rank, OMPK_ERR_INVALID_ARGUMENT},
    {"q data NULL", m_q_null, OMPK_ERR_INVALID_ARGUMENT},
    {"mask", m_mask, OMPK_ERR_INVALID_ARGUMENT},
    {"scale NaN", m_scale_nan, OMPK_ERR_INVALID_ARGUMENT},
    {"negative stride", m_neg_stride, OMPK_ERR_INVALID_ARGUMENT},
};

static const bad_case fwd_cases[] = {
    {"out shape", m_out_shape, OMPK_ERR_INVALID_ARGUMENT},
    {"out dtype", m_out_dtype, OMPK_ERR_INVALID_ARGUMENT},
    {"out aliases q", m_out_alias_q, OMPK_ERR_INVALID_ARGUMENT},
    {"lse dtype", m_lse_dtype, OMPK_ERR_INVALID_ARGUMENT},
    {"lse shape", m_lse_shape, OMPK_ERR_INVALID_ARGUMENT},
    {"lse aliases out", m_lse_alias_out, OMPK_ERR_INVALID_ARGUMENT},
};

static const bad_case bwd_cases[] = {
    {"lse missing", m_bwd_no_lse, OMPK_ERR_INVALID_ARGUMENT},
    {"lse shape", m_lse_shape, OMPK_ERR_INVALID_ARGUMENT},
    {"dq aliases q", m_dq_alias_q, OMPK_ERR_INVALID_ARGUMENT},
    {"dk aliases dv", m_dk_alias_dv, OMPK_ERR_INVALID_ARGUMENT},
    {"dv aliases v", m_dv_alias_v, OMPK_ERR_INVALID_ARGUMENT},
    {"dout shape", m_dout_shape, OMPK_ERR_INVALID_ARGUMENT},
    {"dk shape", m_dk_shape, OMPK_ERR_INVALID_ARGUMENT},
    {"dq dtype", m_dq_dtype, OMPK_ERR_INVALID_ARGUMENT},
    {"dq non-unit dh stride", m_dq_stride, OMPK_ERR_INVALID_ARGUMENT},
    {"dq rows overlap", m_overlapping_dq, OMPK_ERR_INVALID_ARGUMENT},
    {"out dtype", m_out_dtype, OMPK_ERR_INVALID_ARGUMENT},
};

static ompk_status call_fwd(bad_env *e) {
    return ompk_attention_fwd(&e->q, &e->k, &e->v, &e->out, e->plse, e->pp);
}

static ompk_status call_bwd(bad_env *e) {
    return ompk_attention_bwd(&e->dout, &e->q, &e->k, &e->v, &e->out, e->plse, &e->dq, &e->dk,
                              &e->dv, e->pp);
}

static void run_cases(ompk_device dev, const bad_case *cases, size_t n,
                      ompk_status (*call)(bad_env *), const char *which) {
    bad_env e;
    att_case_new(&e.c, dev, OMPK_F32, 2, 4, 2, 9, 11, 64, OMPK_ATTN_MASK_NONE, 7, 1.0, 0);
    for (size_t i = 0; i < n; i++) {
        env_reset(&e);
        cases[i].f(&e);
        ompk_clear_error();
        ompk_status st = call(&e);
        cr_expect_eq(st, cases[i].want, "%s %s on %s: got %s (%s)", which, cases[i].name,
                     tu_device_name(dev), ompk_status_str(st), ompk_last_error());
        cr_expect(strlen(ompk_last_error()) > 0, "%s %s: no message", which, cases[i].name);
        cr_expect(outputs_poisoned(&e), "%s %s on %s: an output was written", which, cases[i].name,
                  tu_device_name(dev));
    }
    /* the unmodified call succeeds, so the cases above failed for their own reason */
    env_reset(&e);
    cr_expect_eq(call_fwd(&e), OMPK_OK, "%s", ompk_last_error());
    att_case_free(&e.c);
}

Test(attention_bad, forward_inputs) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++) {
        run_cases(devs[di], common_cases, sizeof common_cases / sizeof common_cases[0], call_fwd,
                  "fwd");
        run_cases(devs[di], fwd_cases, sizeof fwd_cases / sizeof fwd_cases[0], call_fwd, "fwd");
    }
}

Test(attention_bad, backward_inputs) {
    ompk_device devs[4];
    int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++) {
        run_cases(devs[di], common_cases, sizeof common_cases / sizeof common_cases[0], call_bwd,
                  "bwd");
        run_cases(devs[di], bwd_cases, sizeof bwd_cases / sizeof bwd_cases[0], call_bwd, "bwd");
    }
}

Test(attention_bad, null_descriptors) {
    bad_env e;
    att_case_new(&e.c, ompk_device_host(), OMPK_F32, 1, 2, 1, 4, 4, 32, OMPK_ATTN_MASK_NONE, 3, 1.0,
                 0);
    env_reset(&e);
    cr_expect_eq(ompk_attention_fwd(NULL, &e.k, &e.v, &e.out, NULL, NULL),
                 OMPK_ERR_INVALID_ARGUMENT);
    cr_expect_eq(ompk_attention_fwd(&e.q, &e.k, &e.v, NULL, NULL, NULL), OMPK_ERR_INVALID_ARGUMENT);
    cr_expect_eq(
        ompk_attention_bwd(&e.dout, &e.q, &e.k, &e.v, NULL, &e.lse, &e.dq, &e.dk, &e.dv, NULL),
        OMPK_ERR_INVALID_ARGUMENT);
    cr_expect_eq(
        ompk_attention_bwd(&e.dout, &e.q, &e.k, &e.v, &e.out, &e.lse, &e.dq, NULL, &e.dv, NULL),
        OMPK_ERR_INVALID_ARGUMENT);
    cr_expect(outputs_poisoned(&e), "an output was written");
    att_case_free(&e.c);
}

/* q, out on the host with k, v on a GPU (or on a device that does not exist without one). */
Test(attention_bad, mixed_devices) {
    int ngpu = ompk_device_count();
    bad_env e;
    att_case_new(&e.c, ompk_device_host(), OMPK_F32, 1, 2, 1, 4, 4, 32, OMPK_ATTN_MASK_NONE, 5, 1.0,
                 0);
    tu_buf kd =
        tu_buf_new(ngpu ? ompk_device_target(0) : ompk_device_host(), OMPK_F32, e.c.k.numel);
    env_reset(&e);
    e.k.data = kd.dev;
    e.k.device = ompk_device_target(0);
    ompk_status want = ngpu ? OMPK_ERR_DEVICE_MISMATCH : OMPK_ERR_INVALID_ARGUMENT;
    cr_expect_eq(call_fwd(&e), want, "fwd: %s", ompk_last_error());
    cr_expect_eq(call_bwd(&e), want, "bwd: %s", ompk_last_error());
    cr_expect(outputs_poisoned(&e), "an output was written");
    tu_buf_free(&kd);
    att_case_free(&e.c);
}
