/* Internal: the arguments the router implementation lists (router_impl.c) pass to their
 * entries. */
#ifndef OMPK_ROUTER_IMPL_H
#define OMPK_ROUTER_IMPL_H

#include "route.h"
#include "target/router/router_topk.h"
#include "variant.h"

typedef struct router_fwd_call {
    ompk_exec ex;
    const ompk_router_fwd_args *a;
} router_fwd_call;

typedef struct router_bwd_call {
    ompk_exec ex;
    const ompk_router_bwd_args *a;
} router_bwd_call;

#endif
