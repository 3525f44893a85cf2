/* Internal: the one way the mHC kernels make the stream count n a compile-time constant. A kernel
 * is made per lexical target construct, and only a literal n gives the per-stream register arrays
 * constant extents (a run-time n sizes every kernel for n = 8 and spills to local memory). So the
 * code of one n is a body file that mhc_each_n.inc includes once per n = 1..MHC_N_MAX with MHC_N
 * defined as n, naming its functions MHC_CAT(name, MHC_N); MHC_SWITCH_N_UPTO(max, n, CALL) runs
 * CALL(<literal n>) for the run-time n (n >= max takes max), MHC_SWITCH_N for max = 8. */
#ifndef OMPK_MHC_EACH_N_H
#define OMPK_MHC_EACH_N_H

#define MHC_CAT_(a, b) a##_##b
#define MHC_CAT(a, b) MHC_CAT_(a, b)

// clang-format off
#define MHC_ARM_(N, CALL) case N: CALL(N); break;
#define MHC_ARMS_1(CALL)
#define MHC_ARMS_2(CALL) MHC_ARMS_1(CALL) MHC_ARM_(1, CALL)
#define MHC_ARMS_3(CALL) MHC_ARMS_2(CALL) MHC_ARM_(2, CALL)
#define MHC_ARMS_4(CALL) MHC_ARMS_3(CALL) MHC_ARM_(3, CALL)
#define MHC_ARMS_5(CALL) MHC_ARMS_4(CALL) MHC_ARM_(4, CALL)
#define MHC_ARMS_6(CALL) MHC_ARMS_5(CALL) MHC_ARM_(5, CALL)
#define MHC_ARMS_7(CALL) MHC_ARMS_6(CALL) MHC_ARM_(6, CALL)
#define MHC_ARMS_8(CALL) MHC_ARMS_7(CALL) MHC_ARM_(7, CALL)
#define MHC_SWITCH_N_(max, n, CALL) switch (n) { MHC_ARMS_##max(CALL) default: CALL(max); break; }
// clang-format on
#define MHC_SWITCH_N_UPTO(max, n, CALL) MHC_SWITCH_N_(max, n, CALL)
#define MHC_SWITCH_N(n, CALL) MHC_SWITCH_N_UPTO(8, n, CALL)

#endif
