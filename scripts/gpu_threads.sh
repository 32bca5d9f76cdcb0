#!/usr/bin/env bash
# gpu_threads.sh - calls from threads without a current CUDA context, on the GPU machine, in
# one call (issue #30 item 1):
#   build     this tree (Release, sm_90a) in $BUILD, and, when BASE_SRC names the source tree
#             of an earlier revision, its library in $BUILD-base, to show the tests fail there;
#   ctest     every CUDA test, the *_fresh_thread variants included (each moex call of the GPU
#             mirror on a new thread whose first CUDA work it is);
#   python    tests/python/test_torch_threads.py against this tree's library, and against the
#             base library (expected to fail) when there is one;
#   stress    gpu_check.sh's stress stage (tests/stress/torch_stress.py in fresh processes;
#             zero failures allowed; STRESS_PROCS, STRESS_CALLS);
#   sanitize  compute-sanitizer memcheck over cuda_test_gpu_splits (zero_tail) on fresh threads.
# Usage: BASE_SRC=DIR scripts/gpu_threads.sh [stage ...]   Logs and summary.txt go to $OUT.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-threads}
OUT=${OUT:-$PWD/$BUILD/out}
mkdir -p "$OUT"
STAGES=${*:-build ctest python stress sanitize}
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
has() { [[ " $STAGES " == *" $1 "* ]]; }
note "gpu_threads $(date -u +%FT%TZ) commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)} base ${BASE_SRC:-none}"
note "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"

if has build; then
    t0=$SECONDS
    { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEX_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a &&
      ninja -C "$BUILD"; } > "$OUT/build.log" 2>&1
    rc=$?
    note "build: rc=$rc in $((SECONDS - t0)) s"
    [ $rc -eq 0 ] || { tail -30 "$OUT/build.log"; exit 1; }
    if [ -n "${BASE_SRC:-}" ]; then
        t0=$SECONDS
        { cmake -S "$BASE_SRC" -B "$BUILD-base" -G Ninja -DCMAKE_BUILD_TYPE=Release \
                -DMOEX_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DMOEX_TESTS=OFF &&
          ninja -C "$BUILD-base" moex; } > "$OUT/build_base.log" 2>&1
        note "build base: rc=$? in $((SECONDS - t0)) s"
    fi
fi

if has ctest; then
    t0=$SECONDS
    (cd "$BUILD" && ctest -L cuda --output-on-failure -j 4 --timeout 900) > "$OUT/ctest.log" 2>&1
    note "ctest -L cuda: rc=$? in $((SECONDS - t0)) s: $(grep -E 'tests passed' "$OUT/ctest.log")"
    grep -E '^ *[0-9]+/[0-9]+ Test' "$OUT/ctest.log" | grep -v ' Passed' | sed 's/^/  /' | tee -a "$SUMMARY" > /dev/null
fi

pytest_threads() {   # library python-package-dir label
    MOEX_LIBRARY=$1 PYTHONPATH=$2 PYTHONUNBUFFERED=1 \
        python3 -m pytest -q -p no:cacheprovider tests/python/test_torch_threads.py > "$OUT/threads_$3.log" 2>&1
    note "test_torch_threads ($3 library and package): rc=$? $(tail -1 "$OUT/threads_$3.log")"
    grep -oE 'MOEX_ERR_[A-Z_]+: [^\\]{0,200}' "$OUT/threads_$3.log" | sort | uniq -c | head -4 | sed 's/^/  /' |
        tee -a "$SUMMARY" > /dev/null
}
if has python; then
    pytest_threads "$PWD/$BUILD/libmoex.so" "$PWD/python" this
    if [ -f "$BUILD-base/libmoex.so" ]; then
        pytest_threads "$PWD/$BUILD-base/libmoex.so" "$BASE_SRC/python" base
        # this tree's C test with the base library (the loader takes LD_LIBRARY_PATH first)
        MOEX_TEST_FRESH_THREAD=1 LD_LIBRARY_PATH=$PWD/$BUILD-base "$BUILD"/tests/cuda_test_gpu_grouped_linear \
            > "$OUT/c_threads_base.log" 2>&1
        note "cuda_test_gpu_grouped_linear_fresh_thread (base library): rc=$? $(tail -1 "$OUT/c_threads_base.log")"
        grep -m2 -E 'FAIL' "$OUT/c_threads_base.log" | cut -c1-240 | sed 's/^/  /' | tee -a "$SUMMARY" > /dev/null
    fi
fi

if has stress; then   # gpu_check.sh's stage, on this build
    BUILD=$BUILD OUT=$OUT/stress bash scripts/gpu_check.sh stress > /dev/null 2>&1
    grep -E '^(stress|  torch_stress)' "$OUT/stress/summary.txt" | tee -a "$SUMMARY"
    grep -m5 -E '^call ' "$OUT/stress/stress.log" | cut -c1-300 | sed 's/^/  /' | tee -a "$SUMMARY"
fi

if has sanitize; then
    t0=$SECONDS
    MOEX_TEST_FRESH_THREAD=1 timeout 600 compute-sanitizer --tool memcheck --error-exitcode 9 \
        "$BUILD"/tests/cuda_test_gpu_splits > "$OUT/sanitize.log" 2>&1
    note "memcheck cuda_test_gpu_splits (fresh threads): rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/sanitize.log" | tail -1) $((SECONDS - t0)) s"
fi

echo
echo "================ summary ================"
cat "$SUMMARY"
