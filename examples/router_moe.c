/* Product-key routing feeding the MoE experts (issue 6 integration).
 *
 * A batch of T tokens x [T,H] is projected onto two sets of N sub-keys (sx = x Kx, sy = x Ky);
 * ompk_router_topk_fwd picks each token's k best pairs (i,j) of the N x N product keys; the
 * pair index i*N + j is the expert id (E = N^2 experts, one per product key); the gate weights
 * are the softmax of the k scores; ompk_moe_fwd runs the experts. Every stage is checked
 * against a plain reference computed here: the routing against the brute force over all N^2
 * sums (indices must agree exactly), the layer output against a double-precision SwiGLU on the
 * weights the MoE object reports.
 *
 * Runs on the first GPU when there is one (router on the device, experts staged through the
 * host), else on the host. Exit status 0 when every check passed. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "ompk/router.h"
#ifdef OMPK_HAVE_MOE
#include "ompk/moe.h"
#endif

enum { T = 48, H = 64, N = 8, K = 4, I = 32, E = N * N };

static uint64_t rng = 0x243F6A8885A308D3ull;
static double uniform(void) { /* [-1, 1) */
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

static int fail(const char *what, ompk_status st) {
    fprintf(stderr, "router_moe: %s: %s (%s)\n", what, ompk_status_str(st), ompk_last_error());
    return 1;
}

/* brute force: all N^2 fp32 sums, best first, ties to the lower index */
static void route_reference(const float *sx, const float *sy, float *score, int32_t *idx) {
    for (int t = 0; t < T; t++) {
        int used[E] = {0};
        for (int r = 0; r < K; r++) {
            int best = -1;
            float bs = 0.0f;
            for (int p = 0; p < E; p++) {
                const float s = sx[t * N + p / N] + sy[t * N + p % N];
                if (!used[p] && (best < 0 || s > bs)) best = p, bs = s;
            }
            used[best] = 1;
            score[t * K + r] = bs;
            idx[t * K + r] = best;
        }
    }
}

int main(void) {
    static float x[T * H], kx[H * N], ky[H * N], sx[T * N], sy[T * N];
    static float score[T * K], ref_score[T * K], gate_w[T * K];
    static int32_t idx[T * K], ref_idx[T * K];
    for (int e = 0; e < T * H; e++) x[e] = (float)uniform();
    for (int e = 0; e < H * N; e++) kx[e] = (float)(uniform() / sqrt(H));
    for (int e = 0; e < H * N; e++) ky[e] = (float)(uniform() / sqrt(H));
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) {
            double ax = 0.0, ay = 0.0;
            for (int h = 0; h < H; h++) ax += x[t * H + h] * kx[h * N + n];
            for (int h = 0; h < H; h++) ay += x[t * H + h] * ky[h * N + n];
            sx[t * N + n] = (float)ax;
            sy[t * N + n] = (float)ay;
        }

    ompk_device dev = ompk_device_count() > 0 ? ompk_device_target(0) : ompk_device_host();
    printf("router_moe: T=%d H=%d, %d x %d product keys = %d experts, top-%d, router on %s\n", T, H,
           N, N, E, K, dev.type == OMPK_HOST ? "host" : "gpu0");

    /* ---- routing ---- */
    const size_t bs = sizeof(float) * T * N, bo = sizeof(float) * T * K;
    float *dsx = ompk_malloc(dev, bs), *dsy = ompk_malloc(dev, bs), *dsc = ompk_malloc(dev, bo);
    int32_t *dix = ompk_malloc(dev, sizeof(int32_t) * T * K);
    if (!dsx || !dsy || !dsc || !dix) return fail("allocation", OMPK_ERR_OUT_OF_MEMORY);
    const ompk_device host = ompk_device_host();
    ompk_memcpy(dsx, dev, sx, host, bs);
    ompk_memcpy(dsy, dev, sy, host, bs);
    const int64_t sn[2] = {T, N}, sk[2] = {T, K};
    ompk_tensor tsx = ompk_tensor_make(dsx, OMPK_F32, 2, sn, dev);
    ompk_tensor tsy = ompk_tensor_make(dsy, OMPK_F32, 2, sn, dev);
    ompk_tensor tsc = ompk_tensor_make(dsc, OMPK_F32, 2, sk, dev);
    ompk_tensor tix = ompk_tensor_make(dix, OMPK_I32, 2, sk, dev);
    ompk_status st = ompk_router_topk_fwd(&tsx, &tsy, K, &tsc, &tix);
    if (st != OMPK_OK) return fail("ompk_router_topk_fwd", st);
    ompk_memcpy(score, host, dsc, dev, bo);
    ompk_memcpy(idx, host, dix, dev, sizeof(int32_t) * T * K);
    ompk_free(dev, dsx);
    ompk_free(dev, dsy);
    ompk_free(dev, dsc);
    ompk_free(dev, dix);
    route_reference(sx, sy, ref_score, ref_idx);
    int bad = 0;
    for (int e = 0; e < T * K; e++) bad += idx[e] != ref_idx[e] || score[e] != ref_score[e];
    int load[E] = {0};
    for (int e = 0; e < T * K; e++) load[idx[e]]++;
    int active = 0;
    for (int e = 0; e < E; e++) active += load[e] > 0;
    printf("routing: %d of %d slots differ from the brute force; %d of %d experts active\n", bad,
           T * K, active, E);
    if (bad) return 1;

    /* gate weights: softmax over each token's k scores (the best score first) */
    for (int t = 0; t < T; t++) {
        double z = 0.0;
        for (int r = 0; r < K; r++) z += exp(score[t * K + r] - score[t * K]);
        for (int r = 0; r < K; r++)
            gate_w[t * K + r] = (float)(exp(score[t * K + r] - score[t * K]) / z);
    }
    printf("token 0 -> experts");
    for (int r = 0; r < K; r++) printf(" %d (gate %.3f)", idx[r], gate_w[r]);
    printf("\n");

#ifndef OMPK_HAVE_MOE
    printf("experts: this build has no MoE family (OMPK_HAVE_MOE undefined); stopping after "
           "routing\n");
    return 0;
#else
    /* ---- experts ---- */
    ompk_moe_config cfg = {0};
    cfg.experts = E;
    cfg.hidden = H;
    cfg.intermediate = I;
    cfg.top_k = K;
    cfg.max_tokens = T;
    cfg.format = OMPK_MOE_BF16;
    cfg.no_pin = 1;
    ompk_moe *moe = NULL;
    st = ompk_moe_create(&cfg, &moe);
    if (st != OMPK_OK) {
        printf("experts: ompk_moe_create is not usable here (%s: %s); stopping after routing\n",
               ompk_status_str(st), ompk_last_error());
        return 0;
    }
    static float wg[E * I * H], wu[E * I * H], wd[E * H * I], y[T * H];
    for (int e = 0; e < E * I * H; e++) wg[e] = (float)(uniform() / sqrt(H));
    for (int e = 0; e < E * I * H; e++) wu[e] = (float)(uniform() / sqrt(H));
    for (int e = 0; e < E * H * I; e++) wd[e] = (float)(uniform() / sqrt(I));
    const int64_t sg[3] = {E, I, H}, sd[3] = {E, H, I}, sh[2] = {T, H};
    ompk_tensor tg = ompk_tensor_make(wg, OMPK_F32, 3, sg, host);
    ompk_tensor tu = ompk_tensor_make(wu, OMPK_F32, 3, sg, host);
    ompk_tensor td = ompk_tensor_make(wd, OMPK_F32, 3, sd, host);
    st = ompk_moe_load_weights(moe, &tg, &tu, &td);
    if (st != OMPK_OK) return fail("ompk_moe_load_weights", st);
    /* the expert ids are the router's pair indices, already in [0, E) */
    ompk_tensor tx = ompk_tensor_make(x, OMPK_F32, 2, sh, host);
    ompk_tensor tid = ompk_tensor_make(idx, OMPK_I32, 2, sk, host);
    ompk_tensor tw = ompk_tensor_make(gate_w, OMPK_F32, 2, sk, host);
    ompk_tensor ty = ompk_tensor_make(y, OMPK_F32, 2, sh, host);
    st = ompk_moe_fwd(moe, &tx, &tid, &tw, &ty);
    if (st != OMPK_OK) {
        printf("experts: ompk_moe_fwd is not usable here (%s: %s); stopping after routing\n",
               ompk_status_str(st), ompk_last_error());
        ompk_moe_destroy(moe);
        return 0;
    }
    ompk_moe_info info;
    ompk_moe_get_info(moe, &info);

    /* reference on the weights the object reports (bf16-packed), x and a rounded to bf16 the
     * way OMPK_MOE_BF16 presents them to the matmuls */
    static float g[E * I * H], u[E * I * H], d[E * H * I];
    ompk_tensor rg = ompk_tensor_make(g, OMPK_F32, 3, sg, host);
    ompk_tensor ru = ompk_tensor_make(u, OMPK_F32, 3, sg, host);
    ompk_tensor rd = ompk_tensor_make(d, OMPK_F32, 3, sd, host);
    if (ompk_moe_get_weights(moe, OMPK_MOE_WEIGHT_GATE, &rg) != OMPK_OK ||
        ompk_moe_get_weights(moe, OMPK_MOE_WEIGHT_UP, &ru) != OMPK_OK ||
        ompk_moe_get_weights(moe, OMPK_MOE_WEIGHT_DOWN, &rd) != OMPK_OK)
        return fail("ompk_moe_get_weights", OMPK_ERR_RUNTIME);
    double max_err = 0.0, max_ref = 0.0;
    for (int t = 0; t < T; t++) {
        double yr[H] = {0}, xb[H];
        for (int h = 0; h < H; h++) {
            /* round to bf16 (nearest even) */
            union {
                float f;
                uint32_t u;
            } c = {x[t * H + h]};
            c.u = (c.u + 0x7fffu + ((c.u >> 16) & 1u)) & 0xffff0000u;
            xb[h] = c.f;
        }
        for (int r = 0; r < K; r++) {
            const int e = idx[t * K + r];
            double a[I];
            for (int i = 0; i < I; i++) {
                double gs = 0.0, us = 0.0;
                for (int h = 0; h < H; h++) gs += g[(e * I + i) * H + h] * xb[h];
                for (int h = 0; h < H; h++) us += u[(e * I + i) * H + h] * xb[h];
                union {
                    float f;
                    uint32_t u;
                } c = {(float)(gs / (1.0 + exp(-gs)) * us)};
                c.u = (c.u + 0x7fffu + ((c.u >> 16) & 1u)) & 0xffff0000u;
                a[i] = c.f;
            }
            for (int h = 0; h < H; h++) {
                double s = 0.0;
                for (int i = 0; i < I; i++) s += d[(e * H + h) * I + i] * a[i];
                yr[h] += gate_w[t * K + r] * s;
            }
        }
        for (int h = 0; h < H; h++) {
            const double err = fabs(y[t * H + h] - yr[h]);
            max_err = err > max_err ? err : max_err;
            max_ref = fabs(yr[h]) > max_ref ? fabs(yr[h]) : max_ref;
        }
    }
    const double worst = max_err / (max_ref > 0.0 ? max_ref : 1.0);
    printf("experts: ompk_moe_fwd on the host (%s, %d threads): max |error| / max |reference| "
           "%.3g\n",
           ompk_moe_isa_name(info.isa), info.threads, worst);
    ompk_moe_destroy(moe);
    /* same bf16 operands and fp32 sums: what is left is summation order, plus an occasional a
     * that lands on the other side of a bf16 rounding boundary (one ulp, 2^-8 relative) */
    if (!(worst < 1e-2)) {
        printf("router_moe: FAILED (layer output differs from the reference)\n");
        return 1;
    }
    printf("router_moe: OK\n");
    return 0;
#endif
}
