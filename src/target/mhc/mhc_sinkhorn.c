/* Sinkhorn-Knopp forward and backward (docs/KERNELS.md 1.3, 1.5), one token per work item with the
 * n x n matrix in registers (n a compile-time constant: mhc_each_n.h).
 * The backward is the exact reverse of the unrolled forward: the forward is recomputed once and
 * its 2*repeat intermediate matrices stored in a device workspace laid out [state][token][n*n]
 * (adjacent lanes, adjacent tokens), then walked in reverse. Tokens go in batches so that the
 * workspace stays bounded for any T. */
#include "bare.h"
#include "mhc_kern.h"

#define SK_WS_BYTES ((int64_t)64 << 20)

MHC_INLINE void sk_fwd_token(const int N, const float *lg, const int64_t *sl, float *out,
                             const int64_t *so, int repeat, float eps) {
    float c[8][8];
    MHC_UNROLL
    for (int i = 0; i < 8; i++) MHC_UNROLL
    for (int j = 0; j < 8; j++) c[i][j] = (i < N && j < N) ? lg[i * sl[2] + j * sl[3]] : 0.f;
    mhc_sk_fwd(N, repeat, eps, c, (float *)0, 0);
    MHC_UNROLL
    for (int i = 0; i < 8; i++) MHC_UNROLL
    for (int j = 0; j < 8; j++)
        if (i < N && j < N) out[i * so[2] + j * so[3]] = c[i][j];
}

static int64_t sk_state_floats(const mhc_sk_args *a) {
    return (int64_t)2 * a->repeat * a->n * a->n;
}

int64_t mhc_sk_bwd_batch(const mhc_sk_args *a) {
    int64_t T = a->B * a->S;
    int64_t per = sk_state_floats(a) * (int64_t)sizeof(float);
    int64_t tb = SK_WS_BYTES / (per > 0 ? per : 1);
    if (tb < 1) tb = 1;
    return tb < T ? tb : (T > 0 ? T : 1);
}

int64_t mhc_sk_bwd_workspace(const mhc_sk_args *a) {
    return mhc_sk_bwd_batch(a) * sk_state_floats(a) * (int64_t)sizeof(float);
}

/* y = z/(sum_axis z + eps) backward: g <- (g - sum_axis(g*z)/(s+eps)) / (s+eps), z read from
 * state zs (+ add: eps for the first column step, whose input is the softmax + eps). */
MHC_INLINE void sk_step_bwd(const int N, float g[8][8], const float *zs, int col, float add,
                            float eps) {
    float z[8][8];
    MHC_UNROLL
    for (int i = 0; i < 8; i++) MHC_UNROLL
    for (int j = 0; j < 8; j++) z[i][j] = (i < N && j < N) ? zs[i * N + j] + add : 0.f;
    if (col) {
        MHC_UNROLL
        for (int j = 0; j < 8; j++) {
            if (j >= N) continue;
            float s = 0.f, gz = 0.f;
            MHC_UNROLL
            for (int i = 0; i < 8; i++)
                if (i < N) {
                    s += z[i][j];
                    gz += g[i][j] * z[i][j];
                }
            const float den = s + eps, q = gz / den;
            MHC_UNROLL
            for (int i = 0; i < 8; i++)
                if (i < N) g[i][j] = (g[i][j] - q) / den;
        }
    } else {
        MHC_UNROLL
        for (int i = 0; i < 8; i++) {
            if (i >= N) continue;
            float s = 0.f, gz = 0.f;
            MHC_UNROLL
            for (int j = 0; j < 8; j++)
                if (j < N) {
                    s += z[i][j];
                    gz += g[i][j] * z[i][j];
                }
            const float den = s + eps, q = gz / den;
            MHC_UNROLL
            for (int j = 0; j < 8; j++)
                if (j < N) g[i][j] = (g[i][j] - q) / den;
        }
    }
}

MHC_INLINE void sk_bwd_token(const int N, const float *lg, const int64_t *sl, const float *dc,
                             const int64_t *sd, float *out, const int64_t *so, int repeat,
                             float eps, float *st, int64_t sstride) {
    float c[8][8], g[8][8];
    MHC_UNROLL
    for (int i = 0; i < 8; i++) MHC_UNROLL
    for (int j = 0; j < 8; j++) {
        c[i][j] = (i < N && j < N) ? lg[i * sl[2] + j * sl[3]] : 0.f;
        g[i][j] = (i < N && j < N) ? dc[i * sd[2] + j * sd[3]] : 0.f;
    }
    mhc_sk_fwd(N, repeat, eps, c, st, sstride);
    for (int s = 2 * repeat - 1; s >= 1; s--)
        sk_step_bwd(N, g, st + (s - 1) * sstride, s & 1, s == 1 ? eps : 0.f, eps);
    /* softmax: dlogit = (g - sum_j g*p) * p, p = state 0 */
    MHC_UNROLL
    for (int i = 0; i < 8; i++) {
        if (i >= N) continue;
        float gp = 0.f;
        MHC_UNROLL
        for (int j = 0; j < 8; j++)
            if (j < N) gp += g[i][j] * st[i * N + j];
        MHC_UNROLL
        for (int j = 0; j < 8; j++)
            if (j < N) out[i * so[2] + j * so[3]] = (g[i][j] - gp) * st[i * N + j];
    }
}

#ifdef OMPK_NV_DEVICE
#include "mhc_sinkhorn_lanes.h"
#define SKL_THREADS 128
#endif

#define MHC_N_INC "mhc_sinkhorn_n.inc"
#include "mhc_each_n.inc"

void mhc_sk_fwd_kernel(ompk_exec ex, const mhc_sk_args *a) {
#define SK_FWD(N) sk_fwd_launch_##N(ex, a)
    MHC_SWITCH_N(a->n, SK_FWD)
#undef SK_FWD
}

#ifdef OMPK_NV_DEVICE
/* GPU: the token's rows over G lanes (mhc_sinkhorn_lanes.h) */
void mhc_sk_bwd_lanes_kernel(ompk_exec ex, const mhc_sk_args *a, void *ws) {
#define SK_BWD_LANES(N) sk_bwd_lanes_##N(ex, a, ws)
    MHC_SWITCH_N(a->n, SK_BWD_LANES)
#undef SK_BWD_LANES
}
#endif

void mhc_sk_bwd_kernel(ompk_exec ex, const mhc_sk_args *a, void *ws) {
#define SK_BWD(N) sk_bwd_launch_##N(ex, a, ws)
    MHC_SWITCH_N(a->n, SK_BWD)
#undef SK_BWD
}
