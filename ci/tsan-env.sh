#!/usr/bin/env bash
# Runs a command built by the tsan preset, e.g. ci/tsan-env.sh build-tsan/tests/test_concurrency.
# libomp tells TSan about its own synchronisation through the archer OMPT tool of llvm-19
# (libarcher.so); without it every OpenMP barrier and reduction reads as a race.
set -euo pipefail
export OMP_TOOL_LIBRARIES=/usr/lib/llvm-19/lib/libarcher.so
export TSAN_OPTIONS="ignore_noninstrumented_modules=1 halt_on_error=1 suppressions=$(cd "$(dirname "$0")" && pwd)/tsan.supp ${TSAN_OPTIONS:-}"
exec "$@"
