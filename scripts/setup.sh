#!/usr/bin/env bash
# Installs what the build needs when it is missing (cmake, a C compiler, OpenBLAS, and
# pkg-config for tests/install) and builds moex into build/ (or $MOEX_BUILD_DIR). Sourced by
# scripts/test.sh and scripts/run.sh.
# Without root or apt-get it says what is missing and builds without OpenBLAS.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD_DIR=${MOEX_BUILD_DIR:-build}

missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v cc >/dev/null || missing+=(build-essential)
command -v python3 >/dev/null || missing+=(python3)
command -v pkg-config >/dev/null || missing+=(pkg-config)
# (any one of the places will do: `ls` of both fails when one of them is absent)
have_cblas=0
for f in /usr/include/*/openblas*/cblas.h /usr/include/openblas/cblas.h; do
  [ -f "$f" ] && have_cblas=1
done
[ $have_cblas = 1 ] || missing+=(libopenblas-dev)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing ${missing[*]}" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}") >/dev/null ||
      echo "setup: apt-get could not install ${missing[*]}; continuing with what is here" >&2
  else
    echo "setup: missing ${missing[*]} and cannot apt-get (not root); continuing without them" >&2
  fi
fi
command -v cmake >/dev/null || { echo "setup: cmake is required" >&2; exit 1; }

gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release ${MOEX_CMAKE_ARGS:-}
fi
cmake --build "$BUILD_DIR" -j "$(nproc)"
