#!/usr/bin/env bash
# ci/device/bundle_gcc.sh BUILD_DIR OUT_DIR
# Bundle of a gcc-offload build (GCC 12, nvptx-none) for the GPU machine, which has neither GCC's
# offload runtime nor our binaries: ompk-info, ompk-bench, the test suites, libompk, GCC's
# libgomp.so.1 and libgomp-plugin-nvptx.so.1 (which libgomp dlopens; the plugin loads the
# machine's libcuda) and every other non-system library they load (found by ldd: hwloc,
# Criterion's closure), the test fixtures, packed into OUT_DIR/gcc.tar.xz beside OUT_DIR/run.sh
# (ci/device/run_gcc.sh).
# Carry OUT_DIR alone: run(carry=[".carry/gcc"], command="bash .carry/gcc/run.sh info tests").
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
build=$(cd "$1" && pwd)
out=$2
mkdir -p "$out"
out=$(cd "$out" && pwd)
# a GCC offload build: libompk loads libgomp and holds the table of its offloaded functions
if ! readelf -d "$build/libompk.so" | grep -q 'libgomp' ||
    ! readelf -SW "$build/libompk.so" | grep -q '\.gnu\.offload_funcs'; then
    echo "bundle_gcc: $build is not a gcc-offload build (libompk.so: no libgomp or no offload table)"; exit 1
fi
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin/tests" "$stage/lib"
cp "$build/ompk-info" "$build/ompk-bench" "$stage/bin/"
for t in "$build"/tests/test_*; do [ -x "$t" ] && [ -f "$t" ] && cp "$t" "$stage/bin/tests/"; done
soname=$(readelf -d "$build/libompk.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
cp -L "$build/libompk.so" "$stage/lib/${soname:-libompk.so}"
# libgomp finds its plugin by name at run time: no binary names it, so ldd cannot
plugin=$(gcc-12 -print-file-name=libgomp-plugin-nvptx.so.1)
[ -f "$plugin" ] || { echo "bundle_gcc: no libgomp-plugin-nvptx.so.1 (Debian: libgomp-plugin-nvptx1)"; exit 1; }
cp -L "$plugin" "$stage/lib/"
# the machine has glibc and the CUDA driver; everything else comes along
system_re='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libresolv|libstdc\+\+|libgcc_s|libcuda\.so|libnvidia)'
for f in "$stage"/bin/* "$stage"/bin/tests/* "$stage"/lib/*; do
    [ -f "$f" ] || continue
    LD_LIBRARY_PATH="$stage/lib" ldd "$f" 2>/dev/null | awk '/=>/ {print $1" "$3}'
done | grep -Ev "$system_re" | grep -v '^libompk\.so' | sort -u >"$stage/needed"
if grep -q 'not found' "$stage/needed"; then
    echo "bundle_gcc: unresolved libraries:"; grep 'not found' "$stage/needed"; exit 1
fi
while read -r name path; do [ -f "$stage/lib/$name" ] || cp -L "$path" "$stage/lib/$name"; done <"$stage/needed"
grep -q '^libgomp\.so\.1 ' "$stage/needed" || { echo "bundle_gcc: the binaries do not load libgomp.so.1"; exit 1; }
rm -f "$stage/needed"
cp -r "$repo/tests/fixtures" "$stage/fixtures"
echo "$repo/tests/fixtures" >"$stage/fixture_dir"
tar -C "$stage" -cf - . | xz -T2 -6 >"$out/gcc.tar.xz"
cp "$here/run_gcc.sh" "$out/run.sh"
echo "bundle_gcc: $(ls "$stage/lib" | tr '\n' ' ')"
echo "bundle_gcc: $(du -h "$out/gcc.tar.xz" | cut -f1) in $out/gcc.tar.xz"
