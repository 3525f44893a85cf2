/* The AMX tile kernel (moe_amx_tmpl.h) on a C emulation of the tile registers, following the
 * instruction definitions: TILELOADD/TILESTORED move rows x colsb bytes with a byte stride;
 * TDPBF16PS adds, per row m and column n, for each k pair: a.bf16[2k]*b[k].bf16[2n] then
 * a.bf16[2k+1]*b[k].bf16[2n+1] in fp32; TDPBSSD adds the four s8*s8 products of each quad to
 * an int32. Shape rules the hardware enforces (#UD) abort here, so a wrong configuration fails
 * CI instead of the Xeon. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "moe_internal.h"

typedef struct emu_tiles {
    int palette;
    int rows[8];
    int colsb[8];
    uint8_t t[8][16][64];
} emu_tiles;

static _Thread_local emu_tiles tf;

static void emu_die(const char *what, int i) {
    fprintf(stderr, "ompk moe AMX emulation: invalid %s (tile %d)\n", what, i);
    abort();
}

static void emu_cfg(const uint8_t *c) {
    if (c[0] != 1) emu_die("palette", -1);
    tf.palette = 1;
    for (int i = 0; i < 8; i++) {
        tf.colsb[i] = c[16 + 2 * i] | (c[17 + 2 * i] << 8);
        tf.rows[i] = c[48 + i];
        if (tf.colsb[i] > 64 || tf.rows[i] > 16) emu_die("tile shape", i);
    }
    memset(tf.t, 0, sizeof tf.t);
}

static void emu_check(int i) {
    if (tf.palette != 1 || i < 0 || i > 7 || tf.rows[i] == 0) emu_die("tile use", i);
}

static void emu_load(int i, const void *p, int64_t stride) {
    emu_check(i);
    for (int r = 0; r < tf.rows[i]; r++)
        memcpy(tf.t[i][r], (const uint8_t *)p + r * stride, (size_t)tf.colsb[i]);
}

static void emu_store(int i, void *p, int64_t stride) {
    emu_check(i);
    for (int r = 0; r < tf.rows[i]; r++)
        memcpy((uint8_t *)p + r * stride, tf.t[i][r], (size_t)tf.colsb[i]);
}

static void emu_zero(int i) {
    emu_check(i);
    memset(tf.t[i], 0, sizeof tf.t[i]);
}

static void emu_shapes(int c, int a, int b) {
    emu_check(c);
    emu_check(a);
    emu_check(b);
    if (tf.rows[c] != tf.rows[a] || tf.colsb[a] / 4 != tf.rows[b] || tf.colsb[c] != tf.colsb[b] ||
        c == a || c == b || a == b)
        emu_die("dot-product shapes", c);
}

static void emu_dpbf16(int c, int a, int b) {
    emu_shapes(c, a, b);
    for (int m = 0; m < tf.rows[c]; m++)
        for (int kp = 0; kp < tf.colsb[a] / 4; kp++)
            for (int n = 0; n < tf.colsb[c] / 4; n++) {
                float acc, x[2], y[2];
                uint16_t ab[2], bb[2];
                memcpy(&acc, &tf.t[c][m][n * 4], 4);
                memcpy(ab, &tf.t[a][m][kp * 4], 4);
                memcpy(bb, &tf.t[b][kp][n * 4], 4);
                for (int j = 0; j < 2; j++) {
                    x[j] = ompk_bf16_to_f32(ab[j]);
                    y[j] = ompk_bf16_to_f32(bb[j]);
                }
                /* a bf16*bf16 product is exact in fp32, so this is the fused result */
                acc += x[0] * y[0];
                acc += x[1] * y[1];
                memcpy(&tf.t[c][m][n * 4], &acc, 4);
            }
}

static void emu_dpbssd(int c, int a, int b) {
    emu_shapes(c, a, b);
    for (int m = 0; m < tf.rows[c]; m++)
        for (int kq = 0; kq < tf.colsb[a] / 4; kq++)
            for (int n = 0; n < tf.colsb[c] / 4; n++) {
                int32_t acc;
                memcpy(&acc, &tf.t[c][m][n * 4], 4);
                for (int j = 0; j < 4; j++)
                    acc += (int32_t)(int8_t)tf.t[a][m][kq * 4 + j] *
                           (int32_t)(int8_t)tf.t[b][kq][n * 4 + j];
                memcpy(&tf.t[c][m][n * 4], &acc, 4);
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
#define T_CFG(c) emu_cfg(c)
#define T_LOAD(i, p, s) emu_load(i, p, s)
#define T_STORE(i, p, s) emu_store(i, p, s)
#define T_ZERO(i) emu_zero(i)
#define T_DPBF16(c, a, b) emu_dpbf16(c, a, b)
#define T_DPBSSD(c, a, b) emu_dpbssd(c, a, b)
#define T_UNPACK4(d, s, z) emu_unpack4(d, s, z)
#define T_PF(p0, p1, n) ((void)(p0), (void)(p1), (void)(n))
#define T_PF1(p) ((void)(p))
#define MOE_AMX_PIPE moe_amx_emu_pipe

#include "moe_amx_tmpl.h"
