/* Whether a [B,H,L,dh] attention operand holds only finite values: the tensor-core kernels ask
 * it under a causal mask, where a masked pair's P (or dS) = 0 meets the operand inside an mma
 * and 0 * inf or 0 * NaN would leak into rows that do not see it; the portable kernels, which
 * select instead of multiply, take such calls. One read of the operand (the kernels read it
 * once per query or key block), an integer OR reduction. */
#include <stdint.h>

#include "attention_kernels.h"

int ompk_attn_all_finite(ompk_exec ex, const void *x, int bf16, int64_t B, int64_t H, int64_t L,
                         int64_t dh, const int64_t s[3]) {
    const int64_t n = B * H * L * dh, s0 = s[0], s1 = s[1], s2 = s[2];
    int bad = 0;
    if (n == 0) return 1;
#pragma omp target teams distribute parallel for reduction(| : bad) if (target : ex.on_target)     \
    device(ex.device) is_device_ptr(x) thread_limit(256)
    for (int64_t e = 0; e < n; e++) {
        const int64_t d = e % dh, r = e / dh, l = r % L, bh = r / L;
        const int64_t o = (bh / H) * s0 + (bh % H) * s1 + l * s2 + d;
        bad |= bf16 ? (((const uint16_t *)x)[o] & 0x7f80u) == 0x7f80u
                    : (((const uint32_t *)x)[o] & 0x7f800000u) == 0x7f800000u;
    }
    return !bad;
}
