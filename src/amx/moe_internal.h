/* Internal: the MoE layer object, its packed weight layout and the kernel interface.
 *
 * Packed weights (per NUMA partition p, which owns intermediate columns [i0, i0+iw), padded to
 * ip = roundup(iw, 64) so every partition but the last is exactly 64-aligned):
 *   gate/up  gu[e][nb][kt][2][tile]  nb over ip/16 output blocks, kt over Hk/kte k-tiles,
 *            [2] = gate, up (one k-step of the kernel reads both from adjacent bytes)
 *   down     dn[e][nb][kt][tile]     nb over Hn/16 (H padded to 32), kt over ip/kte
 * A tile is the B operand of one AMX instruction for 16 output rows of W:
 *   bf16  (kte = 32): 16 rows kp x 16 n x 2 k, element (n, k) at ((k/2)*16 + n)*2 + k%2
 *   int8  (kte = 64): 16 rows kq x 16 n x 4 k, element (n, k) at ((k/4)*16 + n)*4 + k%4
 *   int4  (kte = 64): the int8 tile with byte j of row kq in nibble (j < 32 ? low : high) of
 *         byte kq*32 + j%32; codes are unsigned 0..15 and w_int8 = code - z[n] (z = 8 for the
 *         symmetric format), so unpacking is one subtract of a 64-byte zero vector per row.
 * Padding (k beyond K, n beyond N) holds w = 0 (int4: code = z). Int formats carry per
 * (matrix, group, n) fp32 scales, int32 sums of w (for the u8*s8 VNNI trick) and the int4 zero
 * vectors. A group is ktpg k-tiles (group_size/64); int8 has one group per row. */
#ifndef OMPK_MOE_INTERNAL_H
#define OMPK_MOE_INTERNAL_H

#include <hwloc.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ompk/moe.h"

#define MOE_MAX_PARTS 64
#define MOE_MAX_DEPTH 64 /* cache_depth limit */
#define MOE_ROW_PAD 32   /* readable rows after the last activation row (tile overrun) */
#define MOE_NSTEPS 4     /* n-steps one K-blocked AMX call covers */
#define MOE_BWD_STEPS 8  /* n-steps of one backward GEMM work item (its weights stay in L2) */
/* per-thread kernel scratch: unpacked int4 tiles, then C tiles (MOE_NSTEPS blocks of 4 KB) */
#define MOE_KSCRATCH (2048 + MOE_NSTEPS * 4096)
#define MOE_ONE_GROUP (1 << 28) /* ktpg of a format with one group per row */

typedef struct moe_part {
    int node;   /* hwloc NUMA node logical index */
    int64_t i0; /* first intermediate column */
    int64_t iw; /* columns owned */
    int64_t ip; /* padded to 64 */
    int nbg;    /* ip/16 */
    int ktd;    /* ip/kte */
    int gd0;    /* first global k-group of the down slice */
    int gd;     /* k-groups the down slice touches */
    uint8_t *mem;
    size_t mem_bytes;
    uint8_t *gu, *dn;
    float *gu_scale; /* [E][2][Gg][ip] */
    float *dn_scale; /* [E][gd][Hn] */
    int32_t *gu_ws;  /* same shape as gu_scale */
    int32_t *dn_ws;  /* same shape as dn_scale */
    uint8_t *gu_z;   /* [E][2][Gg][nbg][64] */
    uint8_t *dn_z;   /* [E][gd][NBd][64] */
} moe_part;

/* One call of a matmul kernel: rows 0..m-1 (m <= 32) of the activations times two 16-column
 * weight streams, fp32 result out[s][r][n] (s stream, r row, n column), int formats fully
 * scaled (weight scale per group, then row scale). Rows m..31 of out are unspecified. */
typedef struct moe_kargs {
    int fmt;
    int m;
    int kt;              /* k-tiles */
    const uint8_t *a;    /* row r, k-tile t at a + r*lda + t*64 */
    int64_t lda;         /* bytes; rows up to 32 must be readable */
    const uint8_t *b[2]; /* stream s, k-tile t at b[s] + t*bstride */
    int64_t bstride;
    const float *ascale; /* [m] row scales (int formats) */
    int ktg0, ktpg;      /* group of k-tile t: (ktg0+t)/ktpg - ktg0/ktpg */
    const float *s[2];   /* group g: 16 scales at s[st] + g*sstride */
    int64_t sstride;
    const int32_t *ws[2]; /* group g: 16 weight sums at ws[st] + g*sstride */
    const uint8_t *z[2];  /* group g: 64-byte int4 zero vector at z[st] + g*zstride */
    int64_t zstride;
    float *out;       /* [2][32][16]; K-blocked kernel: [nsteps][2][32][16] */
    uint8_t *scratch; /* MOE_KSCRATCH bytes, 64-aligned, private to the thread */
    int nsteps;       /* K-blocked kernel only: n-steps, 1..MOE_NSTEPS */
    int64_t nstride;  /* bytes between the weight streams of consecutive n-steps */
    int64_t sstep;    /* floats between the scales of consecutive n-steps */
    int self_pf;      /* prefetch this call's own B tiles MOE_PF_KT k-steps ahead */
    /* pipelined prefetch (to L2): the lines of these regions, spread evenly over the call's
     * k-steps (the next work item's weights and activations); none where pf_bytes is 0 */
    const uint8_t *pf[2];
    int64_t pf_bytes[2];
    int pf_step; /* bytes between the prefetched lines: 256 (one in four), 64 (all) */
} moe_kargs;

typedef void (*moe_kernel_fn)(const moe_kargs *k);

void moe_kern_portable(const moe_kargs *k);
void moe_kern_avx512(const moe_kargs *k);
void moe_kern_amx(const moe_kargs *k);
void moe_kern_amx_emu(const moe_kargs *k);
/* K-blocked AMX kernels (bf16, int8): nsteps n-steps over one activation block */
void moe_kern_amx_n(const moe_kargs *k);
void moe_kern_amx_emu_n(const moe_kargs *k);
void moe_amx_release(void);

/* AVX-512 epilogues: a = silu(g)*u for rows 0..mr-1 of a kernel's out (16 columns) into dst
 * (row stride ld elements, bf16 or f32); y[0..31] += w * out row r (both streams). */
void moe_epi_silu_avx512(const float *out, int mr, void *dst, int64_t ld, int to_bf16);
void moe_epi_axpy_avx512(float *y, const float *out, int r, float w);

/* CPU features (CPUID + XCR0; AMX also the XTILEDATA permission, requested once). */
int moe_cpu_has_avx512(void);
int moe_cpu_has_amx(void);

enum moe_buf_id {
    MB_OFFS,
    MB_CURSOR,
    MB_ACTIVE,
    MB_ROWTOK,
    MB_ROWW,
    MB_IDS,
    MB_XQT, /* int formats: x quantized once per token */
    MB_SXT,
    MB_XG,
    MB_SX,
    MB_A,
    MB_AF,
    MB_SA,
    MB_YP,
    MB_TSCR,
    MB_STX,
    MB_STIDS,
    MB_STW,
    MB_STY,
    MB_COUNT_
};

/* LoRA as attached: copies of the caller's descriptors (so the caller's struct may go away),
 * the data borrowed and read at every call. */
typedef struct moe_lora {
    int r; /* 0 = detached */
    float s, dropout;
    uint64_t seed;
    ompk_tensor a[3], b[3];
} moe_lora;

/* One saved forward. Rows of g, u and lx are routes in token order: route (t, j) is row
 * t*k + j (padding slots leave their row unused), never the kernels' expert-sorted order. */
typedef struct moe_entry {
    int64_t T;
    ompk_dtype xdt; /* dtype of x (and of dx) */
    ompk_device dev;
    int r;        /* LoRA rank of the forward, 0 = none */
    int32_t *ids; /* [Tm*k] */
    float *w;     /* [Tm*k] */
    uint8_t *xq;  /* x as the kernels consumed it [Tm][H]: bf16 bits, or int8 codes */
    float *xs;    /* int formats: the row scale of xq [Tm] */
    float *g, *u; /* [Tm*k][I] pre-activation, LoRA included */
    float *lx;    /* [Tm*k][3][rmax]: A_g(m x~), A_u(m x~), A_d(m a~) in fp32 */
} moe_entry;

/* training scratch (never the cache): the forward's and the backward's working buffers */
enum moe_tbuf_id {
    TB_RROUTE, /* expert-sorted row -> route t*k+j */
    TB_EOFFS,  /* [E+1] */
    TB_GOFFS,  /* [E+1] backward: first 16-route group of each expert */
    TB_ZP,     /* forward: down partials [P][R][Hn]; backward: the split GEMM operand */
    TB_LW,     /* LoRA in f32, contiguous at the attached rank r: A_g, A_u [E][r][H], A_d
                  [E][r][I], B_g, B_u [E][I][r], B_d [E][H][r] (room for lora_max_rank) */
    TB_AT,     /* backward: a~ [R][I] */
    TB_DG,     /* [R][I] */
    TB_DU,     /* [R][I] */
    TB_DXR,    /* [R][H] per-route dx */
    TB_DWP,    /* [R][nch] per 64-column chunk of I partial of dw */
    TB_BV,     /* [R][3][rmax]: B_g^T dg, B_u^T du, B_d^T dy */
    TB_TDEQ,   /* per thread dequantized weight block */
    TB_STDY,   /* staging: dy [Tm][H] f32 */
    TB_STDX,   /* staging: dx [Tm][H] f32 */
    TB_STDW,   /* staging: dw [Tm][k] */
    TB_COUNT_
};

struct ompk_moe {
    ompk_moe_config cfg; /* normalized */
    ompk_moe_isa isa;
    int fmt;
    int64_t E, H, I;
    int k;
    int kte;    /* k elements per tile: 32 bf16, 64 int */
    int tb;     /* bytes per packed tile */
    int64_t Hk; /* H padded to kte (gate/up K) */
    int64_t Hn; /* H padded to 32 (down N) */
    int64_t Ipad;
    int ktg;  /* Hk/kte */
    int nbd;  /* Hn/16 */
    int gs;   /* group size (int4), 0 otherwise */
    int ktpg; /* k-tiles per group */
    int gg;   /* groups along H */
    int P;
    moe_part part[MOE_MAX_PARTS];
    int nnodes;
    hwloc_topology_t topo; /* the process-wide topology (moe_api.c), shared read-only, not owned */
    int ncores;
    hwloc_cpuset_t *core_set; /* [ncores] */
    int *core_node;           /* [ncores] NUMA node logical index of each core */
    int threads;
    int loaded;
    int amx_min_rows;
    int kblock;    /* use the K-blocked AMX kernels where the format allows */
    int prefetch;  /* weight prefetch mode (ompk_moe_tuning_set) */
    int grad_bf16; /* OMPK_MOE_GRAD_BF16: the data-gradient GEMMs take bf16 operands (hi only) */
    /* scratch arena: one allocation, explicit offsets, a canary after every buffer */
    uint8_t *arena;
    size_t arena_bytes;
    size_t off[MB_COUNT_];
    size_t len[MB_COUNT_];
    int64_t rows_max;
    size_t tscr_bytes; /* per thread */
    ompk_moe_stats stats;
    /* training */
    moe_lora lora;
    int rmax; /* config lora_max_rank */
    uint8_t *cache;
    size_t cache_bytes, cache_tok_bytes;
    /* cache_depth + 1 slots: the live entries and one working slot; perm[0..ncache) is the
     * stack bottom to top, perm[ncache] the working slot */
    moe_entry ent[MOE_MAX_DEPTH + 1];
    int perm[MOE_MAX_DEPTH + 1];
    int ncache;
    uint8_t *tr;
    size_t tr_off[TB_COUNT_], tr_len[TB_COUNT_], tr_bytes, tdeq_floats;
    /* bf16 and int8 bases: transposed packed copies for the backward's dx GEMMs (moe_wt.c) */
    uint8_t *wt;
    size_t wt_bytes;
    int wt_ready;
    int64_t wt_ip;          /* I padded to 32 */
    int wt_dn_kt, wt_dn_nb; /* down^T [I,H]: k-tiles along H, 16-row blocks along I */
    int wt_gu_kt, wt_gu_nb; /* [gate^T; up^T] [H, 2 wt_ip]: k-tiles, 16-row blocks along H */
    size_t wt_dn_bytes, wt_gu_bytes; /* per expert */
    float *wt_scale; /* INT8: [E][H + 2I] row scales of down, gate, up (folded into A) */
};

/* moe_pack.c */
ompk_status moe_parts_alloc(ompk_moe *m);
void moe_parts_free(ompk_moe *m);
/* Pack expert e of matrix `which` (0 gate, 1 up, 2 down) from codes [N][ldc] covering k up to
 * Hk (gate/up) or Ipad (down): bf16 bits, int8 values (as int16 bits) or int4 codes 0..15, with
 * padding columns holding 0 (int4: the group's zero point). Set scales and zero points first. */
void moe_pack_expert(ompk_moe *m, int which, int64_t e, const uint16_t *codes, int64_t ldc);
/* Scale (and int4 zero point) of (which, e, n, global group g). */
void moe_put_scale(ompk_moe *m, int which, int64_t e, int64_t n, int g, float scale, int zero);
float moe_get_deq(const ompk_moe *m, int which, int64_t e, int64_t n, int64_t k);
/* The same values for one tile's block: rows n0..n0+nr-1 (n0 a multiple of 16, nr <= 16) and
 * columns k0..k0+kc-1 (k0 a multiple of the k-tile, kc <= it) into out[nn*ldo + kk]. */
void moe_get_deq_tile(const ompk_moe *m, int which, int64_t e, int64_t n0, int64_t k0, int nr,
                      int kc, float *out, int64_t ldo);

/* INT8: the codes of the same block (as floats) and the scales of its rows, scale[0..nr) */
void moe_get_code_tile(const ompk_moe *m, int which, int64_t e, int64_t n0, int64_t k0, int nr,
                       int kc, float *out, int64_t ldo, float *scale);

/* moe_forward.c */
ompk_status moe_arena_create(ompk_moe *m);
/* Runs the layer on host data: x rows at xd (row stride xs elements, dtype xdt), ids64 [T,k]
 * (validated), w [T,k] contiguous f32, y rows at yd (row stride ys, dtype ydt). */
ompk_status moe_run(ompk_moe *m, int64_t T, const void *xd, int64_t xs, ompk_dtype xdt,
                    const int64_t *ids, const float *w, void *yd, int64_t ys, ompk_dtype ydt);
/* kernel choice and weight addressing shared with the training forward */
enum { K_PORTABLE, K_AVX512, K_AMX, K_AMX_EMU };
int moe_pick_kernel(const ompk_moe *m, int64_t rows);
void moe_run_kernel(int kind, const moe_kargs *k);
/* ompk_moe_combine: y[t] = sum of w[t,j] z[t,j,:] over the slots with ids >= 0 in the forward's
 * order and arithmetic (vec: that of a layer whose moe_combine_vec holds); acc_all holds H floats
 * per OpenMP thread */
void moe_combine(int vec, int64_t T, int k, int64_t H, const float *z, int64_t zst, int64_t zsj,
                 const int64_t *ids, const float *w, int64_t wst, void *yd, int64_t ys, int ybf16,
                 float *acc_all);
int moe_combine_vec(ompk_moe_isa isa);
const uint8_t *moe_gu_b(const ompk_moe *m, const moe_part *pp, int64_t e, int nb);
const uint8_t *moe_dn_b(const ompk_moe *m, const moe_part *pp, int64_t e, int pr);
/* 0 when every canary is intact, else the index of the first damaged buffer + 1. */
int moe_arena_check(const ompk_moe *m);

/* moe_cache.c: the cache arena and the training scratch, sized at create */
ompk_status moe_train_create(ompk_moe *m);
void moe_train_free(ompk_moe *m);
#define TBUF(m, id, type) ((type *)((m)->tr + (m)->tr_off[id]))

/* moe_lora.c: f32 element (e, n, k) of a borrowed LoRA tensor; copy of the active experts'
 * adapters into TB_LW */
float moe_lora_get(const ompk_tensor *t, int64_t e, int64_t n, int64_t k);
void moe_lora_stage(ompk_moe *m, const int64_t *eoffs);
const float *moe_lw(const ompk_moe *m, int which_ab, int proj); /* 0 = A, 1 = B */

/* moe_train_fwd.c: the training forward on host data into entry en (x rows at xd, row stride
 * xs; ids [T,k] validated; w [T,k]; y rows at yd; ys1 > 0: y holds the routes' outputs before
 * their weights instead, f32 rows at yd + t*ys + j*ys1) */
ompk_status moe_run_train(ompk_moe *m, moe_entry *en, int64_t T, const void *xd, int64_t xs,
                          ompk_dtype xdt, const int64_t *ids, const float *w, void *yd, int64_t ys,
                          int64_t ys1, ompk_dtype ydt);
/* ompk_moe_combine of a training forward: moe_run_train's token sums (slot order) on its own */
void moe_combine_train(int64_t T, int k, int64_t H, const float *z, int64_t zst, int64_t zsj,
                       const int64_t *ids, const float *w, int64_t wst, void *yd, int64_t ys,
                       int ybf16, float *acc_all);
/* a~ of one route from its g, u rows (the forward and the backward share it): f32 values of
 * what the down kernel consumed, and the codes it reads (bf16: may be NULL; int formats: I
 * bytes, and the row scale in *scale) */
void moe_train_act(const ompk_moe *m, const float *g, const float *u, float *af, uint8_t *codes,
                   float *scale);

/* e^x in fp32, vectorisable (no libm call): x = n ln2 + r with |r| <= ln2/2 (ln2 in two parts),
 * e^r by Cephes' degree-6 polynomial, then two exact power-of-two scalings so 2^n for n in
 * [-150, 128] never leaves the normal range before the last (correctly rounded) multiply.
 * Within 2 ulp of e^x (subnormal results: of the subnormal grid); +inf above 88.72 and for +inf,
 * 0 below -103.97 and for -inf, NaN for NaN. Every multiply-add is an explicit fmaf, so every
 * compilation of it (and every ISA level) gives the same bits. */
static inline float moe_expf(float x) {
    float xc = x > 89.0f ? 89.0f : x; /* NaN compares false and passes through */
    xc = xc < -104.0f ? -104.0f : xc;
    const float kn = fmaf(xc, 0x1.715476p+0f, 0x1.8p+23f); /* round(x log2 e) + 1.5 * 2^23 */
    const float n = kn - 0x1.8p+23f;
    uint32_t kb;
    memcpy(&kb, &kn, 4);
    float r = fmaf(n, -0.693359375f, xc);
    r = fmaf(n, 2.12194440e-4f, r);
    float p = fmaf(1.9875691500e-4f, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    const float rr = r * r;
    const float y = fmaf(p, rr, r) + 1.0f;
    /* n = kb - 0x4b400000 in [-150, 128]; split into two halves, each a normal 2^k */
    const int32_t ni = (int32_t)(kb - 0x4b400000u);
    const int32_t n1 = ni / 2, n2 = ni - n1;
    const uint32_t b1 = (uint32_t)(n1 + 127) << 23, b2 = (uint32_t)(n2 + 127) << 23;
    float s1, s2;
    memcpy(&s1, &b1, 4);
    memcpy(&s2, &b2, 4);
    return y * s1 * s2;
}

/* silu(g) * u with emg = moe_expf(-g): the SwiGLU activation of the training forward
 * (moe_train_act) and of the backward's recomputation, one expression for both */
static inline float moe_silu_mul(float g, float emg, float u) {
    return g / (1.0f + emg) * u;
}

/* the 16 lane partials of a dot, summed in lane order */
static inline float moe_lane_sum(const float l[16]) {
    float acc = 0.0f;
    for (int j = 0; j < 16; j++) acc += l[j];
    return acc;
}

/* <a, b> in 16 fixed lanes summed in lane order: vectorisable, and the same bits on every run
 * and thread count (the LoRA rank products of the forward and the backward) */
static inline float moe_lane_dot(const float *a, const float *b, int64_t n) {
    float l[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) l[j] += a[i + j] * b[i + j];
    for (int j = 0; i + j < n; j++) l[j] += a[i + j] * b[i + j];
    return moe_lane_sum(l);
}

/* out[q] = moe_lane_dot(M + q*ld, v, n) for q < nq, four rows at a time: four independent
 * lane chains instead of one latency-bound chain, each dot's operations and order unchanged */
static inline void moe_lane_dots(const float *M, int64_t ld, int nq, const float *v, int64_t n,
                                 float *out) {
    int q = 0;
    for (; q + 4 <= nq; q += 4) {
        const float *a0 = M + q * ld, *a1 = a0 + ld, *a2 = a1 + ld, *a3 = a2 + ld;
        float l0[16] = {0}, l1[16] = {0}, l2[16] = {0}, l3[16] = {0};
        int64_t i = 0;
        for (; i + 16 <= n; i += 16)
            for (int j = 0; j < 16; j++) {
                l0[j] += a0[i + j] * v[i + j];
                l1[j] += a1[i + j] * v[i + j];
                l2[j] += a2[i + j] * v[i + j];
                l3[j] += a3[i + j] * v[i + j];
            }
        for (int j = 0; i + j < n; j++) {
            l0[j] += a0[i + j] * v[i + j];
            l1[j] += a1[i + j] * v[i + j];
            l2[j] += a2[i + j] * v[i + j];
            l3[j] += a3[i + j] * v[i + j];
        }
        out[q] = moe_lane_sum(l0);
        out[q + 1] = moe_lane_sum(l1);
        out[q + 2] = moe_lane_sum(l2);
        out[q + 3] = moe_lane_sum(l3);
    }
    for (; q < nq; q++) out[q] = moe_lane_dot(M + q * ld, v, n);
}

/* moe_lane_dots of two vectors against the same rows (two routes of one expert): each row of M
 * is read once for both, each dot's operations and order unchanged (the same bits) */
static inline void moe_lane_dots2(const float *M, int64_t ld, int nq, const float *v,
                                  const float *w, int64_t n, float *ov, float *ow) {
    int q = 0;
    for (; q + 4 <= nq; q += 4) {
        const float *a0 = M + q * ld, *a1 = a0 + ld, *a2 = a1 + ld, *a3 = a2 + ld;
        float l0[16] = {0}, l1[16] = {0}, l2[16] = {0}, l3[16] = {0};
        float k0[16] = {0}, k1[16] = {0}, k2[16] = {0}, k3[16] = {0};
        int64_t i = 0;
        for (; i + 16 <= n; i += 16)
            for (int j = 0; j < 16; j++) {
                l0[j] += a0[i + j] * v[i + j];
                l1[j] += a1[i + j] * v[i + j];
                l2[j] += a2[i + j] * v[i + j];
                l3[j] += a3[i + j] * v[i + j];
                k0[j] += a0[i + j] * w[i + j];
                k1[j] += a1[i + j] * w[i + j];
                k2[j] += a2[i + j] * w[i + j];
                k3[j] += a3[i + j] * w[i + j];
            }
        for (int j = 0; i + j < n; j++) {
            l0[j] += a0[i + j] * v[i + j];
            l1[j] += a1[i + j] * v[i + j];
            l2[j] += a2[i + j] * v[i + j];
            l3[j] += a3[i + j] * v[i + j];
            k0[j] += a0[i + j] * w[i + j];
            k1[j] += a1[i + j] * w[i + j];
            k2[j] += a2[i + j] * w[i + j];
            k3[j] += a3[i + j] * w[i + j];
        }
        ov[q] = moe_lane_sum(l0), ov[q + 1] = moe_lane_sum(l1);
        ov[q + 2] = moe_lane_sum(l2), ov[q + 3] = moe_lane_sum(l3);
        ow[q] = moe_lane_sum(k0), ow[q + 1] = moe_lane_sum(k1);
        ow[q + 2] = moe_lane_sum(k2), ow[q + 3] = moe_lane_sum(k3);
    }
    for (; q < nq; q++) {
        ov[q] = moe_lane_dot(M + q * ld, v, n);
        ow[q] = moe_lane_dot(M + q * ld, w, n);
    }
}

/* acc[i] += M[q*ld + i] * c[q] for q = 0..nq-1 in this order (the LoRA rank products), four
 * rows per pass over acc so it is loaded and stored once per four: same operations per element */
static inline void moe_axpy_rows(float *acc, const float *M, int64_t ld, int nq, const float *c,
                                 int64_t n) {
    int q = 0;
    for (; q + 4 <= nq; q += 4) {
        const float *m0 = M + q * ld, *m1 = m0 + ld, *m2 = m1 + ld, *m3 = m2 + ld;
        const float c0 = c[q], c1 = c[q + 1], c2 = c[q + 2], c3 = c[q + 3];
        for (int64_t i = 0; i < n; i++) {
            float a = acc[i];
            a += m0[i] * c0;
            a += m1[i] * c1;
            a += m2[i] * c2;
            a += m3[i] * c3;
            acc[i] = a;
        }
    }
    for (; q < nq; q++) {
        const float *m0 = M + q * ld, c0 = c[q];
        for (int64_t i = 0; i < n; i++) acc[i] += m0[i] * c0;
    }
}

/* moe_verify_train.c: the forward reference of the layer as attached now (LoRA included), y
 * [T,H]; the OMPK_VERIFY lines of a backward (dx, dw as written on the host) */
void moe_verify_ref_y(const ompk_moe *m, int64_t T, const float *x, const int64_t *ids,
                      const float *w, float *const W[3], double *y);
void moe_verify_backward(const ompk_moe *m, const moe_entry *en, const float *dy,
                         const ompk_moe_grads *gr, const void *dx, const float *dw);

/* moe_wt.c: the transposed copies (bf16, int8 bases), built at the first backward after a load */
void moe_wt_layout(ompk_moe *m);
ompk_status moe_wt_build(ompk_moe *m);
void moe_wt_free(ompk_moe *m);
/* moe_bwd_gemm.c: backward GEMMs on the tile kernels (bf16, int8 bases), orphaned worksharing:
 * called by every thread of the backward's parallel region, tb the thread's scratch
 * (moe_wt_scratch_floats floats). Activations enter as bf16 hi + lo pairs, split once into A
 * (moe_wt_split_bytes(m, R) bytes) in expert-sorted groups of 16 routes (goff from
 * moe_wt_group_offsets; ids the routes' experts).
 * dh: q[route][0..I) = dy_t down[e] (before the routing weight); dy_bf16: every dy value is a
 * bf16 value (lo = 0).
 * dx: o[route][0..H) = dg gate[e] + du up[e] (one GEMM over K = [gate; up]). */
size_t moe_wt_scratch_floats(const ompk_moe *m);
size_t moe_wt_split_bytes(const ompk_moe *m, int64_t R);
void moe_wt_group_offsets(const ompk_moe *m, const int64_t *offs, int64_t *goff);
void moe_bwd_gemm_dh(const ompk_moe *m, const float *dy, int dy_bf16, const int64_t *offs,
                     const int64_t *goff, const int32_t *rroute, const int32_t *ids, uint8_t *A,
                     float *q, float *tb);
void moe_bwd_gemm_dx(const ompk_moe *m, const int64_t *offs, const int64_t *goff,
                     const int32_t *rroute, const int32_t *ids, const float *dg, const float *du,
                     uint8_t *A, float *o, float *tb);

/* moe_backward.c */
ompk_status moe_run_backward(ompk_moe *m, const moe_entry *en, const float *dy, int dy_bf16,
                             void *dxd, int64_t dxs, float *dw, const ompk_moe_grads *gr);

/* moe_train_fwd_v4.c, moe_backward_v4.c: the same sources compiled for x86-64-v4 (AVX-512), which
 * moe_run_train and moe_run_backward call where moe_cpu_has_avx512() (its AVX-512 BF16 CPUs all
 * have v4's F, BW, CD, DQ, VL). Their per-element arithmetic does not depend on the vector width
 * (the one in-order sum GCC vectorises width-dependently, moe_bwd_rank_dot, is compiled once), so
 * both give the same bits; bench/diag/moe_sft checks it against a build with -DOMPK_MOE_NO_V4,
 * which keeps the x86-64-v3 code on every CPU. */
ompk_status moe_run_train_v4(ompk_moe *m, moe_entry *en, int64_t T, const void *xd, int64_t xs,
                             ompk_dtype xdt, const int64_t *ids, const float *w, void *yd,
                             int64_t ys, int64_t ys1, ompk_dtype ydt);
void moe_combine_train_v4(int64_t T, int k, int64_t H, const float *z, int64_t zst, int64_t zsj,
                          const int64_t *ids, const float *w, int64_t wst, void *yd, int64_t ys,
                          int ybf16, float *acc_all);
void moe_train_act_v4(const ompk_moe *m, const float *g, const float *u, float *af, uint8_t *codes,
                      float *scale);
ompk_status moe_run_backward_v4(ompk_moe *m, const moe_entry *en, const float *dy, int dy_bf16,
                                void *dxd, int64_t dxs, float *dw, const ompk_moe_grads *gr);
/* moe_backward.c (x86-64-v3 only): sum over q < r of b[q] c[q] in order, the LoRA part of dw */
float moe_bwd_rank_dot(const float *b, const float *c, int r);

#endif
