/* The forward cache (its own arena: cache_depth + 1 entry slots, the extra one the working slot a
 * training forward writes before it becomes the top entry, so a failed call changes nothing) and
 * the training scratch, both sized at create from max_tokens, top_k, lora_max_rank and depth.
 *
 * Bytes per saved token (what the backward needs, nothing it can recompute cheaply):
 *   8k (ids i32 + routing weight f32) + x as consumed (bf16: 2H; int: H codes + 4 scale)
 *   + k * (8I (g, u fp32) + 12 lora_max_rank (A_g x, A_u x, A_d a fp32))
 * a = silu(g)*u is recomputed from g and u by the same function the forward used, and z (the
 * down output) is not stored: dw = <down^T dy, a> + s <B_d^T dy, A_d a> needs only g, u and A_d a.
 */
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "moe_internal.h"

static size_t al64(size_t x) {
    return (x + 63) / 64 * 64;
}

void moe_train_free(ompk_moe *m) {
    free(m->cache);
    free(m->tr);
    m->cache = m->tr = NULL;
    moe_wt_free(m);
}

ompk_status moe_train_create(ompk_moe *m) {
    const int depth = m->cfg.cache_depth;
    m->rmax = m->cfg.lora_max_rank;
    if (depth == 0 && m->rmax == 0) return OMPK_OK;
    const size_t Tm = (size_t)m->cfg.max_tokens, k = (size_t)m->k, R = Tm * k;
    const size_t H = (size_t)m->H, I = (size_t)m->I, rm = (size_t)m->rmax, E = (size_t)m->E;
    const int isint = m->fmt != OMPK_MOE_BF16;
    m->cache_tok_bytes = 8 * k + (isint ? H + 4 : 2 * H) + k * (8 * I + 12 * rm);
    const size_t lens[7] = {
        R * 4,     R * 4,         Tm * H * (isint ? 1 : 2), isint ? Tm * 4 : 0, R * I * 4,
        R * I * 4, R * 3 * rm * 4};
    size_t slot = 0;
    for (int i = 0; i < 7; i++) slot += al64(lens[i]);
    m->cache_bytes = slot * (size_t)(depth + 1);
    m->cache = aligned_alloc(64, m->cache_bytes);
    if (!m->cache)
        return ompk_fail(OMPK_ERR_OUT_OF_MEMORY, "ompk_moe_create", "forward cache of %zu bytes",
                         m->cache_bytes);
    for (int d = 0; d <= depth; d++) {
        uint8_t *p = m->cache + slot * (size_t)d;
        void *ptr[7];
        for (int i = 0; i < 7; i++) {
            ptr[i] = p;
            p += al64(lens[i]);
        }
        moe_entry *en = &m->ent[d];
        memset(en, 0, sizeof *en);
        en->ids = ptr[0];
        en->w = ptr[1];
        en->xq = ptr[2];
        en->xs = ptr[3];
        en->g = ptr[4];
        en->u = ptr[5];
        en->lx = ptr[6];
        m->perm[d] = d;
    }
    m->ncache = 0;
    /* training scratch */
    const size_t P = (size_t)m->P, Hn = (size_t)m->Hn, nch = (size_t)(m->Ipad / 64);
    moe_wt_layout(m);
    /* the backward's chunk passes: weight blocks and rows of up to 64 columns, the buffers of a
     * four-route group and its LoRA gradient coefficients (8 per rank) */
    m->tdeq_floats = (3 * 64 + 3) * (H > I ? H : I) + 2048 + 8 * (size_t)rm;
    if (m->tdeq_floats < moe_wt_scratch_floats(m)) m->tdeq_floats = moe_wt_scratch_floats(m);
    m->tdeq_floats = (m->tdeq_floats + 15) / 16 * 16; /* 64-byte aligned per thread */
    m->tr_len[TB_RROUTE] = R * 4;
    m->tr_len[TB_EOFFS] = (E + 1) * 8;
    m->tr_len[TB_GOFFS] = (E + 1) * 8;
    m->tr_len[TB_ZP] = P * R * Hn * 4;
    if (m->fmt == OMPK_MOE_BF16 || m->fmt == OMPK_MOE_INT8) {
        const size_t sb = moe_wt_split_bytes(m, (int64_t)R);
        if (m->tr_len[TB_ZP] < sb) m->tr_len[TB_ZP] = sb;
    }
    m->tr_len[TB_LW] = E * rm * (3 * H + 3 * I) * 4;
    m->tr_len[TB_AT] = R * I * 4;
    m->tr_len[TB_DG] = R * I * 4;
    m->tr_len[TB_DU] = R * I * 4;
    m->tr_len[TB_DXR] = R * H * 4;
    m->tr_len[TB_DWP] = R * nch * 4;
    m->tr_len[TB_BV] = R * 3 * rm * 4;
    m->tr_len[TB_TDEQ] = (size_t)m->threads * m->tdeq_floats * 4;
    m->tr_len[TB_STDY] = Tm * H * 4;
    m->tr_len[TB_STDX] = Tm * H * 4;
    m->tr_len[TB_STDW] = R * 4;
    size_t off = 0;
    for (int i = 0; i < TB_COUNT_; i++) {
        m->tr_off[i] = off;
        off += al64(m->tr_len[i]);
    }
    m->tr_bytes = off;
    m->tr = aligned_alloc(64, off > 0 ? off : 64);
    if (!m->tr)
        return ompk_fail(OMPK_ERR_OUT_OF_MEMORY, "ompk_moe_create", "training scratch of %zu bytes",
                         off);
    return OMPK_OK;
}
