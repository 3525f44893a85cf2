/* Internal: the arguments the attention implementation lists (attention_impl.c) pass to their
 * entries. */
#ifndef OMPK_ATTENTION_IMPL_H
#define OMPK_ATTENTION_IMPL_H

#include "route.h"
#include "target/attention/attention_kernels.h"
#include "variant.h"

typedef struct attention_fwd_call {
    ompk_exec ex;
    const ompk_attn_geom *g;
    const void *q, *k, *v;
    void *out;
    float *lse; /* may be NULL */
} attention_fwd_call;

typedef struct attention_bwd_call {
    ompk_exec ex;
    const ompk_attn_geom *g;
    const void *dout, *q, *k, *v, *out;
    const float *lse;
    void *dq, *dk, *dv;
} attention_bwd_call;

/* Whether the kernel that ran rounds P (and dS) to bf16 before its second product (the verify
 * bands depend on it). */
int attention_impl_bf16_p(const ompk_impl *ran, const ompk_attn_geom *g);

#endif
