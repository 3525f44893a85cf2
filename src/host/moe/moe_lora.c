/* LoRA adapters: attach (validation, descriptor copies) and the per-call f32 copy of the
 * routed experts' adapters the training kernels read. */
#include <math.h>
#include <string.h>

#include "bf16.h"
#include "check.h"
#include "error.h"
#include "moe_internal.h"

float moe_lora_get(const ompk_tensor *t, int64_t e, int64_t n, int64_t k) {
    int64_t o = e * t->strides[0] + n * t->strides[1] + k * t->strides[2];
    return ompk_load_f(t->data, o, t->dtype == OMPK_BF16);
}

/* n consecutive elements from element offset o of bf16 or f32 data, as f32 */
static void stage_row(const void *data, int64_t o, int bf, int64_t n, float *out) {
    if (bf) {
        const uint16_t *s = (const uint16_t *)data + o;
        for (int64_t i = 0; i < n; i++) out[i] = ompk_bf16_to_f32(s[i]);
    } else {
        memcpy(out, (const float *)data + o, (size_t)n * 4);
    }
}

/* A [E][r][in] then B^T [E][r][out] per projection, at the attached rank r: the rank-outer
 * loops of the kernels then read both along contiguous features */
const float *moe_lw(const ompk_moe *m, int ab, int proj) {
    const int64_t E = m->E, H = m->H, I = m->I, r = m->lora.r;
    const int64_t asz[3] = {E * r * H, E * r * H, E * r * I},
                  bsz[3] = {E * I * r, E * I * r, E * H * r};
    int64_t off = 0;
    for (int p = 0; p < 3; p++) off += ab == 1 || p < proj ? asz[p] : 0;
    for (int p = 0; p < proj && ab == 1; p++) off += bsz[p];
    return TBUF(m, TB_LW, float) + off;
}

void moe_lora_stage(ompk_moe *m, const int64_t *eoffs) {
    const int64_t E = m->E, r = m->lora.r;
    if (r == 0) return;
    const int64_t in[3] = {m->H, m->H, m->I}, out[3] = {m->I, m->I, m->H};
#pragma omp parallel for num_threads(m->threads) schedule(dynamic, 1)
    for (int64_t e = 0; e < E; e++) {
        if (eoffs[e + 1] == eoffs[e]) continue;
        for (int p = 0; p < 3; p++) {
            float *a = (float *)moe_lw(m, 0, p) + e * r * in[p];
            float *b = (float *)moe_lw(m, 1, p) + e * out[p] * r;
            const ompk_tensor *ta = &m->lora.a[p], *tb = &m->lora.b[p];
            const int abf = ta->dtype == OMPK_BF16, bbf = tb->dtype == OMPK_BF16;
            /* rows by typed loops (unit inner strides, the usual layout), else element-wise */
            if (ta->strides[2] == 1)
                for (int64_t q = 0; q < r; q++)
                    stage_row(ta->data, e * ta->strides[0] + q * ta->strides[1], abf, in[p],
                              a + q * in[p]);
            else
                for (int64_t q = 0; q < r; q++)
                    for (int64_t i = 0; i < in[p]; i++)
                        a[q * in[p] + i] = moe_lora_get(ta, e, q, i);
            if (tb->strides[2] == 1) {
                /* transposed through 16 x 64 tiles: whole lines of B^T written at a time */
                float tile[16][64];
                for (int64_t n0 = 0; n0 < out[p]; n0 += 16) {
                    const int64_t nw = out[p] - n0 < 16 ? out[p] - n0 : 16;
                    for (int64_t q0 = 0; q0 < r; q0 += 64) {
                        const int64_t qw = r - q0 < 64 ? r - q0 : 64;
                        for (int64_t nn = 0; nn < nw; nn++)
                            stage_row(tb->data,
                                      e * tb->strides[0] + (n0 + nn) * tb->strides[1] + q0, bbf, qw,
                                      tile[nn]);
                        for (int64_t q = 0; q < qw; q++)
                            for (int64_t nn = 0; nn < nw; nn++)
                                b[(q0 + q) * out[p] + n0 + nn] = tile[nn][q];
                    }
                }
            } else {
                for (int64_t n = 0; n < out[p]; n++)
                    for (int64_t q = 0; q < r; q++) b[q * out[p] + n] = moe_lora_get(tb, e, n, q);
            }
        }
    }
}

ompk_status ompk_moe_set_lora(ompk_moe *m, const ompk_moe_lora *lora) {
    const char *fn = "ompk_moe_set_lora";
    if (!m) return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "moe is NULL");
    /* a saved entry's backward needs the adapters its forward ran with */
    if (m->ncache > 0)
        return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn,
                         "%d saved forward(s) on the cache stack: attach or detach after their "
                         "backward",
                         m->ncache);
    if (!lora) {
        memset(&m->lora, 0, sizeof m->lora);
        return OMPK_OK;
    }
    if (lora->rank < 1 || lora->rank > m->rmax)
        return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "rank %d must be in 1..lora_max_rank (%d)",
                         lora->rank, m->rmax);
    if (!isfinite(lora->alpha) || !(lora->dropout >= 0.0f && lora->dropout < 1.0f))
        return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn,
                         "alpha must be finite and dropout in [0, 1)");
    const int64_t r = lora->rank, E = m->E, H = m->H, I = m->I;
    const ompk_tensor *ts[6] = {lora->gate_a, lora->gate_b, lora->up_a,
                                lora->up_b,   lora->down_a, lora->down_b};
    static const char *nm[6] = {"gate_a", "gate_b", "up_a", "up_b", "down_a", "down_b"};
    const int64_t d1[6] = {r, I, r, I, r, H}, d2[6] = {H, r, H, r, I, r};
    ompk_call c;
    ompk_call_begin(&c, fn);
    for (int i = 0; i < 6; i++)
        if (ompk_call_input(&c, nm[i], ts[i], 3, OMPK_DT_FLOAT)) {
            ompk_call_dim(&c, nm[i], ts[i], 0, E);
            ompk_call_dim(&c, nm[i], ts[i], 1, d1[i]);
            ompk_call_dim(&c, nm[i], ts[i], 2, d2[i]);
            ompk_call_require(&c, ts[i]->device.type == OMPK_HOST, OMPK_ERR_INVALID_ARGUMENT,
                              "%s must be a host tensor", nm[i]);
        }
    ompk_status st = ompk_call_end(&c);
    if (st != OMPK_OK) return st;
    m->lora.r = lora->rank;
    m->lora.s = lora->alpha / (float)lora->rank;
    m->lora.dropout = lora->dropout;
    m->lora.seed = lora->seed;
    for (int p = 0; p < 3; p++) {
        m->lora.a[p] = *ts[2 * p];
        m->lora.b[p] = *ts[2 * p + 1];
    }
    return OMPK_OK;
}
