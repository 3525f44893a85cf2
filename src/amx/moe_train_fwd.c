/* The training forward: the inference kernels (same tiles, same per-expert kernel choice from
 * this call's row counts) with epilogues that keep g and u (pre-activation) in the cache entry,
 * the LoRA terms in fp32, and the down output per route before its routing weight.
 *
 * Phases (one parallel region, barriers between): x as consumed per token into the entry;
 * expert-sorted gather; per route: the LoRA inputs A_g (m x~), A_u (m x~); gate/up kernels (tasks
 * over partition, expert, n-block) whose epilogue adds s B (A x) and writes g, u into the entry's
 * token-order rows (bf16: and a~ into the down operand rows); per route: a~ of the int formats,
 * A_d a~; down kernels into per-partition fp32 partials of z (one partition: the epilogue adds
 * s B_d (A_d a~) and z is final); more partitions: per route, z = partials in partition order +
 * s B_d (A_d a~); per token: y = sum over slots of w z, rounded once.
 * Every value is written by one thread in a fixed order: results do not depend on the thread
 * count. */
#include <math.h>
#include <omp.h>
#include <string.h>

/* moe_train_fwd_v4.c compiles this file again for x86-64-v4 under other names */
#ifdef MOE_PASS_V4
#define moe_run_train moe_run_train_v4
#define moe_train_act moe_train_act_v4
#define moe_combine_train moe_combine_train_v4
#endif

#include "bf16.h"
#include "error.h"
#include "moe_internal.h"
#include "moe_quant.h"
#include "ref/moe_ref.h"

#define BUF(m, id, type) ((type *)((m)->arena + (m)->off[id]))

void moe_train_act(const ompk_moe *m, const float *g, const float *u, float *af, uint8_t *codes,
                   float *scale) {
    const int64_t I = m->I;
    for (int64_t i = 0; i < I; i++) af[i] = moe_silu_mul(g[i], moe_expf(-g[i]), u[i]);
    if (m->fmt == OMPK_MOE_BF16) {
        for (int64_t i = 0; i < I; i++) {
            uint16_t b = ompk_f32_to_bf16(af[i]);
            if (codes) ((uint16_t *)codes)[i] = b;
            af[i] = ompk_bf16_to_f32(b);
        }
        return;
    }
    int8_t *q = (int8_t *)codes;
    float s = moe_quant_row(af, I, q);
    for (int64_t i = 0; i < I; i++) af[i] = (float)q[i] * s;
    *scale = s;
}

/* x as the kernels consume it, token t, as f32 */
static void x_tilde(const ompk_moe *m, const moe_entry *en, int64_t t, float *xf) {
    if (m->fmt == OMPK_MOE_BF16) {
        const uint16_t *q = (const uint16_t *)en->xq + t * m->H;
        for (int64_t h = 0; h < m->H; h++) xf[h] = ompk_bf16_to_f32(q[h]);
    } else {
        const int8_t *q = (const int8_t *)en->xq + t * m->H;
        for (int64_t h = 0; h < m->H; h++) xf[h] = (float)q[h] * en->xs[t];
    }
}

static void set_scales(const ompk_moe *m, const moe_part *pp, int64_t e, int nb, moe_kargs *ka) {
    ka->ktg0 = 0;
    ka->ktpg = m->ktpg;
    ka->sstride = pp->ip;
    ka->zstride = (int64_t)pp->nbg * 64;
    for (int s = 0; s < 2; s++) {
        size_t so = (size_t)(e * 2 + s) * m->gg * pp->ip + (size_t)nb * 16;
        ka->s[s] = pp->gu_scale + so;
        ka->ws[s] = pp->gu_ws + so;
        if (pp->gu_z) ka->z[s] = pp->gu_z + ((size_t)(e * 2 + s) * m->gg * pp->nbg + nb) * 64;
    }
}

/* acc[j][n] = sum over q < r, in order, of b[q*ldb + n] * c[j][q] for rows j < nj (<= 32) and
 * columns n < nw (<= 32): the LoRA B products of one kernel call's rows (B^T rows of stride ldb),
 * four rows a pass so their chains run side by side; each sum is moe_axpy_rows' chain */
static void lora_b_rows(const float *b, int64_t ldb, int r, const float *const *c, int nj, int nw,
                        float (*acc)[32]) {
    for (int j0 = 0; j0 < nj; j0 += 4) {
        const int n4 = nj - j0 < 4 ? nj - j0 : 4;
        const float *c0 = c[j0], *c1 = c[j0 + (n4 > 1)], *c2 = c[j0 + 2 * (n4 > 2)],
                    *c3 = c[j0 + 3 * (n4 > 3)];
        float a0[32] = {0}, a1[32] = {0}, a2[32] = {0}, a3[32] = {0};
        for (int q = 0; q < r; q++) {
            const float *bq = b + q * ldb, x0 = c0[q], x1 = c1[q], x2 = c2[q], x3 = c3[q];
            const int w = nw == 32 ? 32 : nw == 16 ? 16 : 0; /* constant trip counts vectorise */
            if (w == 32)
                for (int n = 0; n < 32; n++) {
                    a0[n] += bq[n] * x0;
                    a1[n] += bq[n] * x1;
                    a2[n] += bq[n] * x2;
                    a3[n] += bq[n] * x3;
                }
            else if (w == 16)
                for (int n = 0; n < 16; n++) {
                    a0[n] += bq[n] * x0;
                    a1[n] += bq[n] * x1;
                    a2[n] += bq[n] * x2;
                    a3[n] += bq[n] * x3;
                }
            else
                for (int n = 0; n < nw; n++) {
                    a0[n] += bq[n] * x0;
                    a1[n] += bq[n] * x1;
                    a2[n] += bq[n] * x2;
                    a3[n] += bq[n] * x3;
                }
        }
        float *const as[4] = {a0, a1, a2, a3};
        for (int j = 0; j < n4; j++) memcpy(acc[j0 + j], as[j], sizeof a0);
    }
}

/* Gate/up epilogue of one route row over nw <= 16 columns: g = kout + s ag (ag, au from
 * lora_b_rows; NULL without LoRA), u likewise; g, u stored; codes (bf16 base, may be NULL):
 * a~ = bf16(silu(g) u) */
static void gu_epilogue(const float *kg, const float *ku, int nw, const float *ag, const float *au,
                        float s, float *g, float *u, uint16_t *codes) {
    float gv[16], uv[16];
    for (int n = 0; n < nw; n++) {
        gv[n] = kg[n];
        uv[n] = ku[n];
    }
    if (ag)
        for (int n = 0; n < nw; n++) {
            gv[n] += s * ag[n];
            uv[n] += s * au[n];
        }
    for (int n = 0; n < nw; n++) {
        g[n] = gv[n];
        u[n] = uv[n];
    }
    if (codes)
        for (int n = 0; n < nw; n++)
            codes[n] = ompk_f32_to_bf16(moe_silu_mul(gv[n], moe_expf(-gv[n]), uv[n]));
}

/* Down epilogue of one route row (one partition): z = (0 + kout) + s a over the 32 columns (a
 * from lora_b_rows on the nw < H ones; NULL without LoRA), the per-token pass's operations in its
 * order */
static void dn_epilogue(const float *k0, const float *k1, int nw, const float *a, float s,
                        float *zr) {
    float z[32];
    for (int n = 0; n < 16; n++) {
        z[n] = 0.0f + k0[n];
        z[16 + n] = 0.0f + k1[n];
    }
    if (a)
        for (int n = 0; n < nw; n++) z[n] += s * a[n];
    memcpy(zr, z, sizeof z);
}

ompk_status moe_run_train(ompk_moe *m, moe_entry *en, int64_t T, const void *xd, int64_t xs,
                          ompk_dtype xdt, const int64_t *ids, const float *w, void *yd, int64_t ys,
                          int64_t ys1, ompk_dtype ydt) {
    const int64_t E = m->E, H = m->H, I = m->I, Hk = m->Hk, Hn = m->Hn, Ipad = m->Ipad;
    const int k = m->k, P = m->P, isint = m->fmt != OMPK_MOE_BF16, r = m->lora.r;
    const int64_t Rc = m->cfg.max_tokens * k, rm = m->rmax;
    const float s = m->lora.s, drop = m->lora.dropout;
    const uint64_t seed = m->lora.seed;
    const size_t es = isint ? 1 : 2;
#if !defined(MOE_PASS_V4) && defined(__x86_64__) && !defined(OMPK_MOE_NO_V4)
    if (moe_cpu_has_avx512())
        return moe_run_train_v4(m, en, T, xd, xs, xdt, ids, w, yd, ys, ys1, ydt);
#endif
    int64_t *offs = TBUF(m, TB_EOFFS, int64_t), *cur = BUF(m, MB_CURSOR, int64_t);
    int32_t *active = BUF(m, MB_ACTIVE, int32_t), *rroute = TBUF(m, TB_RROUTE, int32_t);
    uint8_t *xg = BUF(m, MB_XG, uint8_t), *abuf = BUF(m, MB_A, uint8_t);
    float *sx = BUF(m, MB_SX, float), *sa = BUF(m, MB_SA, float);
    uint8_t *tscr = BUF(m, MB_TSCR, uint8_t);
    float *zp = TBUF(m, TB_ZP, float), *tdeq = TBUF(m, TB_TDEQ, float);
    const int64_t ldx = Hk * (int64_t)es, lda = Ipad * (int64_t)es;

    en->T = T;
    en->r = r;
    for (int64_t i = 0; i < T * k; i++) {
        en->ids[i] = (int32_t)ids[i];
        en->w[i] = w[i];
    }
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
        for (int j = 0; j < k; j++)
            if (ids[t * k + j] >= 0) rroute[cur[ids[t * k + j]]++] = (int32_t)(t * k + j);
    m->stats.experts_amx = n_amx;
    m->stats.experts_vector = nact - n_amx;
    moe_lora_stage(m, offs);
    const float *la[3], *lb[3];
    for (int p = 0; p < 3; p++) {
        la[p] = moe_lw(m, 0, p);
        lb[p] = moe_lw(m, 1, p);
    }
    int ntask_gu = 0, ntask_dn = 0, tgu[MOE_MAX_PARTS + 1], tdn[MOE_MAX_PARTS + 1];
    for (int p = 0; p < P; p++) {
        tgu[p] = ntask_gu;
        tdn[p] = ntask_dn;
        if (m->part[p].ip == 0) continue;
        ntask_gu += nact * (m->part[p].nbg / 2); /* nbg = ip/16 is a multiple of 4 */
        ntask_dn += nact * (m->nbd / 2);
    }
    tgu[P] = ntask_gu;
    tdn[P] = ntask_dn;
    int live = 0;
    for (int p = 0; p < P; p++) live += m->part[p].ip > 0;
    const int solo = live == 1; /* one partition: the down epilogue makes z final */

    double tm[6];
    tm[0] = omp_get_wtime();
#pragma omp parallel num_threads(m->threads)
    {
        const int tid = omp_get_thread_num();
        uint8_t *kscr = tscr + (size_t)tid * m->tscr_bytes;
        float *kout = (float *)(kscr + MOE_KSCRATCH);
        float *xf = tdeq + (size_t)tid * m->tdeq_floats, *af = xf + (H > I ? H : I);
        float *xm = af + (H > I ? H : I); /* the LoRA input with its dropout mask applied */
        float lacc[2][32][32];            /* LoRA B products of a kernel call's rows (epilogues) */
        int used_amx = 0;
        /* x as consumed, once per token, into the entry */
#pragma omp for schedule(static)
        for (int64_t t = 0; t < T; t++) {
            const uint8_t *src =
                (const uint8_t *)xd + (size_t)(t * xs) * (xdt == OMPK_BF16 ? 2 : 4);
            for (int64_t h = 0; h < H; h++) xf[h] = ompk_load_f(src, h, xdt == OMPK_BF16);
            if (isint) {
                en->xs[t] = moe_quant_row(xf, H, (int8_t *)en->xq + t * H);
            } else {
                uint16_t *d = (uint16_t *)en->xq + t * H;
                for (int64_t h = 0; h < H; h++) d[h] = ompk_f32_to_bf16(xf[h]);
            }
        }
        /* expert-sorted operand rows; rows past R are zero (tile overrun) */
#pragma omp for schedule(static)
        for (int64_t rr = 0; rr < R + MOE_ROW_PAD; rr++) {
            uint8_t *dst = xg + rr * ldx;
            memset(dst, 0, (size_t)ldx);
            memset(abuf + rr * lda, 0, (size_t)lda);
            if (rr >= R) continue;
            const int64_t t = rroute[rr] / k;
            memcpy(dst, en->xq + (size_t)(t * H) * es, (size_t)H * es);
            if (isint) sx[rr] = en->xs[t];
        }
        /* the LoRA inputs of gate and up per route (routes of an expert are adjacent, so its A
         * stays in cache) */
#pragma omp for schedule(static)
        for (int64_t rp = 0; rp < (R + 1) / 2; rp++) {
            if (!r) continue;
            /* a pair of adjacent routes: one pass over A where they share the expert */
            const int64_t rr0 = 2 * rp, nr = rr0 + 1 < R ? 2 : 1;
            const int64_t ra = rroute[rr0], rb = nr > 1 ? rroute[rr0 + 1] : -1;
            const int pair = rb >= 0 && ids[rb] == ids[ra];
            float *xs2[2] = {xf, af}, *xm2[2] = {xm, xm + (H > I ? H : I)};
            for (int b = 0; b < nr; b++) x_tilde(m, en, (b ? rb : ra) / k, xs2[b]);
            for (int p = 0; p < 2; p++) {
                const float *xin[2] = {xf, af}; /* no dropout: the mask is 1 */
                for (int b = 0; b < nr && drop > 0.0f; b++) {
                    const int64_t t = (b ? rb : ra) / k;
                    for (int64_t h = 0; h < H; h++)
                        xm2[b][h] = xs2[b][h] * ompk_moe_lora_keep(seed, p, t, h, drop);
                    xin[b] = xm2[b];
                }
                float *oa = en->lx + ra * 3 * rm + p * rm;
                if (pair)
                    moe_lane_dots2(la[p] + ids[ra] * r * H, H, r, xin[0], xin[1], H, oa,
                                   en->lx + rb * 3 * rm + p * rm);
                else
                    for (int b = 0; b < nr; b++)
                        moe_lane_dots(la[p] + ids[b ? rb : ra] * r * H, H, r, xin[b], H,
                                      b ? en->lx + rb * 3 * rm + p * rm : oa);
            }
        }
        /* gate and up: g, u (LoRA added) into the entry's token-order rows, bf16: a~ */
#pragma omp master
        tm[1] = omp_get_wtime();
#pragma omp for schedule(dynamic, 1)
        for (int task = 0; task < ntask_gu; task++) {
            int p = 0;
            while (task >= tgu[p + 1]) p++;
            const moe_part *pp = &m->part[p];
            /* a task is two 16-column blocks: the bf16 a~ it writes fills whole lines, which two
             * threads would otherwise share */
            const int npair = pp->nbg / 2, lt = task - tgu[p];
            const int64_t e = active[lt / npair], cnt = offs[e + 1] - offs[e];
            const int kind = moe_pick_kernel(m, cnt);
            used_amx |= kind == K_AMX;
            for (int nb = 2 * (lt % npair); nb < 2 * (lt % npair) + 2; nb++)
                for (int64_t row0 = offs[e]; row0 < offs[e + 1]; row0 += 32) {
                    const int mr = (int)(offs[e + 1] - row0 < 32 ? offs[e + 1] - row0 : 32);
                    moe_kargs ka;
                    memset(&ka, 0, sizeof ka);
                    ka.fmt = m->fmt;
                    ka.m = mr;
                    ka.kt = m->ktg;
                    ka.a = xg + row0 * ldx;
                    ka.lda = ldx;
                    ka.b[0] = moe_gu_b(m, pp, e, nb);
                    ka.b[1] = ka.b[0] + m->tb;
                    ka.bstride = 2 * m->tb;
                    if (isint) {
                        ka.ascale = sx + row0;
                        set_scales(m, pp, e, nb, &ka);
                    }
                    ka.out = kout;
                    ka.scratch = kscr;
                    ka.nsteps = 1;
                    moe_run_kernel(kind, &ka);
                    const int64_t c0 = pp->i0 + nb * 16; /* global column of n = 0 */
                    const int nw = (int)(pp->iw - nb * 16 < 16 ? pp->iw - nb * 16 : 16);
                    if (r && nw > 0) {
                        const float *cg[32], *cu[32];
                        for (int rw = 0; rw < mr; rw++) {
                            cg[rw] = en->lx + rroute[row0 + rw] * 3 * rm;
                            cu[rw] = cg[rw] + rm;
                        }
                        lora_b_rows(lb[0] + e * r * I + c0, I, r, cg, mr, nw, lacc[0]);
                        lora_b_rows(lb[1] + e * r * I + c0, I, r, cu, mr, nw, lacc[1]);
                    }
                    for (int rw = 0; rw < mr && nw > 0; rw++) {
                        const int64_t route = rroute[row0 + rw];
                        gu_epilogue(kout + rw * 16, kout + (32 + rw) * 16, nw,
                                    r ? lacc[0][rw] : NULL, r ? lacc[1][rw] : NULL, s,
                                    en->g + route * I + c0, en->u + route * I + c0,
                                    isint ? NULL : (uint16_t *)(abuf + (row0 + rw) * lda) + c0);
                    }
                }
        }
        if (used_amx) moe_amx_release();
        used_amx = 0;
        /* per route: a~ of the int formats into the down operand rows, A_d a~ */
#pragma omp master
        tm[2] = omp_get_wtime();
#pragma omp for schedule(static)
        for (int64_t rp = 0; rp < (R + 1) / 2; rp++) { /* pairs of adjacent routes */
            if (!isint && !r) continue;
            const int64_t rr0 = 2 * rp, nr = rr0 + 1 < R ? 2 : 1;
            float *a2[2] = {af, xf}, *m2[2] = {xm, xm + (H > I ? H : I)};
            const float *ain[2] = {af, xf}; /* no dropout: the mask is 1 */
            for (int b = 0; b < nr; b++) {
                const int64_t rr = rr0 + b, route = rroute[rr], t = route / k;
                if (isint) {
                    moe_train_act(m, en->g + route * I, en->u + route * I, a2[b], abuf + rr * lda,
                                  &sa[rr]);
                } else {
                    const uint16_t *cd = (const uint16_t *)(abuf + rr * lda);
                    for (int64_t i = 0; i < I; i++) a2[b][i] = ompk_bf16_to_f32(cd[i]);
                }
                if (r && drop > 0.0f) {
                    for (int64_t i = 0; i < I; i++)
                        m2[b][i] = a2[b][i] * ompk_moe_lora_keep(seed, 2, t, i, drop);
                    ain[b] = m2[b];
                }
            }
            if (!r) continue;
            const int64_t ra = rroute[rr0], rb = nr > 1 ? rroute[rr0 + 1] : -1;
            float *oa = en->lx + ra * 3 * rm + 2 * rm,
                  *ob = rb >= 0 ? en->lx + rb * 3 * rm + 2 * rm : NULL;
            if (rb >= 0 && ids[rb] == ids[ra]) {
                moe_lane_dots2(la[2] + ids[ra] * r * I, I, r, ain[0], ain[1], I, oa, ob);
            } else {
                moe_lane_dots(la[2] + ids[ra] * r * I, I, r, ain[0], I, oa);
                if (rb >= 0) moe_lane_dots(la[2] + ids[rb] * r * I, I, r, ain[1], I, ob);
            }
        }
        /* down: per-partition fp32 partials of z in token-order rows */
#pragma omp master
        tm[3] = omp_get_wtime();
#pragma omp for schedule(dynamic, 1)
        for (int task = 0; task < ntask_dn; task++) {
            int p = 0;
            while (task >= tdn[p + 1]) p++;
            const moe_part *pp = &m->part[p];
            const int npairs = m->nbd / 2, lt = task - tdn[p], pr = lt % npairs, nb = 2 * pr;
            const int64_t e = active[lt / npairs], cnt = offs[e + 1] - offs[e];
            const int kind = moe_pick_kernel(m, cnt);
            used_amx |= kind == K_AMX;
            for (int64_t row0 = offs[e]; row0 < offs[e + 1]; row0 += 32) {
                const int mr = (int)(offs[e + 1] - row0 < 32 ? offs[e + 1] - row0 : 32);
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
                ka.nsteps = 1;
                moe_run_kernel(kind, &ka);
                const int nw = (int)(H - nb * 16 < 32 ? H - nb * 16 : 32);
                if (solo && r) {
                    const float *cd[32];
                    for (int rw = 0; rw < mr; rw++)
                        cd[rw] = en->lx + rroute[row0 + rw] * 3 * rm + 2 * rm;
                    lora_b_rows(lb[2] + e * r * H + nb * 16, H, r, cd, mr, nw, lacc[0]);
                }
                for (int rw = 0; rw < mr; rw++) {
                    const int64_t route = rroute[row0 + rw];
                    if (solo) { /* the final z into plane 0 */
                        dn_epilogue(kout + rw * 16, kout + (32 + rw) * 16, nw,
                                    r ? lacc[0][rw] : NULL, s, zp + (size_t)route * Hn + nb * 16);
                        continue;
                    }
                    float *zr = zp + ((size_t)p * Rc + route) * Hn + nb * 16;
                    for (int n = 0; n < 16; n++) {
                        zr[n] = kout[rw * 16 + n];
                        zr[16 + n] = kout[(32 + rw) * 16 + n];
                    }
                }
            }
        }
        if (used_amx) moe_amx_release();
        /* several partitions: z per route (routes of an expert adjacent, B_d stays in cache) =
         * partials in partition order + s B_d (A_d a~), into plane 0 */
#pragma omp master
        tm[4] = omp_get_wtime();
#pragma omp for schedule(static)
        for (int64_t rr = 0; rr < R; rr++) {
            if (solo) continue;
            const int64_t route = rroute[rr], e = ids[route];
            const float *lx = en->lx + route * 3 * rm;
            /* B_d (A_d a~) rank outer into af, each sum over q in order; z in xm, one pass per
             * partition: each element's sums keep their order and the loops over h vectorise */
            if (r) {
                for (int64_t h = 0; h < H; h++) af[h] = 0.0f;
                moe_axpy_rows(af, lb[2] + e * r * H, H, r, lx + 2 * rm, H);
            }
            float *z = xm;
            for (int64_t h = 0; h < H; h++) z[h] = 0.0f;
            for (int p = 0; p < P; p++) {
                if (!m->part[p].ip) continue;
                const float *zr = zp + ((size_t)p * Rc + route) * Hn;
                for (int64_t h = 0; h < H; h++) z[h] += zr[h];
            }
            for (int64_t h = 0; h < H && r; h++) z[h] += s * af[h];
            memcpy(zp + (size_t)route * Hn, z, (size_t)H * 4);
        }
        /* y per token: w z of each slot in slot order, rounded once (or the routes' z) */
#pragma omp for schedule(static)
        for (int64_t t = 0; t < T; t++) {
            if (ys1) {
                for (int j = 0; j < k; j++)
                    if (ids[t * k + j] >= 0)
                        memcpy((float *)yd + t * ys + j * ys1, zp + (size_t)(t * k + j) * Hn,
                               (size_t)H * 4);
                continue;
            }
            uint8_t *yrow = (uint8_t *)yd + (size_t)(t * ys) * (ydt == OMPK_BF16 ? 2 : 4);
            for (int64_t h = 0; h < H; h++) xf[h] = 0.0f;
            for (int j = 0; j < k; j++) {
                const int64_t route = t * k + j;
                if (ids[route] < 0) continue;
                const float wt = w[route], *z = zp + (size_t)route * Hn;
                for (int64_t h = 0; h < H; h++) xf[h] += wt * z[h];
            }
            for (int64_t h = 0; h < H; h++) ompk_store_f(yrow, h, xf[h], ydt == OMPK_BF16);
        }
    }
    tm[5] = omp_get_wtime();
    for (int i = 0; i < 5; i++) m->stats.phase_ms[i] = (tm[i + 1] - tm[i]) * 1e3;
    m->stats.fork_ms = 0.0;
    int bad = moe_arena_check(m);
    if (bad)
        return ompk_fail(OMPK_ERR_RUNTIME, "ompk_moe_fwd_train",
                         "scratch arena canary after buffer %d overwritten", bad - 1);
    return OMPK_OK;
}

/* the token sums of the y pass above on their own (ompk_moe_combine of a training forward): the
 * same expression, compiled in both passes of this file */
void moe_combine_train(int64_t T, int k, int64_t H, const float *z, int64_t zst, int64_t zsj,
                       const int64_t *ids, const float *w, int64_t wst, void *yd, int64_t ys,
                       int ybf16, float *acc_all) {
#if !defined(MOE_PASS_V4) && defined(__x86_64__) && !defined(OMPK_MOE_NO_V4)
    if (moe_cpu_has_avx512()) {
        moe_combine_train_v4(T, k, H, z, zst, zsj, ids, w, wst, yd, ys, ybf16, acc_all);
        return;
    }
#endif
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) {
        float *xf = acc_all + (size_t)omp_get_thread_num() * (size_t)H;
        uint8_t *yrow = (uint8_t *)yd + (size_t)(t * ys) * (ybf16 ? 2 : 4);
        for (int64_t h = 0; h < H; h++) xf[h] = 0.0f;
        for (int j = 0; j < k; j++) {
            if (ids[t * k + j] < 0) continue;
            const float wt = w[t * wst + j], *zr = z + t * zst + j * zsj;
            for (int64_t h = 0; h < H; h++) xf[h] += wt * zr[h];
        }
        for (int64_t h = 0; h < H; h++) ompk_store_f(yrow, h, xf[h], ybf16);
    }
}
