#!/usr/bin/env bash
# ci/device/bundle.sh BUILD_DIR OUT_DIR
# Gathers what the GPU machine needs to run a build (it has no clang, libomp or libomptarget):
#   OUT_DIR/bin      ompk-info, ompk-bench, tests/test_*, examples
#   OUT_DIR/lib.tar.xz  lib/libompk.so, compressed (a device run carries at most 64 MiB, and the
#                    offload images make the library 16 MiB); run.sh unpacks it
#   OUT_DIR/run.sh   the device-side driver (copied from ci/device/run.sh)
#   OUT_DIR/fixtures the test fixtures of this checkout (the binaries name their path)
#   .carry/runtime/runtime.tar.xz  (shared by all bundles) the LLVM 19 offload runtime and every
#                    other non-system library the binaries load, found by ldd; rebuilt only when a
#                    binary needs a library it lacks.
# Carry both folders: run(carry=[".carry/runtime", "<OUT_DIR relative to the repo>"], ...).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
build=$(cd "$1" && pwd)
out=$2
mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -rf "$out/bin" "$out/lib"
mkdir -p "$out/bin/tests" "$out/lib"
cp "$build/ompk-info" "$build/ompk-bench" "$out/bin/"
for t in "$build"/tests/test_*; do [ -x "$t" ] && [ -f "$t" ] && cp "$t" "$out/bin/tests/"; done
if [ -d "$build/examples" ]; then
    find "$build/examples" -maxdepth 1 -type f -executable -exec cp {} "$out/bin/" \;
fi
# a gpu-static build (the compute-sanitizer bundle) has no libompk.so: its images are in each binary
# the binaries name libompk by its SONAME (libompk.so.<major.minor>)
if [ -f "$build/libompk.so" ]; then
    soname=$(readelf -d "$build/libompk.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
    cp -L "$build/libompk.so" "$out/lib/${soname:-libompk.so}"
    if [ -n "$soname" ]; then ln -sf "$soname" "$out/lib/libompk.so"; fi
fi
cp "$here/run.sh" "$out/run.sh"
rm -rf "$out/fixtures" && cp -r "$repo/tests/fixtures" "$out/fixtures"
echo "$repo/tests/fixtures" >"$out/fixture_dir"
[ -d "$repo/bench/peers" ] && { rm -rf "$out/peers"; cp -r "$repo/bench/peers" "$out/peers"; }
# pytest for run.sh's python step, in case the machine's python3 has torch but not pytest
if [ ! -d "$out/wheels" ] && ! python3 -m pip download -q -d "$out/wheels" pytest >/dev/null 2>&1; then
    echo "bundle: could not download pytest wheels (the python step needs the machine's pytest)"
    rm -rf "$out/wheels"
fi

# Libraries the device image has itself (glibc, the C++ runtime, the CUDA driver) stay out.
system_re='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libresolv|libstdc\+\+|libgcc_s|libcuda\.so|libnvidia)'
llvmlib=/usr/lib/llvm-19/lib
needed=$(mktemp)
{
    for f in "$out"/bin/* "$out"/bin/tests/* "$out"/lib/*.so "$llvmlib/libomptarget.so.19.1" "$llvmlib/libomp.so.5"; do
        [ -f "$f" ] || continue
        LD_LIBRARY_PATH="$out/lib:$llvmlib" ldd "$f" | awk '/=>/ {print $1" "$3}'
    done
    echo "libomptarget.so.19.1 $llvmlib/libomptarget.so.19.1"
} | grep -Ev "$system_re" | grep -v '^libompk\.so' | sort -u >"$needed"
if grep -q 'not found' "$needed"; then
    echo "bundle: unresolved libraries:"; grep 'not found' "$needed"; exit 1
fi
rt="$repo/.carry/runtime"
mkdir -p "$rt"
exec 9>"$rt/.lock"
flock 9
if [ -f "$rt/manifest" ] && [ -f "$rt/runtime.tar.xz" ] && \
   [ -z "$(comm -23 <(awk '{print $1}' "$needed" | sort -u) <(sort -u "$rt/manifest"))" ]; then
    echo "bundle: runtime up to date ($(wc -l <"$rt/manifest") libraries)"
else
    stage=$(mktemp -d)
    while read -r name path; do cp -L "$path" "$stage/$name"; done <"$needed"
    # libomptarget dlopens its plugins by soname; keep the unversioned names too
    (cd "$stage" && ln -sf libomptarget.so.19.1 libomptarget.so && ln -sf libomp.so.5 libomp.so)
    echo "bundle: packing $(ls "$stage" | wc -l) libraries ($(du -sh "$stage" | cut -f1)) ..."
    tar -C "$stage" -cf - . | xz -T0 -6 >"$rt/runtime.tar.xz.tmp"
    mv "$rt/runtime.tar.xz.tmp" "$rt/runtime.tar.xz"
    awk '{print $1}' "$needed" | sort -u >"$rt/manifest"
    rm -rf "$stage"
fi
rm -f "$needed"
tar -C "$out" -cf - lib | xz -T0 -6 >"$out/lib.tar.xz" && rm -rf "$out/lib"
if [ ! -f "$build/libompk.so" ]; then
    # static binaries each hold the same GPU images: one xz stream with a dictionary larger than
    # a binary stores them about once
    tar -C "$out" -cf - bin | xz -T1 -9 >"$out/bin.tar.xz" && rm -rf "$out/bin"
fi
du -sh "$rt/runtime.tar.xz" "$out" | sed 's/^/bundle: /'
