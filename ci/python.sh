#!/usr/bin/env bash
# The Python package's tests (python/tests, pytest) against a built libompk:
#   ./ci/python.sh [BUILD_DIR]      (default: build)
# Creates .venv once (PyPI: torch, numpy, pytest; the torch wheel is the CUDA build, which runs on
# a machine without a GPU, ~4 GB with its nvidia-* dependencies), installs ./python into it and
# runs pytest with OMPK_LIBRARY=BUILD_DIR/libompk.so. OMPK_TORCH_INDEX=URL installs torch from
# another index (e.g. https://download.pytorch.org/whl/cpu, a 200 MB CPU-only wheel) when that
# is reachable.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
lib=$PWD/$build/libompk.so
[ -f "$lib" ] || { echo "python: $lib not built"; exit 1; }
venv=${OMPK_VENV:-$PWD/.venv}
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c "import torch, numpy, pytest" 2>/dev/null; then
    echo "python: installing torch, numpy, pytest into $venv (first run only)"
    start=$(date +%s)
    if [ -n "${OMPK_TORCH_INDEX:-}" ]; then
        "$venv/bin/pip" install -q --index-url "$OMPK_TORCH_INDEX" torch
    fi
    "$venv/bin/pip" install -q torch numpy pytest
    echo "python: installed in $(($(date +%s) - start)) s"
fi
"$venv/bin/pip" install -q --force-reinstall --no-deps ./python
# run from outside the source tree, so the installed package is the one tested
cd "$(mktemp -d)"
OMPK_LIBRARY=$lib "$venv/bin/python" -m pytest -q "$OLDPWD/python/tests" "${@:2}"
