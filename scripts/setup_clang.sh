#!/usr/bin/env bash
# Finds the C compiler for the sanitizer builds and sets MOEX_SAN_CC: clang with its
# sanitizer and libFuzzer runtimes (Debian's clang and libclang-rt-dev, installed through
# apt-get when missing and it runs as root), else gcc (ASan + UBSan, no libFuzzer), and
# MOEX_SAN_HAVE_FUZZER=1 when clang can link a libFuzzer target. Sourced by scripts/test.sh
# and scripts/fuzz.sh.

san_cc_works() {   # compiler: can it link a program with ASan + UBSan?
  local dir
  dir=$(mktemp -d)
  echo 'int main(void) { return 0; }' > "$dir/t.c"
  "$1" -fsanitize=address,undefined "$dir/t.c" -o "$dir/t" >/dev/null 2>&1
  local rc=$?
  rm -rf "$dir"
  return $rc
}

fuzzer_works() {
  local dir
  dir=$(mktemp -d)
  printf '#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n' > "$dir/f.c"
  clang -fsanitize=fuzzer,address,undefined "$dir/f.c" -o "$dir/f" >/dev/null 2>&1
  local rc=$?
  rm -rf "$dir"
  return $rc
}

if ! { command -v clang >/dev/null && fuzzer_works; }; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup_clang: installing clang and libclang-rt-dev" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang libclang-rt-dev) >/dev/null ||
      echo "setup_clang: apt-get could not install clang" >&2
  fi
fi

MOEX_SAN_HAVE_FUZZER=0
if command -v clang >/dev/null && san_cc_works clang; then
  MOEX_SAN_CC=clang
  fuzzer_works && MOEX_SAN_HAVE_FUZZER=1
elif command -v gcc >/dev/null && san_cc_works gcc; then
  MOEX_SAN_CC=gcc
  echo "setup_clang: no clang with sanitizers; the sanitizer build uses gcc" >&2
else
  echo "setup_clang: no compiler here links -fsanitize=address,undefined" >&2
  exit 1
fi
export MOEX_SAN_CC MOEX_SAN_HAVE_FUZZER
