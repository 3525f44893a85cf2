/* The decode-size mHC pre forward, with or without layer l's post in front (mhc_pre_dec.h). One
 * OpenMP source for GPU and host: target teams, one parallel region a team, barriers and
 * team-shared arrays (omp_pteam_mem_alloc where clang maps it to GPU shared memory). */
#include <omp.h>
#include <string.h>

#include "counters.h"
#include "mhc_pre_dec.h"

#define NMAX 8
#define MMAX (2 * NMAX + NMAX * NMAX)

#include "mhc_pre_token.h"

#define MHC_DEC_THREADS 128
#define MHC_DEC_ITEMS 256 /* items (token, d range) a call aims at */
#define MHC_DEC_KS 16     /* the most d ranges a token: its epilogue sums that many partial rows */

/* 4 loads in flight in a sum that keeps its order */
#if defined(__clang__)
#define MHC_UNROLL4 _Pragma("unroll 4")
#else
#define MHC_UNROLL4 _Pragma("GCC unroll 4")
#endif

/* What the region reads. It travels as DEC_NW 8-byte kernel arguments: a struct argument would
 * cost a host-to-device copy of its own (ompk-bench launch_overhead, combined_struct512). ctr:
 * the per-token arrival counters, a zeroed block of the pool (counters.h) that the region leaves
 * zeroed. */
typedef struct mhc_dec_launch {
    mhc_pre_fwd_args pre;
    ompk_mhc_post_args post;
    int fused, vec; /* vec: mhc_pre_vec_ok, h_in's rows as 16-byte words */
    int64_t T, KS, DS, K;
    int *ctr;
} mhc_dec_launch;

#define DEC_NW 96
_Static_assert(sizeof(mhc_dec_launch) <= DEC_NW * 8, "mhc_dec_launch fits DEC_NW words");
_Static_assert(MHC_DEC_TMAX <= OMPK_COUNTERS_MAX, "a counter block has a counter a token");
// clang-format off
#define DEC_WORDS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15) X(16) X(17) X(18) X(19) X(20) X(21) X(22) X(23) X(24) X(25) X(26) X(27) X(28) X(29) X(30) X(31) X(32) X(33) X(34) X(35) X(36) X(37) X(38) X(39) X(40) X(41) X(42) X(43) X(44) X(45) X(46) X(47) X(48) X(49) X(50) X(51) X(52) X(53) X(54) X(55) X(56) X(57) X(58) X(59) X(60) X(61) X(62) X(63) X(64) X(65) X(66) X(67) X(68) X(69) X(70) X(71) X(72) X(73) X(74) X(75) X(76) X(77) X(78) X(79) X(80) X(81) X(82) X(83) X(84) X(85) X(86) X(87) X(88) X(89) X(90) X(91) X(92) X(93) X(94) X(95)
#define DEC_NAMES w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15, w16, w17, w18, w19, w20, w21, w22, w23, w24, w25, w26, w27, w28, w29, w30, w31, w32, w33, w34, w35, w36, w37, w38, w39, w40, w41, w42, w43, w44, w45, w46, w47, w48, w49, w50, w51, w52, w53, w54, w55, w56, w57, w58, w59, w60, w61, w62, w63, w64, w65, w66, w67, w68, w69, w70, w71, w72, w73, w74, w75, w76, w77, w78, w79, w80, w81, w82, w83, w84, w85, w86, w87, w88, w89, w90, w91, w92, w93, w94, w95
// clang-format on

/* d ranges a token is split into: about MHC_DEC_ITEMS items in all, at most MHC_DEC_KS ranges,
 * at least 32 d a range */
static void dec_geometry(const mhc_pre_fwd_args *a, int64_t *KS, int64_t *DS) {
    const int64_t T = a->B * a->S, D = a->D;
    int64_t ks = T > 0 ? (MHC_DEC_ITEMS + T - 1) / T : 1;
    const int64_t most = (D + 31) / 32;
    if (ks > MHC_DEC_KS) ks = MHC_DEC_KS;
    if (ks > most) ks = most;
    if (ks < 1) ks = 1;
    *DS = (D + ks - 1) / ks;
    *KS = *DS > 0 ? (D + *DS - 1) / *DS : 1;
}

int mhc_pre_dec_ok(const mhc_pre_fwd_args *a) {
    const int64_t T = a->B * a->S;
    return T >= 1 && T <= MHC_DEC_TMAX && a->sx[3] == 1 && a->shin[2] == 1;
}

int64_t mhc_pre_dec_workspace(const mhc_pre_fwd_args *a) {
    int64_t KS, DS;
    dec_geometry(a, &KS, &DS);
    const int64_t T = a->B * a->S, M = 2 * a->n + a->n * a->n;
    return (int64_t)sizeof(float) * (KS * T * (M + 1) + T * a->n) + 64;
}

/* One Sinkhorn step of thread e = i N + j (mine: e < N^2): the team's matrix stored in buf, one
 * barrier, then v / (the sum of row i (row) or column j, in mhc_sk_fwd's order, + eps). */
MHC_INLINE float dec_sk_div(const int N, float *buf, int mine, int e, int i, int j, int row,
                            float v, float eps) {
    if (mine) buf[e] = v;
    MHC_SYNC();
    if (!mine) return v;
    float sum = 0.f;
    for (int k = 0; k < N; k++) sum += row ? buf[i * N + k] : buf[k * N + j];
    sum += eps;
    return v / sum;
}

/* Token t's epilogue by the whole team, pre_token's arithmetic spread over its threads: thread m
 * sums column m of the partial rows in range order, thread i forms h_pre[i] and h_post[i], and
 * thread e = i N + j the logit c[i][j] and its Sinkhorn iterations, rows and columns summed through
 * the team-shared sm in mhc_sk_fwd's order; so the bits are pre_token's. tok: MMAX + 1 and sm: 128
 * team-shared floats. A team of fewer than N^2 threads runs pre_token on its first thread. */
MHC_INLINE void pre_dec_token(const int N, const mhc_dec_launch *P, int64_t t, const float *part,
                              float *hp_ws, float *tok, float *sm, int tid, int nth) {
    const int M = 2 * N + N * N, MP = M + 1;
    const mhc_pre_fwd_args *a = &P->pre;
    const int64_t KS = P->KS, T = P->T, S = a->S, b = t / S, s = t % S;
    if (nth < N * N) {
        if (tid == 0)
            pre_token(N, t, S, KS, T, part, P->K, a, a->alpha, a->bias, hp_ws, a->h_post, a->logits,
                      a->comb, a->h_mix, a->inv_rms, a->h_pre);
        return;
    }
    for (int m = tid; m < MP; m += nth) {
        float acc = 0.f;
        MHC_UNROLL4
        for (int64_t c = 0; c < KS; c++) acc += part[(c * T + t) * MP + m];
        tok[m] = acc;
        if (m < M && a->h_mix) a->h_mix[t * a->shmix[0] + m * a->shmix[1]] = acc;
    }
    MHC_SYNC();
    const float r = 1.f / sqrtf(tok[M] / (float)P->K + a->norm_eps);
    const float a0 = a->alpha[0], a1 = a->alpha[a->salpha], a2 = a->alpha[2 * a->salpha];
    if (tid == 0 && a->inv_rms) a->inv_rms[t * a->sinv] = r;
    if (tid < N) {
        const int i = tid;
        const float hp = sigmoidf(a0 * (tok[i] * r) + a->bias[i * a->sbias]) + a->hc_eps;
        hp_ws[t * N + i] = hp;
        if (a->h_pre) a->h_pre[t * a->shpre[0] + i * a->shpre[1]] = hp;
        a->h_post[b * a->shpost[0] + s * a->shpost[1] + i * a->shpost[2]] =
            a->post_mult * sigmoidf(a1 * (tok[N + i] * r) + a->bias[(N + i) * a->sbias]);
    }
    const int e = tid, mine = e < N * N, i = mine ? e / N : 0, j = mine ? e - i * N : 0;
    float v = 0.f;
    if (mine) {
        const int m = 2 * N + e;
        v = a2 * (tok[m] * r) + a->bias[m * a->sbias];
        if (a->logits)
            a->logits[b * a->slog[0] + s * a->slog[1] + i * a->slog[2] + j * a->slog[3]] = v;
    }
    if (!a->comb) return;
    /* sm holds two matrices: a step writes one and reads it after one barrier; the one it
     * overwrites was last read two steps back, before the barrier between */
    const float eps = a->sk_eps;
    if (mine) sm[e] = v;
    MHC_SYNC();
    if (mine) {
        float mx = sm[i * N];
        for (int jj = 1; jj < N; jj++) mx = sm[i * N + jj] > mx ? sm[i * N + jj] : mx;
        v = expf(v - mx);
    }
    v = dec_sk_div(N, sm + 64, mine, e, i, j, 1, v, 0.f) + eps;
    for (int rep = 0, pb = 1; rep < a->repeat; rep++) {
        if (rep > 0) v = dec_sk_div(N, sm + 64 * (pb ^= 1), mine, e, i, j, 1, v, eps);
        v = dec_sk_div(N, sm + 64 * (pb ^= 1), mine, e, i, j, 0, v, eps);
    }
    if (mine) a->comb[b * a->scomb[0] + s * a->scomb[1] + i * a->scomb[2] + j * a->scomb[3]] = v;
}

/* One item: token t, d range c of every stream. part: the partial rows [KS][T][M+1]; hp_ws:
 * h_pre [T][N] for h_in; red: MHC_DEC_THREADS rows of M+1, red4: 4 rows of M+1, tok: MMAX + 1
 * and sm: 128 team-shared floats; last: one team-shared int. */
MHC_INLINE void pre_dec_item(const int N, mhc_dec_launch *P, int64_t w, float *red, float *red4,
                             float *tok, float *sm, int *last, float *part, float *hp_ws) {
    const int M = 2 * N + N * N, MP = M + 1;
    const mhc_pre_fwd_args *a = &P->pre;
    const int tid = omp_get_thread_num(), nth = omp_get_num_threads();
    const int64_t KS = P->KS, T = P->T, t = w / KS, c = w - t * KS;
    const int64_t S = a->S, b = t / S, s = t % S, D = a->D;
    const int64_t d0 = c * P->DS, d1 = d0 + P->DS < D ? d0 + P->DS : D;
    const int bf16 = a->bf16, esz = bf16 ? 2 : 4;
    char *xrow = (char *)a->x + (b * a->sx[0] + s * a->sx[1]) * esz;
    /* lane ln takes d = d0 + ln + MHC_DEC_THREADS j, whatever the thread count, so the sums
     * do not depend on it */
    for (int ln = tid; ln < MHC_DEC_THREADS; ln += nth) {
        float acc[MMAX + 1];
        MHC_UNROLL
        for (int m = 0; m <= MMAX; m++) acc[m] = 0.f;
        for (int64_t d = d0 + ln; d < d1; d += MHC_DEC_THREADS) {
            float v[NMAX];
            if (P->fused) {
                const ompk_mhc_post_args *q = &P->post;
                const char *xi =
                    (const char *)q->x + (b * q->sx[0] + s * q->sx[1] + d * q->sx[3]) * esz;
                const float *cm = q->comb + b * q->sc[0] + s * q->sc[1];
                const float *pp = q->post + b * q->sp[0] + s * q->sp[1];
                const float fv =
                    ompk_load_f(q->f, b * q->sf[0] + s * q->sf[1] + d * q->sf[2], bf16);
                float xv[NMAX];
                MHC_UNROLL
                for (int i = 0; i < NMAX; i++)
                    if (i < N) xv[i] = ompk_load_f(xi + i * q->sx[2] * esz, 0, bf16);
                /* post forward's arithmetic (mhc_post_fwd.c, mhc_post_kern.h: one product, then an
                 * fma a stream), rounded as its store rounds */
                MHC_UNROLL
                for (int o = 0; o < NMAX; o++) {
                    if (o >= N) continue;
                    float y = pp[o * q->sp[2]] * fv;
                    MHC_UNROLL
                    for (int i = 0; i < NMAX; i++)
                        if (i < N) y = fmaf(cm[i * q->sc[2] + o * q->sc[3]], xv[i], y);
                    ompk_store_f(xrow + (o * a->sx[2] + d) * esz, 0, y, bf16);
                    v[o] = bf16 ? ompk_round_bf16(y) : y;
                }
            } else {
                MHC_UNROLL
                for (int i = 0; i < NMAX; i++)
                    if (i < N) v[i] = ompk_load_f(xrow + (i * a->sx[2] + d) * esz, 0, bf16);
            }
            MHC_UNROLL
            for (int i = 0; i < NMAX; i++) {
                if (i >= N) continue;
                const int64_t k = i * D + d;
                const float g = a->gamma ? a->gamma[k] : 1.f;
                MHC_UNROLL
                for (int m = 0; m < MMAX; m++)
                    if (m < M) acc[m] += v[i] * (a->phi[m * a->sphi + k] * g);
                acc[M] += v[i] * v[i];
            }
        }
        MHC_UNROLL
        for (int m = 0; m <= MMAX; m++)
            if (m < MP) red[ln * MP + m] = acc[m];
    }
    /* the lanes' rows summed in 4 groups of 32, then the groups in order */
    MHC_SYNC();
    for (int q = tid; q < 4 * MP; q += nth) {
        const int g = q / MP, m = q - g * MP;
        float sum = 0.f;
        for (int j = 32 * g; j < 32 * g + 32; j++) sum += red[j * MP + m];
        red4[q] = sum;
    }
    MHC_SYNC();
    for (int m = tid; m < MP; m += nth)
        part[(c * T + t) * MP + m] =
            ((red4[m] + red4[MP + m]) + red4[2 * MP + m]) + red4[3 * MP + m];
    /* this team's partial row and x_out visible to the team that finishes the token */
#pragma omp flush
    MHC_SYNC();
    if (tid == 0) {
        int old;
#pragma omp atomic capture seq_cst
        old = P->ctr[t]++;
        last[0] = old == KS - 1;
        /* the token's other teams are done with its counter: zero again for the pool */
        if (last[0]) P->ctr[t] = 0;
    }
    MHC_SYNC();
    if (last[0]) {
#pragma omp flush
        pre_dec_token(N, P, t, part, hp_ws, tok, sm, tid, nth);
        MHC_SYNC();
        char *hrow = (char *)a->h_in + (b * a->shin[0] + s * a->shin[1]) * esz;
        for (int64_t d = (int64_t)tid * 16; d < D; d += (int64_t)nth * 16)
            pre_hin(N, xrow + d * esz, a->sx[2], hp_ws + t * N, hrow + d * esz,
                    D - d < 16 ? D - d : 16, bf16, P->vec);
    }
    MHC_SYNC();
}

#define MHC_N_INC "mhc_pre_dec_n.inc"
#include "mhc_each_n.inc"

int mhc_pre_dec_kernel(ompk_exec ex, const mhc_pre_fwd_args *a, const ompk_mhc_post_args *post,
                       void *ws) {
    const ompk_device dev = ex.on_target ? ompk_device_target(ex.device) : ompk_device_host();
    mhc_dec_launch L;
    memset(&L, 0, sizeof L);
    L.pre = *a;
    L.fused = post != NULL;
    L.vec = mhc_pre_vec_ok(a);
    if (post) L.post = *post;
    L.T = a->B * a->S;
    L.K = (int64_t)a->n * a->D;
    dec_geometry(a, &L.KS, &L.DS);
    L.ctr = ompk_counters_alloc(dev);
    if (!L.ctr) return -1;
    uint64_t wv[DEC_NW] = {0};
    memcpy(wv, &L, sizeof L);
    float *part = (float *)ws, *hp_ws = part + L.KS * L.T * (2 * a->n + a->n * a->n + 1);
#define PRE_DEC(N) MHC_CAT(pre_dec, N)(ex, wv, L.T * L.KS, part, hp_ws)
    MHC_SWITCH_N(a->n, PRE_DEC)
#undef PRE_DEC
    ompk_counters_free(dev, L.ctr);
    return 0;
}
