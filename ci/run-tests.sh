#!/usr/bin/env bash
# ci/run-tests.sh BUILD_DIR [LABEL]: runs every Criterion suite of a build directory. Prints one
# line per suite as it finishes ("[k/N] suite: N passed, N failed, N skipped (T s)"), the output
# of a suite that failed (of every suite with OMPK_TEST_LOGS=1), and one closing line
# "LABEL: N passed, N failed, N skipped".
# Exit status 1 when any test failed or crashed, or a suite died without its synthesis.
set -uo pipefail
dir=$1
label=${2:-tests}
pass=0 fail=0 skip=0
suites=()
for t in "$dir"/tests/test_*; do
    [ -x "$t" ] && suites+=("$t")
done
[ ${#suites[@]} -eq 0 ] && { echo "$label: no test suites in $dir/tests"; exit 1; }
k=0
for t in "${suites[@]}"; do
    k=$((k + 1))
    log=$(mktemp)
    start=$SECONDS
    "$t" --jobs 1 --verbose=0 >"$log" 2>&1
    rc=$?
    name=$(basename "$t")
    syn=$(grep -a 'Synthesis:' "$log" | tail -1)
    if [ -z "$syn" ]; then
        cat "$log"
        echo "[$k/${#suites[@]}] $label: $name exited $rc without a Criterion synthesis"
        fail=$((fail + 1))
    else
        p=$(sed -E 's/.*Passing: ([0-9]+).*/\1/' <<<"$syn")
        f=$(sed -E 's/.*Failing: ([0-9]+).*/\1/' <<<"$syn")
        c=$(sed -E 's/.*Crashing: ([0-9]+).*/\1/' <<<"$syn")
        s=$(grep -ac '\[SKIP\]' "$log")
        bad=$((f + c))
        [ $rc -ne 0 ] && [ $bad -eq 0 ] && bad=1
        pass=$((pass + p)) fail=$((fail + bad)) skip=$((skip + s))
        [ $bad -ne 0 ] || [ "${OMPK_TEST_LOGS:-0}" = 1 ] && cat "$log"
        echo "[$k/${#suites[@]}] $name: $p passed, $bad failed, $s skipped ($((SECONDS - start)) s)"
    fi
    rm -f "$log"
done
echo "$label: $pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
