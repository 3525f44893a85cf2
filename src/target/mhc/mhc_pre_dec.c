/* The decode-size mHC pre forward, with or without layer l's post in front (mhc_pre_dec.h). One
 * OpenMP source for GPU and host: target teams, one parallel region a team, barriers and
 * team-shared arrays (omp_pteam_mem_alloc where clang maps it to GPU shared memory). */
#include <omp.h>

#include "mhc_pre_dec.h"

#define NMAX 8
#define MMAX (2 * NMAX + NMAX * NMAX)

#include "mhc_pre_token.h"

#define MHC_DEC_THREADS 128
#define MHC_DEC_ITEMS 256 /* items (token, d range) a call aims at */
#define MHC_DEC_KS 16     /* the most d ranges a token: its epilogue sums that many partial rows */

#define MHC_STR_(x) #x
#define MHC_STR(x) MHC_STR_(x)
#if defined(__clang__) && (defined(__NVPTX__) || defined(__AMDGCN__))
#define MHC_TEAM_ALLOC(...)                                                                        \
    _Pragma(MHC_STR(omp allocate(__VA_ARGS__) allocator(omp_pteam_mem_alloc)))
#else
/* GCC 12 has no allocate directive; it shares the teams region's arrays with the team's threads */
#define MHC_TEAM_ALLOC(...)
#endif
#define MHC_SYNC() _Pragma("omp barrier")
/* 4 loads in flight in a sum that keeps its order */
#if defined(__clang__)
#define MHC_UNROLL4 _Pragma("unroll 4")
#else
#define MHC_UNROLL4 _Pragma("GCC unroll 4")
#endif

/* What the region reads, mapped to the device once a call (one transfer); ctr, the per-token
 * arrival counters, arrive zeroed that way. */
typedef struct mhc_dec_launch {
    mhc_pre_fwd_args pre;
    mhc_dec_post post;
    int fused;
    int64_t T, KS, DS, K;
    int ctr[MHC_DEC_TMAX];
} mhc_dec_launch;

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

/* Token t's epilogue by the whole team, pre_token's arithmetic spread over its threads: thread m
 * sums column m of the partial rows in range order, thread i forms h_pre[i] and h_post[i], and
 * thread e = i N + j the logit c[i][j] and its Sinkhorn iterations, rows and columns summed through
 * the team-shared sm in mhc_sk_fwd's order; so the bits are pre_token's. tok: MMAX + 1 and sm: 64
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
    const float eps = a->sk_eps;
    if (mine) sm[e] = v;
    MHC_SYNC();
    if (mine) {
        float mx = sm[i * N];
        for (int jj = 1; jj < N; jj++) mx = sm[i * N + jj] > mx ? sm[i * N + jj] : mx;
        v = expf(v - mx);
    }
    MHC_SYNC();
    if (mine) sm[e] = v;
    MHC_SYNC();
    if (mine) {
        float sum = 0.f;
        for (int jj = 0; jj < N; jj++) sum += sm[i * N + jj];
        v = v / sum + eps;
    }
    for (int rep = 0; rep < a->repeat; rep++) {
        if (rep > 0) {
            MHC_SYNC();
            if (mine) sm[e] = v;
            MHC_SYNC();
            if (mine) {
                float sum = 0.f;
                for (int jj = 0; jj < N; jj++) sum += sm[i * N + jj];
                sum += eps;
                v = v / sum;
            }
        }
        MHC_SYNC();
        if (mine) sm[e] = v;
        MHC_SYNC();
        if (mine) {
            float sum = 0.f;
            for (int ii = 0; ii < N; ii++) sum += sm[ii * N + j];
            sum += eps;
            v = v / sum;
        }
    }
    if (mine) a->comb[b * a->scomb[0] + s * a->scomb[1] + i * a->scomb[2] + j * a->scomb[3]] = v;
}

/* One item: token t, d range c of every stream. part: the partial rows [KS][T][M+1]; hp_ws:
 * h_pre [T][N] for h_in; red: MHC_DEC_THREADS rows of M+1, tok: MMAX + 1 and sm: 64 team-shared
 * floats; last: one team-shared int. */
MHC_INLINE void pre_dec_item(const int N, mhc_dec_launch *P, int64_t w, float *red, float *tok,
                             float *sm, int *last, float *part, float *hp_ws) {
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
                const mhc_dec_post *q = &P->post;
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
    MHC_SYNC();
    for (int m = tid; m < MP; m += nth) {
        float sum = 0.f;
        for (int j = 0; j < MHC_DEC_THREADS; j++) sum += red[j * MP + m];
        part[(c * T + t) * MP + m] = sum;
    }
    /* this team's partial row and x_out visible to the team that finishes the token */
#pragma omp flush
    MHC_SYNC();
    if (tid == 0) {
        int old;
#pragma omp atomic capture seq_cst
        old = P->ctr[t]++;
        last[0] = old == KS - 1;
    }
    MHC_SYNC();
    if (last[0]) {
#pragma omp flush
        pre_dec_token(N, P, t, part, hp_ws, tok, sm, tid, nth);
        MHC_SYNC();
        char *hrow = (char *)a->h_in + (b * a->shin[0] + s * a->shin[1]) * esz;
        for (int64_t d = (int64_t)tid * 16; d < D; d += (int64_t)nth * 16)
            pre_hin(N, xrow + d * esz, a->sx[2], hp_ws + t * N, hrow + d * esz,
                    D - d < 16 ? D - d : 16, bf16, 0);
    }
    MHC_SYNC();
}

#define MHC_N_INC "mhc_pre_dec_n.inc"
#include "mhc_each_n.inc"

void mhc_pre_dec_kernel(ompk_exec ex, const mhc_pre_fwd_args *a, const mhc_dec_post *post,
                        void *ws) {
    mhc_dec_launch L;
    L.pre = *a;
    L.fused = post != NULL;
    if (post) L.post = *post;
    L.T = a->B * a->S;
    L.K = (int64_t)a->n * a->D;
    dec_geometry(a, &L.KS, &L.DS);
    for (int i = 0; i < MHC_DEC_TMAX; i++) L.ctr[i] = 0;
    float *part = (float *)ws, *hp_ws = part + L.KS * L.T * (2 * a->n + a->n * a->n + 1);
#define PRE_DEC(N) MHC_CAT(pre_dec, N)(ex, &L, part, hp_ws)
    MHC_SWITCH_N(a->n, PRE_DEC)
#undef PRE_DEC
}
