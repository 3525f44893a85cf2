/* Launch probe: the fixed cost of one synchronous target region on a GPU, in each form ompk
 * kernels take. Small calls (a router batch, one decode token) pay it in full, so it is the
 * floor under every "ms" figure of the GPU backend and is reported beside them. */
#include <stdio.h>

#include "bench.h"
#include "probe.h"

typedef struct launch_arg {
    int dev;
    ompk_probe_form form;
    int *word;
} launch_arg;

static ompk_status launch_call(void *p) {
    launch_arg *a = p;
    return ompk_probe_launch(a->dev, a->form, a->word) == 0 ? OMPK_OK : OMPK_ERR_RUNTIME;
}

static int bench_launch(ompk_bench_ctx *ctx) {
    static const struct {
        ompk_probe_form form;
        const char *name;
    } forms[] = {{OMPK_PROBE_BARE, "bare"},
                 {OMPK_PROBE_COMBINED, "combined"},
                 {OMPK_PROBE_NOWAIT, "combined_nowait_taskwait"},
                 {OMPK_PROBE_STRUCT, "combined_struct512"}};
    launch_arg a = {ctx->dev.id, OMPK_PROBE_BARE, ompk_bench_alloc_random(ctx, OMPK_I32, 1, 1)};
    if (!a.word) return 1;
    int rc = 0;
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        a.form = forms[i].form;
        double mn;
        double ms = ompk_bench_time(ctx, launch_call, &a, &mn);
        if (ms < 0) {
            rc = 1;
            continue;
        }
        ompk_bench_record r = {0};
        r.kernel = "launch_overhead";
        r.dtype = "i32";
        r.shape = "1 team";
        r.variant = forms[i].name;
        r.ms = ms, r.ms_min = mn, r.extra_mem_bytes = 0;
        ompk_bench_emit(ctx, &r);
    }
    ompk_bench_free(ctx, a.word);
    return rc;
}

OMPK_BENCH_REGISTER(bench_launch, "launch_overhead", 0, 1)
