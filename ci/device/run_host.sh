#!/usr/bin/env bash
# Device side of bundle_host.sh, run from the repo root: bash .carry/NAME/run_host.sh DIR
# Unpacks the bundle into DIR and sets up the fixture path; then `. DIR/env.sh` gives
# LD_LIBRARY_PATH for the carried libraries (the peers use the machine's python3 without it).
set -euo pipefail
B=$(cd "$(dirname "$0")" && pwd)
d=$1
mkdir -p "$d" && tar -C "$d" -xJf "$B/host.tar.xz"
fixture_dir=$(cat "$d/fixture_dir")
if [ ! -e "$fixture_dir" ]; then
    mkdir -p "$(dirname "$fixture_dir")" && ln -s "$d/fixtures" "$fixture_dir"
fi
echo "export LD_LIBRARY_PATH=$d/lib OMPK_FIXTURE_DIR=$fixture_dir" >"$d/env.sh"
