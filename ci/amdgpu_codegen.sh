#!/usr/bin/env bash
# ci/amdgpu_codegen.sh: libompk's sources compiled for each arch of the amdgpu preset, and each
# source's device code put through the AMDGPU back end on its own (device IR, then llc-19 to an
# object that is discarded), so every kernel is code-generated for gfx90a and gfx942. The device
# link of all kernels at once (./ci/build.sh amdgpu: LTO with the OpenMP device runtime) is left
# out: it takes over 30 minutes on 2 cores. Exit status 1 if any step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --preset amdgpu >/dev/null
python3 - "$(nproc)" <<'PY'
import concurrent.futures, json, shlex, subprocess, sys, tempfile
cmds = json.load(open("build-amdgpu/compile_commands.json"))
jobs = []
for e in cmds:
    argv = shlex.split(e["command"])
    if "-o" not in argv or not argv[argv.index("-o") + 1].startswith("CMakeFiles/ompk.dir/"):
        continue
    archs = next((a.split("=", 1)[1] for a in argv if a.startswith("--offload-arch=")), None)
    if not archs:
        continue
    i = argv.index("-o")
    for arch in archs.split(","):
        a = [("--offload-arch=" + arch if x.startswith("--offload-arch=") else x) for x in argv]
        a = a[:i] + a[i + 2:]
        jobs.append((e["file"], arch, [x for x in a if x != "-c"], e["directory"]))
def run(job):
    src, arch, argv, cwd = job
    with tempfile.NamedTemporaryFile(suffix=".ll") as ir:
        r = subprocess.run(argv + ["--offload-device-only", "-S", "-o", ir.name], cwd=cwd,
                           capture_output=True, text=True)
        if r.returncode == 0:
            r = subprocess.run(["llc-19", "-O3", "-mtriple=amdgcn-amd-amdhsa", "-mcpu=" + arch,
                                "-filetype=obj", ir.name, "-o", "/dev/null"],
                               capture_output=True, text=True)
    return src, arch, r.returncode, r.stderr
bad = 0
with concurrent.futures.ThreadPoolExecutor(int(sys.argv[1])) as ex:
    for src, arch, rc, err in ex.map(run, jobs):
        if rc != 0:
            bad += 1
            print(f"FAILED {arch} {src}\n{err}")
print(f"amdgpu codegen: {len(jobs) - bad} of {len(jobs)} source x arch compiles")
sys.exit(1 if bad else 0)
PY
