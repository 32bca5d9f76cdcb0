#!/usr/bin/env bash
# gpu_quant.sh - the FP8 quantization on the GPU machine, in one call: build the library and
# the quantization and scaled-GLU tests (Release, sm_90a), run them (bit for bit against the
# fp64 reference, the GLU's fused FP8 z against GLU + quantize, CUDA-graph replays),
# compute-sanitizer memcheck over them, then bench/quant_bench.py.
# Usage: scripts/gpu_quant.sh   Logs go to $OUT (the device tool's output folder) or
# $BUILD/quant_out. Env: BUILD (default build-quant).
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-quant}
OUT=${OUT:-$PWD/$BUILD/quant_out}
mkdir -p "$OUT"
TESTS="cuda_test_gpu_quantize cuda_test_gpu_weight_quantize cuda_test_gpu_scaled_glu cuda_test_gpu_graph"
{ cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEX_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a &&
  ninja -C "$BUILD" moex $TESTS; } > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
for t in $TESTS; do
    "$BUILD/tests/$t" > "$OUT/$t.log" 2>&1
    echo "$t: rc=$? $(grep -E 'passed' "$OUT/$t.log" | tail -1)"
    grep -m5 FAIL "$OUT/$t.log"
done
for t in cuda_test_gpu_quantize cuda_test_gpu_weight_quantize cuda_test_gpu_scaled_glu; do
    timeout 300 compute-sanitizer --tool memcheck --leak-check no "$BUILD/tests/$t" > "$OUT/memcheck_$t.log" 2>&1
    echo "memcheck $t: $(grep 'ERROR SUMMARY' "$OUT/memcheck_$t.log")"
done
MOEX_LIBRARY=$PWD/$BUILD/libmoex.so PYTHONPATH=$PWD/python python3 bench/quant_bench.py > "$OUT/bench.log" 2>&1
tail -7 "$OUT/bench.log"
