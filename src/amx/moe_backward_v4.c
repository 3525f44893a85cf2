/* The backward engine compiled for x86-64-v4 (CMakeLists.txt): moe_run_backward_v4, which
 * moe_run_backward calls on CPUs with AVX-512. */
#define MOE_PASS_V4 1
#include "moe_backward.c"
