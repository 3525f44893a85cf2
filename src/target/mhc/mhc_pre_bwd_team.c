/* The portable GPU stage 4 of the pre backward on teams (mhc_pre_bwd_team.h), in a file of its
 * own: beside the other pre backward launches it raised their register counts. */
#include <omp.h>

#include "mhc_pre_bwd_team.h"

#define MHC_N_INC "mhc_pre_bwd_team_n.inc"
#include "mhc_each_n.inc"

void mhc_pre_bwd_team_stage4(ompk_exec ex, int n, const bwd_io *io, const bwd_team_geom *g,
                             const char *x, const char *dh, const char *gxp, char *dx,
                             const float *phi, const float *gamma, const float *h_pre,
                             const float *dhm_ws, const float *coef, float *pw) {
#define BWD_TEAM(N)                                                                                \
    bwd_team_launch_##N(ex, io, g, x, dh, gxp, dx, phi, gamma, h_pre, dhm_ws, coef, pw)
    MHC_SWITCH_N(n, BWD_TEAM)
#undef BWD_TEAM
}
