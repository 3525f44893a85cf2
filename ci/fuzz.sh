#!/usr/bin/env bash
# ci/fuzz.sh [--long SECONDS] [HARNESS...]: build the fuzz preset (libFuzzer + ASan + UBSan, host
# only) and run each harness of tests/fuzz over its committed corpus tests/fuzz/corpus/<name>/.
#   default      OMPK_FUZZ_SECONDS (6) seconds a harness; new inputs go to a scratch directory.
#   --long S     S seconds a harness, then merge the new inputs into the committed corpus
#                (commit what grew).
# Fails when any harness crashes, hits a sanitizer report or a contract check; the reproducer
# is left in build-fuzz/artifacts/ (rerun: build-fuzz/tests/fuzz/<name> <file>).
set -uo pipefail
cd "$(dirname "$0")/.."
secs=${OMPK_FUZZ_SECONDS:-6} long=0
if [ "${1:-}" = "--long" ]; then
    secs=${2:?--long needs SECONDS}
    long=1
    shift 2
fi
cmake --preset fuzz >/dev/null || exit 1
cmake --build --preset fuzz -j "$(nproc)" || exit 1
bin=build-fuzz/tests/fuzz
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
    for f in tests/fuzz/fuzz_*.c; do names+=("$(basename "$f" .c)"); done
fi
mkdir -p build-fuzz/artifacts
# one thread a call; calls that ask for a team (the MoE layer's `threads`) must not leave its
# workers spinning against the next input: idle OpenMP threads sleep at once
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive OMPK_VERIFY=0 OMPK_TRACE=0
export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export LSAN_OPTIONS=suppressions=$PWD/ci/lsan.supp:print_suppressions=0
failed=()
for n in "${names[@]}"; do
    corpus=tests/fuzz/corpus/$n
    mkdir -p "$corpus"
    scratch=$(mktemp -d)
    log=build-fuzz/artifacts/$n.log
    "$bin/$n" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=2048 \
        -artifact_prefix="build-fuzz/artifacts/$n-" -print_final_stats=1 \
        "$scratch" "$corpus" >"$log" 2>&1
    rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    if [ $rc -ne 0 ]; then
        failed+=("$n")
        echo "fuzz: $n FAILED (rc $rc)"
        grep -E "ERROR: |runtime error|contract violated|SUMMARY|Test unit written" "$log" | head -8
    else
        echo "fuzz: $n ok, ${execs:-?} executions, ${rate:-?}/s"
    fi
    if [ $long -eq 1 ] && [ $rc -eq 0 ]; then
        "$bin/$n" -merge=1 -max_len=2048 "$corpus" "$scratch" >>"$log" 2>&1 ||
            echo "fuzz: $n corpus merge failed"
    fi
    rm -rf "$scratch"
done
if [ ${#failed[@]} -ne 0 ]; then
    echo "fuzz: ${#failed[@]} of ${#names[@]} harnesses failed: ${failed[*]}"
    exit 1
fi
echo "fuzz: ${#names[@]} harnesses passed"
