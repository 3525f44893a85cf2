/* Internal: the arguments the mHC implementation lists (mhc_*_impl.c) pass to their entries. */
#ifndef OMPK_MHC_IMPL_H
#define OMPK_MHC_IMPL_H

#include "check.h"
#include "ompk/mhc.h"
#include "route.h"
#include "target/mhc/mhc_kern.h"
#include "target/mhc/mhc_pre_dec.h"
#include "target/mhc/mhc_post.h"
#include "impl_avail.h"
#include "variant.h"

/* post: layer l's post forward in front (ompk_mhc_post_pre_fwd), for the decode entry only; NULL
 * otherwise */
typedef struct mhc_pre_fwd_call {
    ompk_exec ex;
    const mhc_pre_fwd_args *a;
    const ompk_mhc_post_args *post;
} mhc_pre_fwd_call;

typedef struct mhc_pre_bwd_call {
    ompk_exec ex;
    const mhc_pre_bwd_args *a;
} mhc_pre_bwd_call;

typedef struct mhc_sk_call {
    ompk_exec ex;
    const mhc_sk_args *a;
} mhc_sk_call;

typedef struct mhc_post_fwd_call {
    ompk_exec ex;
    const ompk_mhc_post_args *a;
} mhc_post_fwd_call;

typedef struct mhc_post_bwd_call {
    ompk_exec ex;
    const mhc_post_bwd_args *a;
} mhc_post_bwd_call;

/* The parts of ompk_mhc_pre_fwd that ompk_mhc_post_pre_fwd shares (mhc_pre_api.c): the checks on
 * an open call (x_out: g->x is written by the post in front, not read), the kernel arguments of
 * a call that passed them, and the verify / trace step. */
void ompk_mhc_pre_fwd_check(ompk_call *c, const ompk_mhc_pre_fwd_args *g, const ompk_mhc_params *p,
                            int x_out);
void ompk_mhc_pre_fwd_build(const ompk_mhc_pre_fwd_args *g, const ompk_mhc_params *p,
                            mhc_pre_fwd_args *a);
void ompk_mhc_pre_fwd_verify(const ompk_mhc_pre_fwd_args *g, const ompk_mhc_params *p);

/* The same for ompk_mhc_post_fwd (mhc_post_fwd_api.c); out_name names out in messages. */
void ompk_mhc_post_fwd_check(ompk_call *c, const ompk_tensor *x, const ompk_tensor *comb,
                             const ompk_tensor *post, const ompk_tensor *f, const ompk_tensor *out,
                             const char *out_name);
void ompk_mhc_post_fwd_build(const ompk_tensor *x, const ompk_tensor *comb, const ompk_tensor *post,
                             const ompk_tensor *f, ompk_tensor *out, ompk_mhc_post_args *a);
void ompk_mhc_post_fwd_verify(const ompk_tensor *x, const ompk_tensor *comb,
                              const ompk_tensor *post, const ompk_tensor *f,
                              const ompk_tensor *out);

#endif
