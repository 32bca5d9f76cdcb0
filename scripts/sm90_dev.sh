#!/usr/bin/env bash
# sm90_dev.sh - one device call for the Hopper grouped GEMMs: build (nvcc, sm_90a), SASS check
# (HGMMA), the correctness test in each kernel variant, then torch._grouped_mm against the
# sm90 kernels on the same shapes, splits and tensors (bench/torch_grouped_mm.py), ending
# with one table. Logs go to $OUT (or ./sm90_out); builds to $B (or /tmp/sm90_build).
#   scripts/sm90_dev.sh [CFG...]      (configs of bench/torch_grouped_mm.py; default all)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-$PWD/sm90_out}
B=${B:-/tmp/sm90_build}
mkdir -p "$OUT" "$B"
NV="nvcc -O3 -std=c++17 -lineinfo -gencode arch=compute_90a,code=sm_90a -Iinclude -Isrc/core -Isrc/cpu"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader
set -e
$NV -Xcompiler -fPIC -Xptxas -v -c src/cuda/sm90_grouped_gemm.cu -o $B/sm90.o 2>&1 | grep -E "registers|spill|error|warning" | sort | uniq -c || true
$NV -shared $B/sm90.o -o $B/libsm90.so
gcc -std=c11 -O2 -Wall -Iinclude -I"$(dirname "$(which nvcc)")/../include" -c tests/cuda/test_sm90_gemm.c -o $B/test.o
$NV $B/test.o $B/sm90.o -o $B/test_sm90
$NV bench/sm90_gemm_bench.cu $B/sm90.o -o $B/sm90_bench
set +e
echo "HGMMA in SASS: $(cuobjdump -sass $B/sm90.o | grep -c HGMMA)"
declare -A RC
for v in "0 0" "1 0" "1 2"; do
  tag=${v// /_}
  timeout 60 $B/test_sm90 $v > $OUT/test_$tag.log 2>&1
  RC[$tag]=$?
done
PYTHONUNBUFFERED=1 timeout 240 python3 bench/torch_grouped_mm.py compare $B/libsm90.so "$OUT" "$@" > $OUT/compare.log 2>&1
crc=$?
grep -h "ceiling" $OUT/compare.log
for tag in "${!RC[@]}"; do
  echo "test (epilogue_tma cluster = $tag): rc=${RC[$tag]} ok=$(grep -c '^ok' $OUT/test_$tag.log) fail=$(grep -c 'FAIL' $OUT/test_$tag.log)"
  grep -h "FAIL" $OUT/test_$tag.log | head -6 | sed 's/^/  /'
done
echo "compare rc=$crc"
sed -n '/^ratio =/,$p' $OUT/compare.log
tail -3 $OUT/compare.log | grep -i -E "error|Traceback" || true
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
