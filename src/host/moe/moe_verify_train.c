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

static double rms(const double *v, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += v[i] * v[i];
    return n > 0 && s > 0 ? sqrt(s / (double)n) : 1.0;
}

static void report(const ompk_moe *m, const char *name, const ompk_tensor *t, const double *ref,
                   int64_t n) {
    if (!t || !ref) return;
    ompk_verify_report("moe_backward", name, ompk_moe_isa_name(m->isa), t, ref, 0, -1,
                       ompk_tol_moe_grad(m->grad_bf16, rms(ref, n)));
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

void moe_verify_backward(const ompk_moe *m, const moe_entry *en, const float *dy,
                         const ompk_moe_grads *gr, const void *dx, const float *dw) {
    const int64_t T = en->T, E = m->E, H = m->H, I = m->I, k = m->k, r = en->r;
    const int64_t in[3] = {H, H, I}, out[3] = {I, I, H};
    float *x = malloc((size_t)(T * H + 1) * 4), *w = malloc((size_t)(T * k + 1) * 4);
    int64_t *ids = malloc((size_t)(T * k + 1) * 8);
    float *W[3], *la[3] = {NULL, NULL, NULL}, *lb[3] = {NULL, NULL, NULL};
    double *rdx = malloc((size_t)(T * H + 1) * 8), *rdw = malloc((size_t)(T * k + 1) * 8);
    ompk_moe_ref_grads rg = {rdx, rdw, {NULL, NULL, NULL}, {NULL, NULL, NULL}, {NULL, NULL, NULL}};
    const ompk_tensor *gda[3] = {gr->gate_da, gr->up_da, gr->down_da},
                      *gdb[3] = {gr->gate_db, gr->up_db, gr->down_db},
                      *gdw[3] = {gr->gate_dw, gr->up_dw, gr->down_dw};
    int ok = x && w && ids && rdx && rdw;
    for (int p = 0; p < 3; p++) {
        W[p] = malloc((size_t)(E * in[p] * out[p]) * 4);
        ok = ok && W[p];
        if (gda[p]) rg.da[p] = malloc((size_t)(E * r * in[p]) * 8);
        if (gdb[p]) rg.db[p] = malloc((size_t)(E * r * out[p]) * 8);
        if (gdw[p]) rg.dW[p] = malloc((size_t)(E * in[p] * out[p]) * 8);
        ok = ok && (!gda[p] || rg.da[p]) && (!gdb[p] || rg.db[p]) && (!gdw[p] || rg.dW[p]);
    }
    ok = lora_f32(m, r, la, lb) && ok;
    if (!ok) {
        fprintf(stderr, "ompk verify moe_backward: out of memory, skipped\n");
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
                           r ? &lr : NULL, NULL, dy, &rg);
        int64_t sx[2] = {T, H}, sw[2] = {T, k};
        ompk_tensor tdx = ompk_tensor_make((void *)dx, en->xdt, 2, sx, ompk_device_host());
        report(m, "dx", &tdx, rdx, T * H);
        if (dw) {
            ompk_tensor tdw = ompk_tensor_make((void *)dw, OMPK_F32, 2, sw, ompk_device_host());
            report(m, "dw", &tdw, rdw, T * k);
        }
        static const char *nda[3] = {"gate_da", "up_da", "down_da"},
                          *ndb[3] = {"gate_db", "up_db", "down_db"},
                          *ndw[3] = {"gate_dw", "up_dw", "down_dw"};
        for (int p = 0; p < 3 && !gr->accumulate; p++) {
            report(m, nda[p], gda[p], rg.da[p], E * r * in[p]);
            report(m, ndb[p], gdb[p], rg.db[p], E * r * out[p]);
            report(m, ndw[p], gdw[p], rg.dW[p], E * in[p] * out[p]);
        }
    }
    free(x);
    free(w);
    free(ids);
    free(rdx);
    free(rdw);
    for (int p = 0; p < 3; p++) {
        free(W[p]);
        free(la[p]);
        free(lb[p]);
        free(rg.da[p]);
        free(rg.db[p]);
        free(rg.dW[p]);
    }
}
