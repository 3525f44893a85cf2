/* Internal: the one AMX tile configuration of ompk's tile kernels (MoE experts, host attention):
 * palette 1, all eight tiles 16 rows x 64 bytes. */
#ifndef OMPK_AMX_TILE_CFG_H
#define OMPK_AMX_TILE_CFG_H

#include <stdint.h>

static inline void ompk_amx_cfg_full(uint8_t cfg[64]) {
    for (int i = 0; i < 64; i++) cfg[i] = 0;
    cfg[0] = 1;
    for (int i = 0; i < 8; i++) {
        cfg[16 + 2 * i] = 64;
        cfg[48 + i] = 16;
    }
}

/* T_CFG of the real-tile builds. GCC 12's _tile_loadconfig names only the first 8 bytes of the
 * configuration as the asm's input, so GCC may drop the stores to the rest as dead (it did in the
 * attention kernels: tiles left unconfigured, a signal at the first tile load); the empty asm with
 * a "memory" clobber keeps all 64 bytes. */
#define OMPK_AMX_LOADCFG(c)                                                                        \
    do {                                                                                           \
        __asm__ volatile("" : : "r"(c) : "memory");                                                \
        _tile_loadconfig(c);                                                                       \
    } while (0)

#endif
