#!/usr/bin/env bash
# ci/device/bundle_host.sh BUILD_DIR OUT_DIR [EXTRA_FILE...]
# Host-only bundle for the Xeon of the device machine (a host-clang or host-gcc build: no offload
# runtime, a few MB): ompk-bench, ompk-info, the MoE and attention suites and test_ops, libompk,
# the bench peers, the test fixtures and every non-system library they load (found by ldd:
# libomp, hwloc, Criterion's closure), plus any EXTRA_FILE (say bench/amx's amx_peak, or a second
# libompk under another name), packed into OUT_DIR/host.tar.xz. Unpack on the device with
# run_host.sh (same folder). Carry OUT_DIR.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
build=$(cd "$1" && pwd)
out=$2
shift 2
mkdir -p "$out"
out=$(cd "$out" && pwd)
stage=$(mktemp -d)
mkdir -p "$stage/bin" "$stage/lib" "$stage/extra"
cp "$build/ompk-bench" "$build/ompk-info" "$stage/bin/"
for t in "$build"/tests/test_moe* "$build"/tests/test_attention* "$build"/tests/test_ops; do
    [ -x "$t" ] && cp "$t" "$stage/bin/"
done
soname=$(readelf -d "$build/libompk.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
cp -L "$build/libompk.so" "$stage/lib/$soname"
for f in "$@"; do cp -L "$f" "$stage/extra/"; done
system_re='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libresolv|libstdc\+\+|libgcc_s)'
for f in "$stage"/bin/* "$stage"/lib/* "$stage"/extra/*; do
    [ -x "$f" ] || [[ $f == *.so* ]] || continue
    LD_LIBRARY_PATH="$stage/lib" ldd "$f" 2>/dev/null | awk '/=>/ {print $1" "$3}'
done | grep -Ev "$system_re" | grep -v '^libompk\.so' | sort -u | while read -r name path; do
    cp -L "$path" "$stage/lib/$name"
done
cp -r "$repo/tests/fixtures" "$stage/fixtures"
echo "$repo/tests/fixtures" >"$stage/fixture_dir"
cp -r "$repo/bench/peers" "$stage/peers"
tar -C "$stage" -cf - . | xz -T2 -6 >"$out/host.tar.xz"
cp "$here/run_host.sh" "$out/run_host.sh"
rm -rf "$stage"
echo "bundle: $(du -h "$out/host.tar.xz" | cut -f1) in $out/host.tar.xz"
