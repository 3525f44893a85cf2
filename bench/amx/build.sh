#!/usr/bin/env bash
# bench/amx/build.sh OUT_DIR: builds amx_peak (host only, clang-19 + libomp) with the library's
# AMX kernel compiled in. The binary needs libomp.so.5 at run time (the device bundle's runtime).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
mkdir -p "$1"
clang-19 -O2 -std=c17 -Wall -Wextra -Werror -fopenmp -I"$repo/include" -I"$repo/src/amx" \
    -I"$repo/src/host" "$here/amx_peak.c" "$repo/src/amx/moe_kern_amx.c" -o "$1/amx_peak"
clang-19 -O2 -std=c17 -march=x86-64-v4 -Wall -Wextra -Werror -fopenmp "$here/rowslice_probe.c" \
    -o "$1/rowslice_probe"
