#!/usr/bin/env bash
# ci/run-tests.sh BUILD_DIR [LABEL]: runs every Criterion suite of a build directory, prints each
# suite's output and one closing line "LABEL: N passed, N failed, N skipped".
# Exit status 1 when any test failed or crashed, or a suite died without its synthesis.
set -uo pipefail
dir=$1
label=${2:-tests}
pass=0 fail=0 skip=0 suites=0
for t in "$dir"/tests/test_*; do
    [ -x "$t" ] || continue
    suites=$((suites + 1))
    log=$(mktemp)
    "$t" --jobs 1 --verbose=0 >"$log" 2>&1
    rc=$?
    cat "$log"
    syn=$(grep -a 'Synthesis:' "$log" | tail -1)
    if [ -z "$syn" ]; then
        echo "$label: $(basename "$t") exited $rc without a Criterion synthesis"
        fail=$((fail + 1))
    else
        tested=$(sed -E 's/.*Tested: ([0-9]+).*/\1/' <<<"$syn")
        p=$(sed -E 's/.*Passing: ([0-9]+).*/\1/' <<<"$syn")
        f=$(sed -E 's/.*Failing: ([0-9]+).*/\1/' <<<"$syn")
        c=$(sed -E 's/.*Crashing: ([0-9]+).*/\1/' <<<"$syn")
        s=$(grep -ac '\[SKIP\]' "$log")
        pass=$((pass + p)) fail=$((fail + f + c)) skip=$((skip + s))
        [ $rc -ne 0 ] && [ $((f + c)) -eq 0 ] && fail=$((fail + 1))
        : "$tested"
    fi
    rm -f "$log"
done
[ $suites -eq 0 ] && { echo "$label: no test suites in $dir/tests"; exit 1; }
echo "$label: $pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
