/* Internal: the per-token steps of the mHC pre forward that every GPU path shares (mhc_pre_fwd.c
 * launches 2 and 3, the decode kernel of mhc_pre_dec.c): a token's partial sums to its outputs
 * and Sinkhorn, and its h_in. Include after NMAX and MMAX are defined. */
#ifndef OMPK_MHC_PRE_TOKEN_H
#define OMPK_MHC_PRE_TOKEN_H

#include "mhc_kern.h"

static inline float sigmoidf(float z) {
    return 1.f / (1.f + expf(-z));
}

/* Stage 2 body from token t's summed row acc (the M sums, then the sum of squares): h_mix,
 * inv_rms, h_pre, h_post, logits, comb. */
MHC_INLINE void pre_token_out(const int N, int64_t t, int64_t S, const float acc[MMAX + 1],
                              int64_t K, const mhc_pre_fwd_args *a, const float *alpha,
                              const float *bias, float *hp_ws, float *h_post, float *logits,
                              float *comb, float *h_mix, float *inv_rms, float *h_pre) {
    const int M = 2 * N + N * N;
    const int64_t b = t / S, s = t % S;
    const float r = 1.f / sqrtf(acc[M] / (float)K + a->norm_eps);
    const float a0 = alpha[0], a1 = alpha[a->salpha], a2 = alpha[2 * a->salpha];
    if (inv_rms) inv_rms[t * a->sinv] = r;
    if (h_mix) MHC_UNROLL
    for (int m = 0; m < MMAX; m++)
        if (m < M) h_mix[t * a->shmix[0] + m * a->shmix[1]] = acc[m];
    MHC_UNROLL
    for (int i = 0; i < NMAX; i++) {
        if (i >= N) continue;
        float hp = sigmoidf(a0 * (acc[i] * r) + bias[i * a->sbias]) + a->hc_eps;
        hp_ws[t * N + i] = hp;
        if (h_pre) h_pre[t * a->shpre[0] + i * a->shpre[1]] = hp;
        h_post[b * a->shpost[0] + s * a->shpost[1] + i * a->shpost[2]] =
            a->post_mult * sigmoidf(a1 * (acc[N + i] * r) + bias[(N + i) * a->sbias]);
    }
    float c[8][8];
    MHC_UNROLL
    for (int i = 0; i < 8; i++) MHC_UNROLL
    for (int j = 0; j < 8; j++) {
        if (i >= N || j >= N) continue;
        const int m = 2 * N + i * N + j;
        c[i][j] = a2 * (acc[m] * r) + bias[m * a->sbias];
        if (logits)
            logits[b * a->slog[0] + s * a->slog[1] + i * a->slog[2] + j * a->slog[3]] = c[i][j];
    }
    if (comb) {
        mhc_sk_fwd(N, a->repeat, a->sk_eps, c, (float *)0, 0);
        MHC_UNROLL
        for (int i = 0; i < 8; i++) MHC_UNROLL
        for (int j = 0; j < 8; j++)
            if (i < N && j < N)
                comb[b * a->scomb[0] + s * a->scomb[1] + i * a->scomb[2] + j * a->scomb[3]] =
                    c[i][j];
    }
}

/* Stage 2 body: one token's partial rows summed in chunk order, then pre_token_out. */
MHC_INLINE void pre_token(const int N, int64_t t, int64_t S, int64_t NC, int64_t T,
                          const float *part, int64_t K, const mhc_pre_fwd_args *a,
                          const float *alpha, const float *bias, float *hp_ws, float *h_post,
                          float *logits, float *comb, float *h_mix, float *inv_rms, float *h_pre) {
    const int M = 2 * N + N * N;
    float acc[MMAX + 1];
    MHC_UNROLL
    for (int m = 0; m <= MMAX; m++)
        if (m <= M) acc[m] = 0.f;
    for (int64_t c = 0; c < NC; c++) {
        const float *p = part + (c * T + t) * (M + 1);
        MHC_UNROLL
        for (int m = 0; m <= MMAX; m++)
            if (m <= M) acc[m] += p[m];
    }
    pre_token_out(N, t, S, acc, K, a, alpha, bias, hp_ws, h_post, logits, comb, h_mix, inv_rms,
                  h_pre);
}

/* Stage 3 body: h_in for 16 consecutive d (fewer at the tail) of token t; a whole 16 as 16-byte
 * words when vec (mhc_pre_vec_ok, and d on 8), else element by element (rows of any layout). */
MHC_INLINE void pre_hin(const int N, const char *xrow, int64_t sx2, const float *hp, char *out,
                        int64_t nd, int bf16, int vec) {
    const int esz = bf16 ? 2 : 4;
    if (nd == 16) {
        float acc[16], xv[16];
        MHC_UNROLL
        for (int e = 0; e < 16; e++) acc[e] = 0.f;
        MHC_UNROLL
        for (int i = 0; i < NMAX; i++) {
            if (i >= N) continue;
            mhc_load16(xrow + i * sx2 * esz, bf16, vec, xv);
            const float h = hp[i];
            MHC_UNROLL
            for (int e = 0; e < 16; e++) acc[e] += h * xv[e];
        }
        if (vec) {
            ompk_store8(out, bf16, acc);
            ompk_store8(out + 8 * esz, bf16, acc + 8);
            return;
        }
        MHC_UNROLL
        for (int e = 0; e < 16; e++) ompk_store_f(out, e, acc[e], bf16);
        return;
    }
    for (int64_t e = 0; e < nd; e++) {
        float acc = 0.f;
        MHC_UNROLL
        for (int i = 0; i < NMAX; i++)
            if (i < N) acc += hp[i] * ompk_load_f(xrow + i * sx2 * esz, e, bf16);
        ompk_store_f(out, e, acc, bf16);
    }
}

#endif
