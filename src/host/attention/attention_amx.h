/* Internal: the tile products of the AMX attention kernels (attention_amx_tmpl.h), compiled on the
 * AMX instructions (attention_amx.c) and on the tile emulation (attention_amx_emu.c); the rest of
 * the kernel (packing, softmax, schedule) is attention_amx.c's, shared by both.
 *
 * Operand layouts (bf16 as uint16_t, packed tiles of 16 x 16 uint32 = 1 KiB):
 * - rows: a [32][DP] or [32][64] bf16 block, row stride in bytes (an A operand as it is);
 * - "T" (transposed pairs, the B operand of X . Y^T): tile (nb, c) of Y holds, at [kp][n],
 *   Y[16nb + n][32c + 2kp .. +1]; tiles ordered nb-major, DP/32 per nb;
 * - "P" (row pairs, the B operand of X . Y): tile (s, dd) of Y holds, at [kp][n],
 *   Y[32s + 2kp][16dd + n] | Y[32s + 2kp + 1][16dd + n] << 16; DP/16 per s.
 * DP is dh rounded up to 32, the padding zero. */
#ifndef OMPK_ATTENTION_AMX_H
#define OMPK_ATTENTION_AMX_H

#include <stdint.h>

typedef struct atx_ops {
    void (*begin)(void); /* the tile configuration, on the calling thread */
    void (*end)(void);   /* tile release */
    /* c[32][64] f32 (row stride 256 bytes) = a[32][32 dc] . (the 64 rows of bt, "T", dc tiles
     * per 16 rows)^T */
    void (*nt)(float *c, const uint16_t *a, int64_t lda, const uint32_t *bt, int dc);
    /* c[32][16 d16] f32 (row stride ldc bytes) += a[32][32 ks] . (the 32 ks rows of bp, "P",
     * d16 tiles per 32 rows); d16 even */
    void (*acc)(float *c, int64_t ldc, const uint16_t *a, int64_t lda, const uint32_t *bp, int ks,
                int d16);
} atx_ops;

extern const atx_ops ompk_atx_amx_ops, ompk_atx_emu_ops;

#endif
