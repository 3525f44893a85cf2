#!/usr/bin/env bash
# ci/build.sh PRESET [TARGET...]: configure and build one CMake preset (see CMakePresets.json),
# all of it or the given targets. Prints the
# configure summary (the "-- ompk:" lines: compiler, offload on/off, archs, cubin patch) and
# warnings; the whole configure output when it fails.
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-default}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! cmake --preset "$preset" >"$log" 2>&1; then
    cat "$log"
    exit 1
fi
grep -E '^-- ompk:' "$log" || true
grep -A4 '^CMake Warning' "$log" || true
shift || true
targets=()
[ $# -gt 0 ] && targets=(--target "$@")
cmake --build --preset "$preset" -j "$(nproc)" "${targets[@]}"
