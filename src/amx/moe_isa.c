/* CPU features of the MoE paths, from the one detector (cpu.c: CPUID, the OS-saved state and, for
 * AMX, the per-process XTILEDATA permission; a refusal means no AMX). */
#include "cpu.h"
#include "moe_internal.h"

/* AVX-512 F/BW/VL with VNNI and BF16: the x86-64-v4 passes and the avx512bf16 kernel */
int moe_cpu_has_avx512(void) {
    const ompk_cpu_features *f = ompk_cpu_get();
    return f->avx512f && f->avx512bw && f->avx512vl && f->avx512_vnni && f->avx512_bf16;
}

int moe_cpu_has_amx(void) {
    const ompk_cpu_features *f = ompk_cpu_get();
    return moe_cpu_has_avx512() && ompk_cpu_amx_usable() && f->amx_bf16 && f->amx_int8;
}
