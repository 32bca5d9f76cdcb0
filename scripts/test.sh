#!/usr/bin/env bash
# Runs every test, in four stages (MOEX_TEST_STAGES, default "unit sanitize fuzz python"):
#   unit      builds build/ (installing what is missing, scripts/setup.sh) and runs CTest;
#             GPU tests report skipped where there is no GPU; then tests/install/test_install.sh:
#             installs build/ into a temporary prefix and builds and runs a user's program
#             against it (find_package(moex), pkg-config);
#   sanitize  builds build-asan/ with every C target under AddressSanitizer and
#             UndefinedBehaviorSanitizer (clang, installed through apt-get when missing;
#             gcc when it cannot be) and runs the CPU tests again: any report fails them;
#   fuzz      scripts/fuzz.sh for MOEX_FUZZ_SECONDS (default 180): the libFuzzer harness of
#             tests/fuzz over every public operation (README: running it longer);
#   python    scripts/test_python.sh: pip-installs ./python (and torch, pytest when missing)
#             and runs pytest over tests/python.
# Extra arguments go to each CTest run (e.g. -R grouped_linear).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
STAGES=" ${MOEX_TEST_STAGES:-unit sanitize fuzz python} "

if [[ $STAGES == *" unit "* ]]; then
  source scripts/setup.sh
  ctest --test-dir "${MOEX_BUILD_DIR:-build}" --output-on-failure -j 2 "$@"
  bash tests/install/test_install.sh "${MOEX_BUILD_DIR:-build}"
fi

if [[ $STAGES == *" sanitize "* ]]; then
  source scripts/setup_clang.sh
  ASAN_DIR=${MOEX_ASAN_BUILD_DIR:-build-asan}
  if [ ! -f "$ASAN_DIR/CMakeCache.txt" ]; then
    gen=()
    command -v ninja >/dev/null && gen=(-G Ninja)
    cxx=()
    [ "$MOEX_SAN_CC" = clang ] && command -v clang++ >/dev/null && cxx=(-DCMAKE_CXX_COMPILER=clang++)
    cmake -S . -B "$ASAN_DIR" "${gen[@]}" "${cxx[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
          -DCMAKE_C_COMPILER="$MOEX_SAN_CC" -DMOEX_SANITIZE=ON -DMOEX_CUDA=OFF
  fi
  cmake --build "$ASAN_DIR" -j "$(nproc)"
  # halt_on_error: the first report fails the test; the CPU tests only (no GPU build here)
  ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1:abort_on_error=1} \
  UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1} \
    ctest --test-dir "$ASAN_DIR" --output-on-failure -j 2 -LE cuda "$@"
fi

if [[ $STAGES == *" fuzz "* ]]; then
  bash scripts/fuzz.sh "${MOEX_FUZZ_SECONDS:-180}"
fi

if [[ $STAGES == *" python "* ]]; then
  bash scripts/test_python.sh
fi
