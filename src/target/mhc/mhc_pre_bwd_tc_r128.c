/* Lab builds only (CMakeLists.txt: OMPK_LAB). Tensor-core stage 4 of the mHC pre backward capped at
 * 128 registers (CMakeLists.txt): a few spilled words, 4 teams an SM; the mhc_pre_bwd entry tc-r128
 * (benchmarks). */
#define BWD_TC_STAGE4_FN mhc_pre_bwd_tc_stage4_r128
#include "mhc_pre_bwd_tc_launch.inc"
