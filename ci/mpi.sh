#!/usr/bin/env bash
# The expert-parallel layer's test (tests/mpi) under mpirun with 1, 2 and 4 ranks on a built
# tree: ./ci/mpi.sh [BUILD_DIR] (default: build). Each rank runs one OpenMP thread (ranks are
# oversubscribed on a 2-core machine). Prints one line per rank count; exit 1 when one failed.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
exe=$build/tests/mpi/mpi_test_moe_ep
[ -x "$exe" ] || { echo "mpi: $exe not built (no MPI found at configure time?)"; exit 1; }
# Open MPI refuses to start as root unless told
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# containers often forbid the cross-memory attach of the shared-memory transport: plain copies
export OMPI_MCA_btl_vader_single_copy_mechanism=none
rc=0
for np in 1 2 4; do
    out=$(OMP_NUM_THREADS=1 timeout 600 mpirun -np "$np" --oversubscribe -x OMP_NUM_THREADS "$exe" 2>&1)
    r=$?
    line=$(grep -a 'mpi_test_moe_ep np=' <<<"$out" | tail -1)
    if [ $r -ne 0 ] || [ -z "$line" ]; then
        echo "$out"
        echo "mpi: np=$np FAILED (exit $r)"
        rc=1
    else
        echo "mpi: $line"
    fi
done
exit $rc
