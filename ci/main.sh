#!/usr/bin/env bash
# The main job (README): set up, build, print ompk-info, then run the quick benchmark set on this
# machine (host, and every GPU when one is present). JSON goes to build/bench-quick.json.
set -euo pipefail
cd "$(dirname "$0")/.."
./ci/bootstrap.sh
./ci/build.sh default
./build/ompk-info
./build/ompk-bench --quick --json build/bench-quick.json
echo "main: results in build/bench-quick.json"
