/* MoE experts (SwiGLU), host path (docs/KERNELS.md section 3, forward).
 *
 * A layer object owns the experts' weights, packed once at load into the tile layout the
 * kernels read (VNNI tiles for AMX; the AVX-512 and portable paths read the same bytes), split
 * across NUMA partitions along the intermediate dimension I, plus one scratch arena sized for
 * max_tokens. Per token t and top-k slot j with expert e = expert_ids[t,j] (-1 = padding):
 *     g = gate_w[e] x_t,  u = up_w[e] x_t,  a = silu(g)*u,  y_t = sum_j weights[t,j] down_w[e] a
 *
 * Operand precision (what the matrix units consume; every sum is fp32, y is rounded once):
 * - OMPK_MOE_BF16: x and a are rounded to bf16 before their matmul (a after SiLU*up in fp32).
 *   On the AVX-512 BF16 and AMX paths the bf16 dot-product instructions read subnormal bf16
 *   operands as zero (a hardware rule), so rows of x or a below 2^-126 contribute 0 there.
 * - int formats (W8A8 / W4A8): x and a are quantized per row, symmetric int8 with
 *   scale = max|row| / 127 and q = rint(v * (127 / max|row|)), each operation rounded to fp32
 *   (the codes are defined by that arithmetic); the integer dot products are exact and the scales
 * are applied in fp32. The quantization of a uses the whole row of a (all of I), so a NUMA split
 * does not change the result beyond fp32 reassociation. Non-finite values in the int formats
 * (docs/KERNELS.md section 3): a row of x or a holding a NaN gets scale NaN, so every output that
 * depends on it is NaN, never a finite number. A row holding an infinity (and no NaN) gets scale
 * +inf and q = +-127 at the infinities, 0 elsewhere: every output that depends on it is +-inf or
 * NaN (0*inf), non-finite as in the float math, though which of the two may differ from it
 * (quantization is not the identity at inf). Weight rows (INT8) and k-groups (INT4, INT4_ZP) with a
 * NaN or an infinity are stored the same way at load (scale NaN or inf; ompk_moe_get_weights then
 * returns non-finite values for that row or group). Tiny (subnormal) and huge finite rows quantize
 * without overflow. Range: the int formats apply the weight scale to the exact integer dot product
 * (up to 127 * 127 * K) in fp32 before the row scale of x or a, so weights above about FLT_MAX /
 * (127 * K) overflow there. Weight formats (dequantized w):
 * - INT8: per output row symmetric, w = q * scale[row], q in -128..127.
 * - INT4: k-groups of group_size along the input dimension, w = q * scale[row, group], q -8..7.
 * - INT4_ZP: k-groups with an integer zero point, w = (q - zero[row, group]) * scale[row, group],
 *   q and zero in 0..15.
 *
 * Threads: a forward runs one OpenMP parallel region of `threads` threads; partition p gets a
 * contiguous share of them, pinned (hwloc) to the cores of its NUMA node unless no_pin is set;
 * the caller's own thread binding is restored on return. Results do not depend on the thread
 * count: every output element is produced by one thread in a fixed order, and partition partials
 * are summed in partition order. (The order does depend on the routing: a row's last bits can
 * change with the number of rows its expert gets, which selects the kernel and the row blocking.)
 *
 * Thread safety: one layer object serves one call at a time. ompk_moe_fwd, the loads and
 * the getters of one object must not overlap (a forward uses the object's scratch arena and
 * writes its stats); distinct objects may be used from different threads at once.
 * ompk_moe_create, ompk_moe_destroy (of an object no call is using) and the ISA queries are
 * safe from any thread.
 */
#ifndef OMPK_MOE_H
#define OMPK_MOE_H

#include "ompk/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ompk_moe_format {
    OMPK_MOE_BF16 = 0,
    OMPK_MOE_INT8 = 1,   /* per output row symmetric */
    OMPK_MOE_INT4 = 2,   /* k-group symmetric */
    OMPK_MOE_INT4_ZP = 3 /* k-group with zero point */
} ompk_moe_format;

typedef enum ompk_moe_numa {
    OMPK_MOE_NUMA_AUTO = 0,  /* one partition per NUMA node (hwloc) */
    OMPK_MOE_NUMA_FORCED = 1 /* numa_split partitions, mapped round-robin onto the nodes */
} ompk_moe_numa;

typedef enum ompk_moe_isa {
    OMPK_MOE_ISA_AUTO = 0, /* OMPK_ISA (README) if set, else the best available */
    OMPK_MOE_ISA_AMX = 1,  /* AMX tiles for experts with >= amx_min_rows rows, AVX-512 below */
    OMPK_MOE_ISA_AVX512BF16 = 2,  /* AVX-512 BF16 + VNNI */
    OMPK_MOE_ISA_PORTABLE = 3,    /* plain C */
    OMPK_MOE_ISA_AMX_EMULATED = 4 /* the AMX tile code on a C emulation of the tiles (tests) */
} ompk_moe_isa;

/* Operands of the backward's data-gradient products (dh = dy down, dx = dg gate + du up) on bf16
 * and int8 bases; the int4 formats use fp32 products on their dequantized weights either way. */
typedef enum ompk_moe_grad_operands {
    OMPK_MOE_GRAD_SPLIT = 0, /* dy, dg, du as bf16 hi + lo pairs: about 16 mantissa bits */
    OMPK_MOE_GRAD_BF16 = 1   /* rounded once to bf16, as a bf16 autograd does: half the tile work */
} ompk_moe_grad_operands;

typedef struct ompk_moe_config {
    int64_t experts;      /* E >= 1 */
    int64_t hidden;       /* H >= 1 (even for int4 formats) */
    int64_t intermediate; /* I >= 1 (even for int4 formats) */
    int top_k;            /* 1..64 */
    int64_t max_tokens;   /* >= 1: scratch is sized for it */
    ompk_moe_format format;
    int group_size; /* int4 k-group length, multiple of 64; 0 = 128 */
    ompk_moe_numa numa;
    int numa_split; /* partitions for OMPK_MOE_NUMA_FORCED, 1..64 */
    int threads;    /* 0 = omp_get_max_threads() */
    int no_pin;     /* 1: leave thread affinity alone */
    ompk_moe_isa isa;
    int amx_min_rows; /* experts with fewer routed rows use AVX-512; 0 = 4 */
    /* Training (all 0 = inference only). The forward cache is one arena of its own, sized here
     * for cache_depth entries (plus one working slot) of max_tokens x top_k routes at LoRA rank
     * <= lora_max_rank. Bytes per saved token: 8k (ids, routing weights) + x as the kernels
     * consumed it (bf16: 2H; int formats: H codes + 4) + k*(8I + 12 lora_max_rank) (g and u
     * fp32, A_g x, A_u x, A_d a fp32); a is recomputed from g and u, z is never stored. */
    int cache_depth;   /* saved forwards alive at once (micro-batches, pipeline stages), 0..64 */
    int lora_max_rank; /* largest LoRA rank ompk_moe_set_lora will accept, 0 = no LoRA */
    ompk_moe_grad_operands grad_operands;
} ompk_moe_config;

typedef struct ompk_moe ompk_moe;

/* Timings of the last successful forward or backward (ms). stage_* are the copies of x/ids/
 * weights (backward: dy) to host buffers and of y (backward: dx, dw) back (0 for host tensors).
 * After a backward phase_ms are its five phases (a and B_d^T dy per route; the I-chunk pass;
 * B^T d per route; the H-chunk pass; the per-token sums); after a training forward its five
 * (x, gather and the LoRA inputs A_g x, A_u x; gate/up with the LoRA terms, bf16 a in their
 * epilogue; per route a (int formats) and A_d a; down with s B_d A_d a in its epilogue; z of
 * several NUMA partitions and the per-token sums of y). */
typedef struct ompk_moe_stats {
    double stage_in_ms;
    double compute_ms;
    double stage_out_ms;
    int experts_amx;    /* active experts that ran on AMX tiles in that forward */
    int experts_vector; /* active experts that ran on AVX-512 / portable code */
    /* compute_ms by phase: gather (+ x quantization), gate/up + SiLU, quantization of a (int
     * formats), down, sum of partials and rounding of y */
    double phase_ms[5];
    double fork_ms; /* of phase_ms[0]: starting the thread team and pinning it */
} ompk_moe_stats;

typedef struct ompk_moe_info {
    ompk_moe_isa isa; /* the path this object runs */
    int partitions;   /* NUMA partitions of I */
    int numa_nodes;   /* NUMA nodes hwloc reports */
    int threads;
    size_t weight_bytes;          /* packed weights, all partitions */
    size_t arena_bytes;           /* scratch arena */
    size_t cache_bytes;           /* forward-cache arena (all cache_depth entries) */
    size_t cache_bytes_per_token; /* of one saved token at top_k routes and lora_max_rank */
    int cache_entries;            /* entries on the stack now */
    /* bf16 and int8 bases: transposed packed copies of the weights for the backward
     * (E * 3*H*I bf16 at tile padding: the size of a bf16 base, twice an int8 one, plus the int8
     * row scales), allocated at the first backward and kept until destroy; 0 before it and for
     * the int4 formats */
    size_t backward_weight_bytes;
} ompk_moe_info;

/* Name of an ISA ("amx", "avx512bf16", "portable", "amx-emulated", "auto"). */
const char *ompk_moe_isa_name(ompk_moe_isa isa);
/* 1 when this machine (CPUID, and for AMX the kernel's XTILEDATA permission) can run it. */
int ompk_moe_isa_available(ompk_moe_isa isa);

/* OMPK_ERR_INVALID_ARGUMENT for a bad config; OMPK_ERR_UNSUPPORTED when the ISA asked for (in
 * the config or by OMPK_ISA, README) cannot run here. */
ompk_status ompk_moe_create(const ompk_moe_config *config, ompk_moe **out);
void ompk_moe_destroy(ompk_moe *moe);
ompk_status ompk_moe_get_info(const ompk_moe *moe, ompk_moe_info *info);
ompk_status ompk_moe_get_stats(const ompk_moe *moe, ompk_moe_stats *stats);

/* gate [E,I,H], up [E,I,H], down [E,H,I], f32 or bf16, on any device (copied to the host
 * first), any strides. Quantized at load for the int formats (scales from max|row| or
 * max|group|; INT4_ZP from the group's min and max). May be called again to replace. */
ompk_status ompk_moe_load_weights(ompk_moe *moe, const ompk_tensor *gate, const ompk_tensor *up,
                                  const ompk_tensor *down);

/* Pre-quantized weights, host tensors.
 * INT8: q i8 [E,N,K]; scale f32 [E,N]; zero NULL.
 * INT4: q i4 [E,N,K] (signed nibbles); scale f32 [E,N,ceil(K/group_size)]; zero NULL.
 * INT4_ZP: q i4 [E,N,K] whose nibbles are read as unsigned 0..15; scale as INT4;
 * zero i8 [E,N,ceil(K/group_size)] with values 0..15.
 * (N,K) = (I,H) for gate and up, (H,I) for down. */
typedef struct ompk_moe_quantized {
    const ompk_tensor *q;
    const ompk_tensor *scale;
    const ompk_tensor *zero;
} ompk_moe_quantized;

ompk_status ompk_moe_load_quantized(ompk_moe *moe, const ompk_moe_quantized *gate,
                                    const ompk_moe_quantized *up, const ompk_moe_quantized *down);

typedef enum ompk_moe_weight {
    OMPK_MOE_WEIGHT_GATE = 0, /* [E,I,H] */
    OMPK_MOE_WEIGHT_UP = 1,   /* [E,I,H] */
    OMPK_MOE_WEIGHT_DOWN = 2  /* [E,H,I] */
} ompk_moe_weight;

/* The dequantized weights the kernels use (what a reference must compute with), read back
 * from the packed layout; out is a contiguous host f32 tensor of which's shape. */
ompk_status ompk_moe_get_weights(const ompk_moe *moe, ompk_moe_weight which, ompk_tensor *out);

/* x [T,H] f32|bf16 (unit inner stride), expert_ids [T,k] i32|i64, weights [T,k] f32,
 * y [T,H] f32|bf16 (unit inner stride, no overlap with any input). T <= max_tokens, k = top_k.
 * All on the host, or all on one GPU device (then contiguous; staged through host buffers).
 * Errors (y untouched): OMPK_ERR_INVALID_ARGUMENT (shapes, dtypes, strides, T > max_tokens,
 * weights not loaded), OMPK_ERR_DEVICE_MISMATCH, OMPK_ERR_INDEX_OUT_OF_RANGE (an id outside
 * [-1, E)). Tokens whose slots are all -1 get y = 0. Not thread-safe per object. */
ompk_status ompk_moe_fwd(ompk_moe *moe, const ompk_tensor *x, const ompk_tensor *expert_ids,
                         const ompk_tensor *weights, ompk_tensor *y);

/* The combine step of the forward alone, for expert-parallel schemes that run the experts
 * elsewhere (ompk/moe_ep.h is one): y[t] = sum over the slots j of token t with
 * expert_ids[t,j] >= 0 of weights[t,j] * z[t,j,:], in the order and fp32 arithmetic of this
 * layer's ompk_moe_fwd (of), experts ascending then slots, or of its ompk_moe_fwd_train and of
 * ompk_moe_fwd with LoRA attached, slots in order; rounded once to y's dtype. z[t,j] is the
 * route's output before its weight: what ompk_moe_fwd_train gives with a 3-D y, or ompk_moe_fwd
 * of a top-1 layer of the same weights on x_t with weight 1 in f32. Then y is the forward's bit
 * for bit (ompk_moe_fwd without LoRA: with one NUMA partition; it sums several apart, so there
 * within fp32 reassociation).
 * z [T,k,H] f32 (unit inner stride, H the layer's), expert_ids [T,k] i32|i64 (values >= -1; only
 * their order matters, so k need not be the layer's), weights [T,k] f32, y [T,H] f32|bf16 (unit
 * inner stride, no overlap with an input), k <= 64, all host tensors. Rows of z for padded slots
 * are not read. */
typedef enum ompk_moe_combine_of {
    OMPK_MOE_COMBINE_FWD = 0,      /* ompk_moe_fwd */
    OMPK_MOE_COMBINE_FWD_TRAIN = 1 /* ompk_moe_fwd_train */
} ompk_moe_combine_of;

ompk_status ompk_moe_combine(const ompk_moe *moe, const ompk_tensor *z,
                             const ompk_tensor *expert_ids, const ompk_tensor *weights,
                             ompk_tensor *y, ompk_moe_combine_of of);

/* ---- Fine-tuning (docs/KERNELS.md section 3, training) ----------------------------------------
 * LoRA adapters, rank r, scale s = alpha / r: for each projection W x becomes W x + s*B(A x).
 * A [E,r,in] and B [E,out,r], f32 or bf16 host tensors, (in,out) = (H,I) for gate and up, (I,H)
 * for down. The layer borrows them: it reads them at every forward and backward, so an
 * optimizer may update them in place between calls without re-attaching. dropout in [0,1) is
 * applied to the LoRA input (x for gate/up, a for down) with a mask that is a pure function of
 * (seed, projection, token, feature), regenerated by the backward, never stored (token = the
 * row index within the call). NULL detaches (frozen base: the backward then gives dx and dw
 * only). r <= config.lora_max_rank. With LoRA attached, ompk_moe_fwd computes the adapted
 * layer too. The LoRA terms use x and a as the base kernels consumed them (bf16 or int8 rounded)
 * and fp32 sums. Attaching or detaching while saved forwards wait for their backward is
 * OMPK_ERR_INVALID_ARGUMENT (so is ompk_moe_load_weights / _load_quantized): a saved entry's
 * backward runs with the weights and adapters of its forward. Values updated in place are read
 * by the next call: update them after the backward of every saved entry. */
typedef struct ompk_moe_lora {
    int rank;
    float alpha;
    const ompk_tensor *gate_a, *gate_b;
    const ompk_tensor *up_a, *up_b;
    const ompk_tensor *down_a, *down_b;
    float dropout;
    uint64_t seed;
} ompk_moe_lora;

ompk_status ompk_moe_set_lora(ompk_moe *moe, const ompk_moe_lora *lora);

typedef enum ompk_moe_cache_mode {
    OMPK_MOE_CACHE_NONE = 0,     /* the inference forward: nothing saved */
    OMPK_MOE_CACHE_PUSH = 1,     /* save one entry on the stack (OMPK_ERR_CACHE_FULL when full) */
    OMPK_MOE_CACHE_RECOMPUTE = 2 /* overwrite the top entry (activation checkpointing) */
} ompk_moe_cache_mode;

/* The training forward: ompk_moe_fwd's inputs, outputs and errors, plus the cache mode. A
 * failed call (any status) leaves y and the cache stack unchanged. y may instead be [T,k,H] f32
 * (host tensors, mode PUSH or RECOMPUTE): each route's output before its routing weight, for
 * ompk_moe_combine (rows of padded slots untouched). */
ompk_status ompk_moe_fwd_train(ompk_moe *moe, const ompk_tensor *x, const ompk_tensor *expert_ids,
                               const ompk_tensor *weights, ompk_tensor *y,
                               ompk_moe_cache_mode mode);

/* Outputs of a backward. dx [T,H] (x's dtype of the saved forward, on dy's device) is required;
 * every other tensor may be NULL (not computed). dw [T,k] f32 on dy's device: the router-weight
 * gradient <dy_t, z[t,j]>. LoRA gradients f32 host tensors of A's and B's shapes (only with
 * LoRA attached at the forward). Full fine-tuning, bf16 base only: dW f32 host tensors of the
 * weights' shapes. accumulate = 0 writes every element of the parameter gradients (0 for
 * experts no token reached); 1 adds into them and leaves unreached experts untouched. dx and dw
 * are always written (=). */
typedef struct ompk_moe_grads {
    ompk_tensor *dx;
    ompk_tensor *dw;
    ompk_tensor *gate_da, *gate_db, *up_da, *up_db, *down_da, *down_db;
    ompk_tensor *gate_dw, *up_dw, *down_dw;
    int accumulate;
} ompk_moe_grads;

/* dy [T,H] (T of the top entry), f32 or bf16, on the device of the saved forward's x. Pops the
 * top entry. OMPK_ERR_CACHE_EMPTY with nothing saved; every other error leaves the stack and
 * all outputs untouched. The gradients are those of the forward that ran: the dequantized
 * weights it used, the operand roundings of x and a (bf16 or int8) counted as identity.
 * bf16 and int8 bases: the data-gradient products down^T dy and gate^T dg + up^T du run on the
 * forward's tile kernels (AMX, AVX-512 BF16, portable, per expert from its routed row count)
 * against transposed packed copies of the weights, built once at the first backward after a load
 * (time: one pass over the weights; memory: backward_weight_bytes, the size of the base).
 * Repacking them at every backward would move about as many bytes as the GEMMs stream. Their
 * activation operands dy, dg and du enter as bf16 pairs hi = bf16(v), lo = bf16(v - hi), two tile
 * products summed in fp32 (about 16 mantissa bits per operand: fp32-level gradients for twice
 * the tile work; parts below 2^-126 read as zero on AMX / AVX-512 BF16); a bf16 dy on a bf16
 * base has lo = 0 and skips that half; grad_operands = OMPK_MOE_GRAD_BF16 keeps hi only. int8: the
 * copies hold the codes (exact in bf16) and each weight row's scale multiplies the activation it
 * meets (code * scale itself is not exact in bf16). The int4 formats keep fp32 products on their
 * dequantized weights (their group scales vary along both dimensions of the products). */
ompk_status ompk_moe_bwd(ompk_moe *moe, const ompk_tensor *dy, const ompk_moe_grads *grads);

/* ---- Deprecated names (CHANGELOG.md lists them and their replacements) ---------------------- */

OMPK_DEPRECATED("use ompk_moe_fwd")
static inline ompk_status ompk_moe_forward(ompk_moe *moe, const ompk_tensor *x,
                                           const ompk_tensor *expert_ids,
                                           const ompk_tensor *weights, ompk_tensor *y) {
    return ompk_moe_fwd(moe, x, expert_ids, weights, y);
}

OMPK_DEPRECATED("use ompk_moe_fwd_train")
static inline ompk_status ompk_moe_forward_train(ompk_moe *moe, const ompk_tensor *x,
                                                 const ompk_tensor *expert_ids,
                                                 const ompk_tensor *weights, ompk_tensor *y,
                                                 ompk_moe_cache_mode mode) {
    return ompk_moe_fwd_train(moe, x, expert_ids, weights, y, mode);
}

OMPK_DEPRECATED("use ompk_moe_bwd")
static inline ompk_status ompk_moe_backward(ompk_moe *moe, const ompk_tensor *dy,
                                            const ompk_moe_grads *grads) {
    return ompk_moe_bwd(moe, dy, grads);
}

#ifdef __cplusplus
}
#endif
#endif
