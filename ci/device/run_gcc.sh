#!/usr/bin/env bash
# Device-side driver of a gcc-offload bundle (ci/device/bundle_gcc.sh copies it in as run.sh).
# From the repo root on the GPU machine:
#   bash .carry/gcc/run.sh [info] [tests] [bench] [--filter S] [--bench-args "ARGS"]
# (bench: ompk-bench, host and GPU passes, into bench.json; --bench-args: further ompk-bench
# flags, e.g. "--impl default,portable")
# The binaries run with the carried libgomp and its nvptx plugin (the PTX of GCC's images is
# compiled by the driver at load; CUDA's cache keeps it across the suites' processes) and
# OMP_TARGET_OFFLOAD=MANDATORY, so a silent host fallback cannot pass for a GPU run. Logs land in
# /tmp/ompk-gcc-out and come back as $OUT/results.tgz plus $OUT/summary.txt.
set -uo pipefail
B=$(cd "$(dirname "$0")" && pwd)
res=/tmp/ompk-gcc-out
rm -rf "$res" && mkdir -p "$res"
if [ ! -d "$B/bin" ] || [ "$B/gcc.tar.xz" -nt "$B/bin" ]; then
    rm -rf "$B/bin" "$B/lib" "$B/fixtures" && tar -C "$B" -xJf "$B/gcc.tar.xz" && touch "$B/bin"
fi
# test binaries carry the fixture path of the checkout they were built in
fixture_dir=$(cat "$B/fixture_dir" 2>/dev/null || echo /work/main/tests/fixtures)
if [ ! -e "$fixture_dir" ]; then
    mkdir -p "$(dirname "$fixture_dir")" && ln -s "$B/fixtures" "$fixture_dir"
fi
export OMPK_FIXTURE_DIR="$fixture_dir"
mkdir -p /tmp/ompk-gcc-cuda-cache
run_ompk() {
    env LD_LIBRARY_PATH="$B/lib:/usr/local/nvidia/lib64:/usr/lib/x86_64-linux-gnu" \
        OMP_TARGET_OFFLOAD=MANDATORY CUDA_CACHE_PATH=/tmp/ompk-gcc-cuda-cache \
        CUDA_CACHE_MAXSIZE=4294967296 "$@"
}
filter=""
bench_args=()
steps=()
while [ $# -gt 0 ]; do
    case $1 in
    --filter) filter=$2; shift 2 ;;
    --bench-args) read -r -a bench_args <<<"$2"; shift 2 ;;
    *) steps+=("$1"); shift ;;
    esac
done
[ ${#steps[@]} -eq 0 ] && steps=(info tests)
summary=$res/summary.txt
for s in "${steps[@]}"; do
    case $s in
    info)
        {
            nvidia-smi -L
            run_ompk "$B/bin/ompk-info" --require-gpu; echo "ompk-info exit $?"
            # what libgomp found: its plugin, the device and the PTX JIT
            run_ompk env GOMP_DEBUG=1 "$B/bin/ompk-info" 2>&1 | grep -a -i -E 'plugin|nvptx|cuda' | head -20
        } >"$res/info.txt" 2>&1
        tail -40 "$res/info.txt" >>"$summary"
        ;;
    tests)
        pass=0 fail=0 skip=0
        for t in "$B"/bin/tests/test_*; do
            log=$res/$(basename "$t").log
            start=$(date +%s)
            run_ompk "$t" --jobs 1 ${filter:+--filter "*$filter*"} >"$log" 2>&1
            rc=$?
            syn=$(grep -a 'Synthesis:' "$log" | tail -1)
            echo "$(basename "$t") rc=$rc $(($(date +%s) - start))s $syn" | tee -a "$summary"
            if [ -n "$syn" ]; then
                p=$(sed -E 's/.*Passing: ([0-9]+).*/\1/' <<<"$syn")
                f=$(sed -E 's/.*Failing: ([0-9]+).*/\1/' <<<"$syn")
                c=$(sed -E 's/.*Crashing: ([0-9]+).*/\1/' <<<"$syn")
                pass=$((pass + p)) fail=$((fail + f + c))
                skip=$((skip + $(grep -ac '\[SKIP\]' "$log")))
                [ $((f + c)) -gt 0 ] && grep -a -E '\[FAIL\]|\[----\].*(Assertion|fail|differ|got)' "$log" | head -20 >>"$summary"
            else
                fail=$((fail + 1)); tail -5 "$log" >>"$summary"
            fi
        done
        echo "gcc device tests: $pass passed, $fail failed, $skip skipped" | tee -a "$summary"
        ;;
    bench)
        gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
        run_ompk env OMPK_GPU_NAME="$gpu_name" "$B/bin/ompk-bench" ${filter:+--filter "$filter"} \
            "${bench_args[@]}" --json "$res/bench.json" >"$res/bench.log" 2>&1
        echo "ompk-bench exit $?" >>"$res/bench.log"
        grep -a -E '^== |FAILED|failed' "$res/bench.log" >>"$summary"
        ;;
    *) echo "unknown step $s" | tee -a "$summary" ;;
    esac
done
tar -C "$res" -czf "$OUT/results.tgz" . 2>/dev/null || true
cp "$summary" "$OUT/summary.txt" 2>/dev/null || true
cat "$summary"
