/* Launch 1 of the portable pre forward (mhc_pre_tile.h): one team an item on a GPU; on the host
 * one team of PTL_T threads walks them all. */
#include "mhc_pre_tile.h"

#define MHC_N_INC "mhc_pre_tile_n.inc"
#include "mhc_each_n.inc"

void mhc_pre_tile_gemm(ompk_exec ex, int n, const pre_tile_geom *g, const char *x, const float *wg,
                       float *part, int64_t NC) {
#define PTL_GEMM(N) pre_tile_gemm_##N(ex, g, x, wg, part, NC)
    MHC_SWITCH_N(n, PTL_GEMM)
#undef PTL_GEMM
}
