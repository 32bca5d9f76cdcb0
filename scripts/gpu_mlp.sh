#!/usr/bin/env bash
# gpu_mlp.sh - the grouped MLP on the GPU machine, in one call: build the library, the host-time
# benchmark and the MLP tests (Release, sm_90a); the tests (TESTS, then compute-sanitizer memcheck,
# racecheck and synccheck over them); bench/host_time.c; bench/mlp_bench.py (moex
# against its six GEMMs, eager PyTorch and torch.compile, with peak memory).
# Usage: scripts/gpu_mlp.sh   Logs go to $OUT (the device tool's output folder) or $BUILD/mlp_out.
# Env: BUILD (default build-mlp), TESTS (default the MLP, MoE-layer and graph tests), SAN_TESTS
# (the tests the sanitizers run, default TESTS), SAN_TOOLS (default memcheck racecheck synccheck),
# MLP_ARGS (extra bench/mlp_bench.py arguments, e.g. "--profile --no-compile").
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-mlp}
OUT=${OUT:-$PWD/$BUILD/mlp_out}
mkdir -p "$OUT"
TESTS=${TESTS-cuda_test_gpu_grouped_mlp cuda_test_gpu_moe_layer cuda_test_gpu_graph}
{ cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEX_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a &&
  ninja -C "$BUILD" moex moex_host_time $TESTS; } > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
for t in $TESTS; do
    "$BUILD/tests/$t" > "$OUT/$t.log" 2>&1
    echo "$t: rc=$? $(grep -E 'passed' "$OUT/$t.log" | tail -1)"
    grep -m5 FAIL "$OUT/$t.log"
done
SAN_TESTS=${SAN_TESTS-$TESTS}
for tool in ${SAN_TOOLS-memcheck racecheck synccheck}; do
    for t in $SAN_TESTS; do
        timeout 300 compute-sanitizer --tool $tool "$BUILD/tests/$t" > "$OUT/${tool}_$t.log" 2>&1
        echo "$tool $t: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/${tool}_$t.log")"
    done
done
"$BUILD/bench/moex_host_time" | tee "$OUT/host_time.log"
MOEX_LIBRARY=$PWD/$BUILD/libmoex.so PYTHONPATH=$PWD/python:$PWD/bench python3 bench/mlp_bench.py ${MLP_ARGS:-} \
    > "$OUT/mlp_bench.log" 2>&1
grep -v '^{' "$OUT/mlp_bench.log" | tail -40
