/* Transposed packed copies of a bf16 or int8 base for the backward's data-gradient GEMMs:
 *   dn^T [e][nb][kt][tile]  N = I (16-row blocks nb), K = H (k-tiles kt of 32)
 *   gu^T [e][nb][kt][tile]  N = H, K = 2 wt_ip: gate^T in k < wt_ip, up^T from wt_ip
 * in the forward's bf16 tile format (element (n, k) at ((k/2)*16 + n)*2 + k%2 of a 1024-byte
 * tile; padding holds 0), so every moe_kargs kernel runs them. bf16 values transpose exactly.
 * int8: the codes (exact in bf16) and the row scales, which are per k of the transposed products
 * and so are folded into the activations (wt_scale), the dequantized w = code * scale intact.
 * Kept rather than repacked per backward: a repack reads and writes every active expert's
 * weights at each step (about the bytes the GEMMs themselves stream), while the copy costs the
 * base weights' size once. Built at the first backward after a load (loads are refused while a
 * saved forward waits, so the copy is always that of the weights the forward used). */
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "error.h"
#include "moe_internal.h"

static int64_t r32(int64_t x) {
    return (x + 31) / 32 * 32;
}

void moe_wt_layout(ompk_moe *m) {
    m->wt_ip = r32(m->I);
    m->wt_dn_kt = (int)(r32(m->H) / 32);
    m->wt_dn_nb = (int)(m->wt_ip / 16);
    m->wt_gu_kt = (int)(2 * m->wt_ip / 32);
    m->wt_gu_nb = (int)(r32(m->H) / 16);
    m->wt_dn_bytes = (size_t)m->wt_dn_nb * (size_t)m->wt_dn_kt * 1024;
    m->wt_gu_bytes = (size_t)m->wt_gu_nb * (size_t)m->wt_gu_kt * 1024;
}

size_t moe_wt_scratch_floats(const ompk_moe *m) {
    (void)m;
    /* kernel outputs of the hi+lo rows (and of the lo rows apart, for the vector kernels), one
     * block per n-step of a work item; kernel scratch */
    return 2 * MOE_BWD_STEPS * 1024 + MOE_KSCRATCH / 4;
}

void moe_wt_free(ompk_moe *m) {
    free(m->wt);
    m->wt = NULL;
    m->wt_scale = NULL;
    m->wt_bytes = 0;
    m->wt_ready = 0;
}

static void put(uint8_t *base, int kt, int64_t n, int64_t k, float v) {
    uint16_t *tile = (uint16_t *)(base + ((size_t)(n / 16) * (size_t)kt + (size_t)(k / 32)) * 1024);
    tile[((k % 32) / 2 * 16 + n % 16) * 2 + k % 2] = ompk_f32_to_bf16(v);
}

/* one tile's block of matrix `which`: bf16 values, or int8 codes with their row scales */
static void block(const ompk_moe *m, int which, int64_t e, int64_t n0, int64_t k0, int nr, int kc,
                  float *tmp, float *sc) {
    if (m->fmt == OMPK_MOE_BF16)
        moe_get_deq_tile(m, which, e, n0, k0, nr, kc, tmp, 64);
    else
        moe_get_code_tile(m, which, e, n0, k0, nr, kc, tmp, 64, sc);
}

ompk_status moe_wt_build(ompk_moe *m) {
    if (m->wt_ready) return OMPK_OK;
    const int64_t E = m->E, H = m->H, I = m->I, ip = m->wt_ip, kte = m->kte;
    const size_t per = m->wt_dn_bytes + m->wt_gu_bytes;
    const int isint = m->fmt == OMPK_MOE_INT8;
    if (!m->wt) {
        const size_t sb = isint ? (size_t)E * (size_t)(H + 2 * I) * 4 : 0;
        /* aligned_alloc wants a multiple of the alignment (the int8 scales need not be one) */
        const size_t bytes = (per * (size_t)E + sb + 63) & ~(size_t)63;
        m->wt = aligned_alloc(64, bytes);
        if (!m->wt)
            return ompk_fail(OMPK_ERR_OUT_OF_MEMORY, "ompk_moe_bwd",
                             "transposed weights of %zu bytes", bytes);
        m->wt_bytes = bytes;
        m->wt_scale = isint ? (float *)(m->wt + per * (size_t)E) : NULL;
    }
#pragma omp parallel for schedule(dynamic, 1) num_threads(m->threads)
    for (int64_t e = 0; e < E; e++) {
        uint8_t *dn = m->wt + per * (size_t)e, *gu = dn + m->wt_dn_bytes;
        float *sc = isint ? m->wt_scale + e * (H + 2 * I) : NULL, rs[16];
        float tmp[16 * 64];
        memset(dn, 0, per);
        /* down [H][I] tile rows h, columns i -> dn^T (n = i, k = h) */
        for (int64_t h0 = 0; h0 < H; h0 += 16)
            for (int64_t i0 = 0; i0 < I; i0 += kte) {
                const int nr = (int)(H - h0 < 16 ? H - h0 : 16),
                          kc = (int)(I - i0 < kte ? I - i0 : kte);
                block(m, 2, e, h0, i0, nr, kc, tmp, rs);
                for (int a = 0; a < nr && sc; a++) sc[h0 + a] = rs[a];
                for (int a = 0; a < nr; a++)
                    for (int b = 0; b < kc; b++)
                        put(dn, m->wt_dn_kt, i0 + b, h0 + a, tmp[a * 64 + b]);
            }
        /* gate/up [I][H] tile rows i, columns h -> gu^T (n = h, k = i or ip + i) */
        for (int w = 0; w < 2; w++)
            for (int64_t i0 = 0; i0 < I; i0 += 16)
                for (int64_t h0 = 0; h0 < H; h0 += kte) {
                    const int nr = (int)(I - i0 < 16 ? I - i0 : 16),
                              kc = (int)(H - h0 < kte ? H - h0 : kte);
                    block(m, w, e, i0, h0, nr, kc, tmp, rs);
                    for (int a = 0; a < nr && sc; a++) sc[H + w * I + i0 + a] = rs[a];
                    for (int a = 0; a < nr; a++)
                        for (int b = 0; b < kc; b++)
                            put(gu, m->wt_gu_kt, h0 + b, w * ip + i0 + a, tmp[a * 64 + b]);
                }
    }
    m->wt_ready = 1;
    return OMPK_OK;
}
