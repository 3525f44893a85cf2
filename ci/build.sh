#!/usr/bin/env bash
# ci/build.sh PRESET: configure and build one CMake preset (see CMakePresets.json).
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-default}
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$(nproc)"
