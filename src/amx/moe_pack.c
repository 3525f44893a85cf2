/* Packed weight storage: per-partition allocation (bound to the partition's NUMA node) and
 * placement / read-back of single weights in the tile layout described in moe_internal.h. */
#include <string.h>
#include <sys/mman.h>

#include "bf16.h"
#include "error.h"
#include "moe_internal.h"

static size_t align64(size_t x) {
    return (x + 63) & ~(size_t)63;
}

ompk_status moe_parts_alloc(ompk_moe *m) {
    int isint = m->fmt != OMPK_MOE_BF16, is4 = m->fmt >= OMPK_MOE_INT4;
    for (int p = 0; p < m->P; p++) {
        moe_part *pp = &m->part[p];
        size_t E = (size_t)m->E;
        size_t gu = E * (size_t)pp->nbg * (size_t)m->ktg * 2 * (size_t)m->tb;
        size_t dn = E * (size_t)m->nbd * (size_t)pp->ktd * (size_t)m->tb;
        size_t gus = isint ? E * 2 * (size_t)m->gg * (size_t)pp->ip : 0;
        size_t dns = isint ? E * (size_t)pp->gd * (size_t)m->Hn : 0;
        size_t guz = is4 ? E * 2 * (size_t)m->gg * (size_t)pp->nbg * 64 : 0;
        size_t dnz = is4 ? E * (size_t)pp->gd * (size_t)m->nbd * 64 : 0;
        size_t o_gu = 0, o_dn = align64(o_gu + gu), o_gus = align64(o_dn + dn);
        size_t o_dns = align64(o_gus + gus * 4), o_guw = align64(o_dns + dns * 4);
        size_t o_dnw = align64(o_guw + gus * 4), o_guz = align64(o_dnw + dns * 4);
        size_t o_dnz = align64(o_guz + guz), total = align64(o_dnz + dnz) + 64;
        void *mem = NULL;
        if (m->nnodes > 1) {
            hwloc_obj_t node =
                hwloc_get_obj_by_type(m->topo, HWLOC_OBJ_NUMANODE, (unsigned)pp->node);
            if (node)
                mem = hwloc_alloc_membind(m->topo, total, node->nodeset, HWLOC_MEMBIND_BIND,
                                          HWLOC_MEMBIND_BYNODESET);
        }
        if (!mem) mem = hwloc_alloc(m->topo, total);
        if (!mem) {
            moe_parts_free(m);
            return ompk_fail(OMPK_ERR_OUT_OF_MEMORY, "ompk_moe_create",
                             "packed weights of partition %d: %zu bytes", p, total);
        }
        /* weights are streamed every forward: huge pages spare the TLB (advice only) */
        madvise(mem, total, MADV_HUGEPAGE);
        memset(mem, 0, total);
        pp->mem = mem;
        pp->mem_bytes = total;
        uint8_t *b = mem;
        pp->gu = b + o_gu;
        pp->dn = b + o_dn;
        pp->gu_scale = (float *)(b + o_gus);
        pp->dn_scale = (float *)(b + o_dns);
        pp->gu_ws = (int32_t *)(b + o_guw);
        pp->dn_ws = (int32_t *)(b + o_dnw);
        pp->gu_z = is4 ? b + o_guz : NULL;
        pp->dn_z = is4 ? b + o_dnz : NULL;
        if (!isint) pp->gu_scale = pp->dn_scale = NULL, pp->gu_ws = pp->dn_ws = NULL;
    }
    return OMPK_OK;
}

void moe_parts_free(ompk_moe *m) {
    for (int p = 0; p < m->P; p++) {
        if (m->part[p].mem) hwloc_free(m->topo, m->part[p].mem, m->part[p].mem_bytes);
        m->part[p].mem = NULL;
    }
}

static int part_of(const ompk_moe *m, int64_t i) {
    for (int p = 0; p < m->P; p++)
        if (i >= m->part[p].i0 && i < m->part[p].i0 + m->part[p].ip) return p;
    return -1;
}

/* Byte offset of element (n%16, k%kte) inside its tile; *hi says which int4 nibble. */
static size_t in_tile(const ompk_moe *m, int64_t nn, int64_t kk, int *hi) {
    *hi = 0;
    if (m->fmt == OMPK_MOE_BF16) return (size_t)((((kk >> 1) * 16 + nn) * 2 + (kk & 1)) * 2);
    int64_t pos = nn * 4 + (kk & 3), row = kk >> 2;
    if (m->fmt == OMPK_MOE_INT8) return (size_t)(row * 64 + pos);
    *hi = pos >= 32;
    return (size_t)(row * 32 + (pos & 31));
}

typedef struct loc {
    uint8_t *tile; /* tile base */
    float *scale;  /* scale slot (int) */
    int32_t *ws;   /* weight-sum slot (int) */
    uint8_t *z;    /* zero vector slot, 4 bytes of n (int4) */
    int64_t nn, kk;
} loc;

static int locate(const ompk_moe *m, int which, int64_t e, int64_t n, int64_t k, loc *l) {
    int g = m->fmt == OMPK_MOE_BF16 ? 0 : (int)((k / m->kte) / m->ktpg);
    if (which < 2) {
        int p = part_of(m, n);
        if (p < 0 || k >= m->Hk) return 0;
        const moe_part *pp = &m->part[p];
        int64_t nl = n - pp->i0, nb = nl / 16, kt = k / m->kte;
        l->tile = pp->gu + ((((size_t)e * pp->nbg + nb) * m->ktg + kt) * 2 + which) * m->tb;
        size_t si = ((size_t)(e * 2 + which) * m->gg + g) * pp->ip + nl;
        l->scale = pp->gu_scale ? pp->gu_scale + si : NULL;
        l->ws = pp->gu_ws ? pp->gu_ws + si : NULL;
        l->z = pp->gu_z ? pp->gu_z + ((((size_t)(e * 2 + which) * m->gg + g) * pp->nbg + nb) * 64 +
                                      (nl % 16) * 4)
                        : NULL;
        l->nn = nl % 16;
        l->kk = k % m->kte;
        return 1;
    }
    int p = part_of(m, k);
    if (p < 0 || n >= m->Hn) return 0;
    const moe_part *pp = &m->part[p];
    int64_t kl = k - pp->i0, nb = n / 16, kt = kl / m->kte;
    int gl = m->fmt == OMPK_MOE_BF16 ? 0 : (int)(((pp->i0 / 64) + kl / 64) / m->ktpg) - pp->gd0;
    if (m->fmt == OMPK_MOE_INT8) gl = 0;
    l->tile = pp->dn + (((size_t)e * m->nbd + nb) * pp->ktd + kt) * m->tb;
    size_t si = ((size_t)e * pp->gd + gl) * m->Hn + n;
    l->scale = pp->dn_scale ? pp->dn_scale + si : NULL;
    l->ws = pp->dn_ws ? pp->dn_ws + si : NULL;
    l->z = pp->dn_z ? pp->dn_z + ((((size_t)e * pp->gd + gl) * m->nbd + nb) * 64 + (n % 16) * 4)
                    : NULL;
    l->nn = n % 16;
    l->kk = kl % m->kte;
    return 1;
}

/* Bytes of one packed element: its tile (n-block, k-tile) and in-tile offset, from codes. */
static void put_code(const ompk_moe *m, uint8_t *tile, int64_t nn, int64_t kk, int code) {
    int hi;
    size_t o = in_tile(m, nn, kk, &hi);
    if (m->fmt == OMPK_MOE_BF16) {
        memcpy(tile + o, &(uint16_t){(uint16_t)code}, 2);
    } else if (m->fmt == OMPK_MOE_INT8) {
        tile[o] = (uint8_t)(int8_t)code;
    } else {
        uint8_t c = (uint8_t)(code & 15);
        tile[o] = hi ? (uint8_t)((tile[o] & 0x0f) | (c << 4)) : (uint8_t)((tile[o] & 0xf0) | c);
    }
}

static int code_value(const ompk_moe *m, uint16_t c) {
    return m->fmt == OMPK_MOE_INT8 ? (int)(int8_t)(uint8_t)c : (int)c;
}

void moe_pack_expert(ompk_moe *m, int which, int64_t e, const uint16_t *codes, int64_t ldc) {
    const int isint = m->fmt != OMPK_MOE_BF16, is4 = m->fmt >= OMPK_MOE_INT4;
    const int64_t N = which < 2 ? m->I : m->H;
    for (int p = 0; p < m->P; p++) {
        const moe_part *pp = &m->part[p];
        if (pp->ip == 0) continue;
        const int nbs = which < 2 ? pp->nbg : m->nbd, kts = which < 2 ? m->ktg : pp->ktd;
        const int64_t n0 = which < 2 ? pp->i0 : 0, k0 = which < 2 ? 0 : pp->i0;
        for (int nb = 0; nb < nbs; nb++)
            for (int kt = 0; kt < kts; kt++) {
                uint8_t *tile =
                    which < 2
                        ? pp->gu + ((((size_t)e * pp->nbg + nb) * m->ktg + kt) * 2 + which) * m->tb
                        : pp->dn + (((size_t)e * m->nbd + nb) * pp->ktd + kt) * m->tb;
                /* group of this k-tile, local to the partition's scale / zero / sum arrays */
                int g = 0;
                if (isint && which < 2) g = kt / m->ktpg;
                if (isint && which == 2) g = (int)((pp->i0 / 64 + kt) / m->ktpg) - pp->gd0;
                for (int nn = 0; nn < 16; nn++) {
                    int64_t n = n0 + nb * 16 + nn;
                    if (n >= N || (which < 2 && n >= pp->i0 + pp->ip)) continue;
                    const uint16_t *row = codes + n * ldc + k0 + (int64_t)kt * m->kte;
                    int32_t sum = 0;
                    int z = 0;
                    int32_t *ws = NULL;
                    if (isint) {
                        size_t si = which < 2 ? ((size_t)(e * 2 + which) * m->gg + g) * pp->ip +
                                                    (size_t)(n - pp->i0)
                                              : ((size_t)e * pp->gd + g) * m->Hn + (size_t)n;
                        ws = (which < 2 ? pp->gu_ws : pp->dn_ws) + si;
                        if (is4)
                            z = which < 2
                                    ? pp->gu_z[(((size_t)(e * 2 + which) * m->gg + g) * pp->nbg +
                                                nb) *
                                                   64 +
                                               nn * 4]
                                    : pp->dn_z[(((size_t)e * pp->gd + g) * m->nbd + nb) * 64 +
                                               nn * 4];
                    }
                    for (int kk = 0; kk < m->kte; kk++) {
                        int c = code_value(m, row[kk]);
                        put_code(m, tile, nn, kk, c);
                        sum += c - z;
                    }
                    if (ws) *ws += sum;
                }
            }
    }
}

void moe_put_scale(ompk_moe *m, int which, int64_t e, int64_t n, int g, float scale, int zero) {
    int64_t kg = m->fmt == OMPK_MOE_INT8 ? 0 : (int64_t)g * m->gs;
    if (which < 2) {
        loc l;
        if (!locate(m, which, e, n, kg, &l)) return;
        *l.scale = scale;
        if (l.z) memset(l.z, zero, 4);
        return;
    }
    for (int p = 0; p < m->P; p++) {
        const moe_part *pp = &m->part[p];
        if (pp->ip == 0) continue;
        int gl = m->fmt == OMPK_MOE_INT8 ? 0 : g - pp->gd0;
        if (gl < 0 || gl >= pp->gd) continue;
        size_t si = ((size_t)e * pp->gd + gl) * m->Hn + n;
        pp->dn_scale[si] = scale;
        if (pp->dn_z)
            memset(pp->dn_z + (((size_t)e * pp->gd + gl) * m->nbd + n / 16) * 64 + (n % 16) * 4,
                   zero, 4);
    }
}

float moe_get_deq(const ompk_moe *m, int which, int64_t e, int64_t n, int64_t k) {
    loc l;
    if (!locate(m, which, e, n, k, &l)) return 0.0f;
    int hi;
    size_t o = in_tile(m, l.nn, l.kk, &hi);
    if (m->fmt == OMPK_MOE_BF16) {
        uint16_t v;
        memcpy(&v, l.tile + o, 2);
        return ompk_bf16_to_f32(v);
    }
    if (m->fmt == OMPK_MOE_INT8) return (float)(int8_t)l.tile[o] * *l.scale;
    int c = hi ? l.tile[o] >> 4 : l.tile[o] & 15;
    return (float)(c - (int)l.z[0]) * *l.scale;
}

void moe_get_deq_tile(const ompk_moe *m, int which, int64_t e, int64_t n0, int64_t k0, int nr,
                      int kc, float *out, int64_t ldo) {
    loc l;
    if (!locate(m, which, e, n0, k0, &l)) {
        for (int nn = 0; nn < nr; nn++)
            for (int kk = 0; kk < kc; kk++) out[nn * ldo + kk] = 0.0f;
        return;
    }
    for (int nn = 0; nn < nr; nn++) {
        float *o = out + nn * ldo;
        if (m->fmt == OMPK_MOE_BF16) {
            for (int kk = 0; kk < kc; kk++) {
                uint16_t v;
                memcpy(&v, l.tile + (((kk >> 1) * 16 + nn) * 2 + (kk & 1)) * 2, 2);
                o[kk] = ompk_bf16_to_f32(v);
            }
        } else if (m->fmt == OMPK_MOE_INT8) {
            const float s = l.scale[nn];
            for (int kk = 0; kk < kc; kk++)
                o[kk] = (float)(int8_t)l.tile[(kk >> 2) * 64 + nn * 4 + (kk & 3)] * s;
        } else {
            const float s = l.scale[nn];
            const int z = l.z[nn * 4];
            for (int kk = 0; kk < kc; kk++) {
                const int pos = nn * 4 + (kk & 3);
                const uint8_t b = l.tile[(kk >> 2) * 32 + (pos & 31)];
                o[kk] = (float)((pos >= 32 ? b >> 4 : b & 15) - z) * s;
            }
        }
    }
}

void moe_get_code_tile(const ompk_moe *m, int which, int64_t e, int64_t n0, int64_t k0, int nr,
                       int kc, float *out, int64_t ldo, float *scale) {
    loc l;
    if (!locate(m, which, e, n0, k0, &l)) {
        for (int nn = 0; nn < nr; nn++) {
            scale[nn] = 0.0f;
            for (int kk = 0; kk < kc; kk++) out[nn * ldo + kk] = 0.0f;
        }
        return;
    }
    for (int nn = 0; nn < nr; nn++) {
        scale[nn] = l.scale[nn];
        for (int kk = 0; kk < kc; kk++)
            out[nn * ldo + kk] = (float)(int8_t)l.tile[(kk >> 2) * 64 + nn * 4 + (kk & 3)];
    }
}
