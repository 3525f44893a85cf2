#!/usr/bin/env bash
# Installs every build and test dependency on Debian 12 (idempotent; apt only).
set -euo pipefail
# clang-tools-19 carries the offload packager and linker wrappers of the GPU build, and
# libclang-rt-19-dev the sanitizer runtimes of the asan preset and libFuzzer of the fuzz preset:
# clang-19 pulls in neither. Open MPI builds libompk_mpi and runs its test (ci/mpi.sh). The amdgpu
# preset links AMD device code with lld-19 against rocm-device-libs; the gcc-offload preset needs
# GCC's nvptx-none offload compiler (gcc-12-offload-nvptx, with libgomp's nvptx plugin).
pkgs=(cmake ninja-build pkg-config clang-19 clang-tools-19 libomp-19-dev llvm-19 gcc-12
      libhwloc-dev hwloc libclang-rt-19-dev libcriterion-dev libdlpack-dev clang-format-19 xz-utils
      python3 python3-venv openmpi-bin libopenmpi-dev lld-19 rocm-device-libs gcc-12-offload-nvptx)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO=sudo
    echo "bootstrap: installing ${missing[*]}"
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
# The repo is formatted with clang-format 19 (.clang-format); older versions disagree on OpenMP
# pragmas and casts, so make `clang-format` that one when it is older.
cf_major=$(clang-format --version 2>/dev/null | sed -nE 's/.*version ([0-9]+).*/\1/p')
if [ "${cf_major:-0}" -lt 19 ] && [ -x /usr/bin/clang-format-19 ]; then
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO update-alternatives --install /usr/bin/clang-format clang-format /usr/bin/clang-format-19 190 >/dev/null
    $SUDO update-alternatives --set clang-format /usr/bin/clang-format-19 >/dev/null
fi
# The offload build needs CUDA's ptxas/nvlink (CUDA 12 or 13; see README). Without them the
# default preset still builds, host-only, and says so.
if [ ! -x "${OMPK_CUDA_PATH:-/usr/local/cuda}/bin/ptxas" ]; then
    echo "bootstrap: no CUDA toolkit at ${OMPK_CUDA_PATH:-/usr/local/cuda}: GPU images will not be built"
fi
echo "bootstrap: ok"
