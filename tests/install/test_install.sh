#!/usr/bin/env bash
# tests/install/test_install.sh <build-dir>: the library as a user gets it. Installs the
# build (cmake --install) into a temporary prefix, checks what the prefix holds, and builds
# and runs the consumer app.c of this directory three ways:
#   1. CMake, find_package(moex) through CMAKE_PREFIX_PATH, linking moex::moex (libmoex.so);
#   2. the same with moex::moex_static (libmoex.a and its find_dependency()s);
#   3. pkg-config: cc app.c $(pkg-config --cflags --libs moex) through PKG_CONFIG_PATH, run
#      with LD_LIBRARY_PATH set to the prefix's library directory; and the same for
#      tests/header/header_fp8.c and header_ep.c, each including one experimental header
#      alone (C11, -pedantic -Werror): the installed headers stand on their own.
# Every header of include/ must be in the prefix.
# Each app must link the installed library (not the build tree's), run, and print OK.
# Exits 1 with a message on the first failure, and keeps the temporary directory then.
# scripts/test.sh runs it after CTest (the unit stage). Needs cmake, cc and pkg-config.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 <build-dir>" >&2; exit 2; }
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUILD=$(cd "$1" && pwd)
CC=${CC:-cc}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/moex-install.XXXXXX")
PREFIX=$TMP/prefix

fail() {
  echo "test_install: FAILED: $*" >&2
  echo "test_install: the prefix, builds and logs are kept in $TMP" >&2
  exit 1
}
step() { echo "test_install: $*"; }
# run_logged <log> <command...>: runs the command with its output in <log>, shown on failure
run_logged() {
  local log=$1; shift
  if ! "$@" > "$log" 2>&1; then
    cat "$log" >&2
    fail "$* (log: $log)"
  fi
}
for tool in cmake "$CC" pkg-config; do
  command -v "$tool" > /dev/null || fail "$tool is not installed (scripts/setup.sh installs it)"
done
[ -f "$BUILD/CMakeCache.txt" ] || fail "$BUILD is not a CMake build directory"

# ---- install -------------------------------------------------------------------------------
step "cmake --install $BUILD --prefix $PREFIX"
run_logged "$TMP/install.log" cmake --install "$BUILD" --prefix "$PREFIX"
for h in "$HERE"/../../include/*.h; do
  h=$(basename "$h")
  [ -f "$PREFIX/include/$h" ] || fail "no include/$h in the prefix"
done
cfg=$(find "$PREFIX" -path '*/cmake/moex/moexConfig.cmake' | head -1)
[ -n "$cfg" ] || fail "no lib*/cmake/moex/moexConfig.cmake in the prefix"
LIBDIR=$(dirname "$(dirname "$(dirname "$cfg")")")
for f in libmoex.so libmoex.a cmake/moex/moexConfigVersion.cmake cmake/moex/moexTargets.cmake \
         pkgconfig/moex.pc; do
  [ -e "$LIBDIR/$f" ] || fail "no $f in $LIBDIR"
done
soname=$(readlink "$LIBDIR/libmoex.so")
[ -n "$soname" ] && [ -e "$LIBDIR/$soname" ] || fail "libmoex.so is not a link to the versioned library"
step "installed: $(cd "$PREFIX" && find . -type f -o -type l | sed 's|^\./||' | sort | tr '\n' ' ')"

# the app must run against the prefix's libmoex.so: ldd names the library it would load
uses_prefix_lib() {
  local lib
  lib=$(LD_LIBRARY_PATH=${2:-} ldd "$1" | awk '/libmoex\.so/ {print $3}')
  [ "$(readlink -f "$lib")" = "$(readlink -f "$LIBDIR/$soname")" ] ||
    fail "$1 loads libmoex.so from '${lib:-nowhere}', not from $LIBDIR"
}
run_app() {
  local out
  out=$(env ${2:+LD_LIBRARY_PATH=$2} "$1" 2>&1) || { echo "$out" >&2; fail "$1 failed"; }
  echo "$out" | sed 's/^/    /'
  grep -q "grouped linear forward: OK" <<< "$out" || fail "$1 did not report OK"
}

# ---- 1, 2: find_package ------------------------------------------------------------------
for kind in shared static; do
  dir=$TMP/cmake-$kind
  static=OFF
  [ $kind = static ] && static=ON
  step "find_package(moex), moex::moex$([ $kind = static ] && echo _static)"
  run_logged "$TMP/cmake-$kind-configure.log" \
    cmake -S "$HERE" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PREFIX" \
          -DCMAKE_C_COMPILER="$CC" -DMOEX_APP_STATIC=$static
  grep -q "moex 0\.[0-9.]* from $LIBDIR/cmake/moex" "$TMP/cmake-$kind-configure.log" ||
    fail "find_package(moex) did not find the installed package (log: $TMP/cmake-$kind-configure.log)"
  run_logged "$TMP/cmake-$kind-build.log" cmake --build "$dir"
  if [ $kind = shared ]; then
    uses_prefix_lib "$dir/app"
  elif ldd "$dir/app" | grep -q libmoex; then
    fail "$dir/app links moex::moex_static but loads libmoex.so"
  fi
  run_app "$dir/app"
done

# ---- 3: pkg-config -------------------------------------------------------------------------
export PKG_CONFIG_PATH=$LIBDIR/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
step "pkg-config: $(pkg-config --cflags --libs moex) (moex $(pkg-config --modversion moex))"
pkg-config --exists 'moex >= 0.1' || fail "pkg-config: moex >= 0.1 not found through $PKG_CONFIG_PATH"
[ "$(pkg-config --variable=libdir moex)" = "$LIBDIR" ] ||
  fail "moex.pc: libdir is $(pkg-config --variable=libdir moex), not $LIBDIR"
mkdir -p "$TMP/pkgconfig-app"
# shellcheck disable=SC2046  # pkg-config's output is a list of words
run_logged "$TMP/pkgconfig-app/build.log" \
  "$CC" -std=c11 -Wall -Wextra -Werror "$HERE/app.c" -o "$TMP/pkgconfig-app/app" \
        $(pkg-config --cflags --libs moex)
uses_prefix_lib "$TMP/pkgconfig-app/app" "$LIBDIR"
run_app "$TMP/pkgconfig-app/app" "$LIBDIR"
for h in header_fp8 header_ep; do
  step "pkg-config: tests/header/$h.c (one experimental header alone)"
  # shellcheck disable=SC2046
  run_logged "$TMP/pkgconfig-app/$h.log" \
    "$CC" -std=c11 -pedantic -Wall -Wextra -Werror "$HERE/../header/$h.c" -o "$TMP/pkgconfig-app/$h" \
          $(pkg-config --cflags --libs moex)
  out=$(LD_LIBRARY_PATH=$LIBDIR "$TMP/pkgconfig-app/$h" 2>&1) || { echo "$out" >&2; fail "$h failed"; }
  echo "    $out"
done

rm -rf "$TMP"
echo "test_install: OK: installed, then found and linked by find_package (shared, static) and pkg-config (moex.h; moex_fp8.h and moex_ep.h alone)"
