/* mHC references: straight loops over logical indices, double accumulation. */
#include "mhc_ref.h"
#include "verify.h"

void ompk_ref_mhc_post_fwd(const ompk_tensor *x, const ompk_tensor *comb, const ompk_tensor *post,
                           const ompk_tensor *f, double *out) {
    const int64_t B = x->shape[0], S = x->shape[1], n = x->shape[2], D = x->shape[3];
    for (int64_t t = 0; t < B * S; t++)
        for (int64_t o = 0; o < n; o++)
            for (int64_t d = 0; d < D; d++) {
                double acc = ompk_host_get(post, t * n + o) * ompk_host_get(f, t * D + d);
                for (int64_t i = 0; i < n; i++)
                    acc += ompk_host_get(comb, (t * n + i) * n + o) *
                           ompk_host_get(x, (t * n + i) * D + d);
                out[(t * n + o) * D + d] = acc;
            }
}
