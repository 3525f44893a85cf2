/* ompk_moe_set_lora + ompk_moe_fwd_train(PUSH) + ompk_moe_bwd against PyTorch float64
 * autograd fixtures (tests/fixtures/gen_moe_sft.py): y, dx, dw, dA/dB and dW of gate, up and
 * down, bf16 base, on every ISA this CPU runs (AMX: real tiles only where available) and every
 * device, with x/y/dy/dx and the LoRA tensors f32 (ids i64) and bf16 (ids i32): the fixture values
 * are bf16-representable, so both load them exactly. Padding slots, a token routed twice to one
 * expert, a token routed nowhere, experts no token reaches (gradients exactly 0). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ompk/moe.h"
#include "test_util.h"

#define MAX_ARRAYS 48

/* b"MOES", int32 count, then per array: 32-byte name, int64 numel, numel float32 */
typedef struct fixture {
    int count;
    char names[MAX_ARRAYS][33];
    int64_t numel[MAX_ARRAYS];
    double *data[MAX_ARRAYS];
} fixture;

static int fixture_load(fixture *f, const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/moe_sft_%s.bin", OMPK_FIXTURE_DIR, name);
    FILE *fh = fopen(path, "rb");
    if (!fh) return 0;
    char magic[4];
    int32_t count = 0;
    int ok = fread(magic, 1, 4, fh) == 4 && memcmp(magic, "MOES", 4) == 0 &&
             fread(&count, 4, 1, fh) == 1 && count > 0 && count <= MAX_ARRAYS;
    f->count = 0;
    for (int i = 0; ok && i < count; i++) {
        memset(f->names[i], 0, 33);
        ok = fread(f->names[i], 1, 32, fh) == 32 && fread(&f->numel[i], 8, 1, fh) == 1 &&
             f->numel[i] >= 0 && f->numel[i] < (1 << 20);
        if (!ok) break;
        float *tmp = malloc(sizeof(float) * (size_t)(f->numel[i] + 1));
        f->data[i] = malloc(sizeof(double) * (size_t)(f->numel[i] + 1));
        f->count = i + 1;
        ok = fread(tmp, 4, (size_t)f->numel[i], fh) == (size_t)f->numel[i];
        for (int64_t e = 0; ok && e < f->numel[i]; e++) f->data[i][e] = tmp[e];
        free(tmp);
    }
    fclose(fh);
    return ok;
}

static const double *fx_get(const fixture *f, const char *name, int64_t numel) {
    for (int i = 0; i < f->count; i++)
        if (strcmp(f->names[i], name) == 0) {
            cr_assert_eq(f->numel[i], numel, "fixture %s has %lld values, want %lld", name,
                         (long long)f->numel[i], (long long)numel);
            return f->data[i];
        }
    cr_assert_fail("fixture array %s missing", name);
    return NULL;
}

static void fixture_free(fixture *f) {
    for (int i = 0; i < f->count; i++) free(f->data[i]);
}

/* Tolerance. The fixture is exact float64 math on bf16-representable inputs; the kernels round
 * matmul operands to bf16 (x: exact here; a; and, on tile paths, the other activation-side
 * operands) and sum in fp32. <name>_err is the generator's first-order propagation of those
 * roundings (u = 2^-8 relative each) and of fp32 sums through the formulas, so |out - ref| <=
 * u * err to first order; 2 u * err leaves room for second-order terms, a bf16 output (y, dx)
 * adds its own rounding u |ref|, and 1e-6 rms(ref) absorbs float32 storage of the fixture. */
static double worst_ratio(const char *what, const tu_buf *out, const double *ref, const double *err,
                          int bf16_out) {
    const double u = 1.0 / 256;
    double ss = 0;
    for (int64_t i = 0; i < out->numel; i++) ss += ref[i] * ref[i];
    const double floor = 1e-6 * sqrt(ss / (double)out->numel) + 1e-30;
    double worst = 0;
    int64_t wi = 0;
    for (int64_t i = 0; i < out->numel; i++) {
        const double tol = 2 * u * err[i] + (bf16_out ? u * fabs(ref[i]) : 0) + floor;
        const double q = fabs(tu_buf_get(out, i) - ref[i]) / tol;
        if (!(q <= worst)) {
            worst = isnan(q) ? INFINITY : q;
            wi = i;
        }
    }
    if (worst > 1)
        fprintf(stderr, "%s: worst at %lld: %.9g vs %.9g (tol %.3g)\n", what, (long long)wi,
                tu_buf_get(out, wi), ref[wi],
                2 * u * err[wi] + (bf16_out ? u * fabs(ref[wi]) : 0) + floor);
    return worst;
}

static tu_buf buf_from(ompk_device d, ompk_dtype dt, const double *v, int64_t n) {
    tu_buf b = tu_buf_new(d, dt, n);
    for (int64_t i = 0; i < n; i++) tu_buf_set(&b, i, v[i]);
    tu_buf_upload(&b);
    return b;
}

/* weights and LoRA in fixture order: gate, up, down, gate_a, gate_b, up_a, up_b, down_a, down_b;
 * gradients of each (dW for the first three) */
static const char *param_name[9] = {"gate", "up",   "down",   "gate_a", "gate_b",
                                    "up_a", "up_b", "down_a", "down_b"};
static const char *grad_name[9] = {"gate_dw", "up_dw", "down_dw", "gate_da", "gate_db",
                                   "up_da",   "up_db", "down_da", "down_db"};

static void run_case(const fixture *f, ompk_moe_isa isa, ompk_device dev, ompk_dtype dt) {
    const double *dims = fx_get(f, "dims", 7);
    const int64_t E = (int64_t)dims[0], H = (int64_t)dims[1], I = (int64_t)dims[2];
    const int64_t T = (int64_t)dims[3], k = (int64_t)dims[4], r = (int64_t)dims[5];
    const int64_t shp[9][3] = {{E, I, H}, {E, I, H}, {E, H, I}, {E, r, H}, {E, I, r},
                               {E, r, H}, {E, I, r}, {E, r, I}, {E, H, r}};
    ompk_moe_config c;
    memset(&c, 0, sizeof c);
    c.experts = E;
    c.hidden = H;
    c.intermediate = I;
    c.top_k = (int)k;
    c.max_tokens = T;
    c.format = OMPK_MOE_BF16;
    c.numa = OMPK_MOE_NUMA_FORCED;
    c.numa_split = 2; /* partition offsets and the partials of dx, dA_gate/up, dB_down, dw */
    c.threads = 2;
    c.isa = isa;
    c.amx_min_rows = 1; /* every expert on the tile code of the AMX paths */
    c.cache_depth = 2;
    c.lora_max_rank = 8;
    ompk_moe *m = NULL;
    cr_assert_eq(ompk_moe_create(&c, &m), OMPK_OK, "%s", ompk_last_error());

    const ompk_device host = ompk_device_host();
    tu_buf p[9], g[9];
    ompk_tensor tp[9], tg[9];
    for (int i = 0; i < 9; i++) {
        const int64_t n = shp[i][0] * shp[i][1] * shp[i][2];
        /* base weights f32 (exact bf16 values); LoRA in the pass's dtype */
        p[i] = buf_from(host, i < 3 ? OMPK_F32 : dt, fx_get(f, param_name[i], n), n);
        g[i] = tu_buf_new(host, OMPK_F32, n);
        tu_buf_fill_bytes(&g[i], 0x7F); /* poison: "=" writes every element */
        tp[i] = tu_view(&p[i], 3, shp[i]);
        tg[i] = tu_view(&g[i], 3, shp[i]);
    }
    cr_assert_eq(ompk_moe_load_weights(m, &tp[0], &tp[1], &tp[2]), OMPK_OK, "%s",
                 ompk_last_error());
    ompk_moe_lora lora;
    memset(&lora, 0, sizeof lora);
    lora.rank = (int)r;
    lora.alpha = (float)dims[6];
    lora.gate_a = &tp[3], lora.gate_b = &tp[4];
    lora.up_a = &tp[5], lora.up_b = &tp[6];
    lora.down_a = &tp[7], lora.down_b = &tp[8];
    cr_assert_eq(ompk_moe_set_lora(m, &lora), OMPK_OK, "%s", ompk_last_error());

    tu_buf bx = buf_from(dev, dt, fx_get(f, "x", T * H), T * H);
    tu_buf bdy = buf_from(dev, dt, fx_get(f, "dy", T * H), T * H);
    tu_buf bi = buf_from(dev, dt == OMPK_F32 ? OMPK_I64 : OMPK_I32, fx_get(f, "ids", T * k), T * k);
    tu_buf bw = buf_from(dev, OMPK_F32, fx_get(f, "w", T * k), T * k);
    tu_buf by = tu_buf_new(dev, dt, T * H), bdx = tu_buf_new(dev, dt, T * H);
    tu_buf bdw = tu_buf_new(dev, OMPK_F32, T * k);
    tu_buf_fill_bytes(&by, 0x7F);
    tu_buf_fill_bytes(&bdx, 0x7F);
    tu_buf_fill_bytes(&bdw, 0x7F);
    const int64_t sx[2] = {T, H}, sk[2] = {T, k};
    ompk_tensor tx = tu_view(&bx, 2, sx), tdy = tu_view(&bdy, 2, sx), ty = tu_view(&by, 2, sx);
    ompk_tensor tdx = tu_view(&bdx, 2, sx), ti = tu_view(&bi, 2, sk), tw = tu_view(&bw, 2, sk);
    ompk_tensor tdw = tu_view(&bdw, 2, sk);
    cr_assert_eq(ompk_moe_fwd_train(m, &tx, &ti, &tw, &ty, OMPK_MOE_CACHE_PUSH), OMPK_OK, "%s",
                 ompk_last_error());
    ompk_moe_grads gr;
    memset(&gr, 0, sizeof gr);
    gr.dx = &tdx;
    gr.dw = &tdw;
    gr.gate_dw = &tg[0], gr.up_dw = &tg[1], gr.down_dw = &tg[2];
    gr.gate_da = &tg[3], gr.gate_db = &tg[4], gr.up_da = &tg[5], gr.up_db = &tg[6];
    gr.down_da = &tg[7], gr.down_db = &tg[8];
    cr_assert_eq(ompk_moe_bwd(m, &tdy, &gr), OMPK_OK, "%s", ompk_last_error());
    ompk_moe_info info;
    cr_assert_eq(ompk_moe_get_info(m, &info), OMPK_OK);
    cr_expect_eq(info.cache_entries, 0, "the backward pops its entry");

    tu_buf_download(&by);
    tu_buf_download(&bdx);
    tu_buf_download(&bdw);
    const tu_buf *outs[12] = {&by,   &bdx,  &bdw,  &g[0], &g[1], &g[2],
                              &g[3], &g[4], &g[5], &g[6], &g[7], &g[8]};
    const char *names[12] = {"y", "dx", "dw"};
    for (int i = 0; i < 9; i++) names[3 + i] = grad_name[i];
    for (int i = 0; i < 12; i++) {
        char what[160], en[48];
        snprintf(what, sizeof what, "%s %s %s %s", ompk_moe_isa_name(isa), tu_device_name(dev),
                 dt == OMPK_BF16 ? "bf16" : "f32", names[i]);
        snprintf(en, sizeof en, "%s_err", names[i]);
        const double *ref = fx_get(f, names[i], outs[i]->numel);
        const double *err = fx_get(f, en, outs[i]->numel);
        const double q = worst_ratio(what, outs[i], ref, err, i < 2 && dt == OMPK_BF16);
        cr_expect(q <= 1.0, "%s: worst ratio %g vs PyTorch float64", what, q);
    }
    for (int i = 0; i < 9; i++) tu_buf_free(&p[i]), tu_buf_free(&g[i]);
    tu_buf *io[7] = {&bx, &bdy, &bi, &bw, &by, &bdx, &bdw};
    for (int i = 0; i < 7; i++) tu_buf_free(io[i]);
    ompk_moe_destroy(m);
}

static void run_fixture(const char *name, ompk_moe_isa isa) {
    if (!ompk_moe_isa_available(isa)) {
        printf("moe_sft: ISA %s not available on this CPU, fixture %s skipped for it\n",
               ompk_moe_isa_name(isa), name);
        cr_skip_test("ISA %s not available on this CPU", ompk_moe_isa_name(isa));
    }
    fixture f;
    cr_assert(fixture_load(&f, name), "cannot read fixture %s from %s", name, OMPK_FIXTURE_DIR);
    ompk_device devs[4];
    const int nd = tu_devices(devs, 4);
    for (int d = 0; d < nd; d++) {
        run_case(&f, isa, devs[d], OMPK_F32);
        run_case(&f, isa, devs[d], OMPK_BF16);
    }
    fixture_free(&f);
}

#define FIXTURE_TESTS(fx)                                                                          \
    Test(moe_sft_fixtures, fx##_portable) {                                                        \
        run_fixture(#fx, OMPK_MOE_ISA_PORTABLE);                                                   \
    }                                                                                              \
    Test(moe_sft_fixtures, fx##_avx512bf16) {                                                      \
        run_fixture(#fx, OMPK_MOE_ISA_AVX512BF16);                                                 \
    }                                                                                              \
    Test(moe_sft_fixtures, fx##_amx_emulated) {                                                    \
        run_fixture(#fx, OMPK_MOE_ISA_AMX_EMULATED);                                               \
    }                                                                                              \
    Test(moe_sft_fixtures, fx##_amx) {                                                             \
        run_fixture(#fx, OMPK_MOE_ISA_AMX);                                                        \
    }

FIXTURE_TESTS(t1_k1_r8)
FIXTURE_TESTS(t9_k4_r8)
FIXTURE_TESTS(t7_k2_r1)
