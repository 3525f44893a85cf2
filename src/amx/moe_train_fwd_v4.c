/* The training forward compiled for x86-64-v4 (CMakeLists.txt): moe_run_train_v4 and
 * moe_train_act_v4, which moe_run_train calls on CPUs with AVX-512. */
#define MOE_PASS_V4 1
#include "moe_train_fwd.c"
