#!/usr/bin/env bash
# bench/diag/moe_sft/build.sh BUILD_DIR OUT: builds moe_sft_hash against BUILD_DIR's libompk
# (a host build: host-clang or host-gcc), with that library on its RUNPATH.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
build=$(cd "$1" && pwd)
mkdir -p "$2"
clang-19 -O2 -std=c17 -Wall -Wextra -Werror -fopenmp -I"$root/include" "$here/moe_sft_hash.c" \
    -L"$build" -Wl,-rpath,"$build" -lompk -lm -o "$2/moe_sft_hash"
