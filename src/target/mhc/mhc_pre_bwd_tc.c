/* Tensor-core stage 4 of the mHC pre backward, capped at 168 registers (CMakeLists.txt): no
 * spills, 3 teams of 4 warps an SM. */
#define BWD_TC_STAGE4_FN mhc_pre_bwd_tc_stage4
#include "mhc_pre_bwd_tc_launch.inc"
