#!/usr/bin/env bash
# sm90_quick.sh - the short GPU loop for Hopper kernel work (one device call): build with
# CMake for sm_90a, the sm90 correctness tests in each kernel variant, the CUDA backend
# tests, then bench/gemm_bench.py on $CONFIGS / $OPS. Logs to $OUT; a summary last.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/build-gpu/quick_out}
CONFIGS=${CONFIGS:-qwen3-30b-fc1,dsv3-fc2}
OPS=${OPS:-fwd,fwd_bias,fwd_sbias}
mkdir -p "$OUT"
{ cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a &&
  ninja -C build-gpu; } > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "build ok"
build-gpu/tests/cuda_test_sm90_epilogue > "$OUT/epilogue.log" 2>&1
echo "test_sm90_epilogue rc=$? ok=$(grep -c '^ok' "$OUT/epilogue.log") $(tail -1 "$OUT/epilogue.log")"
grep -E "FAIL" "$OUT/epilogue.log" | head -12
for v in "1 0 0" "1 1 0" "1 0 64" "0 0 128"; do
    build-gpu/tests/cuda_test_sm90_gemm $v > "$OUT/sm90_gemm_${v// /_}.log" 2>&1
    echo "test_sm90_gemm $v rc=$? fail=$(grep -c FAIL "$OUT/sm90_gemm_${v// /_}.log")"
    grep FAIL "$OUT/sm90_gemm_${v// /_}.log" | head -4
done
(cd build-gpu && ctest -L cuda -j4 --timeout 300 2>&1 | grep -E "Test +#|tests passed")
[ -n "$OPS" ] && python3 bench/gemm_bench.py --lib build-gpu/libmoex.so --out "$OUT" --ops "$OPS" --configs "$CONFIGS" \
    > "$OUT/bench.log" 2>&1; tail -${BENCH_TAIL:-24} "$OUT/bench.log"
