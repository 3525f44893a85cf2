/* ompk_moe_bwd: validation of dy and every gradient against the top cache entry, staging
 * of device tensors through host buffers, the engine, the pop. */
#include <omp.h>
#include <string.h>

#include "bf16.h"
#include "check.h"
#include "error.h"
#include "moe_internal.h"
#include "verify.h"

/* A parameter gradient: optional f32 contiguous host tensor [E, n1, n2] */
static void check_grad(ompk_call *c, const char *name, const ompk_tensor *t, int64_t E, int64_t n1,
                       int64_t n2) {
    if (!t) return;
    if (!ompk_call_tensor(c, name, t, 3, OMPK_DT(OMPK_F32), 1, 0)) return;
    ompk_call_dim(c, name, t, 0, E);
    ompk_call_dim(c, name, t, 1, n1);
    ompk_call_dim(c, name, t, 2, n2);
    ompk_call_require(c, t->device.type == OMPK_HOST && ompk_tensor_is_contiguous(t),
                      OMPK_ERR_INVALID_ARGUMENT, "%s must be a contiguous host tensor", name);
}

static void check_params(ompk_call *c, const ompk_moe *m, const moe_entry *en,
                         const ompk_moe_grads *g) {
    const int64_t E = m->E, H = m->H, I = m->I, r = en->r;
    const ompk_tensor *lg[6] = {g->gate_da, g->gate_db, g->up_da, g->up_db, g->down_da, g->down_db};
    int any = 0;
    for (int i = 0; i < 6; i++) any |= lg[i] != NULL;
    ompk_call_require(c, !any || r > 0, OMPK_ERR_INVALID_ARGUMENT,
                      "LoRA gradients asked for, but no LoRA was attached at the forward");
    ompk_call_require(c, (!g->gate_dw && !g->up_dw && !g->down_dw) || m->fmt == OMPK_MOE_BF16,
                      OMPK_ERR_INVALID_ARGUMENT,
                      "base-weight gradients (full fine-tuning) need the bf16 base format");
    check_grad(c, "gate_da", g->gate_da, E, r, H);
    check_grad(c, "gate_db", g->gate_db, E, I, r);
    check_grad(c, "up_da", g->up_da, E, r, H);
    check_grad(c, "up_db", g->up_db, E, I, r);
    check_grad(c, "down_da", g->down_da, E, r, I);
    check_grad(c, "down_db", g->down_db, E, H, r);
    check_grad(c, "gate_dw", g->gate_dw, E, I, H);
    check_grad(c, "up_dw", g->up_dw, E, I, H);
    check_grad(c, "down_dw", g->down_dw, E, H, I);
}

static void check_io(ompk_call *c, const ompk_moe *m, const moe_entry *en, const ompk_tensor *dy,
                     const ompk_moe_grads *g) {
    const int64_t T = en->T;
    if (ompk_call_input(c, "dy", dy, 2, OMPK_DT_FLOAT)) {
        ompk_call_dim(c, "dy", dy, 0, T);
        ompk_call_dim(c, "dy", dy, 1, m->H);
        ompk_call_unit_stride(c, "dy", dy, 1);
        ompk_call_require(c, ompk_device_equal(dy->device, en->dev), OMPK_ERR_DEVICE_MISMATCH,
                          "dy must be on the device of the saved forward's x");
    }
    if (ompk_call_output(c, "dx", g->dx, 2, OMPK_DT(en->xdt))) {
        ompk_call_dim(c, "dx", g->dx, 0, T);
        ompk_call_dim(c, "dx", g->dx, 1, m->H);
        ompk_call_unit_stride(c, "dx", g->dx, 1);
    }
    if (g->dw && ompk_call_output(c, "dw", g->dw, 2, OMPK_DT(OMPK_F32))) {
        ompk_call_dim(c, "dw", g->dw, 0, T);
        ompk_call_dim(c, "dw", g->dw, 1, m->k);
        ompk_call_require(c, ompk_tensor_is_contiguous(g->dw), OMPK_ERR_INVALID_ARGUMENT,
                          "dw must be contiguous");
    }
}

ompk_status ompk_moe_bwd(ompk_moe *m, const ompk_tensor *dy, const ompk_moe_grads *grads) {
    const char *fn = "ompk_moe_bwd";
    if (!m || !grads) return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "NULL argument");
    if (m->ncache == 0)
        return ompk_fail(OMPK_ERR_CACHE_EMPTY, fn, "no saved forward on the cache stack");
    if (grads->accumulate != 0 && grads->accumulate != 1)
        return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "accumulate must be 0 or 1");
    const moe_entry *en = &m->ent[m->perm[m->ncache - 1]];
    const int on_dev = en->dev.type != OMPK_HOST;
    ompk_call c;
    ompk_call_begin(&c, fn);
    check_io(&c, m, en, dy, grads);
    if (!on_dev) check_params(&c, m, en, grads);
    ompk_status st = ompk_call_end(&c);
    if (st != OMPK_OK) return st;
    if (on_dev) {
        ompk_call_begin(&c, fn);
        check_params(&c, m, en, grads);
        if ((st = ompk_call_end(&c)) != OMPK_OK) return st;
        if (!ompk_tensor_is_contiguous(dy) || !ompk_tensor_is_contiguous(grads->dx))
            return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "device tensors must be contiguous");
    }
    const int64_t T = en->T, H = m->H;
    double t0 = omp_get_wtime();
    /* dy as contiguous f32 rows */
    float *dyf = TBUF(m, TB_STDY, float);
    const size_t dyes = dy->dtype == OMPK_BF16 ? 2 : 4;
    const void *dys = dy->data;
    int64_t dyst = dy->strides[0];
    if (on_dev && T > 0) {
        void *stg = TBUF(m, TB_STDX, void);
        if (ompk_memcpy(stg, ompk_device_host(), dy->data, dy->device, (size_t)(T * H) * dyes) !=
            OMPK_OK)
            return ompk_fail(OMPK_ERR_RUNTIME, fn, "staging dy to the host failed");
        dys = stg;
        dyst = H;
    }
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++)
            dyf[t * H + h] =
                ompk_load_f((const uint8_t *)dys + (size_t)(t * dyst) * dyes, h, dyes == 2);
    double t1 = omp_get_wtime();
    void *dxd = on_dev ? TBUF(m, TB_STDX, void) : grads->dx->data;
    const int64_t dxs = on_dev ? H : grads->dx->strides[0];
    float *dw = grads->dw ? (on_dev ? TBUF(m, TB_STDW, float) : grads->dw->data) : NULL;
    st = moe_run_backward(m, en, dyf, dy->dtype == OMPK_BF16, dxd, dxs, dw, grads);
    if (st != OMPK_OK) return st;
    double t2 = omp_get_wtime();
    if (on_dev && T > 0) {
        const size_t dxes = en->xdt == OMPK_BF16 ? 2 : 4;
        if (ompk_memcpy(grads->dx->data, grads->dx->device, dxd, ompk_device_host(),
                        (size_t)(T * H) * dxes) != OMPK_OK ||
            (dw && ompk_memcpy(grads->dw->data, grads->dw->device, dw, ompk_device_host(),
                               (size_t)(T * m->k) * 4) != OMPK_OK))
            return ompk_fail(OMPK_ERR_RUNTIME, fn, "copying dx/dw to the device failed");
    }
    double t3 = omp_get_wtime();
    m->stats.stage_in_ms = (t1 - t0) * 1e3;
    m->stats.compute_ms = (t2 - t1) * 1e3;
    m->stats.stage_out_ms = (t3 - t2) * 1e3;
    if (ompk_verify_enabled()) moe_verify_backward(m, en, dyf, grads, dxd, dw);
    m->ncache--;
    return OMPK_OK;
}
