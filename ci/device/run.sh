#!/usr/bin/env bash
# Device-side driver, copied into each bundle by ci/device/bundle.sh. Run from the repo root on
# the GPU machine:
#   bash .carry/NAME/run.sh [info] [tests] [sanitize] [bench] [bench-quick] [peers] [python]
#                           [--filter S] [--bench-args "ARGS"]
# (--bench-args: further ompk-bench flags for the bench steps, e.g. "--impl default,portable")
# Our binaries run with the carried LLVM 19 runtime and OMP_TARGET_OFFLOAD=MANDATORY, so a
# silent host fallback cannot pass for a GPU run. Python peers run with the machine's own python3
# and PyTorch (without our LD_LIBRARY_PATH). Everything lands in /tmp/ompk-out and comes back as
# $OUT/results.tgz plus $OUT/summary.txt (the last lines of each step).
set -uo pipefail
B=$(cd "$(dirname "$0")" && pwd)
repo=$(pwd)
res=/tmp/ompk-out
rm -rf "$res" && mkdir -p "$res"
rt=/tmp/ompk-rt
# the bundle carries its library compressed; a bundle is rebuilt, never updated in place, so an
# unpacked lib/ older than the archive is stale
if [ -f "$B/lib.tar.xz" ] && { [ ! -d "$B/lib" ] || [ "$B/lib.tar.xz" -nt "$B/lib" ]; }; then
    rm -rf "$B/lib" && tar -C "$B" -xJf "$B/lib.tar.xz" && touch "$B/lib"
fi
if [ -f "$B/bin.tar.xz" ] && { [ ! -d "$B/bin" ] || [ "$B/bin.tar.xz" -nt "$B/bin" ]; }; then
    rm -rf "$B/bin" && tar -C "$B" -xJf "$B/bin.tar.xz" && touch "$B/bin"
fi
if [ ! -f "$rt/.ok" ]; then
    mkdir -p "$rt" && tar -C "$rt" -xJf "$repo/.carry/runtime/runtime.tar.xz" && touch "$rt/.ok"
fi
# Test binaries carry the fixture path of the checkout they were built in (a worktree, say);
# the bundle brings that checkout's fixtures, and the path is made to resolve to them here.
fixture_dir=$(cat "$B/fixture_dir" 2>/dev/null || echo /work/main/tests/fixtures)
if [ ! -e "$fixture_dir" ]; then
    mkdir -p "$(dirname "$fixture_dir")" && ln -s "$B/fixtures" "$fixture_dir"
fi
export OMPK_FIXTURE_DIR="$fixture_dir"
run_ompk() {
    env LD_LIBRARY_PATH="$rt:$B/lib:/usr/local/nvidia/lib64:/usr/lib/x86_64-linux-gnu" \
        OMP_TARGET_OFFLOAD=MANDATORY "$@"
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
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
export OMPK_GPU_NAME="$gpu_name"
for s in "${steps[@]}"; do
    case $s in
    info)
        {
            nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv
            lscpu | grep -E 'Model name|^CPU\(s\)|NUMA node\(s\)'
            grep -o -w -E 'amx_tile|amx_bf16|amx_int8|avx512_bf16' /proc/cpuinfo | sort | uniq -c
            run_ompk "$B/bin/ompk-info" --require-gpu; echo "ompk-info exit $?"
        } >"$res/info.txt" 2>&1
        tail -22 "$res/info.txt" >>"$summary"
        ;;
    tests)
        pass=0 fail=0 skip=0
        for t in "$B"/bin/tests/test_*; do
            log=$res/$(basename "$t").log
            run_ompk "$t" --jobs 1 ${filter:+--filter "*$filter*"} >"$log" 2>&1
            rc=$?
            syn=$(grep -a 'Synthesis:' "$log" | tail -1)
            echo "$(basename "$t") rc=$rc $syn" | tee -a "$summary"
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
        for e in "$B"/bin/*; do
            case $(basename "$e") in ompk-info|ompk-bench|tests) continue ;; esac
            [ -x "$e" ] && [ -f "$e" ] || continue
            run_ompk "$e" >"$res/$(basename "$e").log" 2>&1
            echo "example $(basename "$e") rc=$?" | tee -a "$summary"
        done
        echo "device tests: $pass passed, $fail failed, $skip skipped" | tee -a "$summary"
        ;;
    sanitize)
        # compute-sanitizer over the GPU suites of a gpu-static bundle (a shared libompk makes
        # the sanitizer disable itself): every tool in OMPK_CS_TOOLS, the GPU device only,
        # OMPK_CS_JOBS suite runs at once (memcheck costs minutes per suite; the GPU is shared).
        cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
        # OMPK_CS_SPLIT="suite ..." runs each Criterion test of those suites as a process of its
        # own (racecheck of a whole large suite outlasts one device call; its tests run in parallel)
        cs_one() { # tool test [criterion-filter] -> one summary line in $res/cs-tool-test.line
            local tool=$1 t=$2 f=${3:-${filter:+*$filter*}} rc errs runs off syn
            local id=$(basename "$2")${3:+-${3##*/}}
            local log=$res/cs-$1-$id.log
            run_ompk env OMPK_TEST_DEVICES=target "$cs" --tool "$tool" --target-processes all \
                --require-cuda-init no "$t" --jobs 1 ${f:+--filter "$f"} >"$log" 2>&1
            rc=$?
            # memcheck/initcheck: "ERROR SUMMARY: N errors"; racecheck: "RACECHECK SUMMARY:
            # N hazards displayed (E errors, W warnings)"
            errs=$(grep -a -E '(ERROR|RACECHECK) SUMMARY' "$log" |
                sed -E 's/.*ERROR SUMMARY: ([0-9]+).*/\1/; s/.*\(([0-9]+) errors.*/\1/' | awk '{s += $1} END {print s + 0}')
            runs=$(grep -ac -E '(ERROR|RACECHECK) SUMMARY' "$log")
            off=$(grep -ac 'Sanitizer will be disabled' "$log")
            syn=$(grep -a 'Synthesis:' "$log" | tail -1)
            {
                echo "cs $tool $id rc=$rc processes=$runs errors=$errs disabled=$off $syn"
                if [ "$errs" != 0 ] || [ "$off" != 0 ] || [ "$runs" = 0 ] || [ $rc -ne 0 ]; then
                    echo BAD; grep -a -m 12 -E '=========  *(Invalid|Race|Uninit|Error|Program hit)' "$log"
                fi
            } >"$res/cs-$tool-$id.line"
        }
        jobs_max=${OMPK_CS_JOBS:-6}
        for tool in ${OMPK_CS_TOOLS:-memcheck racecheck initcheck}; do
            for t in "$B"/bin/tests/test_*; do
                # host-only suites: emulations (test_router_warp too), bad inputs, MoE
                case $(basename "$t") in *_emu | *_bad | test_core | test_sizes | test_moe* | test_router_warp) continue ;; esac
                suite=${t##*/test_}
                # OMPK_CS_SUITES="router_fwd ...": only these suites
                [ -n "${OMPK_CS_SUITES:-}" ] && [[ " $OMPK_CS_SUITES " != *" $suite "* ]] && continue
                if [[ " ${OMPK_CS_SPLIT:-} " == *" $suite "* ]]; then
                    for name in $(run_ompk "$t" --list 2>/dev/null | sed -n -E 's/.*── (.*)$/\1/p'); do
                        while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n; done
                        cs_one "$tool" "$t" "$suite/$name" &
                    done
                    continue
                fi
                while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n; done
                cs_one "$tool" "$t" &
            done
        done
        wait
        total=0 bad=0
        for l in "$res"/cs-*.line; do
            [ -f "$l" ] || continue
            total=$((total + 1))
            grep -q '^BAD' "$l" && bad=$((bad + 1))
            grep -v '^BAD' "$l" | tee -a "$summary"
        done
        echo "compute-sanitizer: $((total - bad)) passed, $bad failed" | tee -a "$summary"
        ;;
    bench | bench-quick)
        q=""; [ "$s" = bench-quick ] && q=--quick
        run_ompk "$B/bin/ompk-bench" $q ${filter:+--filter "$filter"} "${bench_args[@]}" --json "$res/bench.json" >"$res/bench.log" 2>&1
        echo "ompk-bench exit $?" >>"$res/bench.log"
        cat "$res/bench.log" >>"$summary"
        ;;
    peers)
        for p in "$B"/peers/*_peer.py; do
            [ -f "$p" ] || continue
            n=$(basename "$p" .py)
            PYTHONUNBUFFERED=1 python3 "$p" --json "$res/$n.json" ${filter:+--filter "$filter"} >"$res/$n.log" 2>&1
            echo "$n exit $?" >>"$res/$n.log"
            tail -30 "$res/$n.log" >>"$summary"
        done
        ;;
    python)
        # python/tests (pytest, CPU and CUDA) with the machine's python3 and PyTorch on the
        # checkout's python/ package and the bundle's libompk, then the stream-ordering cost
        if ! python3 -c "import pytest" 2>/dev/null && [ -d "$B/wheels" ]; then
            PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --no-index --find-links "$B/wheels" pytest >"$res/python-pip.log" 2>&1
        fi
        pyenv=(OMPK_LIBRARY="$B/lib/libompk.so" PYTHONPATH="$repo/python" KMP_BLOCKTIME=0)
        (cd /tmp && run_ompk env "${pyenv[@]}" python3 -m pytest -q -rs "$repo/python/tests" \
            ${filter:+-k "$filter"}) >"$res/python.log" 2>&1
        echo "python tests exit $?" >>"$res/python.log"
        run_ompk env "${pyenv[@]}" python3 "$repo/python/tests/cuda_sync_cost.py" >>"$res/python.log" 2>&1
        tail -30 "$res/python.log" >>"$summary"
        ;;
    *) echo "unknown step $s" | tee -a "$summary" ;;
    esac
done
tar -C "$res" -czf "$OUT/results.tgz" . 2>/dev/null || true
cp "$summary" "$OUT/summary.txt" 2>/dev/null || true
cat "$summary"
