#!/usr/bin/env bash
# Runs the libFuzzer harness of tests/fuzz (every public operation and size query of
# moex.h, under ASan + UBSan; tests/fuzz/fuzz.h lists its faults and oracles) for a bounded
# time:
#
#   scripts/fuzz.sh [seconds]        (default 180)
#
# Run it longer by giving more seconds (scripts/fuzz.sh 3600 for an hour; the corpus it
# grows is kept in build-fuzz/fuzz/corpus, so successive runs continue where the last one
# stopped). It builds build-fuzz/ with clang and -DMOEX_FUZZ=ON (scripts/setup_clang.sh
# installs clang and its libFuzzer runtime through apt-get when they are missing and it runs
# as root), copies the seed corpus tests/fuzz/corpus into
# build-fuzz/fuzz/corpus (tests/fuzz/corpus is never written), and runs one fuzzing
# process. At the end it prints the inputs executed; it exits 1 on any finding (a crash,
# a sanitizer report, a failed oracle, a timeout, an out-of-memory), printing the path of
# the input that caused it (kept in build-fuzz/fuzz/artifacts/), and 1 with a message when
# clang or libFuzzer is unavailable.
#
# Environment: MOEX_FUZZ_BUILD_DIR (default build-fuzz), MOEX_FUZZ_MAX_LEN (default 512).
# To see what an input does: build-fuzz/tests/fuzz/moex_fuzz_run --verbose FILE
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SECONDS_TO_RUN=${1:-180}
BUILD_DIR=${MOEX_FUZZ_BUILD_DIR:-build-fuzz}
MAX_LEN=${MOEX_FUZZ_MAX_LEN:-512}
if ! [[ $SECONDS_TO_RUN =~ ^[0-9]+$ ]] || [ "$SECONDS_TO_RUN" -lt 1 ]; then
  echo "usage: scripts/fuzz.sh [seconds]   (a positive number of seconds, default 180)" >&2
  exit 2
fi

# ---- clang with libFuzzer (installed by setup_clang.sh when missing and it can) -------------
source scripts/setup_clang.sh
if [ "$MOEX_SAN_HAVE_FUZZER" != 1 ]; then
  echo "fuzz.sh: FAILED: no clang that links -fsanitize=fuzzer,address,undefined here" >&2
  echo "fuzz.sh: install clang and libFuzzer (Debian: apt-get install clang libclang-rt-dev)" >&2
  exit 1
fi
command -v cmake >/dev/null || { echo "fuzz.sh: FAILED: cmake is required" >&2; exit 1; }

# ---- build ---------------------------------------------------------------------------------
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  cmake -S . -B "$BUILD_DIR" "${gen[@]}" -DCMAKE_C_COMPILER=clang -DMOEX_CUDA=OFF -DMOEX_FUZZ=ON \
        -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build "$BUILD_DIR" -j "$(nproc)" --target moex_fuzz moex_fuzz_run
FUZZER="$BUILD_DIR/tests/fuzz/moex_fuzz"
[ -x "$FUZZER" ] || { echo "fuzz.sh: FAILED: $FUZZER was not built (is MOEX_FUZZ=ON in $BUILD_DIR?)" >&2; exit 1; }

# ---- run -------------------------------------------------------------------------------------
WORK="$BUILD_DIR/fuzz"
mkdir -p "$WORK/corpus" "$WORK/artifacts"
cp -n tests/fuzz/corpus/* "$WORK/corpus/" 2>/dev/null || true
LOG="$WORK/fuzz.log"
STAMP="$WORK/.start"
touch "$STAMP"
echo "fuzz.sh: fuzzing for $SECONDS_TO_RUN s: $FUZZER over $WORK/corpus (log: $LOG)"
set +e
# detect_leaks=0: the EP cases (MPI builds) initialise Open MPI, which leaks at exit (LeakSanitizer
# reports it after the run as a crash of an empty input)
ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=0} \
UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1} \
  "$FUZZER" -max_total_time="$SECONDS_TO_RUN" -max_len="$MAX_LEN" -timeout=30 -rss_limit_mb=4096 \
            -print_final_stats=1 -artifact_prefix="$WORK/artifacts/" "$WORK/corpus" > "$LOG" 2>&1
rc=$?
set -e

execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$LOG" | tail -1)
speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$LOG" | tail -1)
calls=$(grep -E -o 'moex_fuzz: [0-9]+ inputs.*' "$LOG" | tail -1 || true)
found=$(find "$WORK/artifacts" -type f -newer "$STAMP" 2>/dev/null | sort)
echo "fuzz.sh: executed ${execs:-?} inputs (${speed:-?} per second); corpus: $(ls "$WORK/corpus" | wc -l) inputs"
[ -n "$calls" ] && echo "fuzz.sh: $calls"
if [ $rc -ne 0 ] || [ -n "$found" ]; then
  echo "fuzz.sh: FAILED: the fuzzer found a problem (libFuzzer exit $rc); what it reported (full log: $LOG):" >&2
  grep -E -A4 'moex_fuzz: FAILED oracle' "$LOG" | grep -v '^ *#' | head -8 >&2 || true
  grep -E 'runtime error|ERROR: [A-Za-z]*Sanitizer|ERROR: libFuzzer|^SUMMARY|sanitizer report|^  (backend|fault)' "$LOG" |
    head -12 >&2 || true
  for f in $found; do
    echo "fuzz.sh: input that triggers it: $f   (replay: $BUILD_DIR/tests/fuzz/moex_fuzz_run --verbose $f)" >&2
  done
  exit 1
fi
echo "fuzz.sh: no findings"
