/* Portable C kernel over the packed tiles (any CPU). Same group/scale arithmetic as the vector
 * paths: exact int32 dot per group, then fmaf(scale, (float)dot, acc), then * row scale. */
#include <math.h>
#include <string.h>

#include "bf16.h"
#include "moe_internal.h"

static int8_t wcode(const moe_kargs *k, int s, const uint8_t *tile, int g, int kq, int j) {
    if (k->fmt == OMPK_MOE_INT8) return (int8_t)tile[kq * 64 + j];
    uint8_t b = tile[kq * 32 + (j & 31)];
    int c = j < 32 ? (b & 15) : (b >> 4);
    return (int8_t)(c - (int)k->z[s][(size_t)g * k->zstride + j]);
}

void moe_kern_portable(const moe_kargs *k) {
    for (int s = 0; s < 2; s++) {
        for (int r = 0; r < k->m; r++) {
            float *o = k->out + (s * 32 + r) * 16;
            const uint8_t *arow = k->a + r * k->lda;
            if (k->fmt == OMPK_MOE_BF16) {
                float acc[16] = {0};
                for (int t = 0; t < k->kt; t++) {
                    const uint8_t *tile = k->b[s] + t * k->bstride;
                    for (int kp = 0; kp < 16; kp++) {
                        uint16_t a2[2];
                        memcpy(a2, arow + t * 64 + kp * 4, 4);
                        float x0 = ompk_bf16_to_f32(a2[0]), x1 = ompk_bf16_to_f32(a2[1]);
                        for (int n = 0; n < 16; n++) {
                            uint16_t w2[2];
                            memcpy(w2, tile + kp * 64 + n * 4, 4);
                            /* exact bf16 products: one rounding per add, as fused */
                            acc[n] += x0 * ompk_bf16_to_f32(w2[0]);
                            acc[n] += x1 * ompk_bf16_to_f32(w2[1]);
                        }
                    }
                }
                memcpy(o, acc, sizeof acc);
                continue;
            }
            float acc[16] = {0};
            int32_t dot[16] = {0};
            int g0 = k->ktg0 / k->ktpg, gcur = 0;
            for (int t = 0; t < k->kt; t++) {
                int g = (k->ktg0 + t) / k->ktpg - g0;
                if (g != gcur) {
                    for (int n = 0; n < 16; n++) {
                        acc[n] =
                            fmaf(k->s[s][(size_t)gcur * k->sstride + n], (float)dot[n], acc[n]);
                        dot[n] = 0;
                    }
                    gcur = g;
                }
                const uint8_t *tile = k->b[s] + t * k->bstride;
                for (int kq = 0; kq < 16; kq++)
                    for (int n = 0; n < 16; n++)
                        for (int j = 0; j < 4; j++)
                            dot[n] += (int32_t)(int8_t)arow[t * 64 + kq * 4 + j] *
                                      wcode(k, s, tile, g, kq, n * 4 + j);
            }
            for (int n = 0; n < 16; n++) {
                acc[n] = fmaf(k->s[s][(size_t)gcur * k->sstride + n], (float)dot[n], acc[n]);
                o[n] = acc[n] * k->ascale[r];
            }
        }
    }
}
