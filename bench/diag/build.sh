#!/usr/bin/env bash
# bench/diag/build.sh BUILD_DIR OUT_DIR: builds the diagnostic probes with the offload flags of
# an offload build directory (its cuda-shim carries the CUDA 13 / LLVM 19 link fix-up) and links
# them with its libompk. Run on the GPU machine with the bundle's runtime on LD_LIBRARY_PATH (see
# ci/device/run.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
build=$(cd "$1" && pwd)
mkdir -p "$2"
for src in "$here"/*.c; do
    clang-19 -O3 -std=c17 -Wall -Wextra -Werror -fopenmp --offload-arch=sm_90 \
        --cuda-path="$build/cuda-shim" --libomptarget-nvptx-bc-path=/usr/lib/llvm-19/lib \
        -fopenmp-cuda-mode -fopenmp-assume-no-thread-state -fopenmp-assume-no-nested-parallelism \
        -Wno-unknown-cuda-version -I"$repo/include" "$src" -o "$2/$(basename "$src" .c)" \
        -L"$build" -lompk
done
