/* Internal: the mHC pre forward for decode-size calls (T <= MHC_DEC_TMAX tokens) as one target
 * region, and the same region with layer l's post forward in front (ompk_mhc_post_pre_fwd).
 *
 * The large-T path takes four regions (weights, GEMM, per-token epilogue, h_in); at a few tokens
 * their fixed costs are the whole call. Here a team takes one token and one d range of every
 * stream (item = (t, c)), sums its GEMM row and sum of squares over the range, reduces them over
 * its threads in a fixed order and writes one partial row. The team that finishes a token's last
 * range (an integer arrival counter per token, the only atomic) then sums the token's partials in
 * range order, runs the epilogue and Sinkhorn (pre_token) and writes h_in. With post in front,
 * each thread first forms x_out = post * f + comb^T x for its d of all streams, stores it rounded
 * to x's dtype, and feeds the rounded values to the GEMM, so the results equal post forward
 * followed by this kernel on x_out, bit for bit. */
#ifndef OMPK_MHC_PRE_DEC_H
#define OMPK_MHC_PRE_DEC_H

#include "mhc_kern.h"
#include "mhc_post.h"

#define MHC_DEC_TMAX 64 /* the most tokens a decode call takes */

/* Whether the decode kernel serves a pre forward of these sizes. */
int mhc_pre_dec_ok(const mhc_pre_fwd_args *a);
/* Workspace bytes on the call's device. */
int64_t mhc_pre_dec_workspace(const mhc_pre_fwd_args *a);
/* post: layer l's post forward in front of the pre (its out is a->x, x_out, which the kernel
 * writes); NULL: the pre forward alone. Returns 0, or -1 (nothing run, ompk_last_error set) when
 * no counter block could be had. */
int mhc_pre_dec_kernel(ompk_exec ex, const mhc_pre_fwd_args *a, const ompk_mhc_post_args *post,
                       void *ws);

#endif
