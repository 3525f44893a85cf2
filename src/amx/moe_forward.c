/* The MoE forward driver: routing (token grouping per expert), the scratch arena, and the four
 * phases of one parallel region (gather/quantize x; gate+up with SiLU*up fused in fp32; down
 * accumulated into per-partition fp32 partials; the fixed-order sum and single rounding of y).
 *
 * Determinism: every value is computed by exactly one thread with a fixed operation order.
 * Gate/up tasks (expert, block of 4 n-blocks) are claimed dynamically but write disjoint
 * columns; down work is split by output columns, each thread walking all active experts in
 * ascending order, so y partial rows are accumulated in the same order for any thread count. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "bf16.h"
#include "error.h"
#include "moe_internal.h"
#include "moe_quant.h"

#define CANARY 64

static size_t align_up(size_t x, size_t a) {
    return (x + a - 1) / a * a;
}

static uint8_t canary_byte(int id, size_t i) {
    return (uint8_t)(0xA5u ^ (unsigned)(id * 31) ^ (unsigned)i);
}

ompk_status moe_arena_create(ompk_moe *m) {
    int64_t Tm = m->cfg.max_tokens, R = Tm * m->k, Rp = R + MOE_ROW_PAD;
    int isint = m->fmt != OMPK_MOE_BF16;
    size_t es = isint ? 1 : 2;
    m->rows_max = R;
    int64_t rowmax = m->Hk > m->Ipad ? m->Hk : m->Ipad;
    m->tscr_bytes = align_up(MOE_KSCRATCH + MOE_NSTEPS * 1024 * 4 + (size_t)rowmax * 4, 64);
    m->len[MB_OFFS] = (size_t)(m->E + 1) * 8;
    m->len[MB_CURSOR] = (size_t)m->E * 8;
    m->len[MB_ACTIVE] = (size_t)m->E * 4;
    m->len[MB_ROWTOK] = (size_t)R * 4;
    m->len[MB_ROWW] = (size_t)R * 4;
    m->len[MB_IDS] = (size_t)R * 8;
    m->len[MB_XQT] = isint ? (size_t)Tm * (size_t)m->Hk : 0;
    m->len[MB_SXT] = isint ? (size_t)Tm * 4 : 0;
    m->len[MB_XG] = (size_t)Rp * (size_t)m->Hk * es;
    m->len[MB_SX] = isint ? (size_t)R * 4 : 0;
    m->len[MB_A] = (size_t)Rp * (size_t)m->Ipad * es;
    m->len[MB_AF] = isint ? (size_t)R * (size_t)m->Ipad * 4 : 0;
    m->len[MB_SA] = isint ? (size_t)R * 4 : 0;
    m->len[MB_YP] = (size_t)m->P * (size_t)Tm * (size_t)m->Hn * 4;
    m->len[MB_TSCR] = (size_t)m->threads * m->tscr_bytes;
    m->len[MB_STX] = (size_t)Tm * (size_t)m->H * 4;
    m->len[MB_STIDS] = (size_t)R * 8;
    m->len[MB_STW] = (size_t)R * 4;
    m->len[MB_STY] = (size_t)Tm * (size_t)m->H * 4;
    size_t off = 0;
    for (int i = 0; i < MB_COUNT_; i++) {
        m->off[i] = off;
        off = align_up(off + m->len[i], 64) + CANARY;
    }
    m->arena_bytes = off;
    m->arena = aligned_alloc(4096, align_up(off, 4096));
    if (!m->arena)
        return ompk_fail(OMPK_ERR_OUT_OF_MEMORY, "ompk_moe_create", "scratch arena of %zu bytes",
                         off);
    madvise(m->arena, align_up(off, 4096), MADV_HUGEPAGE);
    for (int i = 0; i < MB_COUNT_; i++) {
        uint8_t *c = m->arena + align_up(m->off[i] + m->len[i], 64);
        for (size_t j = 0; j < CANARY; j++) c[j] = canary_byte(i, j);
    }
    return OMPK_OK;
}

int moe_arena_check(const ompk_moe *m) {
    for (int i = 0; i < MB_COUNT_; i++) {
        const uint8_t *c = m->arena + align_up(m->off[i] + m->len[i], 64);
        for (size_t j = 0; j < CANARY; j++)
            if (c[j] != canary_byte(i, j)) return i + 1;
    }
    return 0;
}

#define BUF(m, id, type) ((type *)((m)->arena + (m)->off[id]))

/* Thread tid of nth belongs to partition p's group [lo, hi); with fewer threads than
 * partitions a thread serves several partitions alone. */
static int group_of(int p, int P, int nth, int *lo, int *hi) {
    *lo = (int)((int64_t)p * nth / P);
    *hi = (int)((int64_t)(p + 1) * nth / P);
    if (*hi == *lo) *hi = *lo + 1;
    return *hi - *lo;
}

static void pin_thread(const ompk_moe *m, int tid, int nth) {
    if (m->ncores <= 0) return;
    int p = 0, lo = 0, hi = 0;
    for (p = 0; p < m->P; p++) {
        group_of(p, m->P, nth, &lo, &hi);
        if (tid >= lo && tid < hi) break;
    }
    if (p == m->P) return;
    int node = m->part[p].node, rank = tid - lo;
    for (int q = 0; q < p; q++) {
        int l2, h2;
        if (m->part[q].node == node) rank += group_of(q, m->P, nth, &l2, &h2);
    }
    int nn = 0;
    for (int c = 0; c < m->ncores; c++) nn += m->core_node[c] == node;
    if (nn == 0) return;
    int want = rank % nn;
    for (int c = 0; c < m->ncores; c++)
        if (m->core_node[c] == node && want-- == 0) {
            hwloc_set_cpubind(m->topo, m->core_set[c], HWLOC_CPUBIND_THREAD);
            return;
        }
}

int moe_pick_kernel(const ompk_moe *m, int64_t rows) {
    int vec = moe_cpu_has_avx512() ? K_AVX512 : K_PORTABLE;
    switch (m->isa) {
    case OMPK_MOE_ISA_AMX:
        return rows >= m->amx_min_rows ? K_AMX : K_AVX512;
    case OMPK_MOE_ISA_AMX_EMULATED:
        return rows >= m->amx_min_rows ? K_AMX_EMU : vec;
    case OMPK_MOE_ISA_AVX512BF16:
        return K_AVX512;
    default:
        return K_PORTABLE;
    }
}

/* The K-blocked AMX kernels take several n-steps per call (bf16 and int8; int4's per-group
 * flushes stay in the one-step kernel). */
static int blocked(const ompk_moe *m, int kind) {
    return m->kblock && (kind == K_AMX || kind == K_AMX_EMU) &&
           (m->fmt == OMPK_MOE_BF16 || m->fmt == OMPK_MOE_INT8);
}

void moe_run_kernel(int kind, const moe_kargs *k) {
    switch (kind) {
    case K_AMX:
        if (k->nsteps > 1)
            moe_kern_amx_n(k);
        else
            moe_kern_amx(k);
        break;
    case K_AMX_EMU:
        if (k->nsteps > 1)
            moe_kern_amx_emu_n(k);
        else
            moe_kern_amx_emu(k);
        break;
    case K_AVX512:
        moe_kern_avx512(k);
        break;
    default:
        moe_kern_portable(k);
        break;
    }
}

/* Portable epilogues (the AVX-512 ones in moe_kern_avx512.c do the same per element). */
static void silu_rows(const float *out, int mr, void *dst, int64_t ld, int to_bf16) {
    for (int r = 0; r < mr; r++)
        for (int n = 0; n < 16; n++) {
            float g = out[r * 16 + n], u = out[(32 + r) * 16 + n];
            float a = g / (1.0f + expf(-g)) * u;
            if (to_bf16)
                ((uint16_t *)dst)[r * ld + n] = ompk_f32_to_bf16(a);
            else
                ((float *)dst)[r * ld + n] = a;
        }
}

static void axpy_row(float *restrict y, const float *restrict out, int r, float w) {
    for (int n = 0; n < 16; n++) y[n] += w * out[r * 16 + n];
    for (int n = 0; n < 16; n++) y[16 + n] += w * out[(32 + r) * 16 + n];
}

/* Packed gate/up weights of n-block nb of expert e; down weights of column pair pr. */
const uint8_t *moe_gu_b(const ompk_moe *m, const moe_part *pp, int64_t e, int nb) {
    return pp->gu + (((size_t)e * pp->nbg + (size_t)nb) * m->ktg) * 2 * m->tb;
}

const uint8_t *moe_dn_b(const ompk_moe *m, const moe_part *pp, int64_t e, int pr) {
    return pp->dn + ((size_t)e * m->nbd + 2 * (size_t)pr) * pp->ktd * m->tb;
}

/* The next work item's regions (weights, and activations when the expert changes). */
typedef struct pipe_t {
    const uint8_t *p[2];
    int64_t n[2];
} pipe_t;

/* Part u of n (whole lines) of region r of src, into region r of dst. */
static void pipe_part(const pipe_t *src, int r, int u, int n, pipe_t *dst) {
    const int64_t lines = (src->n[r] + 63) / 64, l0 = lines * u / n, l1 = lines * (u + 1) / n;
    dst->p[r] = l1 > l0 ? src->p[r] + l0 * 64 : NULL;
    dst->n[r] = (l1 - l0) * 64;
}

/* Row-block pass rb of nrb prefetches its share (whole lines) of the next work item. */
static void pipe_share(const pipe_t *nx, int rb, int nrb, moe_kargs *ka) {
    for (int r = 0; r < 2; r++) {
        const int64_t lines = (nx->n[r] + 63) / 64, l0 = lines * rb / nrb,
                      l1 = lines * (rb + 1) / nrb;
        ka->pf[r] = l1 > l0 ? nx->p[r] + l0 * 64 : NULL;
        ka->pf_bytes[r] = (l1 - l0) * 64;
    }
}

ompk_status moe_run(ompk_moe *m, int64_t T, const void *xd, int64_t xs, ompk_dtype xdt,
                    const int64_t *ids, const float *w, void *yd, int64_t ys, ompk_dtype ydt) {
    const int64_t E = m->E, H = m->H, Hk = m->Hk, Hn = m->Hn, Ipad = m->Ipad,
                  Tm = m->cfg.max_tokens;
    const int k = m->k, P = m->P, isint = m->fmt != OMPK_MOE_BF16;
    const size_t es = isint ? 1 : 2;
    int64_t *offs = BUF(m, MB_OFFS, int64_t), *cur = BUF(m, MB_CURSOR, int64_t);
    int32_t *active = BUF(m, MB_ACTIVE, int32_t), *rowtok = BUF(m, MB_ROWTOK, int32_t);
    float *roww = BUF(m, MB_ROWW, float);
    uint8_t *xg = BUF(m, MB_XG, uint8_t), *abuf = BUF(m, MB_A, uint8_t);
    float *sx = BUF(m, MB_SX, float), *af = BUF(m, MB_AF, float), *sa = BUF(m, MB_SA, float);
    float *yp = BUF(m, MB_YP, float);
    uint8_t *tscr = BUF(m, MB_TSCR, uint8_t), *xqt = BUF(m, MB_XQT, uint8_t);
    float *sxt = BUF(m, MB_SXT, float);
    const int vec_epi = m->isa != OMPK_MOE_ISA_PORTABLE && moe_cpu_has_avx512();

    /* counting sort of (token, slot) pairs by expert: rows of one expert are contiguous and in
     * token order */
    for (int64_t e = 0; e <= E; e++) offs[e] = 0;
    for (int64_t i = 0; i < T * k; i++)
        if (ids[i] >= 0) offs[ids[i] + 1]++;
    int nact = 0, n_amx = 0;
    for (int64_t e = 0; e < E; e++) {
        if (offs[e + 1] > 0) {
            active[nact++] = (int32_t)e;
            int kind = moe_pick_kernel(m, offs[e + 1]);
            n_amx += kind == K_AMX || kind == K_AMX_EMU;
        }
        offs[e + 1] += offs[e];
        cur[e] = offs[e];
    }
    const int64_t R = offs[E];
    for (int64_t t = 0; t < T; t++)
        for (int j = 0; j < k; j++) {
            int64_t e = ids[t * k + j];
            if (e < 0) continue;
            int64_t r = cur[e]++;
            rowtok[r] = (int32_t)t;
            roww[r] = w[t * k + j];
        }
    m->stats.experts_amx = n_amx;
    m->stats.experts_vector = nact - n_amx;

    int ctr[MOE_MAX_PARTS];
    for (int p = 0; p < P; p++) ctr[p] = 0;
    const int64_t ldx = Hk * (int64_t)es, lda = Ipad * (int64_t)es;
    hwloc_bitmap_t saved = NULL;
    if (!m->cfg.no_pin && m->ncores > 0) {
        saved = hwloc_bitmap_alloc();
        if (saved && hwloc_get_cpubind(m->topo, saved, HWLOC_CPUBIND_THREAD) != 0) {
            hwloc_bitmap_free(saved);
            saved = NULL;
        }
    }
    const int pin = saved != NULL, pipe = m->prefetch == 0 || m->prefetch == 3;
    double tm[4] = {0, 0, 0, 0}, tfork = 0, tstart = omp_get_wtime();

#pragma omp parallel num_threads(m->threads)
    {
        const int tid = omp_get_thread_num(), nth = omp_get_num_threads();
        if (pin) pin_thread(m, tid, nth);
        /* the team is up and pinned: what is left of phase 0 is the gather itself */
#pragma omp barrier
#pragma omp master
        tfork = omp_get_wtime();
        uint8_t *kscr = tscr + (size_t)tid * m->tscr_bytes;
        float *kout = (float *)(kscr + MOE_KSCRATCH);
        float *rowf = kout + MOE_NSTEPS * 1024;
        int used_amx = 0;

        /* phase 0: int formats quantize each token once; then rows are gathered per expert */
        if (isint) {
#pragma omp for schedule(static)
            for (int64_t t = 0; t < T; t++) {
                const uint8_t *src =
                    (const uint8_t *)xd + (size_t)(t * xs) * (xdt == OMPK_BF16 ? 2 : 4);
                for (int64_t h = 0; h < H; h++) rowf[h] = ompk_load_f(src, h, xdt == OMPK_BF16);
                for (int64_t h = H; h < Hk; h++) rowf[h] = 0.0f;
                sxt[t] = moe_quant_row(rowf, Hk, (int8_t *)(xqt + t * Hk));
            }
        }
#pragma omp for schedule(static) nowait
        for (int64_t r = 0; r < R + MOE_ROW_PAD; r++) {
            uint8_t *dst = xg + r * ldx;
            if (r >= R) {
                memset(dst, 0, (size_t)ldx);
                memset(abuf + r * lda, 0, (size_t)lda);
                continue;
            }
            int64_t t = rowtok[r];
            if (isint) {
                memcpy(dst, xqt + t * Hk, (size_t)Hk);
                sx[r] = sxt[t];
                continue;
            }
            const uint8_t *src =
                (const uint8_t *)xd + (size_t)(t * xs) * (xdt == OMPK_BF16 ? 2 : 4);
            uint16_t *d16 = (uint16_t *)dst;
            if (xdt == OMPK_BF16)
                memcpy(d16, src, (size_t)H * 2);
            else
                for (int64_t h = 0; h < H; h++) d16[h] = ompk_f32_to_bf16(((const float *)src)[h]);
            for (int64_t h = H; h < Hk; h++) d16[h] = 0;
        }
#pragma omp for schedule(static)
        for (int64_t i = 0; i < P * T; i++)
            memset(yp + ((i / T) * Tm + i % T) * Hn, 0, (size_t)Hn * 4);

#pragma omp master
        tm[0] = omp_get_wtime();
        /* phase 1: gate and up, SiLU*up in fp32. A task is (expert, 4 n-blocks); tasks are
         * claimed one ahead so the pipelined prefetch knows the next work item. */
        for (int p = 0; p < P; p++) {
            int lo, hi;
            group_of(p, P, nth, &lo, &hi);
            const moe_part *pp = &m->part[p];
            if (tid < lo || tid >= hi || pp->ip == 0) continue;
            const int nch = pp->nbg / 4, ntask = nact * nch;
            const int64_t unit = (int64_t)m->ktg * 2 * m->tb; /* B bytes of one n-block */
            int task, cold = 1;
#pragma omp atomic capture
            task = ctr[p]++;
            while (task < ntask) {
                const int64_t e = active[task / nch];
                const int c = task % nch;
                const int64_t cnt = offs[e + 1] - offs[e];
                const int kind = moe_pick_kernel(m, cnt), ns = blocked(m, kind) ? 4 : 1;
                const int isamx = kind == K_AMX || kind == K_AMX_EMU;
                used_amx |= kind == K_AMX;
                /* claimed before this task's work only where it is prefetched: the vector
                 * kernels (decode) keep the finer dynamic balance */
                int next = -1;
                if (pipe && isamx) {
#pragma omp atomic capture
                    next = ctr[p]++;
                }
                /* the next task: its first weights, and its expert's activations when the
                 * expert changes (those spread over all of this task's n-steps) */
                pipe_t nt = {{NULL, NULL}, {0, 0}};
                if (next >= 0 && next < ntask) {
                    const int64_t e2 = active[next / nch], c2 = next % nch;
                    const int64_t cnt2 = offs[e2 + 1] - offs[e2];
                    nt.p[0] = moe_gu_b(m, pp, e2, (int)c2 * 4);
                    nt.n[0] = (blocked(m, moe_pick_kernel(m, cnt2)) ? 4 : 1) * unit;
                    if (e2 != e) {
                        nt.p[1] = xg + offs[e2] * ldx;
                        nt.n[1] = cnt2 * ldx;
                    }
                }
                for (int nb = c * 4; nb < c * 4 + 4; nb += ns) {
                    pipe_t nx = {{NULL, NULL}, {0, 0}};
                    if (pipe && nb + ns < c * 4 + 4) {
                        nx.p[0] = moe_gu_b(m, pp, e, nb + ns);
                        nx.n[0] = ns * unit;
                    } else {
                        nx.p[0] = nt.p[0];
                        nx.n[0] = nt.n[0];
                    }
                    pipe_part(&nt, 1, (nb - c * 4) / ns, 4 / ns, &nx);
                    const int nrb = (int)((cnt + 31) / 32);
                    for (int rb = 0; rb < nrb; rb++) {
                        const int64_t row0 = offs[e] + rb * 32;
                        const int mr = (int)(cnt - rb * 32 < 32 ? cnt - rb * 32 : 32);
                        moe_kargs ka;
                        memset(&ka, 0, sizeof ka);
                        ka.fmt = m->fmt;
                        ka.m = mr;
                        ka.kt = m->ktg;
                        ka.a = xg + row0 * ldx;
                        ka.lda = ldx;
                        const uint8_t *b = moe_gu_b(m, pp, e, nb);
                        ka.b[0] = b;
                        ka.b[1] = b + m->tb;
                        ka.bstride = 2 * m->tb;
                        if (isint) {
                            ka.ascale = sx + row0;
                            ka.ktg0 = 0;
                            ka.ktpg = m->ktpg;
                            ka.sstride = pp->ip;
                            ka.zstride = (int64_t)pp->nbg * 64;
                            for (int s = 0; s < 2; s++) {
                                size_t so = (size_t)(e * 2 + s) * m->gg * pp->ip + (size_t)nb * 16;
                                ka.s[s] = pp->gu_scale + so;
                                ka.ws[s] = pp->gu_ws + so;
                                if (pp->gu_z)
                                    ka.z[s] = pp->gu_z +
                                              ((size_t)(e * 2 + s) * m->gg * pp->nbg + nb) * 64;
                            }
                        }
                        ka.out = kout;
                        ka.scratch = kscr;
                        ka.nsteps = ns;
                        ka.nstride = (int64_t)m->ktg * 2 * m->tb;
                        ka.sstep = 16;
                        ka.self_pf = m->prefetch == 1 || (pipe && cold && rb == 0);
                        pipe_share(&nx, rb, nrb, &ka);
                        ka.pf_step = m->prefetch == 3 ? 64 : 256;
                        moe_run_kernel(kind, &ka);
                        for (int j = 0; j < ns; j++) {
                            const int64_t col = pp->i0 + (nb + j) * 16;
                            void *dst = isint ? (void *)(af + row0 * Ipad + col)
                                              : (void *)((uint16_t *)(abuf + row0 * lda) + col);
                            if (vec_epi)
                                moe_epi_silu_avx512(kout + j * 1024, mr, dst, Ipad, !isint);
                            else
                                silu_rows(kout + j * 1024, mr, dst, Ipad, !isint);
                        }
                    }
                    /* the vector kernels ignore the prefetch fields */
                    cold = !isamx;
                }
                if (next < 0) {
#pragma omp atomic capture
                    next = ctr[p]++;
                }
                task = next;
            }
        }
#pragma omp barrier
#pragma omp master
        tm[1] = omp_get_wtime();
        if (isint) {
#pragma omp for schedule(static)
            for (int64_t r = 0; r < R; r++)
                sa[r] = moe_quant_row(af + r * Ipad, Ipad, (int8_t *)(abuf + r * lda));
        }

#pragma omp master
        tm[2] = omp_get_wtime();
        /* phase 2: down projection into the partition's fp32 partial of y. A work item is
         * (expert, up to MOE_NSTEPS column pairs) with all its row blocks, so its weights are
         * read from memory once and from L2 for the other row blocks. */
        for (int p = 0; p < P; p++) {
            int lo, hi;
            int gsz = group_of(p, P, nth, &lo, &hi);
            const moe_part *pp = &m->part[p];
            if (tid < lo || tid >= hi || pp->ip == 0) continue;
            const int npairs = m->nbd / 2, rank = tid - lo;
            const int pr0 = (int)((int64_t)rank * npairs / gsz),
                      pr1 = (int)((int64_t)(rank + 1) * npairs / gsz);
            if (pr0 == pr1) continue;
            float *ypp = yp + (size_t)p * Tm * Hn;
            const int64_t unit = 2 * (int64_t)pp->ktd * m->tb; /* B bytes of one pair */
            int cold = 1;
            for (int ai = 0; ai < nact; ai++) {
                const int64_t e = active[ai];
                const int64_t cnt = offs[e + 1] - offs[e];
                const int kind = moe_pick_kernel(m, cnt), bl = blocked(m, kind);
                const int isamx = kind == K_AMX || kind == K_AMX_EMU;
                const int nrb = (int)((cnt + 31) / 32);
                used_amx |= kind == K_AMX;
                /* the next expert: its first weights, and its activations spread over all of
                 * this expert's column steps */
                pipe_t nt = {{NULL, NULL}, {0, 0}};
                if (pipe && ai + 1 < nact) {
                    const int64_t e2 = active[ai + 1], cnt2 = offs[e2 + 1] - offs[e2];
                    const int r = pr1 - pr0;
                    nt.p[0] = moe_dn_b(m, pp, e2, pr0);
                    nt.n[0] =
                        (blocked(m, moe_pick_kernel(m, cnt2)) ? (r < MOE_NSTEPS ? r : MOE_NSTEPS)
                                                              : 1) *
                        unit;
                    nt.p[1] = abuf + offs[e2] * lda;
                    nt.n[1] = cnt2 * lda;
                }
                const int nsm = bl ? MOE_NSTEPS : 1, nsteps_all = (pr1 - pr0 + nsm - 1) / nsm;
                for (int pr = pr0, ns; pr < pr1; pr += ns) {
                    ns = bl ? (pr1 - pr < MOE_NSTEPS ? pr1 - pr : MOE_NSTEPS) : 1;
                    pipe_t nx = {{NULL, NULL}, {0, 0}};
                    if (pipe && pr + ns < pr1) {
                        const int r = pr1 - pr - ns;
                        nx.p[0] = moe_dn_b(m, pp, e, pr + ns);
                        nx.n[0] = (bl ? (r < MOE_NSTEPS ? r : MOE_NSTEPS) : 1) * unit;
                    } else {
                        nx.p[0] = nt.p[0];
                        nx.n[0] = nt.n[0];
                    }
                    pipe_part(&nt, 1, (pr - pr0) / nsm, nsteps_all, &nx);
                    const int nb = 2 * pr;
                    for (int rb = 0; rb < nrb; rb++) {
                        const int64_t row0 = offs[e] + rb * 32;
                        const int mr = (int)(cnt - rb * 32 < 32 ? cnt - rb * 32 : 32);
                        moe_kargs ka;
                        memset(&ka, 0, sizeof ka);
                        ka.fmt = m->fmt;
                        ka.m = mr;
                        ka.kt = pp->ktd;
                        ka.a = abuf + row0 * lda + pp->i0 * (int64_t)es;
                        ka.lda = lda;
                        ka.b[0] = moe_dn_b(m, pp, e, pr);
                        ka.b[1] = ka.b[0] + (size_t)pp->ktd * m->tb;
                        ka.bstride = m->tb;
                        if (isint) {
                            ka.ascale = sa + row0;
                            ka.ktg0 = (int)(pp->i0 / 64);
                            ka.ktpg = m->ktpg;
                            ka.sstride = m->Hn;
                            ka.zstride = (int64_t)m->nbd * 64;
                            size_t so = (size_t)e * pp->gd * m->Hn + (size_t)nb * 16;
                            ka.s[0] = pp->dn_scale + so;
                            ka.s[1] = ka.s[0] + 16;
                            ka.ws[0] = pp->dn_ws + so;
                            ka.ws[1] = ka.ws[0] + 16;
                            if (pp->dn_z) {
                                ka.z[0] = pp->dn_z + ((size_t)e * pp->gd * m->nbd + nb) * 64;
                                ka.z[1] = ka.z[0] + 64;
                            }
                        }
                        ka.out = kout;
                        ka.scratch = kscr;
                        ka.nsteps = ns;
                        ka.nstride = 2 * (int64_t)pp->ktd * m->tb;
                        ka.sstep = 32;
                        ka.self_pf = m->prefetch == 1 || (pipe && cold && rb == 0);
                        pipe_share(&nx, rb, nrb, &ka);
                        ka.pf_step = m->prefetch == 3 ? 64 : 256;
                        moe_run_kernel(kind, &ka);
                        for (int j = 0; j < ns; j++)
                            for (int r = 0; r < mr; r++) {
                                float *yr = ypp + (size_t)rowtok[row0 + r] * Hn + (nb + 2 * j) * 16;
                                if (vec_epi)
                                    moe_epi_axpy_avx512(yr, kout + j * 1024, r, roww[row0 + r]);
                                else
                                    axpy_row(yr, kout + j * 1024, r, roww[row0 + r]);
                            }
                    }
                    cold = !isamx;
                }
            }
        }
        if (used_amx) moe_amx_release();
#pragma omp barrier

#pragma omp master
        tm[3] = omp_get_wtime();
        /* phase 3: y = sum of the partials in partition order, rounded once */
#pragma omp for schedule(static)
        for (int64_t t = 0; t < T; t++) {
            uint8_t *yrow = (uint8_t *)yd + (size_t)(t * ys) * (ydt == OMPK_BF16 ? 2 : 4);
            for (int64_t h = 0; h < H; h++) {
                float s = 0.0f;
                for (int p = 0; p < P; p++) s += yp[((size_t)p * Tm + t) * Hn + h];
                ompk_store_f(yrow, h, s, ydt == OMPK_BF16);
            }
        }
    }
    double tend = omp_get_wtime();
    m->stats.phase_ms[0] = (tm[0] - tstart) * 1e3;
    m->stats.fork_ms = (tfork - tstart) * 1e3;
    for (int i = 1; i < 4; i++) m->stats.phase_ms[i] = (tm[i] - tm[i - 1]) * 1e3;
    m->stats.phase_ms[4] = (tend - tm[3]) * 1e3;
    if (saved) {
        hwloc_set_cpubind(m->topo, saved, HWLOC_CPUBIND_THREAD);
        hwloc_bitmap_free(saved);
    }
    int bad = moe_arena_check(m);
    if (bad)
        return ompk_fail(OMPK_ERR_RUNTIME, "ompk_moe_fwd",
                         "scratch arena canary after buffer %d overwritten", bad - 1);
    return OMPK_OK;
}

/* The combine of moe_run_forward on its own (ompk_moe_combine): in this file so that each sum
 * compiles to the same operations as the down epilogue's (fused on the AVX-512 path, the
 * expression axpy_row uses elsewhere), then the partition sum's 0 + s of one partition. */
void moe_combine(int vec, int64_t T, int k, int64_t H, const float *z, int64_t zst, int64_t zsj,
                 const int64_t *ids, const float *w, int64_t wst, void *yd, int64_t ys, int ybf16,
                 float *acc_all) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) {
        float *acc = acc_all + (size_t)omp_get_thread_num() * (size_t)H;
        int ord[64], n = 0;
        /* the slots in the forward's order: experts ascending, then slots (insertion sort) */
        for (int j = 0; j < k; j++) {
            const int64_t e = ids[t * k + j];
            if (e < 0) continue;
            int q = n++;
            while (q > 0 && ids[t * k + ord[q - 1]] > e) {
                ord[q] = ord[q - 1];
                q--;
            }
            ord[q] = j;
        }
        for (int64_t h = 0; h < H; h++) acc[h] = 0.0f;
        for (int i = 0; i < n; i++) {
            const int j = ord[i];
            const float wt = w[t * wst + j], *zr = z + t * zst + j * zsj;
            if (vec)
                for (int64_t h = 0; h < H; h++) acc[h] = fmaf(wt, zr[h], acc[h]);
            else
                for (int64_t h = 0; h < H; h++) acc[h] += wt * zr[h];
        }
        uint8_t *yrow = (uint8_t *)yd + (size_t)(t * ys) * (ybf16 ? 2 : 4);
        for (int64_t h = 0; h < H; h++) {
            float s = 0.0f;
            s += acc[h];
            ompk_store_f(yrow, h, s, ybf16);
        }
    }
}

int moe_combine_vec(ompk_moe_isa isa) {
    return isa != OMPK_MOE_ISA_PORTABLE && moe_cpu_has_avx512();
}
