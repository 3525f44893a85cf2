/* Internal: argument blocks of the mHC pre / Sinkhorn / post-backward kernels, and helpers
 * shared by their sources (header-only parts usable inside target regions). */
#ifndef OMPK_MHC_KERN_H
#define OMPK_MHC_KERN_H

#include <math.h>
#include <stdint.h>

#include "bf16.h"
#include "mhc_each_n.h"
#include "route.h"
#include "vec8.h"

#define MHC_INLINE static inline __attribute__((always_inline))

/* Full unrolling of the loops over register arrays: an array indexed by a loop that stays rolled
 * is demoted to (GPU local) memory. */
#if defined(__clang__)
#define MHC_UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define MHC_UNROLL _Pragma("GCC unroll 128")
#else
#define MHC_UNROLL
#endif

#define MHC_STR_(x) #x
#define MHC_STR(x) MHC_STR_(x)
/* Team-shared arrays of a teams region: omp_pteam_mem_alloc where clang maps it to GPU shared
 * memory; GCC 12 has no allocate directive and shares the region's arrays with the team's
 * threads as it shares any variable. */
#if defined(__clang__) && (defined(__NVPTX__) || defined(__AMDGCN__))
#define MHC_TEAM_ALLOC(...)                                                                        \
    _Pragma(MHC_STR(omp allocate(__VA_ARGS__) allocator(omp_pteam_mem_alloc)))
#else
#define MHC_TEAM_ALLOC(...)
#endif
#define MHC_SYNC() _Pragma("omp barrier")

/* 4 floats moved as one 16-byte word */
typedef struct mhc_f4 {
    float v[4];
} __attribute__((aligned(16))) mhc_f4;

/* Row width of the padded [.., M] workspaces: a multiple of 4 floats so rows load as 16 bytes. */
static inline int mhc_mw(int n) {
    return (2 * n + n * n + 3) & ~3;
}

/* 16 consecutive elements (f32|bf16) into v: as 16-byte words when vec (the caller checked
 * alignment), else one by one. */
MHC_INLINE void mhc_load16(const char *p, int bf16, int vec, float v[16]) {
    if (vec) {
        ompk_load8(p, bf16, v);
        ompk_load8(p + (bf16 ? 16 : 32), bf16, v + 8);
    } else {
        MHC_UNROLL
        for (int e = 0; e < 16; e++) v[e] = ompk_load_f(p, e, bf16);
    }
}

/* Sinkhorn forward on a register matrix c (logits in, comb out); when st is non-NULL every
 * intermediate is stored: state s at st + s*sstride, element i*N+j (state 0 = the softmax,
 * 2r+1 after round r's column step, 2r after round r's row step). */
MHC_INLINE void mhc_sk_fwd(const int N, int repeat, float eps, float c[8][8], float *st,
                           int64_t sstride) {
    MHC_UNROLL
    for (int i = 0; i < 8; i++) {
        if (i >= N) continue;
        float mx = c[i][0];
        MHC_UNROLL
        for (int j = 1; j < 8; j++)
            if (j < N) mx = c[i][j] > mx ? c[i][j] : mx;
        float s = 0;
        MHC_UNROLL
        for (int j = 0; j < 8; j++)
            if (j < N) {
                c[i][j] = expf(c[i][j] - mx);
                s += c[i][j];
            }
        MHC_UNROLL
        for (int j = 0; j < 8; j++)
            if (j < N) c[i][j] = c[i][j] / s;
    }
    if (st) MHC_UNROLL
    for (int e = 0; e < 64; e++)
        if (e < N * N) st[e] = c[e / N][e % N];
    MHC_UNROLL
    for (int i = 0; i < 8; i++) MHC_UNROLL
    for (int j = 0; j < 8; j++) c[i][j] += eps;
    for (int r = 0; r < repeat; r++) {
        if (r > 0) {
            MHC_UNROLL
            for (int i = 0; i < 8; i++) {
                if (i >= N) continue;
                float s = 0;
                MHC_UNROLL
                for (int j = 0; j < 8; j++)
                    if (j < N) s += c[i][j];
                s += eps;
                MHC_UNROLL
                for (int j = 0; j < 8; j++)
                    if (j < N) c[i][j] = c[i][j] / s;
            }
            if (st) MHC_UNROLL
            for (int e = 0; e < 64; e++)
                if (e < N * N) st[2 * r * sstride + e] = c[e / N][e % N];
        }
        MHC_UNROLL
        for (int j = 0; j < 8; j++) {
            if (j >= N) continue;
            float s = 0;
            MHC_UNROLL
            for (int i = 0; i < 8; i++)
                if (i < N) s += c[i][j];
            s += eps;
            MHC_UNROLL
            for (int i = 0; i < 8; i++)
                if (i < N) c[i][j] = c[i][j] / s;
        }
        if (st) MHC_UNROLL
        for (int e = 0; e < 64; e++)
            if (e < N * N) st[(2 * r + 1) * sstride + e] = c[e / N][e % N];
    }
}

/* ---- pre forward ------------------------------------------------------------------------ */
typedef struct mhc_pre_fwd_args {
    const void *x;
    int64_t B, S, D;
    int n, bf16;
    int64_t sx[4];
    const float *phi, *gamma, *alpha, *bias; /* gamma may be NULL */
    int64_t sphi, salpha, sbias;
    void *h_in;
    int64_t shin[3];
    float *h_post, *logits, *comb, *h_mix, *inv_rms, *h_pre; /* only h_post always present */
    int64_t shpost[3], slog[4], scomb[4], shmix[2], sinv, shpre[2];
    float norm_eps, hc_eps, post_mult, sk_eps;
    int repeat;
} mhc_pre_fwd_args;

/* Whether x and h_in rows move as 16-byte words: unit element strides, the other strides on 8
 * elements, both pointers 16-byte aligned. */
static inline int mhc_pre_vec_ok(const mhc_pre_fwd_args *a) {
    if (a->sx[3] != 1 || a->shin[2] != 1) return 0;
    for (int k = 0; k < 3; k++)
        if (a->sx[k] % 8) return 0;
    if (a->shin[0] % 8 || a->shin[1] % 8) return 0;
    return (((uintptr_t)a->x | (uintptr_t)a->h_in) & 15) == 0;
}

/* Which kernels a pre forward runs: the host form (host = 1: one pass over token tiles, host
 * only), else the GPU's launches: SIMT (tc = 0) or the tensor-core GEMM with contiguous K splits
 * (1), interleaved splits (2), x staged by cp.async (3) or x read in wide row pieces (4, its ring
 * of ring x tiles, 3 or 2; teams aimed at, 0 = the default); the GEMM's stage order rotated by
 * the team number (rot); launch 2 one thread a token (epi = 0), lane-parallel (1), or
 * lane-parallel and fused with launch 3 (2); the register GEMM's x loads asking L2 for 256-byte
 * fills (l2f). */
typedef struct mhc_pre_fwd_cfg {
    int host, tc, rot, epi, l2f, ring, teams;
} mhc_pre_fwd_cfg;

/* Workspace bytes the pre forward needs on the call's device (any configuration). */
int64_t mhc_pre_fwd_workspace(const mhc_pre_fwd_args *a);
/* Whether the tensor-core configuration c (tc >= 1) can serve the call. */
int mhc_pre_fwd_tc_fits(ompk_exec ex, const mhc_pre_fwd_args *a, const mhc_pre_fwd_cfg *c);
void mhc_pre_fwd_kernel(ompk_exec ex, const mhc_pre_fwd_args *a, void *ws,
                        const mhc_pre_fwd_cfg *c);

/* ---- Sinkhorn ------------------------------------------------------------------------------ */
typedef struct mhc_sk_args {
    const float *logits, *dcomb; /* dcomb only for the backward */
    float *out;                  /* comb (forward) or dlogits (backward) */
    int64_t B, S;
    int n, repeat;
    float eps;
    int64_t sl[4], sd[4], so[4];
} mhc_sk_args;

void mhc_sk_fwd_kernel(ompk_exec ex, const mhc_sk_args *a);
/* Tokens per backward batch and the workspace bytes a batch needs. */
int64_t mhc_sk_bwd_batch(const mhc_sk_args *a);
int64_t mhc_sk_bwd_workspace(const mhc_sk_args *a);
void mhc_sk_bwd_kernel(ompk_exec ex, const mhc_sk_args *a, void *ws);
#if defined(__clang__) && defined(OMPK_OFFLOAD_BUILD) && defined(OMPK_OFFLOAD_NVPTX)
/* GPU only: a token's rows over 4 or 8 lanes instead of one thread a token */
void mhc_sk_bwd_lanes_kernel(ompk_exec ex, const mhc_sk_args *a, void *ws);
#endif

/* ---- pre backward -------------------------------------------------------------------------- */
typedef struct mhc_pre_bwd_args {
    const void *x, *dh_in, *gxp; /* gxp (grad_x_post) may be NULL */
    int64_t B, S, D;
    int n, bf16, dh_bf16, gxp_bf16;
    int64_t sx[4], sdh[3], sgxp[4];
    const float *phi, *gamma, *alpha; /* gamma may be NULL */
    int64_t sphi, salpha;
    const float *dh_post, *dh_res, *h_mix, *inv_rms, *h_pre, *h_post;
    int64_t sdpost[3], sdres[4], shmix[2], sinv, shpre[2], shpost[3];
    float hc_eps, post_mult;
    void *dx;
    int64_t sdx[4];
    float *dphi, *dalpha, *dbias, *dgamma; /* dgamma NULL when gamma is */
    int64_t sdphi, sdalpha, sdbias;
} mhc_pre_bwd_args;

int64_t mhc_pre_bwd_workspace(const mhc_pre_bwd_args *a);
/* Whether stage 4 can run on tensor cores for this call. */
int mhc_pre_bwd_tc_fits(ompk_exec ex, const mhc_pre_bwd_args *a);
/* tc: 0 the portable kernels, 1 stage 4 on tensor cores (168-register build), 2 the same in the
 * 128-register build; a tc the call does not fit runs the portable stage 4. */
void mhc_pre_bwd_kernel(ompk_exec ex, const mhc_pre_bwd_args *a, void *ws, int tc);

/* ---- post backward ------------------------------------------------------------------------- */
typedef struct mhc_post_bwd_args {
    const void *x, *f, *dout;
    const float *comb, *post;
    void *dx, *df;
    float *dpost, *dcomb;
    int64_t B, S, D;
    int n, bf16;
    int64_t sx[4], sf[3], sg[4], sc[4], sp[3], sdx[4], sdf[3], sdp[3], sdc[4];
} mhc_post_bwd_args;

int64_t mhc_post_bwd_workspace(const mhc_post_bwd_args *a);
void mhc_post_bwd_kernel(ompk_exec ex, const mhc_post_bwd_args *a, void *ws);

#endif
