/* MoE experts: the CPU ISA list (variant.h), chosen once per layer at ompk_moe_create. The
 * default is the best the CPU offers; amx-emulated (AMX's tiling on AVX-512 or plain C, for
 * tests) runs only when named, through OMPK_ISA, OMPK_VARIANT=moe:<name> or the config's isa.
 * The entries carry no run: the layer keeps the ISA and its kernels dispatch on it. */
#include "moe_internal.h"
#include "variant.h"

static const ompk_impl impls[] = {
    {"amx", 0, moe_cpu_has_amx, NULL, NULL, NULL},
    {"avx512bf16", 0, moe_cpu_has_avx512, NULL, NULL, NULL},
    {"amx-emulated", 1, NULL, NULL, NULL, NULL},
    {"portable", 0, NULL, NULL, NULL, NULL},
};
const ompk_impl_list ompk_impls_moe = {impls, (int)(sizeof impls / sizeof impls[0])};
