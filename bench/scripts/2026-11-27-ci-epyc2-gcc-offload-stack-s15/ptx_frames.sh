#!/usr/bin/env bash
# ptx_frames.sh LIBOMPK [ARCH]: the per-thread stack frames of a gcc-offload libompk's GPU code.
# Pulls the PTX objects mkoffload embedded in the library (NUL-terminated strings that start with
# "// BEGIN PREAMBLE": ompk's kernels first, then libgomp's and newlib's device code), compiles
# each with ptxas -c -v for ARCH (default sm_90, what the driver JITs the sm_80 PTX for on an
# H100) and prints the largest frames of ompk's functions and the libgomp frames on the way to a
# parallel region's body.
set -euo pipefail
lib=$1
arch=${2:-sm_90}
ptxas=${PTXAS:-/usr/local/cuda/bin/ptxas}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "$lib" "$tmp" <<'PY'
import re, sys
data = open(sys.argv[1], "rb").read()
for i, m in enumerate(re.finditer(rb"// BEGIN PREAMBLE", data)):
    end = data.index(b"\0", m.start())
    open(f"{sys.argv[2]}/obj{i:03d}.ptx", "wb").write(data[m.start():end])
PY
for f in "$tmp"/obj*.ptx; do
    "$ptxas" -arch="$arch" -c -v "$f" -o "$f.o" >"$f.log" 2>&1
done
python3 - "$tmp" <<'PY'
import glob, re, sys
def frames(files):
    d = {}
    for f in files:
        for name, size in re.findall(r"Function properties for (\S+)\n\s+(\d+) bytes stack frame",
                                     open(f).read()):
            d[name] = max(d.get(name, 0), int(size))
    return d
logs = sorted(glob.glob(sys.argv[1] + "/obj*.ptx.log"))
ours, lib = frames(logs[:1]), frames(logs[1:])
print("largest frames of ompk's device functions (bytes):")
for size, name in sorted(((s, n) for n, s in ours.items()), reverse=True)[:12]:
    print(f"  {size:6d}  {name}")
print("libgomp/newlib frames on a parallel region's path (bytes):")
for name in ("gomp_nvptx_main", "GOMP_parallel", "gomp_team_start", "gomp_team_barrier_wait",
             "gomp_team_barrier_wait_end", "gomp_barrier_handle_tasks", "expf", "logf"):
    print(f"  {lib.get(name, 0):6d}  {name}")
impl = max((s for n, s in ours.items() if n.endswith("$impl")), default=0)
print(f"largest outlined team function ($impl): {impl} bytes")
PY
