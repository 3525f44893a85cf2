/* Expert-parallel MoE over MPI (include/ompk/moe_ep.h): an ompk_moe layer per rank for its
 * experts, MPI_Alltoallv for the routes out and the expert outputs back, ompk_moe_combine for
 * the token sums. Built into libompk_mpi, apart from libompk, so that only MPI users link MPI. */
#include "ompk/moe_ep.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "check.h"
#include "error.h"

/* Routing of one forward: counts and displacements per rank (this rank's own block included),
 * and (t, j) of each route in send order (destination rank, then t, then j). */
typedef struct ep_route {
    int *cnt; /* [4P]: send counts, receive counts, send and receive displacements */
    int64_t *pos;
    int64_t ns, nr;
} ep_route;

/* One saved training forward of this rank's tokens: its routing and x's dtype. */
typedef struct ep_entry {
    ep_route r;
    int64_t T;
    ompk_dtype xdt;
} ep_entry;

struct ompk_moe_ep {
    MPI_Comm comm;
    int rank, size;
    int64_t E, H, k, max_tokens;
    int64_t *first; /* [size + 1]: rank r owns experts first[r] .. first[r+1]-1 */
    ompk_moe *local;
    int loaded;
    int broken; /* a failed collective step left the ranks' saved forwards out of step */
    int depth, nent;
    ep_entry *ent; /* [depth]: the saved training forwards' routing */
    ompk_moe_ep_stats stats;
    /* buffers kept between calls, grown on demand */
    void *buf[11];
    size_t cap[11];
};

/* rows out and in, ids and weights of this rank's tokens, expert ids in and out, expert outputs
 * out and back, outputs in [T,k,H] order, send positions, staged inputs, ones, staged y */
enum { B_SEND, B_RECV, B_SIDS, B_RIDS, B_ZOUT, B_ZBACK, B_ZFULL, B_POS, B_XST, B_ST, B_ONES, B_N };

static void *grow(ompk_moe_ep *ep, int i, size_t bytes) {
    if (bytes == 0) bytes = 1;
    if (ep->cap[i] >= bytes) return ep->buf[i];
    void *p = realloc(ep->buf[i], bytes);
    if (!p) return NULL;
    ep->buf[i] = p;
    ep->cap[i] = bytes;
    return p;
}

static int owner(const ompk_moe_ep *ep, int64_t e) {
    int lo = 0, hi = ep->size - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (ep->first[mid] <= e)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Every rank learns whether all succeeded. On failure each rank returns its own status, the ranks
 * that succeeded OMPK_ERR_INVALID_ARGUMENT naming the lowest failing rank. */
static ompk_status agree(MPI_Comm comm, int rank, const char *fn, ompk_status mine) {
    int in[2] = {mine == OMPK_OK, rank}, out[2];
    if (MPI_Allreduce(in, out, 1, MPI_2INT, MPI_MINLOC, comm) != MPI_SUCCESS)
        return ompk_fail(OMPK_ERR_RUNTIME, fn, "MPI_Allreduce failed");
    if (out[0] == 1) return OMPK_OK;
    if (mine != OMPK_OK) return mine;
    return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn,
                     "rank %d rejected the call (its status says why)", out[1]);
}

ompk_status ompk_moe_ep_create(const ompk_moe_config *config, MPI_Comm comm, ompk_moe_ep **out) {
    const char *fn = "ompk_moe_ep_create";
    if (!out) return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "out is NULL");
    *out = NULL;
    int inited = 0, level = 0;
    MPI_Initialized(&inited);
    if (!inited) return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "MPI is not initialised");
    if (comm == MPI_COMM_NULL)
        return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "comm is MPI_COMM_NULL");
    MPI_Query_thread(&level);
    ompk_moe_ep *ep = calloc(1, sizeof *ep);
    if (!ep) return ompk_fail(OMPK_ERR_OUT_OF_MEMORY, fn, "no memory for the layer");
    if (MPI_Comm_dup(comm, &ep->comm) != MPI_SUCCESS) {
        free(ep);
        return ompk_fail(OMPK_ERR_RUNTIME, fn, "MPI_Comm_dup failed");
    }
    MPI_Comm_set_errhandler(ep->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(ep->comm, &ep->rank);
    MPI_Comm_size(ep->comm, &ep->size);
    ompk_status st = OMPK_OK;
    if (!config)
        st = ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "config is NULL");
    else if (level < MPI_THREAD_FUNNELED)
        st =
            ompk_fail(OMPK_ERR_UNSUPPORTED, fn,
                      "MPI provides thread level %d; MPI_THREAD_FUNNELED or more is needed", level);
    else if (config->experts < ep->size)
        st = ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "experts = %lld is fewer than the %d ranks",
                       (long long)config->experts, ep->size);
    else if (config->top_k < 1 || config->top_k > 64 || config->max_tokens < 1 ||
             config->max_tokens > INT_MAX / config->top_k / ep->size)
        st = ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn,
                       "top_k = %d, max_tokens = %lld: max_tokens * top_k * ranks must be "
                       "1..INT_MAX and top_k 1..64",
                       config->top_k, (long long)config->max_tokens);
    if (st == OMPK_OK && (!(ep->first = malloc((size_t)(ep->size + 1) * sizeof *ep->first)) ||
                          !(ep->ent = calloc((size_t)config->cache_depth + 1, sizeof *ep->ent))))
        st = ompk_fail(OMPK_ERR_OUT_OF_MEMORY, fn, "no memory");
    if (st == OMPK_OK) ep->depth = config->cache_depth;
    if (st == OMPK_OK) {
        ep->E = config->experts, ep->H = config->hidden, ep->k = config->top_k;
        ep->max_tokens = config->max_tokens;
        const int64_t q = ep->E / ep->size, rem = ep->E % ep->size;
        ep->first[0] = 0;
        for (int r = 0; r < ep->size; r++) ep->first[r + 1] = ep->first[r] + q + (r < rem);
        /* one rank: the layer itself; more: this rank's experts on the rows they receive */
        ompk_moe_config lc = *config;
        if (ep->size > 1) {
            lc.experts = ep->first[ep->rank + 1] - ep->first[ep->rank];
            lc.top_k = 1;
            lc.max_tokens = ep->max_tokens * ep->k * ep->size;
        }
        st = ompk_moe_create(&lc, &ep->local);
    }
    st = agree(ep->comm, ep->rank, fn, st);
    if (st != OMPK_OK) {
        ompk_moe_ep_destroy(ep);
        return st;
    }
    *out = ep;
    return OMPK_OK;
}

static void entries_free(ompk_moe_ep *ep);

void ompk_moe_ep_destroy(ompk_moe_ep *ep) {
    if (!ep) return;
    entries_free(ep);
    free(ep->ent);
    ompk_moe_destroy(ep->local);
    for (int i = 0; i < B_N; i++) free(ep->buf[i]);
    free(ep->first);
    MPI_Comm_free(&ep->comm);
    free(ep);
}

ompk_status ompk_moe_ep_experts(const ompk_moe_ep *ep, int64_t *first, int64_t *count) {
    if (!ep || !first || !count)
        return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, "ompk_moe_ep_experts", "NULL argument");
    *first = ep->first[ep->rank];
    *count = ep->first[ep->rank + 1] - ep->first[ep->rank];
    return OMPK_OK;
}

ompk_moe *ompk_moe_ep_local(ompk_moe_ep *ep) {
    return ep ? ep->local : NULL;
}

ompk_status ompk_moe_ep_load_weights(ompk_moe_ep *ep, const ompk_tensor *gate,
                                     const ompk_tensor *up, const ompk_tensor *down) {
    const char *fn = "ompk_moe_ep_load_weights";
    if (!ep) return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "ep is NULL");
    const ompk_status st =
        agree(ep->comm, ep->rank, fn, ompk_moe_load_weights(ep->local, gate, up, down));
    ep->loaded = st == OMPK_OK;
    return st;
}

ompk_status ompk_moe_ep_get_stats(const ompk_moe_ep *ep, ompk_moe_ep_stats *stats) {
    if (!ep || !stats)
        return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, "ompk_moe_ep_get_stats", "NULL argument");
    *stats = ep->stats;
    return OMPK_OK;
}

/* The local checks of a forward: 1 and the host copies (staged from a GPU where needed) when
 * they pass. ids64 gets the expert ids as int64, w32 the weights, contiguous [T,k]. */
static ompk_status check_local(ompk_moe_ep *ep, const char *fn, const ompk_tensor *x,
                               const ompk_tensor *expert_ids, const ompk_tensor *weights,
                               ompk_tensor *y, int64_t *T_out, int64_t **ids64, float **w32,
                               const void **xh, int64_t *xs) {
    if (!ep->loaded) return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "weights not loaded");
    const int64_t H = ep->H, k = ep->k;
    ompk_call c;
    ompk_call_begin(&c, fn);
    int64_t T = 0;
    if (ompk_call_input(&c, "x", x, 2, OMPK_DT_FLOAT)) {
        T = x->shape[0];
        ompk_call_dim(&c, "x", x, 1, H);
        ompk_call_unit_stride(&c, "x", x, 1);
    }
    if (ompk_call_input(&c, "expert_ids", expert_ids, 2, OMPK_DT(OMPK_I32) | OMPK_DT(OMPK_I64))) {
        ompk_call_dim(&c, "expert_ids", expert_ids, 0, T);
        ompk_call_dim(&c, "expert_ids", expert_ids, 1, k);
    }
    if (ompk_call_input(&c, "weights", weights, 2, OMPK_DT(OMPK_F32))) {
        ompk_call_dim(&c, "weights", weights, 0, T);
        ompk_call_dim(&c, "weights", weights, 1, k);
    }
    if (ompk_call_output(&c, "y", y, 2, OMPK_DT_FLOAT)) {
        ompk_call_dim(&c, "y", y, 0, T);
        ompk_call_dim(&c, "y", y, 1, H);
        ompk_call_unit_stride(&c, "y", y, 1);
    }
    ompk_call_require(&c, T <= ep->max_tokens, OMPK_ERR_INVALID_ARGUMENT,
                      "T = %lld exceeds max_tokens = %lld", (long long)T,
                      (long long)ep->max_tokens);
    ompk_status st = ompk_call_end(&c);
    if (st != OMPK_OK) return st;
    const int on_dev = c.device.type != OMPK_HOST;
    if (on_dev && !(ompk_tensor_is_contiguous(x) && ompk_tensor_is_contiguous(expert_ids) &&
                    ompk_tensor_is_contiguous(weights) && ompk_tensor_is_contiguous(y)))
        return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "device tensors must be contiguous");
    *T_out = T;
    const size_t xes = x->dtype == OMPK_BF16 ? 2 : 4, ies = expert_ids->dtype == OMPK_I64 ? 8 : 4;
    int64_t *ids = grow(ep, B_SIDS, (size_t)(T * k) * (sizeof(int64_t) + sizeof(float)));
    uint8_t *xs_buf = on_dev ? grow(ep, B_XST, (size_t)T * (size_t)H * xes) : NULL;
    uint8_t *stage = on_dev ? grow(ep, B_ST, (size_t)(T * k) * (ies + 4)) : NULL;
    if (!ids || (on_dev && (!xs_buf || !stage)))
        return ompk_fail(OMPK_ERR_OUT_OF_MEMORY, fn, "no memory for %lld tokens", (long long)T);
    float *w = (float *)(ids + T * k);
    const void *idd = expert_ids->data, *wd = weights->data;
    int64_t is0 = expert_ids->strides[0], is1 = expert_ids->strides[1];
    int64_t ws0 = weights->strides[0], ws1 = weights->strides[1];
    *xh = x->data;
    *xs = x->strides[0];
    if (on_dev && T > 0) {
        const ompk_device h = ompk_device_host();
        if (ompk_memcpy(xs_buf, h, x->data, x->device, (size_t)T * (size_t)H * xes) != OMPK_OK ||
            ompk_memcpy(stage, h, idd, c.device, (size_t)(T * k) * ies) != OMPK_OK ||
            ompk_memcpy(stage + (size_t)(T * k) * ies, h, wd, c.device, (size_t)(T * k) * 4) !=
                OMPK_OK)
            return ompk_fail(OMPK_ERR_RUNTIME, fn, "staging the inputs to the host failed");
        idd = stage, wd = stage + (size_t)(T * k) * ies;
        is0 = k, is1 = 1, ws0 = k, ws1 = 1;
        *xh = xs_buf;
        *xs = H;
    }
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < k; j++) {
            const int64_t o = t * is0 + j * is1;
            const int64_t e = ies == 8 ? ((const int64_t *)idd)[o] : ((const int32_t *)idd)[o];
            if (e < -1 || e >= ep->E)
                return ompk_fail(OMPK_ERR_INDEX_OUT_OF_RANGE, fn,
                                 "expert_ids[%lld,%lld] = %lld is outside [-1, %lld)", (long long)t,
                                 (long long)j, (long long)e, (long long)ep->E);
            ids[t * k + j] = e;
            w[t * k + j] = ((const float *)wd)[t * ws0 + j * ws1];
        }
    *ids64 = ids;
    *w32 = w;
    return OMPK_OK;
}

static void route_free(ep_route *r) {
    free(r->cnt);
    free(r->pos);
    r->cnt = NULL, r->pos = NULL;
}

/* Counts, the all-to-all of the counts and the send order; *sid the local expert id of each
 * route in send order. Collective; a failure is agreed on. */
static ompk_status route_plan(ompk_moe_ep *ep, const char *fn, int64_t T, const int64_t *ids,
                              ep_route *r, int32_t **sid_out) {
    const int P = ep->size;
    const int64_t k = ep->k;
    ompk_status st = OMPK_OK;
    r->cnt = calloc((size_t)(4 * P), sizeof(int));
    int64_t n = 0;
    for (int64_t i = 0; i < T * k; i++) n += ids[i] >= 0;
    r->pos = malloc((size_t)(n + P) * sizeof(int64_t));
    int32_t *sid = grow(ep, B_RIDS, (size_t)n * sizeof(int32_t));
    if (!r->cnt || !r->pos || !sid) st = ompk_fail(OMPK_ERR_OUT_OF_MEMORY, fn, "no memory");
    st = agree(ep->comm, ep->rank, fn, st);
    if (st != OMPK_OK) return st;
    int *sc = r->cnt, *rc = r->cnt + P, *sd = r->cnt + 2 * P, *rd = r->cnt + 3 * P;
    for (int64_t i = 0; i < T * k; i++)
        if (ids[i] >= 0) sc[owner(ep, ids[i])]++;
    if (MPI_Alltoall(sc, 1, MPI_INT, rc, 1, MPI_INT, ep->comm) != MPI_SUCCESS)
        return ompk_fail(OMPK_ERR_RUNTIME, fn, "MPI_Alltoall of the counts failed");
    r->ns = r->nr = 0;
    for (int q = 0; q < P; q++) {
        sd[q] = (int)r->ns, rd[q] = (int)r->nr;
        r->ns += sc[q], r->nr += rc[q];
    }
    int64_t *fill = r->pos + n;
    for (int q = 0; q < P; q++) fill[q] = sd[q];
    for (int64_t i = 0; i < T * k; i++) {
        if (ids[i] < 0) continue;
        const int d = owner(ep, ids[i]);
        const int64_t p = fill[d]++;
        sid[p] = (int32_t)(ids[i] - ep->first[d]);
        r->pos[p] = i;
    }
    *sid_out = sid;
    return OMPK_OK;
}

/* Rows of `row` bytes, one per route, to the routes' ranks: row p of the send order is made by
 * fill(p, dst) (fill NULL: sbuf holds them already); this rank's own rows go straight into its
 * receive block. back: the receive side's rows (src, nr of them) return into rbuf (ns rows). */
typedef void (*row_fill)(const void *ctx, int64_t p, uint8_t *dst);

static ompk_status exchange(ompk_moe_ep *ep, const char *fn, const ep_route *r, size_t row,
                            row_fill fill, const void *ctx, uint8_t *sbuf, uint8_t *rbuf, int back,
                            const uint8_t *src) {
    const int P = ep->size, me = ep->rank;
    int *sc = r->cnt, *rc = r->cnt + P, *sd = r->cnt + 2 * P, *rd = r->cnt + 3 * P;
    const int64_t s0 = sd[me], s1 = s0 + sc[me], r0 = rd[me];
    if (!back && fill) {
#pragma omp parallel for schedule(static)
        for (int64_t p = 0; p < r->ns; p++)
            fill(ctx, p,
                 p >= s0 && p < s1 ? rbuf + (size_t)(r0 + p - s0) * row : sbuf + (size_t)p * row);
    } else if (!back) { /* sbuf already holds the rows in send order */
        memcpy(rbuf + (size_t)r0 * row, sbuf + (size_t)s0 * row, (size_t)(s1 - s0) * row);
    } else {
#pragma omp parallel for schedule(static)
        for (int64_t p = s0; p < s1; p++)
            memcpy(rbuf + (size_t)p * row, src + (size_t)(r0 + p - s0) * row, row);
    }
    MPI_Datatype t;
    if (MPI_Type_contiguous((int)row, MPI_BYTE, &t) != MPI_SUCCESS ||
        MPI_Type_commit(&t) != MPI_SUCCESS)
        return ompk_fail(OMPK_ERR_RUNTIME, fn, "MPI_Type_contiguous failed");
    const int ks = sc[me], kr = rc[me];
    sc[me] = rc[me] = 0; /* this rank's own rows were copied above */
    const int rcode = back ? MPI_Alltoallv(src, rc, rd, t, rbuf, sc, sd, t, ep->comm)
                           : MPI_Alltoallv(sbuf, sc, sd, t, rbuf, rc, rd, t, ep->comm);
    sc[me] = ks, rc[me] = kr;
    MPI_Type_free(&t);
    return rcode == MPI_SUCCESS ? OMPK_OK : ompk_fail(OMPK_ERR_RUNTIME, fn, "MPI_Alltoallv failed");
}

typedef struct fill_x {
    const uint8_t *x;
    int64_t xs, k, H;
    ompk_dtype xdt;
    int to_f32;
    const int64_t *pos;
} fill_x;

static void fill_x_row(const void *ctx, int64_t p, uint8_t *dst) {
    const fill_x *f = ctx;
    const size_t es = f->xdt == OMPK_BF16 ? 2 : 4;
    const uint8_t *src = f->x + (size_t)((f->pos[p] / f->k) * f->xs) * es;
    if (!f->to_f32 || f->xdt == OMPK_F32) {
        memcpy(dst, src, (size_t)f->H * es);
        return;
    }
    float *o = (float *)dst; /* bf16 -> f32 is exact */
    for (int64_t h = 0; h < f->H; h++) {
        const uint32_t u = (uint32_t)((const uint16_t *)src)[h] << 16;
        memcpy(&o[h], &u, 4);
    }
}

typedef struct fill_small {
    const void *src;
    size_t bytes;
    const int64_t *pos; /* NULL: row p itself */
} fill_small;

static void fill_small_row(const void *ctx, int64_t p, uint8_t *dst) {
    const fill_small *f = ctx;
    memcpy(dst, (const uint8_t *)f->src + (size_t)(f->pos ? f->pos[p] : p) * f->bytes, f->bytes);
}

static void entries_free(ompk_moe_ep *ep) {
    for (int i = 0; ep->ent && i <= ep->depth; i++) route_free(&ep->ent[i].r);
}

/* The forward (mode NONE) and the training forward. */
static ompk_status ep_forward(ompk_moe_ep *ep, const char *fn, const ompk_tensor *x,
                              const ompk_tensor *expert_ids, const ompk_tensor *weights,
                              ompk_tensor *y, ompk_moe_cache_mode mode) {
    if (!ep) return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "ep is NULL");
    const double t0 = MPI_Wtime();
    const int P = ep->size, train = mode != OMPK_MOE_CACHE_NONE;
    const int64_t H = ep->H, k = ep->k;
    int64_t T = 0, xs = 0, *ids = NULL;
    float *w = NULL;
    const void *xh = NULL;
    ompk_status st = check_local(ep, fn, x, expert_ids, weights, y, &T, &ids, &w, &xh, &xs);
    if (st == OMPK_OK && train && (unsigned)mode > (unsigned)OMPK_MOE_CACHE_RECOMPUTE)
        st = ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "unknown cache mode %d", (int)mode);
    if (st == OMPK_OK && train && ep->broken)
        st = ompk_fail(OMPK_ERR_RUNTIME, fn,
                       "an earlier failed step left the ranks' saved forwards out of step");
    if (st == OMPK_OK && mode == OMPK_MOE_CACHE_PUSH && ep->nent >= ep->depth)
        st = ompk_fail(OMPK_ERR_CACHE_FULL, fn, "the cache stack holds cache_depth = %d entries",
                       ep->depth);
    if (st == OMPK_OK && mode == OMPK_MOE_CACHE_RECOMPUTE && ep->nent == 0)
        st = ompk_fail(OMPK_ERR_CACHE_EMPTY, fn, "RECOMPUTE with no saved entry to overwrite");
    /* x's dtype must agree: the rows travel as they are */
    int dt[2] = {st == OMPK_OK ? (int)x->dtype : INT_MAX, st == OMPK_OK ? -(int)x->dtype : INT_MAX};
    int dtr[2];
    if (MPI_Allreduce(dt, dtr, 2, MPI_INT, MPI_MIN, ep->comm) != MPI_SUCCESS)
        return ompk_fail(OMPK_ERR_RUNTIME, fn, "MPI_Allreduce failed");
    if (st == OMPK_OK && dtr[0] != INT_MAX && dtr[1] != INT_MAX && dtr[0] != -dtr[1])
        st = ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "x must have the same dtype on every rank");
    st = agree(ep->comm, ep->rank, fn, st);
    if (st != OMPK_OK) return st;
    memset(&ep->stats, 0, sizeof ep->stats);
    for (int64_t i = 0; i < T * k; i++) ep->stats.routes_sent += ids[i] >= 0;
    if (P == 1) { /* no exchange: the layer's own forward */
        st = train ? ompk_moe_fwd_train(ep->local, x, expert_ids, weights, y, mode)
                   : ompk_moe_fwd(ep->local, x, expert_ids, weights, y);
        if (st == OMPK_OK && mode == OMPK_MOE_CACHE_PUSH) ep->nent++;
        ep->stats.total_ms = ep->stats.experts_ms = (MPI_Wtime() - t0) * 1e3;
        ep->stats.routes_received = ep->stats.routes_sent;
        return st;
    }
    /* training sends x as f32 (exact), so the owner's saved x, and the dx it gives, are f32 */
    const ompk_dtype rdt = train ? OMPK_F32 : x->dtype;
    const size_t xrow = (size_t)H * (rdt == OMPK_BF16 ? 2 : 4), zrow = (size_t)H * 4;
    ep_route r = {0};
    int32_t *sid = NULL;
    double tx = MPI_Wtime();
    st = route_plan(ep, fn, T, ids, &r, &sid);
    if (st != OMPK_OK) {
        route_free(&r);
        return st;
    }
    const int64_t ns = r.ns, nr = r.nr;
    uint8_t *sbuf = grow(ep, B_SEND, (size_t)ns * xrow),
            *rbuf = grow(ep, B_RECV, (size_t)nr * xrow);
    int32_t *rid = grow(ep, B_ST, (size_t)nr * sizeof(int32_t) * 2 + 8);
    float *sw = grow(ep, B_ONES, (size_t)(ns + nr) * sizeof(float) + 8);
    float *zout = grow(ep, B_ZOUT, (size_t)nr * zrow),
          *zback = grow(ep, B_ZBACK, (size_t)ns * zrow);
    float *zfull = grow(ep, B_ZFULL, (size_t)(T * k) * zrow);
    st = sbuf && rbuf && rid && sw && zout && zback && zfull
             ? OMPK_OK
             : ompk_fail(OMPK_ERR_OUT_OF_MEMORY, fn, "no memory for %lld routes",
                         (long long)(ns + nr));
    st = agree(ep->comm, ep->rank, fn, st);
    float *rw = sw + ns;
    if (st == OMPK_OK) {
        const fill_x fx = {xh, xs, k, H, x->dtype, train, r.pos};
        st = exchange(ep, fn, &r, xrow, fill_x_row, &fx, sbuf, rbuf, 0, NULL);
    }
    if (st == OMPK_OK) {
        st = exchange(ep, fn, &r, 4, NULL, NULL, (uint8_t *)sid, (uint8_t *)rid, 0, NULL);
    }
    if (st == OMPK_OK && train) { /* the routing weights too: the owner saves them */
        const fill_small fw = {w, 4, r.pos};
        st = exchange(ep, fn, &r, 4, fill_small_row, &fw, (uint8_t *)sw, (uint8_t *)rw, 0, NULL);
    }
    tx = MPI_Wtime() - tx;
    /* the experts of this rank on every row it received */
    double texp = MPI_Wtime();
    if (st == OMPK_OK && !train)
        for (int64_t i = 0; i < nr; i++) rw[i] = 1.0f;
    ompk_status lst = st;
    if (st == OMPK_OK && (nr > 0 || train)) {
        ompk_tensor tx_, ti_, tw_, tz_;
        const int64_t sx[2] = {nr, H}, si[2] = {nr, 1}, sz[3] = {nr, 1, H};
        const ompk_device h = ompk_device_host();
        lst = ompk_tensor_init(&tx_, rbuf, rdt, 2, sx, NULL, h);
        if (lst == OMPK_OK) lst = ompk_tensor_init(&ti_, rid, OMPK_I32, 2, si, NULL, h);
        if (lst == OMPK_OK) lst = ompk_tensor_init(&tw_, rw, OMPK_F32, 2, si, NULL, h);
        if (lst == OMPK_OK)
            lst = ompk_tensor_init(&tz_, zout, OMPK_F32, train ? 3 : 2, train ? sz : sx, NULL, h);
        if (lst == OMPK_OK)
            lst = train ? ompk_moe_fwd_train(ep->local, &tx_, &ti_, &tw_, &tz_, mode)
                        : ompk_moe_fwd(ep->local, &tx_, &ti_, &tw_, &tz_);
    }
    texp = MPI_Wtime() - texp;
    st = agree(ep->comm, ep->rank, fn, lst);
    /* a rank that saved while another failed leaves the stacks out of step */
    if (st != OMPK_OK && lst == OMPK_OK && train) ep->broken = 1;
    double tb = MPI_Wtime();
    if (st == OMPK_OK)
        st = exchange(ep, fn, &r, zrow, NULL, NULL, NULL, (uint8_t *)zback, 1,
                      (const uint8_t *)zout);
    tb = MPI_Wtime() - tb;
    /* the token sums, in the forward's order and arithmetic */
    const double tc = MPI_Wtime();
    if (st == OMPK_OK) {
#pragma omp parallel for schedule(static)
        for (int64_t p = 0; p < ns; p++) memcpy(zfull + r.pos[p] * H, zback + p * H, zrow);
        ompk_tensor tz, ti, tw, ty;
        const int64_t sz[3] = {T, k, H}, sk[2] = {T, k}, sy[2] = {T, H};
        const ompk_device h = ompk_device_host();
        const int on_dev = y->device.type != OMPK_HOST;
        const size_t ybytes = (size_t)T * (size_t)H * (y->dtype == OMPK_BF16 ? 2 : 4);
        void *yh = on_dev ? grow(ep, B_XST, ybytes) : y->data; /* staged x is no longer needed */
        st = yh ? OMPK_OK : ompk_fail(OMPK_ERR_OUT_OF_MEMORY, fn, "no memory for y");
        if (st == OMPK_OK) {
            const int64_t ys[2] = {on_dev ? H : y->strides[0], 1};
            ompk_tensor_init(&tz, zfull, OMPK_F32, 3, sz, NULL, h);
            ompk_tensor_init(&ti, ids, OMPK_I64, 2, sk, NULL, h);
            ompk_tensor_init(&tw, w, OMPK_F32, 2, sk, NULL, h);
            st = ompk_tensor_init(&ty, yh, y->dtype, 2, sy, ys, h);
            if (st == OMPK_OK)
                st = ompk_moe_combine(ep->local, &tz, &ti, &tw, &ty,
                                      train ? OMPK_MOE_COMBINE_FWD_TRAIN : OMPK_MOE_COMBINE_FWD);
            if (st == OMPK_OK && on_dev && T > 0 &&
                ompk_memcpy(y->data, y->device, yh, h, ybytes) != OMPK_OK)
                st = ompk_fail(OMPK_ERR_RUNTIME, fn, "copying y to the device failed");
        }
    }
    if (st == OMPK_OK && train) { /* the routing, for the backward */
        ep_entry *en = &ep->ent[mode == OMPK_MOE_CACHE_PUSH ? ep->nent : ep->nent - 1];
        route_free(&en->r);
        en->r = r;
        en->T = T;
        en->xdt = x->dtype;
        r.cnt = NULL, r.pos = NULL;
        if (mode == OMPK_MOE_CACHE_PUSH) ep->nent++;
    }
    const double tend = MPI_Wtime();
    ep->stats.total_ms = (tend - t0) * 1e3;
    ep->stats.exchange_ms = (tx + tb) * 1e3;
    ep->stats.experts_ms = texp * 1e3;
    ep->stats.combine_ms = (tend - tc) * 1e3;
    ep->stats.routes_received = nr;
    ep->stats.bytes_sent = ns * (int64_t)(xrow + 4 + (train ? 4 : 0)) + nr * (int64_t)zrow;
    ep->stats.bytes_received = nr * (int64_t)(xrow + 4 + (train ? 4 : 0)) + ns * (int64_t)zrow;
    route_free(&r);
    return st;
}

ompk_status ompk_moe_ep_fwd(ompk_moe_ep *ep, const ompk_tensor *x, const ompk_tensor *expert_ids,
                            const ompk_tensor *weights, ompk_tensor *y) {
    return ep_forward(ep, "ompk_moe_ep_fwd", x, expert_ids, weights, y, OMPK_MOE_CACHE_NONE);
}

ompk_status ompk_moe_ep_fwd_train(ompk_moe_ep *ep, const ompk_tensor *x,
                                  const ompk_tensor *expert_ids, const ompk_tensor *weights,
                                  ompk_tensor *y, ompk_moe_cache_mode mode) {
    const char *fn = "ompk_moe_ep_fwd_train";
    if (ep && mode == OMPK_MOE_CACHE_NONE)
        return agree(ep->comm, ep->rank, fn,
                     ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "mode NONE: use ompk_moe_ep_fwd"));
    return ep_forward(ep, fn, x, expert_ids, weights, y, mode);
}

ompk_status ompk_moe_ep_set_lora(ompk_moe_ep *ep, const ompk_moe_lora *lora) {
    const char *fn = "ompk_moe_ep_set_lora";
    if (!ep) return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "ep is NULL");
    ompk_status st = OMPK_OK;
    if (lora && lora->dropout != 0.0f && ep->size > 1)
        st = ompk_fail(OMPK_ERR_UNSUPPORTED, fn,
                       "LoRA dropout over several ranks: its mask is a function of the row index "
                       "within a rank's call");
    else if (ep->nent > 0)
        st = ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "saved forwards wait for their backward");
    if (st == OMPK_OK) st = ompk_moe_set_lora(ep->local, lora);
    return agree(ep->comm, ep->rank, fn, st);
}

typedef struct fill_dy {
    const uint8_t *dy;
    int64_t ds, k;
    size_t row, es;
    const int64_t *pos;
} fill_dy;

static void fill_dy_row(const void *ctx, int64_t p, uint8_t *dst) {
    const fill_dy *f = ctx;
    memcpy(dst, f->dy + (size_t)((f->pos[p] / f->k) * f->ds) * f->es, f->row);
}

ompk_status ompk_moe_ep_bwd(ompk_moe_ep *ep, const ompk_tensor *dy, const ompk_moe_grads *grads) {
    const char *fn = "ompk_moe_ep_bwd";
    if (!ep) return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "ep is NULL");
    const double t0 = MPI_Wtime();
    const int P = ep->size;
    const int64_t H = ep->H, k = ep->k;
    ompk_status st = OMPK_OK;
    ep_entry *en = ep->nent > 0 ? &ep->ent[ep->nent - 1] : NULL;
    if (!en)
        st = ompk_fail(OMPK_ERR_CACHE_EMPTY, fn, "no saved forward");
    else if (ep->broken)
        st = ompk_fail(OMPK_ERR_RUNTIME, fn,
                       "an earlier failed step left the ranks' saved forwards out of step");
    else if (!grads || !grads->dx)
        st = ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "grads and grads->dx are required");
    if (st == OMPK_OK && P > 1) {
        const int64_t T = en->T;
        ompk_call c;
        ompk_call_begin(&c, fn);
        if (ompk_call_input(&c, "dy", dy, 2, OMPK_DT_FLOAT)) {
            ompk_call_dim(&c, "dy", dy, 0, T);
            ompk_call_dim(&c, "dy", dy, 1, H);
            ompk_call_unit_stride(&c, "dy", dy, 1);
        }
        if (ompk_call_output(&c, "dx", grads->dx, 2, OMPK_DT(en->xdt))) {
            ompk_call_dim(&c, "dx", grads->dx, 0, T);
            ompk_call_dim(&c, "dx", grads->dx, 1, H);
            ompk_call_unit_stride(&c, "dx", grads->dx, 1);
        }
        if (grads->dw && ompk_call_output(&c, "dw", grads->dw, 2, OMPK_DT(OMPK_F32))) {
            ompk_call_dim(&c, "dw", grads->dw, 0, T);
            ompk_call_dim(&c, "dw", grads->dw, 1, k);
        }
        st = ompk_call_end(&c);
        if (st == OMPK_OK && c.device.type != OMPK_HOST &&
            !(ompk_tensor_is_contiguous(dy) && ompk_tensor_is_contiguous(grads->dx) &&
              (!grads->dw || ompk_tensor_is_contiguous(grads->dw))))
            st = ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "device tensors must be contiguous");
    }
    st = agree(ep->comm, ep->rank, fn, st);
    if (st != OMPK_OK) return st;
    memset(&ep->stats, 0, sizeof ep->stats);
    if (P == 1) {
        st = ompk_moe_bwd(ep->local, dy, grads);
        if (st == OMPK_OK) ep->nent--;
        ep->stats.total_ms = ep->stats.experts_ms = (MPI_Wtime() - t0) * 1e3;
        return st;
    }
    const ep_route *r = &en->r;
    const int64_t ns = r->ns, nr = r->nr, T = en->T;
    const size_t des = dy->dtype == OMPK_BF16 ? 2 : 4, dyrow = (size_t)H * des,
                 dxrow = (size_t)H * 4;
    uint8_t *sbuf = grow(ep, B_SEND, (size_t)ns * dyrow),
            *rbuf = grow(ep, B_RECV, (size_t)nr * dyrow);
    float *dxo = grow(ep, B_ZOUT, (size_t)nr * dxrow), *dxb = grow(ep, B_ZBACK, (size_t)ns * dxrow);
    float *dwo = grow(ep, B_ONES, (size_t)(nr + ns) * 4 + 8), *dwb = dwo + nr;
    /* GPU tensors: dy staged to the host, dx and dw made there and copied back */
    const int on_dev = dy->device.type != OMPK_HOST;
    const size_t xes = en->xdt == OMPK_BF16 ? 2 : 4;
    const uint8_t *dyh = dy->data;
    int64_t dys = dy->strides[0];
    uint8_t *dxh = on_dev ? grow(ep, B_ZFULL, (size_t)(T * H) * xes + 8) : grads->dx->data;
    float *dwh = on_dev ? grow(ep, B_SIDS, (size_t)(T * k) * 4 + 8)
                        : (grads->dw ? (float *)grads->dw->data : NULL);
    const int64_t dxs = on_dev ? H : grads->dx->strides[0];
    const int64_t dws0 = on_dev ? k : (grads->dw ? grads->dw->strides[0] : 0);
    const int64_t dws1 = on_dev ? 1 : (grads->dw ? grads->dw->strides[1] : 0);
    st = sbuf && rbuf && dxo && dxb && dwo && dxh && dwh
             ? OMPK_OK
             : ompk_fail(OMPK_ERR_OUT_OF_MEMORY, fn, "no memory");
    if (st == OMPK_OK && on_dev && T > 0) {
        uint8_t *stg = grow(ep, B_XST, (size_t)(T * H) * des);
        if (!stg || ompk_memcpy(stg, ompk_device_host(), dy->data, dy->device,
                                (size_t)(T * H) * des) != OMPK_OK)
            st = ompk_fail(OMPK_ERR_RUNTIME, fn, "staging dy to the host failed");
        dyh = stg, dys = H;
    }
    st = agree(ep->comm, ep->rank, fn, st);
    double tx = MPI_Wtime();
    if (st == OMPK_OK) {
        const fill_dy fd = {dyh, dys, k, dyrow, des, r->pos};
        st = exchange(ep, fn, r, dyrow, fill_dy_row, &fd, sbuf, rbuf, 0, NULL);
    }
    tx = MPI_Wtime() - tx;
    double texp = MPI_Wtime();
    ompk_status lst = st;
    if (st == OMPK_OK) {
        const int64_t sx[2] = {nr, H}, sw[2] = {nr, 1};
        const ompk_device h = ompk_device_host();
        ompk_tensor tdy = ompk_tensor_make(rbuf, dy->dtype, 2, sx, h),
                    tdx = ompk_tensor_make(dxo, OMPK_F32, 2, sx, h),
                    tdw = ompk_tensor_make(dwo, OMPK_F32, 2, sw, h);
        ompk_moe_grads g = *grads;
        g.dx = &tdx;
        g.dw = &tdw;
        lst = ompk_moe_bwd(ep->local, &tdy, &g);
    }
    texp = MPI_Wtime() - texp;
    st = agree(ep->comm, ep->rank, fn, lst);
    double tb = MPI_Wtime();
    if (st == OMPK_OK)
        st = exchange(ep, fn, r, dxrow, NULL, NULL, NULL, (uint8_t *)dxb, 1, (const uint8_t *)dxo);
    if (st == OMPK_OK)
        st = exchange(ep, fn, r, 4, NULL, NULL, NULL, (uint8_t *)dwb, 1, (const uint8_t *)dwo);
    tb = MPI_Wtime() - tb;
    if (lst == OMPK_OK && st != OMPK_OK) ep->broken = 1; /* popped here, not elsewhere */
    const double tc = MPI_Wtime();
    if (st == OMPK_OK) {
        /* where each route's rows came back: slot (t, j) -> row in send order */
        int64_t *at = grow(ep, B_POS, (size_t)(T * k + 1) * sizeof(int64_t));
        if (!at) {
            st = ompk_fail(OMPK_ERR_OUT_OF_MEMORY, fn, "no memory");
        } else {
            for (int64_t i = 0; i < T * k; i++) at[i] = -1;
            for (int64_t p = 0; p < ns; p++) at[r->pos[p]] = p;
            const int xb = en->xdt == OMPK_BF16;
            /* dx = the routes' rows summed in slot order from 0, rounded once (the single layer's
             * last phase) */
#pragma omp parallel for schedule(static)
            for (int64_t t = 0; t < T; t++) {
                uint8_t *row = dxh + (size_t)(t * dxs) * xes;
                for (int64_t h = 0; h < H; h++) {
                    float a = 0.0f;
                    for (int64_t j = 0; j < k; j++)
                        if (at[t * k + j] >= 0) a += dxb[at[t * k + j] * H + h];
                    ompk_store_f(row, h, a, xb);
                }
            }
            if (grads->dw)
                for (int64_t t = 0; t < T; t++)
                    for (int64_t j = 0; j < k; j++)
                        dwh[t * dws0 + j * dws1] = at[t * k + j] >= 0 ? dwb[at[t * k + j]] : 0.0f;
            const ompk_device h = ompk_device_host();
            if (on_dev && T > 0 &&
                (ompk_memcpy(grads->dx->data, grads->dx->device, dxh, h, (size_t)(T * H) * xes) !=
                     OMPK_OK ||
                 (grads->dw && ompk_memcpy(grads->dw->data, grads->dw->device, dwh, h,
                                           (size_t)(T * k) * 4) != OMPK_OK)))
                st = ompk_fail(OMPK_ERR_RUNTIME, fn, "copying dx, dw to the device failed");
        }
    }
    if (lst == OMPK_OK) { /* this rank's local entry was popped */
        route_free(&en->r);
        ep->nent--;
    }
    const double tend = MPI_Wtime();
    ep->stats.total_ms = (tend - t0) * 1e3;
    ep->stats.exchange_ms = (tx + tb) * 1e3;
    ep->stats.experts_ms = texp * 1e3;
    ep->stats.combine_ms = (tend - tc) * 1e3;
    ep->stats.routes_sent = ns, ep->stats.routes_received = nr;
    ep->stats.bytes_sent = ns * (int64_t)dyrow + nr * (int64_t)(dxrow + 4);
    ep->stats.bytes_received = nr * (int64_t)dyrow + ns * (int64_t)(dxrow + 4);
    return st;
}
