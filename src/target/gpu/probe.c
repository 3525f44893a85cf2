/* Offload health probe used by ompk-info and the device test script: a silent host fallback
 * (e.g. an image the runtime does not recognise) must be reported, not mistaken for a GPU.
 * Also the launch probe: the fixed cost of one synchronous target region, which every small
 * ompk call pays and which no kernel tuning can remove. And the FP32 peak probe, the compute
 * roofline ompk-bench measures on each platform. */
#include <omp.h>
#include <stdint.h>

#include "bare.h"
#include "cpu.h"
#include "gpu_ctx.h"
#include "probe.h"

/* the host code of an x86-64 build (not its GPU images) */
#if defined(__x86_64__) && !defined(__NVPTX__) && !defined(__AMDGPU__) && !defined(__nvptx__)
#define OMPK_PROBE_X86 1
#else
#define OMPK_PROBE_X86 0
#endif

int ompk_probe_device(int dev) {
    if (dev < 0 || dev >= omp_get_num_devices()) return -1;
    int on_host = 1, sum = 0;
#pragma omp target device(dev) map(from : on_host, sum)
    {
        on_host = omp_is_initial_device();
        int s = 0;
        for (int i = 1; i <= 10; i++) s += i;
        sum = s;
    }
    return !on_host && sum == 55;
}

int ompk_probe_launch(int dev, ompk_probe_form form, int *word) {
    if (dev < 0 || dev >= omp_get_num_devices() || !word) return -1;
    /* what every ompk GPU call does first, so the probe measures the library's own wait */
    ompk_gpu_prepare(dev);
    switch (form) {
    case OMPK_PROBE_BARE:
#ifdef OMPK_BARE_DEVICE
#pragma omp target teams ompx_bare num_teams(1) thread_limit(32) device(dev) is_device_ptr(word)
    {
        if (ompx_thread_id_x() == 0) word[0] += 1;
    }
        return 0;
#else
        return -1;
#endif
    case OMPK_PROBE_COMBINED:
#pragma omp target teams distribute parallel for device(dev) is_device_ptr(word)
        for (int i = 0; i < 1; i++) word[i] += 1;
        return 0;
    case OMPK_PROBE_NOWAIT:
#pragma omp target teams distribute parallel for device(dev) is_device_ptr(word) nowait
        for (int i = 0; i < 1; i++) word[i] += 1;
#pragma omp taskwait
        return 0;
    case OMPK_PROBE_STRUCT: {
        /* an aggregate argument reaches the device by a host-to-device copy of its own */
        struct {
            int v[128];
        } blk;
        for (int i = 0; i < 128; i++) blk.v[i] = i;
#pragma omp target teams distribute parallel for device(dev) is_device_ptr(word) firstprivate(blk)
        for (int i = 0; i < 1; i++) word[i] += blk.v[1];
        return 0;
    }
    }
    return -1;
}

/* Eight chains per GPU thread hide the FMA latency with a few warps an SM; on the host, eight
 * vectors of chains per thread hide it on two FMA ports. */
#define FMA_CHAINS 8
#define FMA_GPU_ITEMS (1 << 21)
#define FMA_GPU_STEPS 8192
#define FMA_HOST_STEPS (1 << 22)

/* FMA_CHAINS vectors of lanes chains a = a * b + c for steps steps, held in registers (vector
 * types: an array would leave it to the vectoriser); the sum keeps them live. The contraction
 * into FMAs is the compilers' (clang by default, GCC with -ffp-contract=fast), as for the
 * portable kernels. */
typedef float fma_v8 __attribute__((vector_size(32)));
typedef float fma_v16 __attribute__((vector_size(64)));
#define FMA_HOST_BODY(vec, lanes)                                                                  \
    vec lane;                                                                                      \
    for (int l = 0; l < (lanes); l++) lane[l] = (float)l * 1e-4f;                                  \
    const vec vb = lane * 0.0f + b, vc = lane * 0.0f + c;                                          \
    vec a0 = lane + (float)seed * 1e-3f, a1 = a0 + 1e-3f, a2 = a0 + 2e-3f, a3 = a0 + 3e-3f;        \
    vec a4 = a0 + 4e-3f, a5 = a0 + 5e-3f, a6 = a0 + 6e-3f, a7 = a0 + 7e-3f;                        \
    for (int64_t s = 0; s < steps; s++) {                                                          \
        a0 = a0 * vb + vc;                                                                         \
        a1 = a1 * vb + vc;                                                                         \
        a2 = a2 * vb + vc;                                                                         \
        a3 = a3 * vb + vc;                                                                         \
        a4 = a4 * vb + vc;                                                                         \
        a5 = a5 * vb + vc;                                                                         \
        a6 = a6 * vb + vc;                                                                         \
        a7 = a7 * vb + vc;                                                                         \
    }                                                                                              \
    const vec t = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;                                           \
    float sum = 0;                                                                                 \
    for (int l = 0; l < (lanes); l++) sum += t[l];                                                 \
    return sum

static float fma_host_8(int64_t steps, float b, float c, int seed) {
    FMA_HOST_BODY(fma_v8, 8);
}

#if OMPK_PROBE_X86
__attribute__((target("avx512f,fma"))) static float fma_host_16(int64_t steps, float b, float c,
                                                                int seed) {
    FMA_HOST_BODY(fma_v16, 16);
}
#endif

static volatile float fma_sink;

double ompk_probe_fma(int dev) {
    const float b = 0.999999f, c = 1e-7f;
    if (dev < 0) {
        int lanes = 8;
#if OMPK_PROBE_X86
        if (ompk_cpu_get()->avx512f) lanes = 16;
#endif
        int threads = 1;
        float total = 0;
#pragma omp parallel reduction(+ : total)
        {
#pragma omp single
            threads = omp_get_num_threads();
            const int seed = omp_get_thread_num();
#if OMPK_PROBE_X86
            total += lanes == 16 ? fma_host_16(FMA_HOST_STEPS, b, c, seed)
                                 : fma_host_8(FMA_HOST_STEPS, b, c, seed);
#else
            total += fma_host_8(FMA_HOST_STEPS, b, c, seed);
#endif
        }
        fma_sink = total;
        return 2.0 * FMA_CHAINS * lanes * (double)FMA_HOST_STEPS * threads;
    }
    if (dev >= omp_get_num_devices()) return -1;
    ompk_gpu_prepare(dev);
    float total = 0;
#pragma omp target teams distribute parallel for device(dev) map(tofrom : total)                   \
    reduction(+ : total)
    for (int i = 0; i < FMA_GPU_ITEMS; i++) {
        float a0 = (float)i * 1e-9f, a1 = a0 + 1e-3f, a2 = a0 + 2e-3f, a3 = a0 + 3e-3f;
        float a4 = a0 + 4e-3f, a5 = a0 + 5e-3f, a6 = a0 + 6e-3f, a7 = a0 + 7e-3f;
        for (int s = 0; s < FMA_GPU_STEPS; s++) {
            a0 = a0 * b + c;
            a1 = a1 * b + c;
            a2 = a2 * b + c;
            a3 = a3 * b + c;
            a4 = a4 * b + c;
            a5 = a5 * b + c;
            a6 = a6 * b + c;
            a7 = a7 * b + c;
        }
        total += a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
    }
    fma_sink = total;
    return 2.0 * FMA_CHAINS * (double)FMA_GPU_ITEMS * FMA_GPU_STEPS;
}
