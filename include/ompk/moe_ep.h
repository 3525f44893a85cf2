/* Expert-parallel MoE over MPI (libompk_mpi; built when CMake finds MPI, OMPK_MPI).
 *
 * One layer spans the ranks of a communicator: rank r owns a contiguous range of the E experts
 * (E / size each, the first E % size ranks one more) in an ompk_moe layer of its own, and loads
 * only those experts' weights. A forward takes each rank's own tokens: every route (t, j) with
 * expert_ids[t,j] >= 0 travels with its row of x to the rank owning its expert
 * (MPI_Alltoallv: counts first, then rows), the owner runs its experts on all the rows it
 * received (ompk_moe_fwd with one slot per row and weight 1), the per-route outputs travel back,
 * and the token's rank sums them with ompk_moe_combine (one rank: the layer's own ompk_moe_fwd,
 * nothing exchanged). Routes reach their owner in the order of
 * the ranks and, within a rank, of (t, j), so each expert sees its rows in the order a single
 * layer would see them on the ranks' tokens concatenated in rank order: with one NUMA partition
 * per layer (numa = OMPK_MOE_NUMA_FORCED, numa_split = 1, or a one-node machine) y is bit-identical
 * to ompk_moe_fwd of one layer on those concatenated tokens, whatever the number of ranks.
 *
 * Collective calls: create, load_weights and fwd must be called by every rank of the
 * communicator, in the same order. The layer works on a duplicate of the caller's communicator
 * (MPI_Comm_dup at create, freed at destroy) with MPI_ERRORS_RETURN, so its messages never mix
 * with the caller's. Bad inputs on any rank are found before the first exchange and reported on
 * every rank (that rank gets its own status and message, the others OMPK_ERR_INVALID_ARGUMENT
 * naming the rank): no rank is left waiting in a collective, and no output is written anywhere.
 *
 * Threads: MPI is called from the calling thread only, so MPI_Init_thread with
 * MPI_THREAD_FUNNELED (or more) is enough; the experts run on config.threads OpenMP threads of
 * that rank (0 = omp_get_max_threads()), and ompk does not change the caller's OpenMP settings.
 * A layer serves one call at a time; layers on different communicators may be used from
 * different threads where MPI_THREAD_MULTIPLE is provided.
 *
 * Tensors: x [T,H] f32|bf16, expert_ids [T,k] i32|i64 (global expert ids in [-1, E)), weights
 * [T,k] f32, y [T,H] f32|bf16, as ompk_moe_fwd takes them (T may differ per rank and may be 0; x's
 * dtype must be the same on every rank), on the host or all on one GPU (contiguous; staged
 * through host buffers: ompk never hands device memory to MPI, so it needs no GPU-aware MPI; the
 * LoRA and weight gradients are host tensors as in ompk_moe_grads). A failed collective step after
 * some ranks saved or popped a training forward marks the layer (OMPK_ERR_RUNTIME for later
 * training calls): destroy and re-create it. */
#ifndef OMPK_MOE_EP_H
#define OMPK_MOE_EP_H

#include <mpi.h>

#include "ompk/moe.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ompk_moe_ep ompk_moe_ep;

/* Timings (ms) and traffic of this rank's last forward. */
typedef struct ompk_moe_ep_stats {
    double total_ms;
    double exchange_ms; /* the all-to-alls (counts, rows out, outputs back) and the agreements */
    double experts_ms;  /* this rank's ompk_moe_fwd on the rows it received */
    double combine_ms;  /* ompk_moe_combine of this rank's tokens */
    int64_t routes_sent, routes_received; /* rows of x this rank sent / its experts received */
    int64_t bytes_sent, bytes_received;   /* both directions, rows and outputs */
} ompk_moe_ep_stats;

/* config describes the whole layer (experts = E over all ranks, max_tokens = the largest T any
 * rank passes, cache_depth and lora_max_rank as for ompk_moe_create). Needs E >= the
 * communicator's size and MPI initialised with at least MPI_THREAD_FUNNELED. Collective. */
ompk_status ompk_moe_ep_create(const ompk_moe_config *config, MPI_Comm comm, ompk_moe_ep **out);
/* Collective (frees the duplicate communicator). */
void ompk_moe_ep_destroy(ompk_moe_ep *ep);
/* This rank's experts: global ids first .. first + count - 1. */
ompk_status ompk_moe_ep_experts(const ompk_moe_ep *ep, int64_t *first, int64_t *count);
/* This rank's layer (for ompk_moe_get_info and the like; owned by ep). */
ompk_moe *ompk_moe_ep_local(ompk_moe_ep *ep);
/* gate [count,I,H], up [count,I,H], down [count,H,I]: this rank's experts only, as
 * ompk_moe_load_weights takes them. Collective (every rank must succeed before any forward). */
ompk_status ompk_moe_ep_load_weights(ompk_moe_ep *ep, const ompk_tensor *gate,
                                     const ompk_tensor *up, const ompk_tensor *down);
/* The forward of this rank's tokens (header comment). Collective. */
ompk_status ompk_moe_ep_fwd(ompk_moe_ep *ep, const ompk_tensor *x, const ompk_tensor *expert_ids,
                            const ompk_tensor *weights, ompk_tensor *y);
ompk_status ompk_moe_ep_get_stats(const ompk_moe_ep *ep, ompk_moe_ep_stats *stats);

/* Fine-tuning across the ranks. Each rank attaches the adapters of its own
 * experts (A [count,r,in], B [count,out,r], as ompk_moe_set_lora takes them); dropout must be 0
 * with more than one rank (its mask is a function of the row index within a rank's call).
 * Collective. */
ompk_status ompk_moe_ep_set_lora(ompk_moe_ep *ep, const ompk_moe_lora *lora);
/* ompk_moe_fwd_train of this rank's tokens (mode PUSH or RECOMPUTE): the routes travel with x as
 * f32 (exact) and their routing weights, each owner saves its routes' forward, y comes back as
 * in ompk_moe_ep_fwd (the training forward's combine). Collective. */
ompk_status ompk_moe_ep_fwd_train(ompk_moe_ep *ep, const ompk_tensor *x,
                                  const ompk_tensor *expert_ids, const ompk_tensor *weights,
                                  ompk_tensor *y, ompk_moe_cache_mode mode);
/* ompk_moe_bwd across the ranks: dy [T,H] of this rank's tokens goes to the routes' owners, each
 * owner runs the backward of its saved routes, and dx (each route's fp32 rows summed in slot
 * order, rounded once, as the single layer does) and dw come back to the token's rank; LoRA and
 * full-weight gradients are this rank's experts' ([count,...], accumulate as in ompk_moe_grads).
 * dx, dw, LoRA gradients and dW equal the single layer's bit for bit. Collective. */
ompk_status ompk_moe_ep_bwd(ompk_moe_ep *ep, const ompk_tensor *dy, const ompk_moe_grads *grads);

#ifdef __cplusplus
}
#endif
#endif
