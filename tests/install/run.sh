#!/usr/bin/env bash
# tests/install/run.sh BUILD_DIR SOURCE_DIR C_COMPILER: installs BUILD_DIR into a temporary
# prefix, checks the layout and RUNPATHs, then builds and runs consumer.c three ways: CMake's
# find_package, pkg-config, and the plain compiler line of README.md (taken from it verbatim);
# last, builds examples/ on its own against the install and runs it (ctest -L example).
# None of it may need LD_LIBRARY_PATH.
set -euo pipefail
build=$(realpath "$1") src=$(realpath "$2") cc=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
unset LD_LIBRARY_PATH
prefix=$tmp/prefix
say() { echo "install test: $* ($SECONDS s)"; }
die() { echo "install test: FAILED: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" || { cat "$tmp/install.log"; die "cmake --install"; }
for f in include/ompk/ompk.h include/ompk/tensor.h lib/cmake/ompk/ompkConfig.cmake \
         lib/cmake/ompk/ompkConfigVersion.cmake lib/cmake/ompk/ompkTargets.cmake \
         lib/pkgconfig/ompk.pc lib/libompk.so bin/ompk-info bin/ompk-bench; do
    [ -e "$prefix/$f" ] || die "$f not installed"
done
soname=$(readelf -d "$prefix/lib/libompk.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
if [ -z "$soname" ] || [ ! -e "$prefix/lib/$soname" ]; then die "no SONAME or no $soname file"; fi
for f in lib/libompk.so bin/ompk-info; do
    if readelf -d "$prefix/$f" | grep -q '(RPATH)'; then die "$f has DT_RPATH, not DT_RUNPATH"; fi
    if ldd "$prefix/$f" | grep -q 'not found'; then ldd "$prefix/$f"; die "$f misses libraries"; fi
done
"$prefix/bin/ompk-info" >"$tmp/info.log" || { cat "$tmp/info.log"; die "installed ompk-info"; }
say "layout ok ($soname, RUNPATH, ompk-info runs)"

cmake -S "$src/tests/install" -B "$tmp/fp" -G Ninja -DCMAKE_C_COMPILER="$cc" \
      -DCMAKE_PREFIX_PATH="$prefix" >"$tmp/fp.log" 2>&1 || { cat "$tmp/fp.log"; die "find_package configure"; }
cmake --build "$tmp/fp" >>"$tmp/fp.log" 2>&1 || { cat "$tmp/fp.log"; die "find_package build"; }
"$tmp/fp/consumer" || die "find_package consumer"
say "find_package(ompk) ok"

export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
# shellcheck disable=SC2046
"$cc" "$src/tests/install/consumer.c" $(pkg-config --cflags --libs ompk) \
      -Wl,-rpath,"$(pkg-config --variable=libdir ompk)" -lm -o "$tmp/pc_consumer" || die "pkg-config build"
"$tmp/pc_consumer" || die "pkg-config consumer"
say "pkg-config ok"

line=$(sed -n 's/^ *\(cc my_prog\.c -I.*\)$/\1/p' "$src/README.md" | head -1)
[ -n "$line" ] || die "README.md has no 'cc my_prog.c ...' line"
mkdir "$tmp/plain"
cp "$src/tests/install/consumer.c" "$tmp/plain/my_prog.c"
(cd "$tmp/plain" && export OMPK=$prefix && eval "$line") || die "README line: $line"
"$tmp/plain/my_prog" || die "README-line consumer"
say "README compiler line ok: $line"

cmake -S "$src/examples" -B "$tmp/ex" -G Ninja -DCMAKE_C_COMPILER="$cc" \
      -DCMAKE_PREFIX_PATH="$prefix" >"$tmp/ex.log" 2>&1 || { cat "$tmp/ex.log"; die "examples configure"; }
cmake --build "$tmp/ex" >>"$tmp/ex.log" 2>&1 || { cat "$tmp/ex.log"; die "examples build"; }
(cd "$tmp/ex" && ctest -L example --output-on-failure >>"$tmp/ex.log" 2>&1) || { cat "$tmp/ex.log"; die "examples run"; }
say "examples/ built against the install and run ok"
