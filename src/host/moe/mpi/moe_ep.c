/* Expert-parallel MoE over MPI (include/ompk/moe_ep.h): an ompk_moe layer per rank for its
 * experts, MPI_Alltoallv for the routes out and the expert outputs back, ompk_moe_combine for
 * the token sums. Built into libompk_mpi, apart from libompk, so that only MPI users link MPI. */
#include "ompk/moe_ep.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "error.h"

struct ompk_moe_ep {
    MPI_Comm comm;
    int rank, size;
    int64_t E, H, k, max_tokens;
    int64_t *first; /* [size + 1]: rank r owns experts first[r] .. first[r+1]-1 */
    ompk_moe *local;
    ompk_moe_isa isa;
    int loaded;
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
    else if (config->cache_depth != 0 || config->lora_max_rank != 0)
        st = ompk_fail(OMPK_ERR_UNSUPPORTED, fn,
                       "cache_depth and lora_max_rank must be 0 (no expert-parallel training yet)");
    else if (config->experts < ep->size)
        st = ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "experts = %lld is fewer than the %d ranks",
                       (long long)config->experts, ep->size);
    else if (config->top_k < 1 || config->top_k > 64 || config->max_tokens < 1 ||
             config->max_tokens > INT_MAX / config->top_k / ep->size)
        st = ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn,
                       "top_k = %d, max_tokens = %lld: max_tokens * top_k * ranks must be "
                       "1..INT_MAX and top_k 1..64",
                       config->top_k, (long long)config->max_tokens);
    if (st == OMPK_OK && !(ep->first = malloc((size_t)(ep->size + 1) * sizeof *ep->first)))
        st = ompk_fail(OMPK_ERR_OUT_OF_MEMORY, fn, "no memory");
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
    if (st == OMPK_OK) {
        ompk_moe_info info;
        ompk_moe_get_info(ep->local, &info);
        ep->isa = info.isa;
    }
    st = agree(ep->comm, ep->rank, fn, st);
    if (st != OMPK_OK) {
        ompk_moe_ep_destroy(ep);
        return st;
    }
    *out = ep;
    return OMPK_OK;
}

void ompk_moe_ep_destroy(ompk_moe_ep *ep) {
    if (!ep) return;
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

ompk_status ompk_moe_ep_fwd(ompk_moe_ep *ep, const ompk_tensor *x, const ompk_tensor *expert_ids,
                            const ompk_tensor *weights, ompk_tensor *y) {
    const char *fn = "ompk_moe_ep_fwd";
    if (!ep) return ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "ep is NULL");
    const double t0 = MPI_Wtime();
    const int P = ep->size;
    const int64_t H = ep->H, k = ep->k;
    int64_t T = 0, xs = 0, *ids = NULL;
    float *w = NULL;
    const void *xh = NULL;
    ompk_status st = check_local(ep, fn, x, expert_ids, weights, y, &T, &ids, &w, &xh, &xs);
    /* x's dtype must agree: the rows travel as they are */
    int dt[2] = {st == OMPK_OK ? (int)x->dtype : INT_MAX, st == OMPK_OK ? -(int)x->dtype : INT_MAX};
    int dtr[2];
    if (MPI_Allreduce(dt, dtr, 2, MPI_INT, MPI_MIN, ep->comm) != MPI_SUCCESS)
        return ompk_fail(OMPK_ERR_RUNTIME, fn, "MPI_Allreduce failed");
    if (st == OMPK_OK && dtr[0] != INT_MAX && dtr[1] != INT_MAX && dtr[0] != -dtr[1])
        st = ompk_fail(OMPK_ERR_INVALID_ARGUMENT, fn, "x must have the same dtype on every rank");
    st = agree(ep->comm, ep->rank, fn, st);
    if (st != OMPK_OK) return st;
    if (P == 1) { /* no exchange: the layer's own forward */
        st = ompk_moe_fwd(ep->local, x, expert_ids, weights, y);
        memset(&ep->stats, 0, sizeof ep->stats);
        ep->stats.total_ms = ep->stats.experts_ms = (MPI_Wtime() - t0) * 1e3;
        for (int64_t i = 0; i < T * k; i++) ep->stats.routes_sent += ids[i] >= 0;
        ep->stats.routes_received = ep->stats.routes_sent;
        return st;
    }
    const size_t xes = x->dtype == OMPK_BF16 ? 2 : 4, xrow = (size_t)H * xes;
    const size_t zrow = (size_t)H * 4;

    /* counts and send order: destination rank, then (t, j) */
    int *cnt = calloc((size_t)(4 * P), sizeof(int));
    if (!cnt) return ompk_fail(OMPK_ERR_OUT_OF_MEMORY, fn, "no memory");
    int *scnt = cnt, *rcnt = cnt + P, *sdis = cnt + 2 * P, *rdis = cnt + 3 * P;
    for (int64_t i = 0; i < T * k; i++)
        if (ids[i] >= 0) scnt[owner(ep, ids[i])]++;
    ompk_status mem = OMPK_OK;
    double tx = MPI_Wtime(), texp = 0.0;
    if (MPI_Alltoall(scnt, 1, MPI_INT, rcnt, 1, MPI_INT, ep->comm) != MPI_SUCCESS) {
        free(cnt);
        return ompk_fail(OMPK_ERR_RUNTIME, fn, "MPI_Alltoall of the counts failed");
    }
    int64_t ns = 0, nr = 0;
    for (int r = 0; r < P; r++) {
        sdis[r] = (int)ns, rdis[r] = (int)nr;
        ns += scnt[r], nr += rcnt[r];
    }
    uint8_t *sbuf = grow(ep, B_SEND, (size_t)ns * xrow),
            *rbuf = grow(ep, B_RECV, (size_t)nr * xrow);
    int32_t *sid = grow(ep, B_RIDS, (size_t)(ns + nr) * sizeof(int32_t));
    float *zout = grow(ep, B_ZOUT, (size_t)nr * zrow),
          *zback = grow(ep, B_ZBACK, (size_t)ns * zrow);
    float *zfull = grow(ep, B_ZFULL, (size_t)(T * k) * zrow);
    int64_t *pos = grow(ep, B_POS, (size_t)(ns + P) * sizeof(int64_t));
    if (!sbuf || !rbuf || !sid || !zout || !zback || !zfull || !pos)
        mem = ompk_fail(OMPK_ERR_OUT_OF_MEMORY, fn, "no memory for %lld routes",
                        (long long)(ns + nr));
    st = agree(ep->comm, ep->rank, fn, mem);
    if (st != OMPK_OK) {
        free(cnt);
        return st;
    }
    int32_t *rid = sid + ns;
    int64_t *fill = pos + ns;
    for (int r = 0; r < P; r++) fill[r] = sdis[r];
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < k; j++) {
            const int64_t e = ids[t * k + j];
            if (e < 0) continue;
            const int d = owner(ep, e);
            const int64_t p = fill[d]++;
            sid[p] = (int32_t)(e - ep->first[d]);
            pos[p] = t * k + j;
        }
    /* this rank's own routes go straight to its receive block; MPI moves the others */
    const int me = ep->rank;
    const int64_t s0 = sdis[me], s1 = s0 + scnt[me], r0 = rdis[me];
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < ns; p++) {
        uint8_t *dst =
            p >= s0 && p < s1 ? rbuf + (size_t)(r0 + p - s0) * xrow : sbuf + (size_t)p * xrow;
        memcpy(dst, (const uint8_t *)xh + (size_t)((pos[p] / k) * xs) * xes, xrow);
    }
    for (int64_t p = s0; p < s1; p++) rid[r0 + p - s0] = sid[p];
    const int self_s = scnt[me], self_r = rcnt[me];
    scnt[me] = rcnt[me] = 0;
    MPI_Datatype xt, zt;
    MPI_Type_contiguous((int)xrow, MPI_BYTE, &xt);
    MPI_Type_commit(&xt);
    MPI_Type_contiguous((int)H, MPI_FLOAT, &zt);
    MPI_Type_commit(&zt);
    int rc = MPI_Alltoallv(sbuf, scnt, sdis, xt, rbuf, rcnt, rdis, xt, ep->comm);
    if (rc == MPI_SUCCESS)
        rc = MPI_Alltoallv(sid, scnt, sdis, MPI_INT32_T, rid, rcnt, rdis, MPI_INT32_T, ep->comm);
    tx = MPI_Wtime() - tx;
    /* the experts of this rank on every row it received */
    st = rc == MPI_SUCCESS ? OMPK_OK
                           : ompk_fail(OMPK_ERR_RUNTIME, fn, "MPI_Alltoallv of the rows failed");
    if (st == OMPK_OK && nr > 0) {
        const double te = MPI_Wtime();
        float *wr = grow(ep, B_ONES, (size_t)nr * sizeof(float));
        if (!wr) {
            st = ompk_fail(OMPK_ERR_OUT_OF_MEMORY, fn, "no memory");
        } else {
            for (int64_t i = 0; i < nr; i++) wr[i] = 1.0f;
            ompk_tensor tx_, ti_, tw_, tz_;
            const int64_t sx[2] = {nr, H}, si[2] = {nr, 1};
            const ompk_device h = ompk_device_host();
            st = ompk_tensor_init(&tx_, rbuf, x->dtype, 2, sx, NULL, h);
            if (st == OMPK_OK) st = ompk_tensor_init(&ti_, rid, OMPK_I32, 2, si, NULL, h);
            if (st == OMPK_OK) st = ompk_tensor_init(&tw_, wr, OMPK_F32, 2, si, NULL, h);
            if (st == OMPK_OK) st = ompk_tensor_init(&tz_, zout, OMPK_F32, 2, sx, NULL, h);
            if (st == OMPK_OK) st = ompk_moe_fwd(ep->local, &tx_, &ti_, &tw_, &tz_);
        }
        texp = MPI_Wtime() - te;
    }
    st = agree(ep->comm, ep->rank, fn, st);
    double tb = MPI_Wtime();
    if (st == OMPK_OK &&
        MPI_Alltoallv(zout, rcnt, rdis, zt, zback, scnt, sdis, zt, ep->comm) != MPI_SUCCESS)
        st = ompk_fail(OMPK_ERR_RUNTIME, fn, "MPI_Alltoallv of the expert outputs failed");
    tb = MPI_Wtime() - tb;
    scnt[me] = self_s, rcnt[me] = self_r;
    MPI_Type_free(&xt);
    MPI_Type_free(&zt);
    if (st != OMPK_OK) {
        free(cnt);
        return st;
    }
    /* the token sums, in the forward's order and arithmetic */
    const double tc = MPI_Wtime();
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < ns; p++)
        memcpy(zfull + pos[p] * H, p >= s0 && p < s1 ? zout + (r0 + p - s0) * H : zback + p * H,
               zrow);
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
        if (st == OMPK_OK) st = ompk_moe_combine(&tz, &ti, &tw, &ty, ep->isa);
        if (st == OMPK_OK && on_dev && T > 0 &&
            ompk_memcpy(y->data, y->device, yh, h, ybytes) != OMPK_OK)
            st = ompk_fail(OMPK_ERR_RUNTIME, fn, "copying y to the device failed");
    }
    const double tend = MPI_Wtime();
    ep->stats.total_ms = (tend - t0) * 1e3;
    ep->stats.exchange_ms = (tx + tb) * 1e3;
    ep->stats.experts_ms = texp * 1e3;
    ep->stats.combine_ms = (tend - tc) * 1e3;
    ep->stats.routes_sent = ns;
    ep->stats.routes_received = nr;
    ep->stats.bytes_sent = ns * (int64_t)(xrow + 4) + nr * (int64_t)zrow;
    ep->stats.bytes_received = nr * (int64_t)(xrow + 4) + ns * (int64_t)zrow;
    free(cnt);
    return st;
}
