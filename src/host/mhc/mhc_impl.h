/* Internal: the arguments the mHC implementation lists (mhc_*_impl.c) pass to their entries. */
#ifndef OMPK_MHC_IMPL_H
#define OMPK_MHC_IMPL_H

#include "route.h"
#include "target/mhc/mhc_kern.h"
#include "target/mhc/mhc_post.h"
#include "impl_avail.h"
#include "variant.h"

typedef struct mhc_pre_fwd_call {
    ompk_exec ex;
    const mhc_pre_fwd_args *a;
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

#endif
