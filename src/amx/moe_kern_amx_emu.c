/* The AMX tile kernel (moe_amx_tmpl.h) on the C emulation of the tile registers (amx_tile_emu.h);
 * TDPBSSD adds the four s8*s8 products of each quad to an int32. */
#include <math.h>

#include "amx_tile_emu.h"
#include "moe_internal.h"

static void emu_dpbssd(int c, int a, int b) {
    amx_emu_shapes(c, a, b);
    for (int m = 0; m < amx_emu_tf.rows[c]; m++)
        for (int kq = 0; kq < amx_emu_tf.colsb[a] / 4; kq++)
            for (int n = 0; n < amx_emu_tf.colsb[c] / 4; n++) {
                int32_t acc;
                memcpy(&acc, &amx_emu_tf.t[c][m][n * 4], 4);
                for (int j = 0; j < 4; j++)
                    acc += (int32_t)(int8_t)amx_emu_tf.t[a][m][kq * 4 + j] *
                           (int32_t)(int8_t)amx_emu_tf.t[b][kq][n * 4 + j];
                memcpy(&amx_emu_tf.t[c][m][n * 4], &acc, 4);
            }
}

static void emu_unpack4(uint8_t *dst, const uint8_t *src, const uint8_t *z) {
    for (int r = 0; r < 16; r++)
        for (int j = 0; j < 64; j++) {
            uint8_t b = src[r * 32 + (j & 31)];
            dst[r * 64 + j] = (uint8_t)((j < 32 ? (b & 15) : (b >> 4)) - z[j]);
        }
}

#define MOE_AMX_FN
#define MOE_AMX_NAME moe_kern_amx_emu
#define MOE_AMX_NAME_N moe_kern_amx_emu_n
#define MOE_AMX_FLUSH moe_amx_emu_flush
#define T_CFG(c) amx_emu_cfg(c)
#define T_LOAD(i, p, s) amx_emu_load(i, p, s)
#define T_STORE(i, p, s) amx_emu_store(i, p, s)
#define T_ZERO(i) amx_emu_zero(i)
#define T_DPBF16(c, a, b) amx_emu_dpbf16(c, a, b)
#define T_DPBSSD(c, a, b) emu_dpbssd(c, a, b)
#define T_UNPACK4(d, s, z) emu_unpack4(d, s, z)
#define T_PF(p0, p1, n) ((void)(p0), (void)(p1), (void)(n))
#define T_PF1(p) ((void)(p))
#define MOE_AMX_PIPE moe_amx_emu_pipe

#include "moe_amx_tmpl.h"
