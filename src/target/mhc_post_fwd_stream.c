/* mHC post forward, streaming GPU kernels (mhc_post_kern.h): the defaults for n <= 4, and the
 * alternatives the benchmark sweeps at n = 4 (OMPK_MHC_POST_VARIANT names them).
 *
 * Configurations are (U chunks per thread and step, hint level). On the H200, B4 S4096 n4 D4096
 * bf16 (2026-11-21, bench/results/2026-11-21-s2-mhcpost-*.json, medians of 20 synchronous calls,
 * copy bandwidth of the same run 4021 GB/s): U4/plain 0.332 ms (90.7% of copy), U2/nc-cs with
 * 128 threads 0.335, U2/nc-cs 0.338, U1/nc-cs 0.341, U4/nc-cs 0.353-0.368, U4/L2-256B 0.377;
 * the first bare kernel 0.375. ptxas (sm_90): U4 nc/cs 130 registers, U4 plain 168 (both three
 * 128-thread teams per multiprocessor), U2 128, U1 109, the first bare kernel 95 (two 256-thread
 * teams). ptxas interleaves the n outputs of a chunk, so registers grow slower than the bytes in
 * flight: U4 bf16 keeps 320 bytes of loads in flight per thread, 120 KB per multiprocessor. At
 * n = 4 bf16 takes U4/plain; n < 4 keeps U4/nc-cs, the configuration the sweep's GPU tests ran for
 * them. f32 (a chunk is two 16-byte words per stream) takes U2/nc-cs: 0.763 ms against 0.863 for
 * the first bare kernel (medians; the minimums favoured the bare kernel, 0.672 against 0.736). A
 * file of its own so it compiles beside mhc_post_fwd.c. */
#include "mhc_post_kern.h"

POST_STREAM_KERNEL(1, 1, 4, 1, bf16_1_u4c)
POST_STREAM_KERNEL(2, 1, 4, 1, bf16_2_u4c)
POST_STREAM_KERNEL(3, 1, 4, 1, bf16_3_u4c)
POST_STREAM_KERNEL(4, 1, 4, 0, bf16_4_u4)
POST_STREAM_KERNEL(1, 0, 2, 1, f32_1_u2c)
POST_STREAM_KERNEL(2, 0, 2, 1, f32_2_u2c)
POST_STREAM_KERNEL(3, 0, 2, 1, f32_3_u2c)
POST_STREAM_KERNEL(4, 0, 2, 1, f32_4_u2c)
POST_STREAM_KERNEL(4, 1, 1, 1, bf16_4_u1c)
POST_STREAM_KERNEL(4, 1, 2, 1, bf16_4_u2c)
POST_STREAM_KERNEL(4, 1, 4, 1, bf16_4_u4c)
POST_STREAM_KERNEL(4, 1, 4, 2, bf16_4_u4p)
POST_STREAM_KERNEL(4, 0, 1, 1, f32_4_u1c)

static const ompk_mhc_post_stream_cfg cfgs[] = {
    {NULL, 1, 1, 4, bf16_1_u4c},    {NULL, 2, 1, 4, bf16_2_u4c},  {NULL, 3, 1, 4, bf16_3_u4c},
    {NULL, 4, 1, 4, bf16_4_u4},     {NULL, 1, 0, 2, f32_1_u2c},   {NULL, 2, 0, 2, f32_2_u2c},
    {NULL, 3, 0, 2, f32_3_u2c},     {NULL, 4, 0, 2, f32_4_u2c},   {"u1c", 4, 1, 1, bf16_4_u1c},
    {"u2c", 4, 1, 2, bf16_4_u2c},   {"u4c", 4, 1, 4, bf16_4_u4c}, {"u4p", 4, 1, 4, bf16_4_u4p},
    {"f32u1c", 4, 0, 1, f32_4_u1c},
};

const ompk_mhc_post_stream_cfg *ompk_mhc_post_stream_list(int *count) {
    *count = (int)(sizeof cfgs / sizeof cfgs[0]);
    return cfgs;
}
