/* ompk-info: what this build has and what this machine offers.
 *   ompk-info [--require-gpu] [--require-amx]
 *   ompk-info --variants
 * Exit status 1 when a requested capability is missing, or when any OpenMP device exists but the
 * offload image does not run on it (a silent host fallback is an error, not success). With
 * --variants: every op's implementation list, and status 1 when OMPK_VARIANT or OMPK_ISA is
 * bad. */
#include <dlfcn.h>
#include <hwloc.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "ompk/ompk.h"
#include "gpu_ctx.h"
#include "gpu_stack.h"
#include "gpu_wait.h"
#include "probe.h"
#include "variant.h"

/* Why a GPU build sees no device: LLVM's offload runtime loads the CUDA driver itself and
 * reports zero devices, without a word, when it cannot. */
static void explain_no_device(const char *archs) {
    if (!archs[0]) {
        printf("note:      this libompk has no GPU images (host-only build); build the default "
               "preset with a CUDA toolkit in /usr/local/cuda for GPU support\n");
        return;
    }
    void *cuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!cuda)
        printf("note:      the NVIDIA driver (libcuda.so.1) cannot be loaded: no GPU runs here\n");
    else {
        printf("note:      the NVIDIA driver loads but the offload runtime found no device with a "
               "usable image (%s); LIBOMPTARGET_INFO=-1 shows why\n",
               archs);
        dlclose(cuda);
    }
}

static void print_topology(void) {
    hwloc_topology_t topo;
    if (hwloc_topology_init(&topo) != 0 || hwloc_topology_load(topo) != 0) {
        printf("topology:  hwloc failed to load the topology\n");
        return;
    }
    int packages = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE);
    int numa = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
    int cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
    int pus = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
    printf("topology:  %d package(s), %d NUMA node(s), %d core(s), %d PU(s)\n", packages, numa,
           cores, pus);
    for (int i = 0; i < numa; i++) {
        hwloc_obj_t n = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, i);
        int ncores = hwloc_get_nbobjs_inside_cpuset_by_type(topo, n->cpuset, HWLOC_OBJ_CORE);
        printf("           NUMA %u: %d cores, %.1f GiB\n", n->os_index, ncores,
               (double)n->attr->numanode.local_memory / (1 << 30));
    }
    const hwloc_obj_type_t caches[] = {HWLOC_OBJ_L1CACHE, HWLOC_OBJ_L2CACHE, HWLOC_OBJ_L3CACHE};
    const char *names[] = {"L1d", "L2", "L3"};
    for (int k = 0; k < 3; k++) {
        int cnt = hwloc_get_nbobjs_by_type(topo, caches[k]);
        if (cnt == 0) continue;
        hwloc_obj_t c = hwloc_get_obj_by_type(topo, caches[k], 0);
        printf("           %s: %d x %llu KiB\n", names[k], cnt,
               (unsigned long long)c->attr->cache.size / 1024);
    }
    hwloc_topology_destroy(topo);
}

/* Each op's list in order: '*' where the entry is available in this build and on this machine;
 * "default" where the default order takes it for the calls it serves (the first of those that
 * serves a call runs), "named" where only a selection takes it; "<- selected" for the entry
 * OMPK_VARIANT or OMPK_ISA names. */
static int print_variants(void) {
    const char *bad = ompk_variant_env_error();
    printf("implementations (OMPK_VARIANT=op:name,...; * = available here; default = taken in this "
           "order where it serves the call; named = only when selected)\n");
    for (int op = 0; op < OMPK_OP_COUNT_; op++) {
        const ompk_impl_list t = ompk_impl_table((ompk_op)op);
        if (t.count == 0) continue;
        const ompk_impl *named = NULL;
        if (!bad) ompk_variant_selected((ompk_op)op, "ompk-info", &named);
        printf("%s:\n", ompk_op_name((ompk_op)op));
        for (int i = 0; i < t.count; i++) {
            const ompk_impl *e = &t.impl[i];
            printf("  %c %-16s %s%s\n", ompk_impl_available(e) ? '*' : ' ', e->name,
                   e->named_only ? "named" : "default", e == named ? "  <- selected" : "");
        }
    }
    if (bad) {
        printf("ERROR: %s\n", bad);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    int need_gpu = 0, need_amx = 0, rc = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--require-gpu"))
            need_gpu = 1;
        else if (!strcmp(argv[i], "--require-amx"))
            need_amx = 1;
        else if (!strcmp(argv[i], "--variants") && argc == 2)
            return print_variants();
        else {
            fprintf(stderr, "usage: %s [--require-gpu] [--require-amx] | --variants\n", argv[0]);
            return 2;
        }
    }
    printf("ompk:      %s, built by %s\n", ompk_version(), ompk_compiler());
    const char *archs = ompk_offload_archs();
    printf("offload:   %s\n", archs[0] ? archs : "none (host-only build)");
    const char *policy = getenv("OMP_TARGET_OFFLOAD");
    printf("OMP_TARGET_OFFLOAD=%s\n", policy ? policy : "(unset)");
    int ndev = omp_get_num_devices();
    printf("devices:   %d OpenMP offload device(s)\n", ndev);
    for (int d = 0; d < ndev; d++) {
        int r = ompk_probe_device(d);
        printf("           device %d: %s\n", d,
               r == 1 ? "image loaded, kernel ran on the device"
                      : "ERROR: kernel fell back to the host (no compatible image?)");
        if (r != 1) rc = 1;
        ompk_gpu_prepare(d);
        printf("           device %d waits by: %s (OMPK_GPU_WAIT)\n", d, ompk_gpu_wait_mode(d));
        const long long stack = ompk_gpu_stack_limit(d), wanted = ompk_gpu_stack_wanted();
        if (stack > 0)
            printf("           device %d thread stack: %lld bytes (CU_LIMIT_STACK_SIZE; %s)\n", d,
                   stack, wanted ? "ompk raises it in GCC offload builds" : "the runtime's");
        else
            printf("           device %d thread stack: %s\n", d,
                   stack == 0 ? "no context yet" : "unknown (no CUDA driver or context)");
    }
    if (ndev == 0) explain_no_device(archs);
    if (need_gpu && ndev == 0) {
        printf("ERROR: --require-gpu but no OpenMP device is visible\n");
        rc = 1;
    }
    const ompk_cpu_features *f = ompk_cpu_get();
    printf("cpu isa:   avx2=%d fma=%d avx512f=%d avx512bw=%d avx512vl=%d avx512_bf16=%d "
           "avx512_vnni=%d\n",
           f->avx2, f->fma, f->avx512f, f->avx512bw, f->avx512vl, f->avx512_bf16, f->avx512_vnni);
    printf("amx:       tile=%d bf16=%d int8=%d, XTILEDATA permission: %s\n", f->amx_tile,
           f->amx_bf16, f->amx_int8,
           !f->amx_tile       ? "n/a"
           : f->amx_permitted ? "granted"
                              : "REFUSED");
    if (need_amx && !ompk_cpu_amx_usable()) {
        printf("ERROR: --require-amx but AMX is not usable here\n");
        rc = 1;
    }
    printf("threads:   %d OpenMP host threads\n", omp_get_max_threads());
    print_topology();
    printf("status:    %s\n", rc ? "BROKEN" : "ok");
    return rc;
}
