#!/usr/bin/env bash
# sm90_quick.sh - the short GPU loop for Hopper kernel work (one device call): build with
# CMake for sm_90a, the sm90 correctness tests in each kernel variant, the CUDA backend
# tests, bench/gemm_bench.py on $CONFIGS / $OPS, then bench/torch_grouped_mm.py compare for
# each "CFG,CFG:OP[:VARIANT,VARIANT]" word of $COMPARE. Logs to $LOGS (a tarball of them in $OUT when set);
# the table rows as they come. CTEST_R: the CUDA backend tests run (a ctest -R expression;
# unset: all of them; empty: none). VARIANTS: the test_sm90_gemm variants ("ARGS;ARGS", default
# all of ALL_VARIANTS), TEST_TIMEOUT: seconds per sm90 test run (default 120).
set -u
cd "$(dirname "$0")/.."
LOGS=${LOGS:-$PWD/build-gpu/quick_out}
CONFIGS=${CONFIGS-qwen3-30b-fc1,dsv3-fc2}
OPS=${OPS-fwd,fwd_bias,fwd_sbias}
COMPARE=${COMPARE:-}
mkdir -p "$LOGS"
pack() { [ -n "${OUT:-}" ] && tar czf "$OUT/quick_logs.tgz" -C "$LOGS" . ; }
trap pack EXIT TERM
{ cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a &&
  ninja -C build-gpu; } > "$LOGS/build.log" 2>&1 || { tail -40 "$LOGS/build.log"; exit 1; }
echo "build ok"
timeout ${TEST_TIMEOUT:-120} build-gpu/tests/cuda_test_sm90_epilogue > "$LOGS/epilogue.log" 2>&1
echo "test_sm90_epilogue rc=$? ok=$(grep -c '^ok' "$LOGS/epilogue.log") $(tail -1 "$LOGS/epilogue.log")"
grep -E "FAIL" "$LOGS/epilogue.log" | head -12
ALL_VARIANTS=("1 0 0" "1 1 0" "1 0 64" "0 0 128" "1 0 0 256 3" "1 1 0 256 3" "1 0 0 0 0 6 2" "1 1 0 0 0 5 2"
              "1 0 64 0 0 7 2")
[ -n "${VARIANTS:-}" ] && IFS=';' read -r -a ALL_VARIANTS <<< "$VARIANTS"
for v in "${ALL_VARIANTS[@]}"; do
    timeout ${TEST_TIMEOUT:-120} build-gpu/tests/cuda_test_sm90_gemm $v > "$LOGS/sm90_gemm_${v// /_}.log" 2>&1
    echo "test_sm90_gemm $v rc=$? fail=$(grep -c FAIL "$LOGS/sm90_gemm_${v// /_}.log")"
    grep FAIL "$LOGS/sm90_gemm_${v// /_}.log" | head -4
done
[ -n "${CTEST_R-x}" ] && (cd build-gpu && ctest -L cuda -R "${CTEST_R:-.}" -j4 --timeout 300 2>&1 | grep -E "Test +#|tests passed")
[ -n "$OPS" ] && python3 bench/gemm_bench.py --lib build-gpu/libmoex.so --out "$LOGS" --ops "$OPS" --configs "$CONFIGS" \
    2>&1 | tee "$LOGS/bench.log" | grep -E "^(dsv3|qwen3|mixtral|gptoss)"
for c in $COMPARE; do   # CFG,CFG:OP[:VARIANT,VARIANT]
    IFS=: read -r cfgs op variants <<< "$c"
    d="$LOGS/compare_${cfgs}_${op}"
    mkdir -p "$d"
    python3 bench/torch_grouped_mm.py compare build-gpu/bench/libmoex_sm90_bench.so "$d" "$cfgs" "$op" ${variants:+"$variants"} \
        2>&1 | tee "$d/log" | grep -E "^(dsv3|qwen3|mixtral|gptoss|g256)"
done
