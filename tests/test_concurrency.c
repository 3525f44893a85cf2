/* Concurrency: two host threads call different entry points at once, on the host and on each
 * GPU device tu_devices() lists. One thread's calls succeed while the other's fail validation:
 * the successful results match a single-threaded run bit for bit, each thread sees only its
 * own error message (ompk_last_error is per thread), and a failed call writes nothing. */
#define _POSIX_C_SOURCE 200809L /* pthread barriers under -std=c17 */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "test_util.h"

#define ITERS 12

enum { SK_FWD, SK_BWD, POST_FWD, ROUTER_FWD, ATTN_FWD, NKINDS };

/* One entry point's buffers on one device: inputs filled once, outputs poisoned per call. */
typedef struct job {
    ompk_device dev;
    int kind;
    tu_buf in[4];
    int nin;
    tu_buf out[2];
    int nout;
} job;

static const char *const bad_msg[NKINDS] = {"repeat", "eps", "out dim", "k = 0", "scale"};

static void job_in(job *j, ompk_dtype dt, int64_t n, tu_rng *r) {
    j->in[j->nin] = tu_buf_new(j->dev, dt, n);
    tu_buf_randn(&j->in[j->nin], r, 1.0);
    j->nin++;
}

static void job_out(job *j, ompk_dtype dt, int64_t n) {
    j->out[j->nout++] = tu_buf_new(j->dev, dt, n);
}

static job job_make(ompk_device dev, int kind) {
    job j;
    memset(&j, 0, sizeof j);
    j.dev = dev;
    j.kind = kind;
    tu_rng r = tu_rng_make(100 + (uint64_t)kind);
    switch (kind) {
    case SK_FWD: /* logits [2,3,4,4] -> comb */
        job_in(&j, OMPK_F32, 96, &r);
        job_out(&j, OMPK_F32, 96);
        break;
    case SK_BWD: /* logits, dcomb [2,3,4,4] -> dlogits */
        job_in(&j, OMPK_F32, 96, &r);
        job_in(&j, OMPK_F32, 96, &r);
        job_out(&j, OMPK_F32, 96);
        break;
    case POST_FWD: /* x [2,3,4,64], comb [2,3,4,4], post [2,3,4], f [2,3,64] -> out */
        job_in(&j, OMPK_F32, 2 * 3 * 4 * 64, &r);
        job_in(&j, OMPK_F32, 2 * 3 * 16, &r);
        job_in(&j, OMPK_F32, 2 * 3 * 4, &r);
        job_in(&j, OMPK_F32, 2 * 3 * 64, &r);
        job_out(&j, OMPK_F32, 2 * 3 * 4 * 64);
        break;
    case ROUTER_FWD: /* sx, sy [16,32], k = 8 -> scores, indices [16,8] */
        job_in(&j, OMPK_F32, 16 * 32, &r);
        job_in(&j, OMPK_F32, 16 * 32, &r);
        job_out(&j, OMPK_F32, 16 * 8);
        job_out(&j, OMPK_I32, 16 * 8);
        break;
    case ATTN_FWD: /* q [1,2,48,64], k, v [1,1,80,64] -> out, lse [1,2,48] */
        job_in(&j, OMPK_F32, 2 * 48 * 64, &r);
        job_in(&j, OMPK_F32, 80 * 64, &r);
        job_in(&j, OMPK_F32, 80 * 64, &r);
        job_out(&j, OMPK_F32, 2 * 48 * 64);
        job_out(&j, OMPK_F32, 2 * 48);
        break;
    }
    return j;
}

static void job_free(job *j) {
    for (int i = 0; i < j->nin; i++) tu_buf_free(&j->in[i]);
    for (int i = 0; i < j->nout; i++) tu_buf_free(&j->out[i]);
}

/* One call; bad != 0 breaks one argument so that validation fails. */
static ompk_status job_run(job *j, int bad) {
    for (int i = 0; i < j->nout; i++) tu_buf_fill_bytes(&j->out[i], 0xA7);
    switch (j->kind) {
    case SK_FWD: {
        const int64_t s[4] = {2, 3, 4, 4};
        ompk_tensor lg = tu_view(&j->in[0], 4, s), cb = tu_view(&j->out[0], 4, s);
        const ompk_mhc_params p = tu_sk_params(bad ? 0 : 20, 1e-6f);
        return ompk_mhc_sinkhorn_fwd(&lg, &cb, &p);
    }
    case SK_BWD: {
        const int64_t s[4] = {2, 3, 4, 4};
        ompk_tensor lg = tu_view(&j->in[0], 4, s), dc = tu_view(&j->in[1], 4, s);
        ompk_tensor dl = tu_view(&j->out[0], 4, s);
        const ompk_mhc_params p = tu_sk_params(20, bad ? -1.0f : 1e-6f);
        return ompk_mhc_sinkhorn_bwd(&lg, &dc, &dl, &p);
    }
    case POST_FWD: {
        ompk_tensor x = tu_view(&j->in[0], 4, (int64_t[]){2, 3, 4, 64});
        ompk_tensor comb = tu_view(&j->in[1], 4, (int64_t[]){2, 3, 4, 4});
        ompk_tensor post = tu_view(&j->in[2], 3, (int64_t[]){2, 3, 4});
        ompk_tensor f = tu_view(&j->in[3], 3, (int64_t[]){2, 3, 64});
        ompk_tensor out = tu_view(&j->out[0], 4, (int64_t[]){2, 3, 4, bad ? 32 : 64});
        return ompk_mhc_post_fwd(&x, &comb, &post, &f, &out);
    }
    case ROUTER_FWD: {
        const int64_t s[2] = {16, 32}, o[2] = {16, 8};
        ompk_tensor sx = tu_view(&j->in[0], 2, s), sy = tu_view(&j->in[1], 2, s);
        ompk_tensor sc = tu_view(&j->out[0], 2, o), ix = tu_view(&j->out[1], 2, o);
        return ompk_router_topk_fwd(&sx, &sy, bad ? 0 : 8, &sc, &ix);
    }
    case ATTN_FWD: {
        ompk_tensor q = tu_view(&j->in[0], 4, (int64_t[]){1, 2, 48, 64});
        ompk_tensor k = tu_view(&j->in[1], 4, (int64_t[]){1, 1, 80, 64});
        ompk_tensor v = tu_view(&j->in[2], 4, (int64_t[]){1, 1, 80, 64});
        ompk_tensor out = tu_view(&j->out[0], 4, (int64_t[]){1, 2, 48, 64});
        ompk_tensor lse = tu_view(&j->out[1], 3, (int64_t[]){1, 2, 48});
        ompk_attention_params p = ompk_attention_params_default();
        p.mask = OMPK_ATTN_MASK_CAUSAL_BOTTOM_RIGHT;
        if (bad) p.scale = NAN;
        return ompk_attention_fwd(&q, &k, &v, &out, &lse, &p);
    }
    }
    return OMPK_ERR_RUNTIME;
}

/* Single-threaded results of each kind, the reference for the concurrent runs. */
typedef struct ref {
    void *bytes[2];
    size_t n[2];
} ref;

static ref job_reference(ompk_device dev, int kind) {
    job j = job_make(dev, kind);
    ref r;
    memset(&r, 0, sizeof r);
    cr_assert_eq(job_run(&j, 0), OMPK_OK, "reference %d: %s", kind, ompk_last_error());
    for (int i = 0; i < j.nout; i++) {
        tu_buf_download(&j.out[i]);
        r.n[i] = j.out[i].bytes;
        r.bytes[i] = malloc(r.n[i]);
        memcpy(r.bytes[i], j.out[i].host, r.n[i]);
    }
    job_free(&j);
    return r;
}

typedef struct worker {
    job j;
    int bad;
    const ref *expect;
    pthread_barrier_t *start;
    char failure[256]; /* first failure, "" if none */
} worker;

static void *worker_main(void *arg) {
    worker *w = arg;
    ompk_clear_error();
    pthread_barrier_wait(w->start);
    for (int it = 0; it < ITERS && !w->failure[0]; it++) {
        const ompk_status st = job_run(&w->j, w->bad);
        for (int i = 0; i < w->j.nout; i++) tu_buf_download(&w->j.out[i]);
        if (w->bad) {
            if (st != OMPK_ERR_INVALID_ARGUMENT)
                snprintf(w->failure, sizeof w->failure, "kind %d bad: status %s", w->j.kind,
                         ompk_status_str(st));
            else if (!strstr(ompk_last_error(), bad_msg[w->j.kind]))
                snprintf(w->failure, sizeof w->failure, "kind %d bad: error \"%s\"", w->j.kind,
                         ompk_last_error());
            for (int i = 0; i < w->j.nout && !w->failure[0]; i++)
                if (!tu_buf_all_bytes(&w->j.out[i], 0xA7))
                    snprintf(w->failure, sizeof w->failure, "kind %d bad: output %d written",
                             w->j.kind, i);
        } else {
            if (st != OMPK_OK)
                snprintf(w->failure, sizeof w->failure, "kind %d: status %s (%s)", w->j.kind,
                         ompk_status_str(st), ompk_last_error());
            else if (ompk_last_error()[0])
                snprintf(w->failure, sizeof w->failure,
                         "kind %d: another thread's error is visible here: \"%s\"", w->j.kind,
                         ompk_last_error());
            for (int i = 0; i < w->j.nout && !w->failure[0]; i++)
                if (memcmp(w->j.out[i].host, w->expect->bytes[i], w->expect->n[i]) != 0)
                    snprintf(w->failure, sizeof w->failure,
                             "kind %d: output %d differs from the single-threaded run", w->j.kind,
                             i);
        }
    }
    return NULL;
}

/* Threads running kinds a (bad_a) and b (bad_b) at once on dev, ITERS calls each. */
static void run_pair(ompk_device dev, int a, int bad_a, int b, int bad_b, const ref refs[]) {
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, 2);
    worker w[2];
    const int kinds[2] = {a, b}, bads[2] = {bad_a, bad_b};
    for (int i = 0; i < 2; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].j = job_make(dev, kinds[i]);
        w[i].bad = bads[i];
        w[i].expect = &refs[kinds[i]];
        w[i].start = &start;
    }
    pthread_t th[2];
    for (int i = 0; i < 2; i++) cr_assert_eq(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&start);
    for (int i = 0; i < 2; i++) {
        job_free(&w[i].j);
        cr_expect(!w[i].failure[0], "%s, kinds %d/%d: %s", tu_device_name(dev), a, b, w[i].failure);
    }
}

static void each_device(int both_good) {
    ompk_device devs[4];
    const int nd = tu_devices(devs, 4);
    for (int d = 0; d < nd; d++) {
        ref refs[NKINDS];
        for (int k = 0; k < NKINDS; k++) refs[k] = job_reference(devs[d], k);
        for (int a = 0; a < NKINDS; a++) {
            const int b = (a + 1) % NKINDS;
            run_pair(devs[d], a, 0, b, !both_good, refs);
        }
        for (int k = 0; k < NKINDS; k++) free(refs[k].bytes[0]), free(refs[k].bytes[1]);
    }
}

Test(concurrency, one_thread_fails_validation) {
    each_device(0);
}

Test(concurrency, both_threads_succeed) {
    each_device(1);
}
