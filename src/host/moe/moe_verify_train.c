/* OMPK_VERIFY=1 for the MoE training calls: the forward's reference with the attached LoRA, and
 * for the backward: the double reference (ompk_moe_ref_train) on the saved
 * entry's x as consumed, its routing, the dequantized weights and the attached LoRA, one line
 * per output (dx, dw, dA and dB per projection, dW per projection). Tolerances are bf16-level:
 * the forward's operands were bf16/int8 rounded, and the reference rounds its own a. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "bf16.h"
#include "moe_internal.h"
#include "ref/moe_ref.h"
#include "tolerance.h"
#include "verify.h"

/* The backward's verify: the entry it consumed and the upstream gradient. */
typedef struct train_verify_ctx {
    const ompk_moe *m;
    const moe_entry *en;
    const float *dy;
} train_verify_ctx;

static ompk_tol grad_tol(const ompk_verify_io *io, int i) {
    const ompk_moe *m = ((const train_verify_ctx *)io->ctx)->m;
    const double *v = io->ref[i];
    const int64_t n = io->ref_n[i];
    double s = 0.0;
    for (int64_t e = 0; e < n; e++) s += v[e] * v[e];
    return ompk_tol_moe_grad(m->grad_bf16, m->fmt != OMPK_MOE_BF16,
                             n > 0 && s > 0 ? sqrt(s / (double)n) : 1.0);
}

static int lora_f32(const ompk_moe *m, int64_t r, float *la[3], float *lb[3]) {
    const int64_t E = m->E, in[3] = {m->H, m->H, m->I}, out[3] = {m->I, m->I, m->H};
    int ok = 1;
    for (int p = 0; p < 3; p++) {
        la[p] = lb[p] = NULL;
        if (!r) continue;
        la[p] = malloc((size_t)(E * r * in[p]) * 4);
        lb[p] = malloc((size_t)(E * out[p] * r) * 4);
        if (!la[p] || !lb[p]) {
            ok = 0;
            continue;
        }
        for (int64_t e = 0; e < E; e++) {
            for (int64_t q = 0; q < r; q++)
                for (int64_t kk = 0; kk < in[p]; kk++)
                    la[p][(e * r + q) * in[p] + kk] = moe_lora_get(&m->lora.a[p], e, q, kk);
            for (int64_t n = 0; n < out[p]; n++)
                for (int64_t q = 0; q < r; q++)
                    lb[p][(e * out[p] + n) * r + q] = moe_lora_get(&m->lora.b[p], e, n, q);
        }
    }
    return ok;
}

void moe_verify_ref_y(const ompk_moe *m, int64_t T, const float *x, const int64_t *ids,
                      const float *w, float *const W[3], double *y) {
    const int64_t r = m->lora.r;
    float *la[3], *lb[3];
    const ompk_moe_ref_act act =
        m->fmt == OMPK_MOE_BF16 ? OMPK_MOE_REF_ACT_BF16 : OMPK_MOE_REF_ACT_INT8;
    if (lora_f32(m, r, la, lb)) {
        ompk_moe_ref_lora lr = {
            (int)r,          m->lora.s,   {la[0], la[1], la[2]}, {lb[0], lb[1], lb[2]},
            m->lora.dropout, m->lora.seed};
        ompk_moe_ref_train(T, m->E, m->H, m->I, m->k, x, ids, w, W[0], W[1], W[2], act,
                           r ? &lr : NULL, y, NULL, NULL);
    }
    for (int p = 0; p < 3; p++) {
        free(la[p]);
        free(lb[p]);
    }
}

/* args: dx, dw, then per projection (gate, up, down) dA, dB, dW. */
static int train_ref(const ompk_verify_io *io) {
    const train_verify_ctx *c = io->ctx;
    const ompk_moe *m = c->m;
    const moe_entry *en = c->en;
    const int64_t T = en->T, E = m->E, H = m->H, I = m->I, k = m->k, r = en->r;
    const int64_t in[3] = {H, H, I}, out[3] = {I, I, H};
    float *x = malloc((size_t)(T * H + 1) * 4), *w = malloc((size_t)(T * k + 1) * 4);
    int64_t *ids = malloc((size_t)(T * k + 1) * 8);
    float *W[3], *la[3] = {NULL, NULL, NULL}, *lb[3] = {NULL, NULL, NULL};
    ompk_moe_ref_grads rg = {
        io->ref[0], io->ref[1], {NULL, NULL, NULL}, {NULL, NULL, NULL}, {NULL, NULL, NULL}};
    int ok = x && w && ids;
    for (int p = 0; p < 3; p++) {
        W[p] = malloc((size_t)(E * in[p] * out[p]) * 4);
        ok = ok && W[p];
        rg.da[p] = io->ref[2 + 3 * p];
        rg.db[p] = io->ref[3 + 3 * p];
        rg.dW[p] = io->ref[4 + 3 * p];
    }
    ok = lora_f32(m, r, la, lb) && ok;
    if (!ok) {
        fprintf(stderr, "ompk verify %s: out of memory, skipped\n", io->fn);
    } else {
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < H; h++)
                x[t * H + h] = m->fmt == OMPK_MOE_BF16
                                   ? ompk_bf16_to_f32(((const uint16_t *)en->xq)[t * H + h])
                                   : (float)((const int8_t *)en->xq)[t * H + h] * en->xs[t];
        for (int64_t i = 0; i < T * k; i++) {
            ids[i] = en->ids[i];
            w[i] = en->w[i];
        }
        for (int p = 0; p < 3; p++) {
            for (int64_t e = 0; e < E; e++)
                for (int64_t n = 0; n < out[p]; n++)
                    for (int64_t kk = 0; kk < in[p]; kk++)
                        W[p][(e * out[p] + n) * in[p] + kk] = moe_get_deq(m, p, e, n, kk);
        }
        ompk_moe_ref_lora lr = {
            (int)r,          m->lora.s,   {la[0], la[1], la[2]}, {lb[0], lb[1], lb[2]},
            m->lora.dropout, m->lora.seed};
        ompk_moe_ref_train(T, E, H, I, (int)k, x, ids, w, W[0], W[1], W[2],
                           m->fmt == OMPK_MOE_BF16 ? OMPK_MOE_REF_ACT_BF16 : OMPK_MOE_REF_ACT_INT8,
                           r ? &lr : NULL, NULL, c->dy, &rg);
    }
    free(x);
    free(w);
    free(ids);
    for (int p = 0; p < 3; p++) {
        free(W[p]);
        free(la[p]);
        free(lb[p]);
    }
    return ok;
}

void moe_verify_backward(const ompk_moe *m, const moe_entry *en, const float *dy,
                         const ompk_moe_grads *gr, const void *dx, const float *dw) {
    const int64_t T = en->T, E = m->E, H = m->H, I = m->I, k = m->k, r = en->r;
    const int64_t in[3] = {H, H, I}, out[3] = {I, I, H};
    const int64_t sx[2] = {T, H}, sw[2] = {T, k};
    const ompk_tensor tdx = ompk_tensor_make((void *)dx, en->xdt, 2, sx, ompk_device_host());
    const ompk_tensor tdw = ompk_tensor_make((void *)dw, OMPK_F32, 2, sw, ompk_device_host());
    const char *isa = ompk_moe_isa_name(m->isa);
    ompk_verify_arg args[11] = {{"dx", &tdx, 0, 1, 0, isa}, {"dw", dw ? &tdw : NULL, 0, 1, 0, isa}};
    /* accumulated parameter gradients hold more than this call's: not reported */
    const ompk_tensor *g[9] = {gr->gate_da, gr->gate_db, gr->gate_dw, gr->up_da,  gr->up_db,
                               gr->up_dw,   gr->down_da, gr->down_db, gr->down_dw};
    static const char *names[9] = {"gate_da", "gate_db", "gate_dw", "up_da",  "up_db",
                                   "up_dw",   "down_da", "down_db", "down_dw"};
    for (int p = 0; p < 3; p++) {
        const int64_t n[3] = {E * r * in[p], E * r * out[p], E * in[p] * out[p]};
        for (int j = 0; j < 3; j++) {
            const ompk_tensor *t = gr->accumulate ? NULL : g[3 * p + j];
            const ompk_verify_arg a = {names[3 * p + j], t, 0, 1, t ? n[j] : 0, isa};
            args[2 + 3 * p + j] = a;
        }
    }
    const train_verify_ctx c = {m, en, dy};
    const ompk_verify_op op = {.fn = "moe_backward",
                               .args = args,
                               .nargs = 11,
                               .ctx = &c,
                               .ref = train_ref,
                               .tol = grad_tol};
    ompk_verify_run(&op);
}
