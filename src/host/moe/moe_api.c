/* MoE experts: public entry points (validation, ISA choice, NUMA partitions, weight loading,
 * staging of device tensors). */
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "check.h"
#include "error.h"
#include "moe_internal.h"
#include "moe_quant.h"
#include "ref/moe_ref.h"
#include "tolerance.h"
#include "variant.h"
#include "verify.h"

const char *ompk_moe_isa_name(ompk_moe_isa isa) {
    switch (isa) {
    case OMPK_MOE_ISA_AUTO:
        return "auto";
    case OMPK_MOE_ISA_AMX:
        return "amx";
    case OMPK_MOE_ISA_AVX512BF16:
        return "avx512bf16";
    case OMPK_MOE_ISA_PORTABLE:
        return "portable";
    case OMPK_MOE_ISA_AMX_EMULATED:
        return "amx-emulated";
    }
    return "unknown";
}

int ompk_moe_isa_available(ompk_moe_isa isa) {
    switch (isa) {
    case OMPK_MOE_ISA_AUTO:
    case OMPK_MOE_ISA_PORTABLE:
    case OMPK_MOE_ISA_AMX_EMULATED:
        return 1;
    case OMPK_MOE_ISA_AMX:
        return moe_cpu_has_amx();
    case OMPK_MOE_ISA_AVX512BF16:
        return moe_cpu_has_avx512();
    }
    return 0;
}

static const char *FN_CREATE = "ompk_moe_create";

/* The config's isa; for AUTO the selection's (OMPK_ISA, OMPK_VARIANT=moe:<name>, variant.h),
 * else the best available. */
static ompk_status resolve_isa(ompk_moe_isa want, ompk_moe_isa *out) {
    if ((unsigned)want > (unsigned)OMPK_MOE_ISA_AMX_EMULATED)
        return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, FN_CREATE, "unknown isa %d", (int)want);
    const ompk_impl *named;
    const ompk_status st = ompk_variant_selected(OMPK_OP_MOE, FN_CREATE, &named);
    if (st != OMPK_OK) return st;
    if (want == OMPK_MOE_ISA_AUTO && named) {
        static const ompk_moe_isa all[] = {OMPK_MOE_ISA_AMX, OMPK_MOE_ISA_AVX512BF16,
                                           OMPK_MOE_ISA_PORTABLE, OMPK_MOE_ISA_AMX_EMULATED};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            if (!strcmp(named->name, ompk_moe_isa_name(all[i]))) want = all[i];
    }
    if (want == OMPK_MOE_ISA_AUTO)
        want = moe_cpu_has_amx()      ? OMPK_MOE_ISA_AMX
               : moe_cpu_has_avx512() ? OMPK_MOE_ISA_AVX512BF16
                                      : OMPK_MOE_ISA_PORTABLE;
    if (!ompk_moe_isa_available(want))
        return ompk_fail(OMPK_ERR_UNSUPPORTED, FN_CREATE, "isa %s is not available on this CPU%s",
                         ompk_moe_isa_name(want),
                         want == OMPK_MOE_ISA_AMX ? " (CPUID, XCR0 or XTILEDATA permission)" : "");
    *out = want;
    return OMPK_OK;
}

static ompk_status check_config(const ompk_moe_config *c) {
    const char *f = FN_CREATE;
    if (c->experts < 1 || c->experts > (1 << 20))
        return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, f, "experts must be in 1..2^20");
    if (c->hidden < 1 || c->hidden > 65536 || c->intermediate < 1 || c->intermediate > 65536)
        return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, f,
                         "hidden and intermediate must be in 1..65536");
    if (c->top_k < 1 || c->top_k > 64)
        return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, f, "top_k must be in 1..64");
    if (c->max_tokens < 1 || c->max_tokens > (1 << 24))
        return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, f, "max_tokens must be in 1..2^24");
    if ((unsigned)c->format > (unsigned)OMPK_MOE_INT4_ZP)
        return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, f, "unknown weight format %d", (int)c->format);
    if (c->format >= OMPK_MOE_INT4) {
        if (c->group_size != 0 &&
            (c->group_size < 64 || c->group_size > 65536 || c->group_size % 64))
            return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, f,
                             "group_size must be a multiple of 64 in 64..65536 (or 0)");
        if (c->hidden % 2 || c->intermediate % 2)
            return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, f, "int4 formats need even H and I");
    }
    if (c->numa != OMPK_MOE_NUMA_AUTO && c->numa != OMPK_MOE_NUMA_FORCED)
        return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, f, "unknown numa policy %d", (int)c->numa);
    if (c->numa == OMPK_MOE_NUMA_FORCED && (c->numa_split < 1 || c->numa_split > MOE_MAX_PARTS))
        return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, f, "numa_split must be in 1..%d",
                         MOE_MAX_PARTS);
    if (c->threads < 0 || c->threads > 4096 || c->amx_min_rows < 0)
        return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, f,
                         "threads must be in 0..4096, amx_min_rows >= 0");
    if (c->cache_depth < 0 || c->cache_depth > MOE_MAX_DEPTH || c->lora_max_rank < 0 ||
        c->lora_max_rank > 4096)
        return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, f,
                         "cache_depth must be in 0..64, lora_max_rank in 0..4096");
    if (c->grad_operands != OMPK_MOE_GRAD_SPLIT && c->grad_operands != OMPK_MOE_GRAD_BF16)
        return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, f, "unknown grad_operands %d",
                         (int)c->grad_operands);
    return OMPK_OK;
}

/* One topology per process, discovered once (reading the machine's description takes
 * milliseconds) and shared read-only by every layer; refreshed after the load so concurrent
 * reads build no lazy caches (hwloc_topology_refresh). */
static hwloc_topology_t moe_topo;
static int moe_topo_ok;
static pthread_once_t moe_topo_once = PTHREAD_ONCE_INIT;

static void moe_topo_load(void) {
    if (hwloc_topology_init(&moe_topo) != 0) return;
    if (hwloc_topology_load(moe_topo) != 0 || hwloc_topology_refresh(moe_topo) != 0) {
        hwloc_topology_destroy(moe_topo);
        return;
    }
    moe_topo_ok = 1;
}

static ompk_status setup_topology(ompk_moe *m) {
    pthread_once(&moe_topo_once, moe_topo_load);
    if (!moe_topo_ok)
        return ompk_fail(OMPK_ERR_RUNTIME, FN_CREATE, "hwloc topology could not be loaded");
    m->topo = moe_topo;
    int nn = hwloc_get_nbobjs_by_type(m->topo, HWLOC_OBJ_NUMANODE);
    m->nnodes = nn > 0 ? nn : 1;
    int nc = hwloc_get_nbobjs_by_type(m->topo, HWLOC_OBJ_CORE);
    if (nc <= 0) return OMPK_OK;
    m->core_set = calloc((size_t)nc, sizeof *m->core_set);
    m->core_node = calloc((size_t)nc, sizeof *m->core_node);
    if (!m->core_set || !m->core_node)
        return ompk_fail(OMPK_ERR_OUT_OF_MEMORY, FN_CREATE, "core table");
    for (int c = 0; c < nc; c++) {
        hwloc_obj_t core = hwloc_get_obj_by_type(m->topo, HWLOC_OBJ_CORE, (unsigned)c);
        m->core_set[c] = hwloc_bitmap_dup(core->cpuset);
        m->core_node[c] = 0;
        for (int n = 0; n < nn; n++) {
            hwloc_obj_t node = hwloc_get_obj_by_type(m->topo, HWLOC_OBJ_NUMANODE, (unsigned)n);
            if (node && node->cpuset && hwloc_bitmap_intersects(core->cpuset, node->cpuset)) {
                m->core_node[c] = n;
                break;
            }
        }
        m->ncores = c + 1;
    }
    return OMPK_OK;
}

/* kblock 0 = the format's default: bf16 measured slower K-blocked on the Xeon (parking the fp32
 * C tiles costs more than the L1 reuse of A saves); int8 about even, slightly ahead. */
static void moe_tuning_apply(ompk_moe *m, int kblock, int prefetch) {
    m->kblock = kblock ? kblock > 0 : m->fmt != OMPK_MOE_BF16;
    m->prefetch = prefetch;
}

ompk_status ompk_moe_tuning_set(ompk_moe *m, int kblock, int prefetch) {
    const char *fn = "ompk_moe_tuning_set";
    if (!m) return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "moe is NULL");
    if (kblock < -1 || kblock > 1 || prefetch < 0 || prefetch > 3)
        return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "kblock must be -1..1, prefetch 0..3");
    moe_tuning_apply(m, kblock, prefetch);
    return OMPK_OK;
}

ompk_status ompk_moe_create(const ompk_moe_config *config, ompk_moe **out) {
    if (!config || !out) return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, FN_CREATE, "NULL argument");
    ompk_status st = check_config(config);
    if (st != OMPK_OK) return st;
    ompk_moe_isa isa = OMPK_MOE_ISA_PORTABLE;
    if ((st = resolve_isa(config->isa, &isa)) != OMPK_OK) return st;
    ompk_moe *m = calloc(1, sizeof *m);
    if (!m) return ompk_fail(OMPK_ERR_OUT_OF_MEMORY, FN_CREATE, "layer object");
    m->cfg = *config;
    m->isa = isa;
    m->fmt = (int)config->format;
    m->E = config->experts;
    m->H = config->hidden;
    m->I = config->intermediate;
    m->k = config->top_k;
    m->threads = config->threads > 0 ? config->threads : omp_get_max_threads();
    m->amx_min_rows = config->amx_min_rows > 0 ? config->amx_min_rows : 4;
    int isint = m->fmt != OMPK_MOE_BF16;
    moe_tuning_apply(m, 0, 0);
    m->grad_bf16 = config->grad_operands == OMPK_MOE_GRAD_BF16;
    m->kte = isint ? 64 : 32;
    m->tb = m->fmt >= OMPK_MOE_INT4 ? 512 : 1024;
    m->Hk = (m->H + m->kte - 1) / m->kte * m->kte;
    m->Hn = (m->H + 31) / 32 * 32;
    m->Ipad = (m->I + 63) / 64 * 64;
    m->ktg = (int)(m->Hk / m->kte);
    m->nbd = (int)(m->Hn / 16);
    m->gs = m->fmt >= OMPK_MOE_INT4 ? (config->group_size ? config->group_size : 128) : 0;
    m->ktpg = m->fmt >= OMPK_MOE_INT4 ? m->gs / 64 : MOE_ONE_GROUP;
    m->gg = m->fmt >= OMPK_MOE_INT4 ? (int)((m->H + m->gs - 1) / m->gs) : 1;
    if ((st = setup_topology(m)) != OMPK_OK) {
        ompk_moe_destroy(m);
        return st;
    }
    m->P = config->numa == OMPK_MOE_NUMA_FORCED
               ? config->numa_split
               : (m->nnodes < MOE_MAX_PARTS ? m->nnodes : MOE_MAX_PARTS);
    int64_t nb64 = m->Ipad / 64;
    for (int p = 0; p < m->P; p++) {
        moe_part *pp = &m->part[p];
        int64_t lo = p * nb64 / m->P, hi = (p + 1) * nb64 / m->P;
        pp->node = p % m->nnodes;
        pp->i0 = lo * 64;
        pp->ip = (hi - lo) * 64;
        pp->iw = hi > lo ? (hi * 64 < m->I ? hi * 64 : m->I) - pp->i0 : 0;
        pp->nbg = (int)(pp->ip / 16);
        pp->ktd = (int)(pp->ip / m->kte);
        if (hi > lo && isint) {
            pp->gd0 = (int)(lo / m->ktpg);
            pp->gd = (int)((hi - 1) / m->ktpg) - pp->gd0 + 1;
        }
    }
    if ((st = moe_parts_alloc(m)) != OMPK_OK || (st = moe_arena_create(m)) != OMPK_OK ||
        (st = moe_train_create(m)) != OMPK_OK) {
        ompk_moe_destroy(m);
        return st;
    }
    *out = m;
    return OMPK_OK;
}

void ompk_moe_destroy(ompk_moe *m) {
    if (!m) return;
    if (m->topo) moe_parts_free(m);
    free(m->arena);
    moe_train_free(m);
    for (int c = 0; c < m->ncores; c++) hwloc_bitmap_free(m->core_set[c]);
    free(m->core_set);
    free(m->core_node);
    free(m);
}

ompk_status ompk_moe_get_info(const ompk_moe *m, ompk_moe_info *info) {
    if (!m || !info)
        return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, "ompk_moe_get_info", "NULL argument");
    info->isa = m->isa;
    info->partitions = m->P;
    info->numa_nodes = m->nnodes;
    info->threads = m->threads;
    info->weight_bytes = 0;
    for (int p = 0; p < m->P; p++) info->weight_bytes += m->part[p].mem_bytes;
    info->arena_bytes = m->arena_bytes + m->tr_bytes;
    info->cache_bytes = m->cache_bytes;
    info->cache_bytes_per_token = m->cache_tok_bytes;
    info->cache_entries = m->ncache;
    info->backward_weight_bytes = m->wt_bytes;
    return OMPK_OK;
}

ompk_status ompk_moe_get_stats(const ompk_moe *m, ompk_moe_stats *stats) {
    if (!m || !stats)
        return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, "ompk_moe_get_stats", "NULL argument");
    *stats = m->stats;
    return OMPK_OK;
}

/* ---- weight loading ------------------------------------------------------------------- */

/* The saved entries' backward must use the weights their forward used: no replacement while
 * any is on the stack. */
static ompk_status check_no_entries(const ompk_moe *m, const char *fn) {
    if (m->ncache == 0) return OMPK_OK;
    return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn,
                     "%d saved forward(s) on the cache stack: load weights after their backward",
                     m->ncache);
}

static void clear_weights(ompk_moe *m) {
    for (int p = 0; p < m->P; p++) memset(m->part[p].mem, 0, m->part[p].mem_bytes);
    m->loaded = 0;
    m->wt_ready = 0;
}

static int64_t mat_n(const ompk_moe *m, int which) {
    return which < 2 ? m->I : m->H;
}
static int64_t mat_k(const ompk_moe *m, int which) {
    return which < 2 ? m->H : m->I;
}
static int64_t mat_kpad(const ompk_moe *m, int which) {
    return which < 2 ? m->Hk : m->Ipad;
}

/* Quantize one row v[K] into codes crow[Kp] (padding included) and set its scales. */
static void code_row(ompk_moe *m, int which, int64_t e, int64_t n, const float *v, int8_t *q,
                     uint16_t *crow) {
    const int64_t K = mat_k(m, which), Kp = mat_kpad(m, which);
    for (int64_t kk = K; kk < Kp; kk++) crow[kk] = 0;
    if (m->fmt == OMPK_MOE_BF16) {
        for (int64_t kk = 0; kk < K; kk++) crow[kk] = ompk_f32_to_bf16(v[kk]);
        return;
    }
    if (m->fmt == OMPK_MOE_INT8) {
        float s = moe_quant_row(v, K, q);
        moe_put_scale(m, which, e, n, 0, s, 0);
        for (int64_t kk = 0; kk < K; kk++) crow[kk] = (uint16_t)(uint8_t)q[kk];
        return;
    }
    const int64_t gs = m->gs;
    const int zp = m->fmt == OMPK_MOE_INT4_ZP;
    for (int64_t g0 = 0; g0 < K; g0 += gs) {
        int64_t g1 = g0 + gs < K ? g0 + gs : K;
        float lo = 0.0f, hi = 0.0f;
        int nan = 0;
        for (int64_t kk = g0; kk < g1; kk++) {
            nan |= isnan(v[kk]);
            lo = v[kk] < lo ? v[kk] : lo;
            hi = v[kk] > hi ? v[kk] : hi;
        }
        float s;
        int z = 8;
        if (nan || isinf(lo) || isinf(hi)) {
            /* as moe_quant_row: a NaN group gets scale NaN; an infinite one scale inf with codes
             * +-7 at the infinities and 0 elsewhere, so its products are NaN or +-inf */
            s = nan ? NAN : INFINITY;
            for (int64_t kk = g0; kk < g1; kk++)
                crow[kk] = (uint16_t)(!nan && isinf(v[kk]) ? (v[kk] > 0.0f ? 15 : 1) : 8);
        } else {
            if (!zp) {
                s = fmaxf(hi, -lo) / 7.0f;
            } else {
                s = (hi - lo) / 15.0f;
                /* a range wider than FLT_MAX: the same scale, formed without the overflow */
                if (isinf(s)) s = hi / 15.0f - lo / 15.0f;
                z = s > 0.0f ? (int)fminf(fmaxf(rintf(-lo / s), 0.0f), 15.0f) : 0;
            }
            for (int64_t kk = g0; kk < g1; kk++) {
                int c = z;
                if (s > 0.0f) {
                    /* |v/s| may exceed the code range when s is subnormal: clamp, then convert */
                    float r = rintf(v[kk] / s) + (float)z;
                    c = (int)fminf(fmaxf(r, zp ? 0.0f : 1.0f), 15.0f);
                }
                crow[kk] = (uint16_t)c;
            }
        }
        moe_put_scale(m, which, e, n, (int)(g0 / gs), s, z);
        /* padding (inside the last group, as Kp <= roundup(K, gs)) decodes to 0: its zero point */
        if (g1 == K)
            for (int64_t kk = K; kk < Kp; kk++) crow[kk] = (uint16_t)z;
    }
}

static ompk_status weights_from_float(ompk_moe *m, const ompk_tensor *mats[3]) {
    clear_weights(m);
    int fail = 0;
    for (int which = 0; which < 3; which++) {
        const ompk_tensor *t = mats[which];
        const int64_t N = mat_n(m, which), K = mat_k(m, which);
        const int isbf = t->dtype == OMPK_BF16;
        const int64_t Kp = mat_kpad(m, which);
#pragma omp parallel num_threads(m->threads) reduction(| : fail)
        {
            float *row = malloc((size_t)K * sizeof *row);
            int8_t *q = malloc((size_t)K);
            uint16_t *codes = malloc((size_t)(N * Kp) * sizeof *codes);
            if (!row || !q || !codes) fail = 1;
            /* by expert: an int4 byte holds nibbles of two rows, so rows of one expert stay
             * with one thread */
#pragma omp for schedule(dynamic, 1)
            for (int64_t e = 0; e < m->E; e++) {
                if (!row || !q || !codes) continue;
                for (int64_t n = 0; n < N; n++) {
                    int64_t base = e * t->strides[0] + n * t->strides[1];
                    for (int64_t kk = 0; kk < K; kk++)
                        row[kk] = ompk_load_f(t->data, base + kk * t->strides[2], isbf);
                    code_row(m, which, e, n, row, q, codes + n * Kp);
                }
                moe_pack_expert(m, which, e, codes, Kp);
            }
            free(row);
            free(q);
            free(codes);
        }
    }
    if (fail) return ompk_fail(OMPK_ERR_OUT_OF_MEMORY, "ompk_moe_load_weights", "row buffers");
    m->loaded = 1;
    return OMPK_OK;
}

static void check_mat(ompk_call *c, const char *name, const ompk_tensor *t, unsigned dts, int64_t E,
                      int64_t N, int64_t K) {
    if (!ompk_call_input(c, name, t, 3, dts)) return;
    ompk_call_dim(c, name, t, 0, E);
    ompk_call_dim(c, name, t, 1, N);
    ompk_call_dim(c, name, t, 2, K);
}

ompk_status ompk_moe_load_weights(ompk_moe *m, const ompk_tensor *gate, const ompk_tensor *up,
                                  const ompk_tensor *down) {
    const char *fn = "ompk_moe_load_weights";
    if (!m) return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "moe is NULL");
    ompk_status st0 = check_no_entries(m, fn);
    if (st0 != OMPK_OK) return st0;
    ompk_call c;
    ompk_call_begin(&c, fn);
    check_mat(&c, "gate", gate, OMPK_DT_FLOAT, m->E, m->I, m->H);
    check_mat(&c, "up", up, OMPK_DT_FLOAT, m->E, m->I, m->H);
    check_mat(&c, "down", down, OMPK_DT_FLOAT, m->E, m->H, m->I);
    ompk_status st = ompk_call_end(&c);
    if (st != OMPK_OK) return st;
    const ompk_tensor *src[3] = {gate, up, down};
    ompk_tensor hv[3];
    void *owned[3] = {NULL, NULL, NULL};
    const ompk_tensor *mats[3];
    for (int i = 0; i < 3; i++) {
        mats[i] = src[i];
        if (src[i]->device.type != OMPK_HOST) {
            if ((st = ompk_host_view(src[i], &hv[i], &owned[i])) != OMPK_OK) break;
            mats[i] = &hv[i];
        }
    }
    if (st == OMPK_OK) st = weights_from_float(m, mats);
    for (int i = 0; i < 3; i++) ompk_host_view_free(owned[i]);
    return st;
}

static int read_code(const ompk_tensor *q, int64_t e, int64_t n, int64_t kk, int unsigned4) {
    int64_t o = e * q->strides[0] + n * q->strides[1] + kk * q->strides[2];
    if (q->dtype == OMPK_I8) return ((const int8_t *)q->data)[o];
    uint8_t b = ((const uint8_t *)q->data)[o >> 1];
    int v = (o & 1) ? b >> 4 : b & 15;
    return unsigned4 ? v : (v ^ 8) - 8;
}

static float read_f(const ompk_tensor *t, int64_t e, int64_t n, int64_t g) {
    int64_t o = e * t->strides[0] + n * t->strides[1] + (t->ndim == 3 ? g * t->strides[2] : 0);
    return ((const float *)t->data)[o];
}

ompk_status ompk_moe_load_quantized(ompk_moe *m, const ompk_moe_quantized *gate,
                                    const ompk_moe_quantized *up, const ompk_moe_quantized *down) {
    const char *fn = "ompk_moe_load_quantized";
    if (!m || !gate || !up || !down)
        return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "NULL argument");
    if (m->fmt == OMPK_MOE_BF16)
        return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn,
                         "the layer's format is bf16: use ompk_moe_load_weights");
    ompk_status st0 = check_no_entries(m, fn);
    if (st0 != OMPK_OK) return st0;
    const ompk_moe_quantized *w[3] = {gate, up, down};
    static const char *qn[3] = {"gate.q", "up.q", "down.q"},
                      *sn[3] = {"gate.scale", "up.scale", "down.scale"},
                      *zn[3] = {"gate.zero", "up.zero", "down.zero"};
    const int is4 = m->fmt >= OMPK_MOE_INT4, zp = m->fmt == OMPK_MOE_INT4_ZP;
    ompk_call c;
    ompk_call_begin(&c, fn);
    for (int i = 0; i < 3; i++) {
        int64_t N = mat_n(m, i), K = mat_k(m, i), G = is4 ? (K + m->gs - 1) / m->gs : 1;
        check_mat(&c, qn[i], w[i]->q, OMPK_DT(is4 ? OMPK_I4 : OMPK_I8), m->E, N, K);
        if (ompk_call_input(&c, sn[i], w[i]->scale, is4 ? 3 : 2, OMPK_DT(OMPK_F32))) {
            ompk_call_dim(&c, sn[i], w[i]->scale, 0, m->E);
            ompk_call_dim(&c, sn[i], w[i]->scale, 1, N);
            if (is4) ompk_call_dim(&c, sn[i], w[i]->scale, 2, G);
        }
        if (zp) {
            check_mat(&c, zn[i], w[i]->zero, OMPK_DT(OMPK_I8), m->E, N, G);
        } else {
            ompk_call_require(&c, w[i]->zero == NULL, OMPK_ERR_INVALID_ARGUMENT,
                              "%s must be NULL for this format", zn[i]);
        }
    }
    ompk_status st = ompk_call_end(&c);
    if (st != OMPK_OK) return st;
    for (int i = 0; i < 3; i++) {
        const ompk_tensor *ts[3] = {w[i]->q, w[i]->scale, w[i]->zero};
        for (int j = 0; j < 3; j++)
            if (ts[j] && ts[j]->device.type != OMPK_HOST)
                return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn,
                                 "pre-quantized tensors must be on the host");
        if (zp) {
            const ompk_tensor *z = w[i]->zero;
            for (int64_t e = 0; e < z->shape[0]; e++)
                for (int64_t n = 0; n < z->shape[1]; n++)
                    for (int64_t g = 0; g < z->shape[2]; g++) {
                        int8_t v =
                            ((const int8_t *)z
                                 ->data)[e * z->strides[0] + n * z->strides[1] + g * z->strides[2]];
                        if (v < 0 || v > 15)
                            return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn,
                                             "%s[%lld,%lld,%lld] = %d is outside 0..15", zn[i],
                                             (long long)e, (long long)n, (long long)g, v);
                    }
        }
    }
    clear_weights(m);
    int fail = 0;
    for (int i = 0; i < 3; i++) {
        const int64_t N = mat_n(m, i), K = mat_k(m, i), Kp = mat_kpad(m, i);
        const ompk_moe_quantized *qw = w[i];
        const ompk_tensor *zt = qw->zero;
#pragma omp parallel num_threads(m->threads) reduction(| : fail)
        {
            uint16_t *codes = calloc((size_t)(N * Kp), sizeof *codes);
            if (!codes) fail = 1;
#pragma omp for schedule(dynamic, 1)
            for (int64_t e = 0; e < m->E; e++) {
                if (!codes) continue;
                for (int64_t n = 0; n < N; n++) {
                    uint16_t *crow = codes + n * Kp;
                    if (!is4) {
                        moe_put_scale(m, i, e, n, 0, read_f(qw->scale, e, n, 0), 0);
                        for (int64_t kk = 0; kk < K; kk++)
                            crow[kk] = (uint16_t)(uint8_t)read_code(qw->q, e, n, kk, 0);
                        continue;
                    }
                    int z = 8;
                    for (int64_t g = 0; g * m->gs < K; g++) {
                        if (zp)
                            z = ((const int8_t *)zt->data)[e * zt->strides[0] + n * zt->strides[1] +
                                                           g * zt->strides[2]];
                        moe_put_scale(m, i, e, n, (int)g, read_f(qw->scale, e, n, g), z);
                    }
                    for (int64_t kk = 0; kk < K; kk++) {
                        int v = read_code(qw->q, e, n, kk, zp);
                        crow[kk] = (uint16_t)(zp ? v : v + 8);
                    }
                    /* padding (in the last group) decodes to 0: that group's zero point */
                    for (int64_t kk = K; kk < Kp; kk++) crow[kk] = (uint16_t)z;
                }
                moe_pack_expert(m, i, e, codes, Kp);
            }
            free(codes);
        }
    }
    if (fail) {
        clear_weights(m);
        return ompk_fail(OMPK_ERR_OUT_OF_MEMORY, fn, "code buffers");
    }
    m->loaded = 1;
    return OMPK_OK;
}

ompk_status ompk_moe_get_weights(const ompk_moe *m, ompk_moe_weight which_w, ompk_tensor *out) {
    const char *fn = "ompk_moe_get_weights";
    const int which = (int)which_w; /* an out-of-range value may come through the enum type */
    if (!m) return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "moe is NULL");
    if (which < 0 || which > 2)
        return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "which must be 0, 1 or 2");
    if (!m->loaded) return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "weights not loaded");
    ompk_call c;
    ompk_call_begin(&c, fn);
    if (ompk_call_output(&c, "out", out, 3, OMPK_DT(OMPK_F32))) {
        ompk_call_dim(&c, "out", out, 0, m->E);
        ompk_call_dim(&c, "out", out, 1, mat_n(m, which));
        ompk_call_dim(&c, "out", out, 2, mat_k(m, which));
        ompk_call_require(&c, out->device.type == OMPK_HOST && ompk_tensor_is_contiguous(out),
                          OMPK_ERR_INVALID_ARGUMENT, "out must be a contiguous host tensor");
    }
    ompk_status st = ompk_call_end(&c);
    if (st != OMPK_OK) return st;
    const int64_t N = mat_n(m, which), K = mat_k(m, which);
    float *o = out->data;
#pragma omp parallel for num_threads(m->threads) schedule(static)
    for (int64_t e = 0; e < m->E; e++)
        for (int64_t n = 0; n < N; n++)
            for (int64_t kk = 0; kk < K; kk++)
                o[(e * N + n) * K + kk] = moe_get_deq(m, which, e, n, kk);
    return OMPK_OK;
}

/* ---- forward ------------------------------------------------------------------------- */

/* The working slot becomes the new top (PUSH) or replaces it (RECOMPUTE); NONE keeps nothing. */
static void moe_commit_entry(ompk_moe *m, ompk_moe_cache_mode mode) {
    const int n = m->ncache;
    if (mode == OMPK_MOE_CACHE_PUSH) {
        m->ncache = n + 1;
    } else if (mode == OMPK_MOE_CACHE_RECOMPUTE) {
        int tmp = m->perm[n - 1];
        m->perm[n - 1] = m->perm[n];
        m->perm[n] = tmp;
    }
}

/* OMPK_TRACE: norms of x and y. OMPK_VERIFY: the double reference on the weights the kernels
 * use (read back from the packed layout) with the path's operand rounding (bf16 or int8 rows),
 * so the report measures the kernels, not the quantization; y is compared at bf16 tolerance
 * because the operands are bf16/int8 rounded. args: x, expert_ids, weights, y. */
static int moe_verify_ref(const ompk_verify_io *io) {
    const ompk_moe *m = io->ctx;
    const int64_t T = io->h[0].shape[0], H = m->H, I = m->I, E = m->E, k = m->k;
    float *xf = malloc((size_t)(T * H) * 4), *wf = malloc((size_t)(T * k) * 4);
    int64_t *idv = malloc((size_t)(T * k) * 8);
    float *wt[3];
    for (int i = 0; i < 3; i++) wt[i] = malloc((size_t)(E * I * H) * 4);
    int ok = xf && wf && idv && wt[0] && wt[1] && wt[2];
    if (!ok) fprintf(stderr, "ompk verify %s: out of memory, skipped\n", io->fn);
    if (ok) {
        for (int64_t i = 0; i < T * H; i++) xf[i] = (float)ompk_host_get(&io->h[0], i);
        for (int64_t i = 0; i < T * k; i++) {
            idv[i] = (int64_t)ompk_host_get(&io->h[1], i);
            wf[i] = (float)ompk_host_get(&io->h[2], i);
        }
        for (int i = 0; i < 3; i++) {
            const int64_t N = mat_n(m, i), K = mat_k(m, i);
            float *o = wt[i];
#pragma omp parallel for schedule(static)
            for (int64_t e = 0; e < E; e++)
                for (int64_t n = 0; n < N; n++)
                    for (int64_t kk = 0; kk < K; kk++)
                        o[(e * N + n) * K + kk] = moe_get_deq(m, i, e, n, kk);
        }
        moe_verify_ref_y(m, T, xf, idv, wf, wt, io->ref[3]);
    }
    free(xf);
    free(wf);
    free(idv);
    for (int i = 0; i < 3; i++) free(wt[i]);
    return ok;
}

static ompk_tol moe_verify_tol(const ompk_verify_io *io, int i) {
    const double *ref = io->ref[i];
    const int64_t n = io->ref_n[i];
    double s2 = 0;
    for (int64_t e = 0; e < n; e++) s2 += ref[e] * ref[e];
    double scale = n > 0 ? sqrt(s2 / (double)n) : 1.0;
    const ompk_tol t = ompk_tol_for(OMPK_BF16, scale > 0 ? scale : 1.0);
    return ((const ompk_moe *)io->ctx)->fmt != OMPK_MOE_BF16 ? ompk_tol_int_flips(t) : t;
}

static void moe_verify(const ompk_moe *m, const ompk_tensor *x, const ompk_tensor *ids,
                       const ompk_tensor *w, const ompk_tensor *y) {
    const ompk_verify_arg args[4] = {{"x", x, 1, 0, 0, NULL},
                                     {"expert_ids", ids, 0, 0, 0, NULL},
                                     {"weights", w, 0, 0, 0, NULL},
                                     {"y", y, 1, 1, 0, ompk_moe_isa_name(m->isa)}};
    const ompk_verify_op op = {.fn = "moe_forward",
                               .args = args,
                               .nargs = 4,
                               .ctx = m,
                               .ref = moe_verify_ref,
                               .tol = moe_verify_tol};
    ompk_verify_run(&op);
}

static ompk_status forward_common(ompk_moe *m, const char *fn, const ompk_tensor *x,
                                  const ompk_tensor *expert_ids, const ompk_tensor *weights,
                                  ompk_tensor *y, ompk_moe_cache_mode mode) {
    if (!m) return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "moe is NULL");
    if ((unsigned)mode > (unsigned)OMPK_MOE_CACHE_RECOMPUTE)
        return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "unknown cache mode %d", (int)mode);
    if (!m->loaded) return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "weights not loaded");
    ompk_call c;
    ompk_call_begin(&c, fn);
    int64_t T = 0;
    if (ompk_call_input(&c, "x", x, 2, OMPK_DT_FLOAT)) {
        T = x->shape[0];
        ompk_call_dim(&c, "x", x, 1, m->H);
        ompk_call_unit_stride(&c, "x", x, 1);
    }
    if (ompk_call_input(&c, "expert_ids", expert_ids, 2, OMPK_DT(OMPK_I32) | OMPK_DT(OMPK_I64))) {
        ompk_call_dim(&c, "expert_ids", expert_ids, 0, T);
        ompk_call_dim(&c, "expert_ids", expert_ids, 1, m->k);
    }
    if (ompk_call_input(&c, "weights", weights, 2, OMPK_DT(OMPK_F32))) {
        ompk_call_dim(&c, "weights", weights, 0, T);
        ompk_call_dim(&c, "weights", weights, 1, m->k);
    }
    /* a training forward may give the routes' outputs [T,k,H] f32 instead of y */
    const int routes = mode != OMPK_MOE_CACHE_NONE && y && y->ndim == 3;
    if (ompk_call_output(&c, "y", y, routes ? 3 : 2, routes ? OMPK_DT(OMPK_F32) : OMPK_DT_FLOAT)) {
        ompk_call_dim(&c, "y", y, 0, T);
        if (routes) ompk_call_dim(&c, "y", y, 1, m->k);
        ompk_call_dim(&c, "y", y, routes ? 2 : 1, m->H);
        ompk_call_unit_stride(&c, "y", y, routes ? 2 : 1);
    }
    ompk_call_require(&c, !routes || x == NULL || x->device.type == OMPK_HOST, OMPK_ERR_UNSUPPORTED,
                      "route outputs (a 3-D y) need host tensors");
    ompk_call_require(&c, T <= m->cfg.max_tokens, OMPK_ERR_INVALID_ARGUMENT,
                      "T = %lld exceeds max_tokens = %lld", (long long)T,
                      (long long)m->cfg.max_tokens);
    ompk_status st = ompk_call_end(&c);
    if (st != OMPK_OK) return st;
    const int on_dev = c.device.type != OMPK_HOST;
    if (on_dev && !(ompk_tensor_is_contiguous(x) && ompk_tensor_is_contiguous(expert_ids) &&
                    ompk_tensor_is_contiguous(weights) && ompk_tensor_is_contiguous(y)))
        return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "device tensors must be contiguous");
    if (mode == OMPK_MOE_CACHE_PUSH && m->ncache >= m->cfg.cache_depth)
        return ompk_fail(OMPK_ERR_CACHE_FULL, fn, "the cache stack holds cache_depth = %d entries",
                         m->cfg.cache_depth);
    if (mode == OMPK_MOE_CACHE_RECOMPUTE && m->ncache == 0)
        return ompk_fail(OMPK_ERR_CACHE_EMPTY, fn, "RECOMPUTE with no saved entry to overwrite");
    const int train = mode != OMPK_MOE_CACHE_NONE || m->lora.r > 0;
    moe_entry *en = train ? &m->ent[m->perm[m->ncache]] : NULL;
    if (T == 0) {
        if (train) {
            en->T = 0;
            en->r = m->lora.r;
            en->xdt = x->dtype;
            en->dev = x->device;
            moe_commit_entry(m, mode);
        }
        m->stats.stage_in_ms = m->stats.compute_ms = m->stats.stage_out_ms = 0.0;
        return OMPK_OK;
    }
    const int k = m->k;
    const size_t xes = x->dtype == OMPK_BF16 ? 2 : 4, yes = y->dtype == OMPK_BF16 ? 2 : 4;
    const size_t ides = expert_ids->dtype == OMPK_I64 ? 8 : 4;
    double t0 = omp_get_wtime();
    const void *xd = x->data, *idd = expert_ids->data, *wd = weights->data;
    int64_t xs = x->strides[0], is0 = expert_ids->strides[0], is1 = expert_ids->strides[1];
    int64_t ws0 = weights->strides[0], ws1 = weights->strides[1];
    if (on_dev) {
        void *sx = m->arena + m->off[MB_STX], *si = m->arena + m->off[MB_STIDS],
             *sw = m->arena + m->off[MB_STW];
        ompk_device h = ompk_device_host();
        if (ompk_memcpy(sx, h, x->data, x->device, (size_t)T * (size_t)m->H * xes) != OMPK_OK ||
            ompk_memcpy(si, h, expert_ids->data, c.device, (size_t)T * (size_t)k * ides) !=
                OMPK_OK ||
            ompk_memcpy(sw, h, weights->data, c.device, (size_t)T * (size_t)k * 4) != OMPK_OK)
            return ompk_fail(OMPK_ERR_RUNTIME, fn, "staging the inputs to the host failed");
        xd = sx;
        idd = si;
        wd = sw;
        xs = m->H;
        is0 = k;
        is1 = 1;
        ws0 = k;
        ws1 = 1;
    }
    double t1 = omp_get_wtime();
    int64_t *ids = (int64_t *)(m->arena + m->off[MB_IDS]);
    float *wc = (float *)(m->arena + m->off[MB_STW]);
    for (int64_t t = 0; t < T; t++)
        for (int j = 0; j < k; j++) {
            int64_t o = t * is0 + j * is1;
            int64_t e = ides == 8 ? ((const int64_t *)idd)[o] : ((const int32_t *)idd)[o];
            if (e < -1 || e >= m->E)
                return ompk_fail(OMPK_ERR_INDEX_OUT_OF_RANGE, fn,
                                 "expert_ids[%lld,%d] = %lld is outside [-1, %lld)", (long long)t,
                                 j, (long long)e, (long long)m->E);
            ids[t * k + j] = e;
        }
    /* on the device path the staged copy is already contiguous [T,k] */
    if (!on_dev)
        for (int64_t t = 0; t < T; t++)
            for (int j = 0; j < k; j++) wc[t * k + j] = ((const float *)wd)[t * ws0 + j * ws1];
    void *yd = on_dev ? (void *)(m->arena + m->off[MB_STY]) : y->data;
    int64_t ys = on_dev ? m->H : y->strides[0];
    st = train ? moe_run_train(m, en, T, xd, xs, x->dtype, ids, wc, yd, ys,
                               routes ? y->strides[1] : 0, y->dtype)
               : moe_run(m, T, xd, xs, x->dtype, ids, wc, yd, ys, y->dtype);
    if (st != OMPK_OK) return st;
    double t2 = omp_get_wtime();
    if (on_dev && ompk_memcpy(y->data, y->device, yd, ompk_device_host(),
                              (size_t)T * (size_t)m->H * yes) != OMPK_OK)
        return ompk_fail(OMPK_ERR_RUNTIME, fn, "copying y to the device failed");
    double t3 = omp_get_wtime();
    m->stats.stage_in_ms = (t1 - t0) * 1e3;
    m->stats.compute_ms = (t2 - t1) * 1e3;
    m->stats.stage_out_ms = (t3 - t2) * 1e3;
    if (train) {
        en->xdt = x->dtype;
        en->dev = x->device;
        moe_commit_entry(m, mode);
    }
    if (!routes && (ompk_verify_enabled() || ompk_trace_enabled()))
        moe_verify(m, x, expert_ids, weights, y);
    return OMPK_OK;
}

ompk_status ompk_moe_fwd(ompk_moe *m, const ompk_tensor *x, const ompk_tensor *expert_ids,
                         const ompk_tensor *weights, ompk_tensor *y) {
    return forward_common(m, "ompk_moe_fwd", x, expert_ids, weights, y, OMPK_MOE_CACHE_NONE);
}

ompk_status ompk_moe_fwd_train(ompk_moe *m, const ompk_tensor *x, const ompk_tensor *expert_ids,
                               const ompk_tensor *weights, ompk_tensor *y,
                               ompk_moe_cache_mode mode) {
    return forward_common(m, "ompk_moe_fwd_train", x, expert_ids, weights, y, mode);
}

/* ompk_moe_combine under verify: y against the double sum of w z over the slots (gather mode) */
static int combine_verify_ref(const ompk_verify_io *io) {
    const int64_t T = io->h[0].shape[0], k = io->h[0].shape[1], H = io->h[0].shape[2];
    const double *z = io->d[0], *id = io->d[1], *w = io->d[2];
    double *y = io->ref[3];
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < k; j++)
            if (id[t * k + j] >= 0)
                for (int64_t h = 0; h < H; h++)
                    y[t * H + h] += w[t * k + j] * z[(t * k + j) * H + h];
    return 1;
}

ompk_status ompk_moe_combine(const ompk_moe *moe, const ompk_tensor *z,
                             const ompk_tensor *expert_ids, const ompk_tensor *weights,
                             ompk_tensor *y, ompk_moe_combine_of of) {
    const char *fn = "ompk_moe_combine";
    if (!moe) return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "moe is NULL");
    ompk_call c;
    ompk_call_begin(&c, fn);
    int64_t T = 0, k = 0, H = 0;
    if (ompk_call_input(&c, "z", z, 3, OMPK_DT(OMPK_F32))) {
        T = z->shape[0], k = z->shape[1], H = z->shape[2];
        ompk_call_unit_stride(&c, "z", z, 2);
    }
    ompk_call_require(&c, k <= 64, OMPK_ERR_INVALID_ARGUMENT, "k = %lld exceeds 64", (long long)k);
    if (ompk_call_input(&c, "expert_ids", expert_ids, 2, OMPK_DT(OMPK_I32) | OMPK_DT(OMPK_I64))) {
        ompk_call_dim(&c, "expert_ids", expert_ids, 0, T);
        ompk_call_dim(&c, "expert_ids", expert_ids, 1, k);
    }
    if (ompk_call_input(&c, "weights", weights, 2, OMPK_DT(OMPK_F32))) {
        ompk_call_dim(&c, "weights", weights, 0, T);
        ompk_call_dim(&c, "weights", weights, 1, k);
    }
    if (ompk_call_output(&c, "y", y, 2, OMPK_DT_FLOAT)) {
        ompk_call_dim(&c, "y", y, 0, T);
        ompk_call_dim(&c, "y", y, 1, H);
        ompk_call_unit_stride(&c, "y", y, 1);
    }
    ompk_call_require(&c, (unsigned)of <= (unsigned)OMPK_MOE_COMBINE_FWD_TRAIN,
                      OMPK_ERR_INVALID_ARGUMENT, "unknown combine %d", (int)of);
    ompk_call_require(&c, H == moe->H, OMPK_ERR_INVALID_ARGUMENT,
                      "z has %lld features, the layer's hidden size is %lld", (long long)H,
                      (long long)moe->H);
    ompk_status st = ompk_call_end(&c);
    if (st != OMPK_OK) return st;
    if (c.device.type != OMPK_HOST)
        return ompk_fail(OMPK_ERR_DEVICE_MISMATCH, fn,
                         "z, expert_ids, weights and y must be host tensors");
    if (T == 0) return OMPK_OK;
    int64_t *ids = malloc((size_t)(T * k) * sizeof *ids);
    float *w = malloc((size_t)(T * k) * sizeof *w);
    float *acc = malloc((size_t)omp_get_max_threads() * (size_t)H * sizeof *acc);
    if (!ids || !w || !acc) {
        free(ids), free(w), free(acc);
        return ompk_fail(OMPK_ERR_OUT_OF_MEMORY, fn, "no memory for %lld routes",
                         (long long)(T * k));
    }
    const int i64 = expert_ids->dtype == OMPK_I64;
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < k; j++) {
            const int64_t o = t * expert_ids->strides[0] + j * expert_ids->strides[1];
            const int64_t e = i64 ? ((const int64_t *)expert_ids->data)[o]
                                  : ((const int32_t *)expert_ids->data)[o];
            if (e < -1) {
                free(ids), free(w), free(acc);
                return ompk_fail(OMPK_ERR_INDEX_OUT_OF_RANGE, fn,
                                 "expert_ids[%lld,%lld] = %lld is below -1", (long long)t,
                                 (long long)j, (long long)e);
            }
            ids[t * k + j] = e;
            w[t * k + j] =
                ((const float *)weights->data)[t * weights->strides[0] + j * weights->strides[1]];
        }
    /* the forward with LoRA attached, like the training forward, is moe_run_train's */
    if (of == OMPK_MOE_COMBINE_FWD_TRAIN || moe->lora.r > 0)
        moe_combine_train(T, (int)k, H, (const float *)z->data, z->strides[0], z->strides[1], ids,
                          w, k, y->data, y->strides[0], y->dtype == OMPK_BF16, acc);
    else
        moe_combine(moe_combine_vec(moe->isa), T, (int)k, H, (const float *)z->data, z->strides[0],
                    z->strides[1], ids, w, k, y->data, y->strides[0], y->dtype == OMPK_BF16, acc);
    free(ids), free(w), free(acc);
    if (ompk_verify_enabled() || ompk_trace_enabled()) {
        const ompk_verify_arg args[4] = {{"z", z, 1, 0, 0, NULL},
                                         {"expert_ids", expert_ids, 0, 0, 0, NULL},
                                         {"weights", weights, 0, 0, 0, NULL},
                                         {"y", y, 1, 1, 0, NULL}};
        const ompk_verify_op op = {.fn = "moe_combine",
                                   .args = args,
                                   .nargs = 4,
                                   .gather = 1,
                                   .ref = combine_verify_ref,
                                   .tol = ompk_verify_tol_ref_max};
        ompk_verify_run(&op);
    }
    return OMPK_OK;
}
