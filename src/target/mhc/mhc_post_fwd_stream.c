/* mHC post forward, streaming GPU kernels (mhc_post_kern.h): the defaults for n <= 4, and the
 * alternatives the benchmark sweeps at n = 4 (the mhc_post_fwd entries of the same names, lab
 * builds only).
 *
 * Configurations are (U chunks per thread and step, hint level); the defaults are the fastest of
 * the sweep (timings and register counts: bench/results/INDEX.md, Decisions). ptxas interleaves
 * the n outputs of a chunk, so registers grow slower than the bytes in flight: U4 bf16 keeps 320
 * bytes of loads in flight per thread, 120 KB per multiprocessor. At n = 4 bf16 takes U4/plain;
 * n < 4 keeps U4/nc-cs, the configuration the sweep's GPU tests ran for them. f32 (a chunk is two
 * 16-byte words per stream) takes U2/nc-cs. A file of its own so it compiles beside
 * mhc_post_fwd.c. */
#include "mhc_post_kern.h"

#define MHC_N_MAX 4
#define MHC_N_INC "mhc_post_fwd_stream_n.inc"
#include "mhc_each_n.inc"

/* clang-format off */
static const ompk_mhc_post_stream_cfg cfgs[] = {
    {NULL, 1, 1, 4, bf16_1_u4c}, {NULL, 2, 1, 4, bf16_2_u4c}, {NULL, 3, 1, 4, bf16_3_u4c},
    {NULL, 4, 1, 4, bf16_4_u4},  {NULL, 1, 0, 2, f32_1_u2c},  {NULL, 2, 0, 2, f32_2_u2c},
    {NULL, 3, 0, 2, f32_3_u2c},  {NULL, 4, 0, 2, f32_4_u2c},
#ifdef OMPK_LAB
    {"u1c", 4, 1, 1, bf16_4_u1c}, {"u2c", 4, 1, 2, bf16_4_u2c}, {"u4c", 4, 1, 4, bf16_4_u4c},
    {"u4p", 4, 1, 4, bf16_4_u4p}, {"f32u1c", 4, 0, 1, f32_4_u1c},
#endif
};
/* clang-format on */

const ompk_mhc_post_stream_cfg *ompk_mhc_post_stream_list(int *count) {
    *count = (int)(sizeof cfgs / sizeof cfgs[0]);
    return cfgs;
}
