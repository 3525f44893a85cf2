/* An OpenMP program that owns its device data and hands it to ompk: a routed MoE layer.
 *
 * The program maps its arrays with `#pragma omp target data` (no ompk_malloc), computes the
 * router's sub-key scores in its own target region, and passes the device addresses to ompk
 * through `use_device_ptr`, describing them as tensors on OpenMP device `dev`:
 *   1. ompk_router_topk_fwd picks each token's K best of the N x N product keys (on the GPU),
 *   2. the program turns the K scores into gate weights (softmax) in its own target region,
 *   3. ompk_moe_fwd runs the experts. They run on the host CPU (AMX where there is one):
 *      given device tensors, ompk copies x, the ids and the weights to host buffers, runs the
 *      experts there and copies y back to the device (the staging time is in
 *      ompk_moe_get_stats). The program then brings y home with `target update`.
 * The result is checked against the same layer run on host copies of the routing.
 * Without a GPU (or with OMP_TARGET_OFFLOAD=DISABLED) the same code runs on the host: the
 * target regions fall back and use_device_ptr yields host addresses. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ompk/ompk.h>

enum { T = 64, H = 64, N = 4, E = N * N, K = 2, I = 32 };

static int fail(const char *what, ompk_status st) {
    fprintf(stderr, "omp_device_data: %s: %s (%s)\n", what, ompk_status_str(st), ompk_last_error());
    return 1;
}

int main(void) {
    /* the device the program's own target regions use is the one the tensors name. Built
     * without a GPU image of its own regions, the program keeps its data on the host. */
    int dev_id = omp_get_default_device(), on_gpu = 0;
    if (omp_get_num_devices() > 0) {
#pragma omp target map(from : on_gpu) device(dev_id)
        on_gpu = !omp_is_initial_device();
        if (!on_gpu) dev_id = omp_get_initial_device();
    }
    const ompk_device dev = on_gpu ? ompk_device_target(dev_id) : ompk_device_host();
    printf("omp_device_data: T=%d H=%d, %d experts, top-%d, data on %s\n", T, H, E, K,
           on_gpu ? "the GPU" : "the host");

    float *x = malloc(sizeof(float) * T * H), *keys = malloc(sizeof(float) * 2 * H * N);
    float *sx = malloc(sizeof(float) * T * N), *sy = malloc(sizeof(float) * T * N);
    float *score = malloc(sizeof(float) * T * K), *gate = malloc(sizeof(float) * T * K);
    int32_t *ids = malloc(sizeof(int32_t) * T * K);
    float *y = malloc(sizeof(float) * T * H);
    uint64_t r = 12345;
    for (int e = 0; e < T * H + 2 * H * N; e++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        const float u = (float)((double)(r >> 11) * (2.0 / 9007199254740992.0) - 1.0);
        if (e < T * H)
            x[e] = u;
        else
            keys[e - T * H] = u / 8.0f;
    }

    /* the experts: weights are loaded once, from host arrays */
    ompk_moe_config cfg = {0};
    cfg.experts = E, cfg.hidden = H, cfg.intermediate = I, cfg.top_k = K, cfg.max_tokens = T;
    cfg.format = OMPK_MOE_BF16, cfg.no_pin = 1;
    ompk_moe *moe = NULL;
    ompk_status st = ompk_moe_create(&cfg, &moe);
    if (st != OMPK_OK) return fail("ompk_moe_create", st);
    float *wg = malloc(sizeof(float) * E * I * H), *wu = malloc(sizeof(float) * E * I * H),
          *wd = malloc(sizeof(float) * E * H * I);
    for (int e = 0; e < E * I * H; e++)
        wg[e] = 0.1f * sinf((float)e), wu[e] = 0.1f * cosf((float)e);
    for (int e = 0; e < E * H * I; e++) wd[e] = 0.1f * sinf(0.5f * (float)e);
    const int64_t sg[3] = {E, I, H}, sd[3] = {E, H, I};
    const ompk_device host = ompk_device_host();
    ompk_tensor tg = ompk_tensor_make(wg, OMPK_F32, 3, sg, host);
    ompk_tensor tu = ompk_tensor_make(wu, OMPK_F32, 3, sg, host);
    ompk_tensor td = ompk_tensor_make(wd, OMPK_F32, 3, sd, host);
    if ((st = ompk_moe_load_weights(moe, &tg, &tu, &td)) != OMPK_OK)
        return fail("ompk_moe_load_weights", st);

    const int64_t sn[2] = {T, N}, sk[2] = {T, K}, sh[2] = {T, H};
#pragma omp target data map(to : x[0 : T * H], keys[0 : 2 * H * N])                                \
    map(alloc : sx[0 : T * N], sy[0 : T * N], score[0 : T * K], ids[0 : T * K], gate[0 : T * K],   \
            y[0 : T * H]) device(dev_id)
    {
        /* the program's own kernel: sub-key scores sx = x Kx, sy = x Ky */
#pragma omp target teams distribute parallel for device(dev_id)
        for (int t = 0; t < T; t++)
            for (int j = 0; j < N; j++) {
                float ax = 0, ay = 0;
                for (int h = 0; h < H; h++) {
                    ax += x[t * H + h] * keys[h * N + j];
                    ay += x[t * H + h] * keys[H * N + h * N + j];
                }
                sx[t * N + j] = ax;
                sy[t * N + j] = ay;
            }

        /* ompk gets the device addresses of the mapped arrays */
#pragma omp target data use_device_ptr(sx, sy, score, ids) device(dev_id)
        {
            ompk_tensor tsx = ompk_tensor_make(sx, OMPK_F32, 2, sn, dev);
            ompk_tensor tsy = ompk_tensor_make(sy, OMPK_F32, 2, sn, dev);
            ompk_tensor tsc = ompk_tensor_make(score, OMPK_F32, 2, sk, dev);
            ompk_tensor tid = ompk_tensor_make(ids, OMPK_I32, 2, sk, dev);
            st = ompk_router_topk_fwd(&tsx, &tsy, K, &tsc, &tid);
        }
        if (st == OMPK_OK) { /* (a structured block cannot be left by return) */
            /* gate weights: softmax over each token's K scores (best first), on the device */
#pragma omp target teams distribute parallel for device(dev_id)
            for (int t = 0; t < T; t++) {
                float z = 0;
                for (int k = 0; k < K; k++) z += expf(score[t * K + k] - score[t * K]);
                for (int k = 0; k < K; k++)
                    gate[t * K + k] = expf(score[t * K + k] - score[t * K]) / z;
            }

            /* the experts, on device tensors: ompk stages them through the host */
#pragma omp target data use_device_ptr(x, ids, gate, y) device(dev_id)
            {
                ompk_tensor tx = ompk_tensor_make(x, OMPK_F32, 2, sh, dev);
                ompk_tensor tid = ompk_tensor_make(ids, OMPK_I32, 2, sk, dev);
                ompk_tensor tw = ompk_tensor_make(gate, OMPK_F32, 2, sk, dev);
                ompk_tensor ty = ompk_tensor_make(y, OMPK_F32, 2, sh, dev);
                st = ompk_moe_fwd(moe, &tx, &tid, &tw, &ty);
            }
        }
#pragma omp target update from(y[0 : T * H], ids[0 : T * K], gate[0 : T * K]) device(dev_id)
    }
    if (st != OMPK_OK) return fail("ompk_router_topk_fwd or ompk_moe_fwd", st);
    ompk_moe_stats stats;
    ompk_moe_get_stats(moe, &stats);

    /* the same experts on host copies of the routing give the same y, bit for bit */
    float *y_host = malloc(sizeof(float) * T * H);
    ompk_tensor hx = ompk_tensor_make(x, OMPK_F32, 2, sh, host);
    ompk_tensor hid = ompk_tensor_make(ids, OMPK_I32, 2, sk, host);
    ompk_tensor hw = ompk_tensor_make(gate, OMPK_F32, 2, sk, host);
    ompk_tensor hy = ompk_tensor_make(y_host, OMPK_F32, 2, sh, host);
    if ((st = ompk_moe_fwd(moe, &hx, &hid, &hw, &hy)) != OMPK_OK)
        return fail("ompk_moe_fwd (host)", st);
    const int same = memcmp(y, y_host, sizeof(float) * T * H) == 0;
    printf("token 0 -> experts %d, %d (gates %.3f, %.3f); y[0] = %.5f\n", ids[0], ids[1], gate[0],
           gate[1], y[0]);
    printf("staging %.3f ms in, %.3f ms out; device-tensor y %s the host-tensor y\n",
           stats.stage_in_ms, stats.stage_out_ms, same ? "equals" : "DIFFERS FROM");
    ompk_moe_destroy(moe);
    free(x), free(keys), free(sx), free(sy), free(score), free(gate), free(ids), free(y);
    free(wg), free(wu), free(wd), free(y_host);
    printf("omp_device_data: %s\n", same ? "OK" : "FAILED");
    return !same;
}
