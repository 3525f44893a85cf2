/* The MoE layer's life: ompk_moe_create (config from the input), the tuning modes, get_info,
 * load_weights or load_quantized, get_weights, set_lora, fwd or fwd_train + bwd, get_stats,
 * destroy; each call checked on its own. */
#include "fuzz_common.h"
#include "variant.h" /* ompk_moe_tuning_set */

static const int fz_isas[] = {OMPK_MOE_ISA_PORTABLE,
                              OMPK_MOE_ISA_PORTABLE,
                              OMPK_MOE_ISA_AUTO,
                              OMPK_MOE_ISA_AMX_EMULATED,
                              OMPK_MOE_ISA_AVX512BF16,
                              OMPK_MOE_ISA_AMX,
                              5,
                              -1};

/* A weight set in the layer's format: float [E,N,K], or q/scale/zero. */
static void quantized(ompk_moe_quantized *w, ompk_tensor t[3], ompk_moe_format fmt, int64_t E,
                      int64_t N, int64_t K, int64_t gs) {
    int is4 = fmt >= OMPK_MOE_INT4;
    int64_t G = is4 ? (K + gs - 1) / gs : 1;
    w->q = fz_in(&t[0], is4 ? OMPK_I4 : OMPK_I8, 3, E, N, K);
    w->scale = is4 ? fz_in(&t[1], OMPK_F32, 3, E, N, G) : fz_in(&t[1], OMPK_F32, 2, E, N);
    w->zero = NULL;
    if (fmt == OMPK_MOE_INT4_ZP || (fz_u8() & 7) == 7) {
        w->zero = fz_in(&t[2], OMPK_I8, 3, E, N, G);
        fz_indices(w->zero, 0, 16, 16);
    }
}

/* Whether a layer of this config would hold many bytes (weights, scratch, cache, LoRA, roughly):
 * its sizes are in their valid ranges and the sum passes FZ_MOE_MAX_BYTES (1), else 0. */
#define FZ_MOE_MAX_BYTES (64.0 * (1 << 20))
static int fz_moe_huge(const ompk_moe_config *c) {
    if (c->experts < 1 || c->experts > (1 << 20) || c->hidden < 1 || c->hidden > 65536 ||
        c->intermediate < 1 || c->intermediate > 65536 || c->top_k < 1 || c->top_k > 64 ||
        c->max_tokens < 1 || c->max_tokens > (1 << 24) || c->cache_depth < 0 ||
        c->cache_depth > 64 || c->lora_max_rank < 0 || c->lora_max_rank > 4096)
        return 0;
    const double E = (double)c->experts, H = (double)c->hidden + 64,
                 I = (double)c->intermediate + 64, R = (double)c->max_tokens * c->top_k;
    const double weights = E * 3 * H * I * 2, scratch = R * (H + I) * 8 + c->max_tokens * H * 16;
    const double cache = (c->cache_depth + 1) * R * (I * 8 + H * 2);
    const double lora = E * c->lora_max_rank * (H + I) * 3 * 8;
    return weights + scratch + cache + lora > FZ_MOE_MAX_BYTES;
}

FZ_INIT {
    fz_begin(data, size);
    ompk_moe_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.format = (ompk_moe_format)fz_int(fz_range(0, 3), 4, -1);
    int64_t mult = cfg.format >= OMPK_MOE_INT4 ? 2 : 1;
    cfg.experts = fz_int(fz_range(1, 4), 0, (1 << 20) + 1);
    cfg.hidden = fz_int(mult * fz_range(1, 40), 65537, 3);
    cfg.intermediate = fz_int(mult * fz_range(1, 40), 0, 5);
    cfg.top_k = (int)fz_int(fz_range(1, 4), 65, 0);
    cfg.max_tokens = fz_int(fz_range(1, 6), 0, (1 << 24) + 1);
    cfg.group_size = (int)fz_int(64 * fz_range(0, 2), 63, 96);
    cfg.numa = (ompk_moe_numa)fz_int(fz_range(0, 1), 2, -1);
    cfg.numa_split = (int)fz_int(fz_range(1, 3), 65, 0);
    cfg.threads = (int)fz_int(1, 0, 2);
    cfg.no_pin = (int)fz_int(1, 0, 1);
    cfg.isa = (ompk_moe_isa)fz_isas[fz_u8() % 8];
    cfg.amx_min_rows = (int)fz_int(0, 1, 1000);
    const int kblock = (int)fz_int(0, -1, 1);
    const int prefetch = (int)fz_int(fz_range(0, 3), 4, -1);
    cfg.cache_depth = (int)fz_int(fz_range(0, 2), 65, -1);
    cfg.lora_max_rank = (int)fz_int(fz_range(0, 2), -1, 1 << 20);

    /* A valid config of a big layer (an edge value such as 65536 experts or 2^23 tokens) makes
     * create allocate and zero up to gigabytes: seconds an input, most of the run's time. Those
     * are left out; sizes out of range still reach create, which rejects them. */
    if (fz_moe_huge(&cfg)) {
        fz_end();
        return 0;
    }
    static int sentinel;
    ompk_moe *m = (ompk_moe *)&sentinel;
    ompk_status st = ompk_moe_create((fz_u8() == 255) ? NULL : &cfg, &m);
    if (st != OMPK_OK) {
        if (m != (ompk_moe *)&sentinel) fz_fail("failed create wrote *out");
        if (!ompk_last_error()[0]) fz_fail("failed call left no message");
        fz_end();
        return 0;
    }
    if (!m) fz_fail("create returned OK and NULL");
    if (ompk_moe_tuning_set(m, kblock, prefetch) != OMPK_OK) {
        if (!ompk_last_error()[0]) fz_fail("failed call left no message");
        ompk_moe_destroy(m);
        fz_end();
        return 0;
    }

    ompk_moe_info info, info0;
    memset(&info, 0xa5, sizeof info);
    info0 = info;
    st = ompk_moe_get_info(m, &info);
    if (st != OMPK_OK && memcmp(&info, &info0, sizeof info)) fz_fail("failed get_info wrote");

    const int64_t E = cfg.experts, H = cfg.hidden, I = cfg.intermediate, k = cfg.top_k;
    const int64_t gs = cfg.group_size ? cfg.group_size : 128;
    ompk_tensor w[9];
    if (cfg.format == OMPK_MOE_BF16 || (fz_u8() & 3) == 3) {
        ompk_dtype dt = fz_float_dtype();
        ompk_tensor *g = fz_in(&w[0], dt, 3, E, I, H);
        ompk_tensor *u = fz_in(&w[1], dt, 3, E, I, H);
        ompk_tensor *d = fz_in(&w[2], dt, 3, E, H, I);
        fz_arm();
        fz_check(ompk_moe_load_weights(m, g, u, d), OMPK_OK);
    } else {
        ompk_moe_quantized q[3];
        quantized(&q[0], &w[0], cfg.format, E, I, H, gs);
        quantized(&q[1], &w[3], cfg.format, E, I, H, gs);
        quantized(&q[2], &w[6], cfg.format, E, H, I, gs);
        fz_arm();
        fz_check(ompk_moe_load_quantized(m, &q[0], &q[1], &q[2]), OMPK_OK);
    }

    int which = (int)fz_int(fz_range(0, 2), 3, -1);
    if (fz_u8() & 1) {
        ompk_tensor o;
        int64_t N = which == 2 ? H : I, K = which == 2 ? I : H;
        ompk_tensor *po = fz_out(&o, OMPK_F32, 3, E, N, K);
        fz_arm();
        fz_check(ompk_moe_get_weights(m, which, po), OMPK_OK);
    }

    int64_t T = fz_int(fz_range(0, (int)cfg.max_tokens), cfg.max_tokens + 1, 0);
    int64_t Tn = T >= 0 && T <= 64 ? T : 1;
    ompk_dtype xdt = fz_float_dtype();
    ompk_tensor x, ids, wts, y;
    ompk_tensor *px = fz_in(&x, xdt, 2, Tn, H);
    ompk_tensor *pi = fz_in(&ids, (fz_u8() & 1) ? OMPK_I64 : OMPK_I32, 2, Tn, k);
    fz_indices(pi, -1, E, E);
    ompk_tensor *pw = fz_in(&wts, OMPK_F32, 2, Tn, k);
    ompk_tensor *py = fz_out(&y, (fz_u8() & 7) == 7 ? fz_float_dtype() : xdt, 2, Tn, H);
    /* LoRA adapters of rank r (A [E,r,in], B [E,out,r]) */
    const int64_t r = fz_int(1 + (fz_u8() & 1), 0, 3);
    const int64_t rr = r >= 0 && r <= 8 ? r : 1;
    ompk_tensor la[6];
    ompk_moe_lora lora = {(int)r, fz_float(2.0f), NULL, NULL,           NULL,
                          NULL,   NULL,           NULL, fz_float(0.0f), fz_u32()};
    const int lora_on = fz_u8() & 1;
    if (lora_on) {
        ompk_dtype ldt = fz_float_dtype();
        lora.gate_a = fz_in(&la[0], ldt, 3, E, rr, H);
        lora.gate_b = fz_in(&la[1], ldt, 3, E, I, rr);
        lora.up_a = fz_in(&la[2], ldt, 3, E, rr, H);
        lora.up_b = fz_in(&la[3], ldt, 3, E, I, rr);
        lora.down_a = fz_in(&la[4], ldt, 3, E, rr, I);
        lora.down_b = fz_in(&la[5], ldt, 3, E, H, rr);
        fz_arm();
        fz_check(ompk_moe_set_lora(m, &lora), OMPK_OK);
    }
    uint8_t mode = fz_u8();
    fz_arm();
    if (mode < 128) {
        fz_check(ompk_moe_fwd(m, px, pi, pw, py), OMPK_OK);
    } else {
        ompk_moe_cache_mode cm = (ompk_moe_cache_mode)fz_int(1 + (mode & 1), 0, 3);
        st = ompk_moe_fwd_train(m, px, pi, pw, py, cm);
        fz_check(st, OMPK_OK);
        /* the backward of what was saved (or of nothing: CACHE_EMPTY) */
        ompk_tensor dy, dx, dw, lg[6];
        ompk_moe_grads g;
        memset(&g, 0, sizeof g);
        ompk_tensor *pdy = fz_in(&dy, fz_float_dtype(), 2, Tn, H);
        g.dx = fz_out(&dx, xdt, 2, Tn, H);
        g.dw = (fz_u8() & 1) ? fz_out(&dw, OMPK_F32, 2, Tn, k) : NULL;
        if (lora_on && (fz_u8() & 1)) {
            g.gate_da = fz_out(&lg[0], OMPK_F32, 3, E, rr, H);
            g.gate_db = fz_out(&lg[1], OMPK_F32, 3, E, I, rr);
            g.up_da = fz_out(&lg[2], OMPK_F32, 3, E, rr, H);
            g.up_db = fz_out(&lg[3], OMPK_F32, 3, E, I, rr);
            g.down_da = fz_out(&lg[4], OMPK_F32, 3, E, rr, I);
            g.down_db = fz_out(&lg[5], OMPK_F32, 3, E, H, rr);
        }
        g.accumulate = (int)fz_int(0, 1, -1);
        fz_arm();
        fz_check(ompk_moe_bwd(m, pdy, (fz_u8() == 255) ? NULL : &g), OMPK_OK);
    }

    ompk_moe_stats stats, stats0;
    memset(&stats, 0xa5, sizeof stats);
    stats0 = stats;
    st = ompk_moe_get_stats(m, (fz_u8() == 255) ? NULL : &stats);
    if (st != OMPK_OK && memcmp(&stats, &stats0, sizeof stats)) fz_fail("failed get_stats wrote");

    ompk_moe_destroy(m);
    fz_end();
    return 0;
}
