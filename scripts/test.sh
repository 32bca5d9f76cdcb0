#!/usr/bin/env bash
# Runs every test, in five stages (MOEX_TEST_STAGES, default "unit example sanitize fuzz python"):
#   unit      builds build/ (installing what is missing, scripts/setup.sh; the CUDA backend as
#             MOEX_CUDA says: AUTO for this machine's GPUs, none without one; CI sets ON) and
#             runs CTest; GPU tests report skipped where there is no GPU; then
#             tests/install/test_install.sh: installs build/ into a temporary prefix and builds
#             and runs a user's program against it (find_package(moex), pkg-config);
#   example   installs build/ into a temporary prefix, builds examples/c/grouped_mlp.c against
#             it with find_package(moex) (examples/c/CMakeLists.txt) and with pkg-config
#             (examples/c/Makefile; with the CUDA runtime where moex has its CUDA backend), and
#             runs both: the grouped MLP forward and backward on the CPU, and on the GPU where
#             there is one, checked against the program's own reference;
#   sanitize  builds build-asan/ with every C target under AddressSanitizer and
#             UndefinedBehaviorSanitizer (clang, installed through apt-get when missing;
#             gcc when it cannot be) and runs the CPU tests again: any report fails them;
#   fuzz      scripts/fuzz.sh for MOEX_FUZZ_SECONDS (default 180): the libFuzzer harness of
#             tests/fuzz over every public operation (README: running it longer);
#   python    scripts/test_python.sh: in a virtual environment in build/ (build/venv), installs
#             torch and pytest when missing and pip-installs ./python, then runs pytest over
#             tests/python.
# Extra arguments go to each CTest run (e.g. -R grouped_linear).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
STAGES=" ${MOEX_TEST_STAGES:-unit example sanitize fuzz python} "

if [[ $STAGES == *" unit "* ]]; then
  source scripts/setup.sh
  ctest --test-dir "${MOEX_BUILD_DIR:-build}" --output-on-failure -j 2 "$@"
  bash tests/install/test_install.sh "${MOEX_BUILD_DIR:-build}"
fi

if [[ $STAGES == *" example "* ]]; then
  [[ $STAGES == *" unit "* ]] || source scripts/setup.sh
  EX=$(mktemp -d "${TMPDIR:-/tmp}/moex-example.XXXXXX")
  # logged <log> <command...>: the command's output goes to <log>, shown when it fails
  logged() { local log=$1; shift; "$@" > "$log" 2>&1 || { cat "$log" >&2; echo "example: FAILED: $*" >&2; exit 1; }; }
  echo "example: cmake --install ${MOEX_BUILD_DIR:-build} --prefix $EX/prefix"
  logged "$EX/install.log" cmake --install "${MOEX_BUILD_DIR:-build}" --prefix "$EX/prefix"
  logged "$EX/cmake.log" cmake -S examples/c -B "$EX/cmake" -DCMAKE_BUILD_TYPE=Release \
         -DCMAKE_PREFIX_PATH="$EX/prefix"
  echo "example: find_package: $(grep -o "moex 0\..*" "$EX/cmake.log")"
  logged "$EX/cmake-build.log" cmake --build "$EX/cmake"
  "$EX/cmake/grouped_mlp"
  ex_cuda=0
  grep -qs 'set(moex_HAVE_CUDA ON)' "$EX"/prefix/lib*/cmake/moex/moexConfig.cmake && ex_cuda=1
  pc_dir=$(dirname "$(find "$EX/prefix" -name moex.pc)")
  echo "example: pkg-config: PKG_CONFIG_PATH=$pc_dir make -f examples/c/Makefile CUDA=$ex_cuda"
  logged "$EX/make.log" env PKG_CONFIG_PATH="$pc_dir" make -C "$EX" -f "$PWD/examples/c/Makefile" CUDA=$ex_cuda
  "$EX/grouped_mlp"
  rm -rf "$EX"
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
