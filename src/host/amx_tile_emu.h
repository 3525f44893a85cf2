/* Internal: a C emulation of the AMX tile registers, following the instruction definitions, so
 * CI (no AMX) runs the tile kernels' own code (configuration, shapes, strides, packed operand
 * addressing): TILELOADD/TILESTORED move rows x colsb bytes with a byte stride; TDPBF16PS adds,
 * per row m and column n, for each k pair: a.bf16[2k]*b[k].bf16[2n] then
 * a.bf16[2k+1]*b[k].bf16[2n+1] in fp32. Shape rules the hardware enforces (#UD) abort here, so a
 * wrong configuration fails CI instead of the Xeon. Each including file gets its own per-thread
 * tile state. */
#ifndef OMPK_AMX_TILE_EMU_H
#define OMPK_AMX_TILE_EMU_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"

typedef struct amx_emu_tiles {
    int palette;
    int rows[8];
    int colsb[8];
    uint8_t t[8][16][64];
} amx_emu_tiles;

static _Thread_local amx_emu_tiles amx_emu_tf;

static inline void amx_emu_die(const char *what, int i) {
    fprintf(stderr, "ompk AMX emulation: invalid %s (tile %d)\n", what, i);
    abort();
}

static inline void amx_emu_cfg(const uint8_t *c) {
    if (c[0] != 1) amx_emu_die("palette", -1);
    amx_emu_tf.palette = 1;
    for (int i = 0; i < 8; i++) {
        amx_emu_tf.colsb[i] = c[16 + 2 * i] | (c[17 + 2 * i] << 8);
        amx_emu_tf.rows[i] = c[48 + i];
        if (amx_emu_tf.colsb[i] > 64 || amx_emu_tf.rows[i] > 16) amx_emu_die("tile shape", i);
    }
    memset(amx_emu_tf.t, 0, sizeof amx_emu_tf.t);
}

/* TILERELEASE: back to the init state, where every tile instruction faults. */
static inline void amx_emu_release(void) {
    memset(&amx_emu_tf, 0, sizeof amx_emu_tf);
}

static inline void amx_emu_check(int i) {
    if (amx_emu_tf.palette != 1 || i < 0 || i > 7 || amx_emu_tf.rows[i] == 0)
        amx_emu_die("tile use", i);
}

static inline void amx_emu_load(int i, const void *p, int64_t stride) {
    amx_emu_check(i);
    for (int r = 0; r < amx_emu_tf.rows[i]; r++)
        memcpy(amx_emu_tf.t[i][r], (const uint8_t *)p + r * stride, (size_t)amx_emu_tf.colsb[i]);
}

static inline void amx_emu_store(int i, void *p, int64_t stride) {
    amx_emu_check(i);
    for (int r = 0; r < amx_emu_tf.rows[i]; r++)
        memcpy((uint8_t *)p + r * stride, amx_emu_tf.t[i][r], (size_t)amx_emu_tf.colsb[i]);
}

static inline void amx_emu_zero(int i) {
    amx_emu_check(i);
    memset(amx_emu_tf.t[i], 0, sizeof amx_emu_tf.t[i]);
}

static inline void amx_emu_shapes(int c, int a, int b) {
    amx_emu_check(c);
    amx_emu_check(a);
    amx_emu_check(b);
    const amx_emu_tiles *t = &amx_emu_tf;
    if (t->rows[c] != t->rows[a] || t->colsb[a] / 4 != t->rows[b] || t->colsb[c] != t->colsb[b] ||
        c == a || c == b || a == b)
        amx_emu_die("dot-product shapes", c);
}

static inline void amx_emu_dpbf16(int c, int a, int b) {
    amx_emu_shapes(c, a, b);
    amx_emu_tiles *t = &amx_emu_tf;
    for (int m = 0; m < t->rows[c]; m++)
        for (int kp = 0; kp < t->colsb[a] / 4; kp++)
            for (int n = 0; n < t->colsb[c] / 4; n++) {
                float acc, x[2], y[2];
                uint16_t ab[2], bb[2];
                memcpy(&acc, &t->t[c][m][n * 4], 4);
                memcpy(ab, &t->t[a][m][kp * 4], 4);
                memcpy(bb, &t->t[b][kp][n * 4], 4);
                for (int j = 0; j < 2; j++) {
                    x[j] = ompk_bf16_to_f32(ab[j]);
                    y[j] = ompk_bf16_to_f32(bb[j]);
                }
                /* a bf16*bf16 product is exact in fp32, so this is the fused result */
                acc += x[0] * y[0];
                acc += x[1] * y[1];
                memcpy(&t->t[c][m][n * 4], &acc, 4);
            }
}

#endif
