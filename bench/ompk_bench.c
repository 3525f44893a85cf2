/* ompk-bench: runs the registered entries on the host and on each OpenMP device and writes JSON.
 *   ompk-bench [--quick] [--backend host|gpu|all] [--filter S] [--reps N] [--warmup N]
 *              [--impl LIST] [--json FILE] [--list]
 *   (ompk-bench --help explains each flag)
 * Each pass first measures the copy bandwidth of its device (device-to-device copy on a GPU, a
 * parallel copy loop on the host), which every record is compared with, and the FP32 rate of
 * FMA-bound OpenMP code there (the peak probe), which every record carries for bench/matrix.py. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "bf16.h"
#include "probe.h"
#include "variant.h"

#define MAX_ENTRIES 128
static const ompk_bench_entry *entries[MAX_ENTRIES];
static int nentries;
static FILE *json;
static int first_record = 1;

/* --impl: the implementation names each pass runs its entries under ("default": none named) */
#define MAX_IMPLS 8
static const char *impls[MAX_IMPLS] = {"default"};
static int nimpls = 1;

/* what the closing summary counts */
static int records_host, records_gpu, failed_entries;
static double best_pct_bw[2] = {-1, -1}, best_tflops[2] = {-1, -1};
static const char *best_bw_kernel[2], *best_tf_kernel[2];

/* one column layout for the header and every record line */
#define ROW_FMT "%-5s %-28s %-5s %-30s %-14s %10s %10s %9s %9s %9s\n"

static void print_header(void) {
    printf(ROW_FMT, "where", "kernel", "dtype", "shape", "variant", "median ms", "GB/s", "% copy",
           "TFLOP/s", "% peak");
}

void ompk_bench_register(const ompk_bench_entry *e) {
    if (nentries < MAX_ENTRIES) entries[nentries++] = e;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double ompk_bench_time(ompk_bench_ctx *ctx, ompk_status (*call)(void *), void *arg,
                       double *min_ms) {
    for (int i = 0; i < ctx->warmup; i++) {
        ompk_status st = call(arg);
        if (st != OMPK_OK) {
            fprintf(stderr, "  call failed: %s: %s\n", ompk_status_str(st), ompk_last_error());
            return -1;
        }
    }
    double *t = malloc(sizeof(double) * (size_t)ctx->reps);
    for (int i = 0; i < ctx->reps; i++) {
        double t0 = omp_get_wtime();
        ompk_status st = call(arg);
        t[i] = (omp_get_wtime() - t0) * 1e3;
        if (st != OMPK_OK) {
            fprintf(stderr, "  call failed: %s: %s\n", ompk_status_str(st), ompk_last_error());
            free(t);
            return -1;
        }
    }
    qsort(t, (size_t)ctx->reps, sizeof(double), cmp_double);
    double med = ctx->reps % 2 ? t[ctx->reps / 2] : 0.5 * (t[ctx->reps / 2 - 1] + t[ctx->reps / 2]);
    if (min_ms) *min_ms = t[0];
    free(t);
    return med;
}

static void json_str(const char *k, const char *v, int comma) {
    fprintf(json, "\"%s\": ", k);
    if (v)
        fprintf(json, "\"%s\"", v);
    else
        fprintf(json, "null");
    if (comma) fputs(", ", json);
}

static void json_num(const char *k, double v, int comma) {
    if (isfinite(v))
        fprintf(json, "\"%s\": %.6g", k, v);
    else
        fprintf(json, "\"%s\": null", k);
    if (comma) fputs(", ", json);
}

/* The op whose implementation list ran a record's kernel: the op of the same name, or these. */
static const char *record_op(const char *kernel) {
    static const char *const alias[][2] = {{"router_topk_fwd", "router_fwd"},
                                           {"router_topk_bwd", "router_bwd"}};
    for (size_t i = 0; i < sizeof alias / sizeof alias[0]; i++)
        if (!strcmp(kernel, alias[i][0])) return alias[i][1];
    return kernel;
}

void ompk_bench_emit(ompk_bench_ctx *ctx, const ompk_bench_record *r) {
    double gbs = r->ms > 0 ? r->bytes / (r->ms * 1e6) : NAN;
    double tfs = r->ms > 0 && r->flops > 0 ? r->flops / (r->ms * 1e9) : NAN;
    double pct_bw = ctx->copy_gbs > 0 ? 100.0 * gbs / ctx->copy_gbs : NAN;
    double floor_ms = ctx->copy_gbs > 0 ? r->bytes / (ctx->copy_gbs * 1e6) : NAN;
    double peak = 0;
    if (r->peak && strcmp(r->peak, "fp32") == 0) peak = ctx->peak_fp32_tflops;
    if (r->peak && strcmp(r->peak, "bf16") == 0) peak = ctx->peak_bf16_tflops;
    double pct_peak = peak > 0 && isfinite(tfs) ? 100.0 * tfs / peak : NAN;
    char ms_s[32], gbs_s[32], bw_s[32], tfs_s[32], pk_s[32];
    snprintf(ms_s, sizeof ms_s, "%.4f", r->ms);
    snprintf(gbs_s, sizeof gbs_s, isfinite(gbs) ? "%.1f" : "-", gbs);
    snprintf(bw_s, sizeof bw_s, isfinite(pct_bw) ? "%.1f" : "-", pct_bw);
    snprintf(tfs_s, sizeof tfs_s, isfinite(tfs) ? "%.2f" : "-", tfs);
    if (isfinite(pct_peak))
        snprintf(pk_s, sizeof pk_s, "%.1f %s", pct_peak, r->peak);
    else
        snprintf(pk_s, sizeof pk_s, "-");
    printf(ROW_FMT, ctx->backend, r->kernel, r->dtype, r->shape, r->variant ? r->variant : "-",
           ms_s, gbs_s, bw_s, tfs_s, pk_s);
    const int b = ctx->dev.type == OMPK_HOST ? 0 : 1;
    if (b)
        records_gpu++;
    else
        records_host++;
    if (isfinite(pct_bw) && pct_bw > best_pct_bw[b])
        best_pct_bw[b] = pct_bw, best_bw_kernel[b] = r->kernel;
    if (isfinite(tfs) && tfs > best_tflops[b]) best_tflops[b] = tfs, best_tf_kernel[b] = r->kernel;
    if (!json) return;
    fputs(first_record ? "\n    {" : ",\n    {", json);
    first_record = 0;
    json_str("backend", ctx->backend, 1);
    json_str("kernel", r->kernel, 1);
    json_str("dtype", r->dtype, 1);
    json_str("shape", r->shape, 1);
    json_str("variant", r->variant, 1);
    json_num("ms", r->ms, 1);
    json_num("ms_min", r->ms_min, 1);
    json_num("bytes", r->bytes, 1);
    json_num("flops", r->flops, 1);
    json_num("gb_per_s", gbs, 1);
    json_num("tflop_per_s", tfs, 1);
    json_num("copy_gb_per_s", ctx->copy_gbs, 1);
    json_num("pct_of_copy_bw", pct_bw, 1);
    json_num("hbm_floor_ms", floor_ms, 1);
    json_num("pct_of_peak", pct_peak, 1);
    json_str("peak", r->peak, 1);
    json_num("extra_mem_bytes", r->extra_mem_bytes, 1);
    json_num("fp32_probe_tflops", ctx->fp32_probe, 1);
    json_str("impl", ompk_variant_ran(record_op(r->kernel)), 1);
    json_str("impl_named", ctx->impl ? ctx->impl : "default", 0);
    if (r->extra_json) fprintf(json, ", %s", r->extra_json);
    fputs("}", json);
    fflush(json);
}

void *ompk_bench_alloc_random(ompk_bench_ctx *ctx, ompk_dtype dtype, int64_t numel, uint64_t seed) {
    size_t bytes = (size_t)((numel * ompk_dtype_bits(dtype) + 7) / 8);
    unsigned char *h = malloc(bytes ? bytes : 1);
    if (!h) return NULL;
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 12345;
#pragma omp parallel for firstprivate(s)
    for (int64_t i = 0; i < numel; i++) {
        uint64_t z = s + (uint64_t)i * 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        float u = (float)((double)(z >> 11) * (2.0 / 9007199254740992.0) - 1.0);
        switch (dtype) {
        case OMPK_F32:
            ((float *)h)[i] = u;
            break;
        case OMPK_BF16:
            ((uint16_t *)h)[i] = ompk_f32_to_bf16(u);
            break;
        case OMPK_I32:
            ((int32_t *)h)[i] = (int32_t)(z % 1000);
            break;
        case OMPK_I8:
            ((int8_t *)h)[i] = (int8_t)(z & 0xff);
            break;
        default:
            h[i * ompk_dtype_bits(dtype) / 8] = (unsigned char)z;
            break;
        }
    }
    if (ctx->dev.type == OMPK_HOST) return h;
    void *d = ompk_malloc(ctx->dev, bytes);
    if (d) ompk_memcpy(d, ctx->dev, h, ompk_device_host(), bytes);
    free(h);
    return d;
}

void ompk_bench_free(ompk_bench_ctx *ctx, void *p) {
    if (ctx->dev.type == OMPK_HOST)
        free(p);
    else
        ompk_free(ctx->dev, p);
}

/* Copy bandwidth (bytes read + written per second) of the pass's device. */
static double measure_copy(ompk_bench_ctx *ctx) {
    size_t bytes = ctx->quick ? ((size_t)256 << 20) : ((size_t)2 << 30);
    if (ctx->dev.type == OMPK_HOST) bytes = ctx->quick ? ((size_t)256 << 20) : ((size_t)1 << 30);
    char *a = ompk_malloc(ctx->dev, bytes), *b = ompk_malloc(ctx->dev, bytes);
    if (!a || !b) return 0;
    double best = 1e30;
    for (int r = 0; r < 8; r++) {
        double t0 = omp_get_wtime();
        if (ctx->dev.type == OMPK_HOST) {
            const size_t nw = bytes / 8;
            const uint64_t *s = (const uint64_t *)a;
            uint64_t *d = (uint64_t *)b;
            if (r == 0) memset(a, 1, bytes);
#pragma omp parallel for
            for (size_t i = 0; i < nw; i++) d[i] = s[i];
        } else {
            ompk_memcpy(b, ctx->dev, a, ctx->dev, bytes);
        }
        double t = omp_get_wtime() - t0;
        if (r > 0 && t < best) best = t; /* first copy pays page faults / lazy init */
    }
    ompk_free(ctx->dev, a);
    ompk_free(ctx->dev, b);
    return 2.0 * (double)bytes / best / 1e9;
}

/* FP32 TFLOP/s of the peak probe on the pass's device: the best of three calls after one. */
static double measure_fma(ompk_bench_ctx *ctx) {
    const int dev = ctx->dev.type == OMPK_HOST ? -1 : ctx->dev.id;
    if (ompk_probe_fma(dev) <= 0) return 0;
    double best = 1e30, flops = 0;
    for (int r = 0; r < 3; r++) {
        double t0 = omp_get_wtime();
        flops = ompk_probe_fma(dev);
        double t = omp_get_wtime() - t0;
        if (t < best) best = t;
    }
    return flops / best / 1e12;
}

/* Names implementation `name` for every op whose list has it (NULL: clears every op's name). */
static void impl_name_all(const char *name) {
    for (int o = 0; o < OMPK_OP_COUNT_; o++) {
        const char *op = ompk_op_name((ompk_op)o);
        const ompk_impl *e;
        for (int i = 0; (e = ompk_variant_list(op, i)) != NULL; i++)
            if (!name || !strcmp(e->name, name)) {
                ompk_variant_force(op, name);
                break;
            }
    }
}

void ompk_bench_variant_restore(ompk_bench_ctx *ctx, const char *op) {
    if (!ctx->impl || ompk_variant_force(op, ctx->impl) != OMPK_OK) ompk_variant_force(op, NULL);
}

/* Whether some op's list has an implementation called name. */
static int impl_known(const char *name) {
    const ompk_impl *e;
    for (int o = 0; o < OMPK_OP_COUNT_; o++)
        for (int i = 0; (e = ompk_variant_list(ompk_op_name((ompk_op)o), i)) != NULL; i++)
            if (!strcmp(e->name, name)) return 1;
    return 0;
}

static double env_double(const char *name, double dflt) {
    const char *v = getenv(name);
    return v && *v ? atof(v) : dflt;
}

static void run_pass(ompk_bench_ctx *ctx) {
    ctx->copy_gbs = measure_copy(ctx);
    ctx->fp32_probe = measure_fma(ctx);
    printf("== %s pass: copy bandwidth %.1f GB/s (read+write), FP32 FMA probe %.2f TFLOP/s, %d "
           "reps (median reported)\n",
           ctx->backend, ctx->copy_gbs, ctx->fp32_probe, ctx->reps);
    for (int k = 0; k < nimpls; k++) {
        ctx->impl = strcmp(impls[k], "default") ? impls[k] : NULL;
        if (nimpls > 1) printf("== %s pass, implementations: %s\n", ctx->backend, impls[k]);
        print_header();
        for (int i = 0; i < nentries; i++) {
            const ompk_bench_entry *e = entries[i];
            if (ctx->filter && !strstr(e->name, ctx->filter)) continue;
            if (ctx->dev.type == OMPK_HOST ? !e->host_ok : !e->gpu_ok) continue;
            /* named again before each entry: entries that pick variants clear their op's name */
            if (ctx->impl) impl_name_all(ctx->impl);
            if (e->run(ctx) != 0) {
                fprintf(stderr, "entry %s failed on %s\n", e->name, ctx->backend);
                failed_entries++;
            }
            if (ctx->impl) impl_name_all(NULL);
        }
    }
    ctx->impl = NULL;
}

static void usage(FILE *to, const char *argv0) {
    fprintf(
        to,
        "usage: %s [--quick] [--backend host|gpu|all] [--filter S] [--reps N] [--warmup N] "
        "[--impl LIST] [--json FILE] [--list] [--help]\n"
        "Times every benchmark entry on the host and on each OpenMP GPU device; each pass\n"
        "first measures its device's copy bandwidth, which every record is compared with,\n"
        "and its FP32 FMA rate (the peak probe), which every record carries.\n"
        "  --quick           small shapes and 2 warm-up + 7 timed calls (CI-sized); default\n"
        "                    is the full shapes with 5 warm-up + 20 timed calls\n"
        "  --backend B       host, gpu or all (default all); gpu with no device exits 1\n"
        "  --filter S        only entries whose name contains S (see --list)\n"
        "  --reps N          timed calls per record (the median is reported)\n"
        "  --warmup N        untimed calls before them\n"
        "  --impl LIST       run the entries once per comma-separated implementation name:\n"
        "                    default (the library's choice; the default LIST) or a name of the\n"
        "                    ops' lists (ompk-info --variants), e.g. default,portable; each\n"
        "                    record's JSON says what ran (impl) and what was named (impl_named)\n"
        "  --json FILE       also write every record to FILE (bench/report.py merges it with\n"
        "                    the PyTorch peers of bench/peers/ and prints the peer ratios)\n"
        "  --list            print the entry names and exit\n"
        "  --help            this text\n"
        "Environment: OMPK_HOST_PEAK_FP32_TFLOPS, OMPK_HOST_PEAK_BF16_TFLOPS (host peaks for\n"
        "the %% of peak column, unset = not shown), OMPK_GPU_PEAK_FP32_TFLOPS,\n"
        "OMPK_GPU_PEAK_BF16_TFLOPS (default 67 and 989, H100/H200 SXM), OMPK_GPU_NAME (JSON).\n",
        argv0);
}

static void print_summary(double seconds) {
    printf("== summary: %d host and %d gpu records in %.1f s", records_host, records_gpu, seconds);
    if (failed_entries)
        printf(", %d entr%s FAILED (see above)", failed_entries, failed_entries == 1 ? "y" : "ies");
    printf("\n");
    const char *names[2] = {"host", "gpu"};
    for (int b = 0; b < 2; b++) {
        if (best_pct_bw[b] >= 0)
            printf("   %-4s best %% of copy bandwidth: %.1f (%s)\n", names[b], best_pct_bw[b],
                   best_bw_kernel[b]);
        if (best_tflops[b] >= 0)
            printf("   %-4s best TFLOP/s: %.2f (%s)\n", names[b], best_tflops[b],
                   best_tf_kernel[b]);
    }
    printf("   peer ratios: bench/report.py BENCH.json PEER.json... (bench/peers/*_peer.py)\n");
}

int main(int argc, char **argv) {
    int quick = 0, reps = -1, warmup = -1;
    const char *backend = "all", *filter = NULL, *json_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--backend") && i + 1 < argc)
            backend = argv[++i];
        else if (!strcmp(argv[i], "--filter") && i + 1 < argc)
            filter = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc)
            warmup = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--impl") && i + 1 < argc) {
            static char list[256];
            snprintf(list, sizeof list, "%s", argv[++i]);
            nimpls = 0;
            for (char *save = NULL, *t = strtok_r(list, ",", &save); t && nimpls < MAX_IMPLS;
                 t = strtok_r(NULL, ",", &save)) {
                if (strcmp(t, "default") && !impl_known(t)) {
                    fprintf(stderr, "%s: --impl %s: no op has an implementation of that name\n",
                            argv[0], t);
                    return 2;
                }
                impls[nimpls++] = t;
            }
            if (!nimpls) {
                usage(stderr, argv[0]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--json") && i + 1 < argc)
            json_path = argv[++i];
        else if (!strcmp(argv[i], "--list")) {
            for (int k = 0; k < nentries; k++) printf("%s\n", entries[k]->name);
            return 0;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout, argv[0]);
            return 0;
        } else {
            usage(stderr, argv[0]);
            return 2;
        }
    }
    if (json_path) {
        json = fopen(json_path, "w");
        if (!json) {
            perror(json_path);
            return 1;
        }
        char host[128] = "unknown", cpu[256] = "unknown";
        gethostname(host, sizeof host);
        FILE *ci = fopen("/proc/cpuinfo", "r");
        if (ci) {
            char line[512];
            while (fgets(line, sizeof line, ci))
                if (!strncmp(line, "model name", 10)) {
                    char *p = strchr(line, ':');
                    if (p) snprintf(cpu, sizeof cpu, "%s", p + 2);
                    cpu[strcspn(cpu, "\n\"")] = 0;
                    break;
                }
            fclose(ci);
        }
        time_t now = time(NULL);
        char date[64];
        strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
        fprintf(
            json,
            "{\n  \"tool\": \"ompk-bench\", \"ompk_version\": \"%s\", \"compiler\": \"%s\",\n"
            "  \"offload_archs\": \"%s\", \"date\": \"%s\", \"host\": \"%s\", \"cpu\": \"%s\",\n"
            "  \"host_threads\": %d, \"omp_devices\": %d, \"gpu\": \"%s\", \"quick\": %d,\n"
            "  \"records\": [",
            ompk_version(), ompk_compiler(), ompk_offload_archs(), date, host, cpu,
            omp_get_max_threads(), ompk_device_count(),
            getenv("OMPK_GPU_NAME") ? getenv("OMPK_GPU_NAME") : "", quick);
    }
    ompk_bench_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.quick = quick;
    ctx.filter = filter;
    ctx.warmup = warmup >= 0 ? warmup : (quick ? 2 : 5);
    ctx.reps = reps > 0 ? reps : (quick ? 7 : 20);
    int rc = 0;
    const double t_start = omp_get_wtime();
    printf("ompk-bench: ompk %s (%s), offload images: %s, %d OpenMP device(s), %d host threads%s\n",
           ompk_version(), ompk_compiler(), ompk_offload_archs()[0] ? ompk_offload_archs() : "none",
           ompk_device_count(), omp_get_max_threads(), quick ? ", --quick" : "");
    if (!strcmp(backend, "host") || !strcmp(backend, "all")) {
        ctx.dev = ompk_device_host();
        ctx.backend = "host";
        ctx.peak_fp32_tflops = env_double("OMPK_HOST_PEAK_FP32_TFLOPS", 0);
        ctx.peak_bf16_tflops = env_double("OMPK_HOST_PEAK_BF16_TFLOPS", 0);
        run_pass(&ctx);
    }
    if (!strcmp(backend, "gpu") || !strcmp(backend, "all")) {
        if (ompk_device_count() == 0) {
            printf("== gpu pass skipped: no OpenMP offload device\n");
            if (!strcmp(backend, "gpu")) rc = 1;
        }
        for (int d = 0; d < ompk_device_count(); d++) {
            ctx.dev = ompk_device_target(d);
            ctx.backend = "gpu";
            /* H100/H200 SXM datasheet figures unless told otherwise */
            ctx.peak_fp32_tflops = env_double("OMPK_GPU_PEAK_FP32_TFLOPS", 67);
            ctx.peak_bf16_tflops = env_double("OMPK_GPU_PEAK_BF16_TFLOPS", 989);
            run_pass(&ctx);
        }
    }
    if (json) {
        fputs("\n  ]\n}\n", json);
        fclose(json);
    }
    print_summary(omp_get_wtime() - t_start);
    return rc;
}
