/* Internal: host CPU features from CPUID, and the AMX tile-data permission. */
#ifndef OMPK_CPU_H
#define OMPK_CPU_H

typedef struct ompk_cpu_features {
    int avx2, fma, avx512f, avx512bw, avx512vl, avx512_bf16, avx512_vnni;
    int amx_tile, amx_bf16, amx_int8;
    int amx_permitted;        /* the kernel granted XTILEDATA to this process (checked once) */
    int amx_permission_errno; /* errno of a refused request, 0 otherwise */
} ompk_cpu_features;

/* Detected once per process (thread-safe); AMX use requests the permission on first call. */
const ompk_cpu_features *ompk_cpu_get(void);

/* 1 when AMX tiles are present and usable by this process. */
int ompk_cpu_amx_usable(void);

#endif
