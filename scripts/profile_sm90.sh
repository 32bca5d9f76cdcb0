#!/usr/bin/env bash
# profile_sm90.sh - Nsight Compute profiles of the Hopper grouped GEMM kernels, one launch
# each, taken from `moex bench --backend cuda` (which runs forward, dgrad, wgrad in that
# order): tensor-pipe utilisation, memory throughput and the warp stall reasons, so that a
# kernel change is aimed at what actually stalls.
# Usage: scripts/profile_sm90.sh [SPEC ...]   SPEC = config:splits:kernel-regex
# Env: BUILD (default build-gpu, already built), OUT (logs; default $BUILD/prof_out).
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-gpu}
OUT=${OUT:-$PWD/$BUILD/prof_out}
mkdir -p "$OUT"
SPECS=${*:-"qwen3-30b-fc2:balanced:FWD dsv3-fc1:balanced:FWD qwen3-30b-fc1:balanced:sm90_wgrad_kernel dsv3-fc1:balanced:sm90_wgrad_kernel"}
# FWD and DGRAD stand for the regexes of the default bf16 instances of sm90_rows_kernel
# <IS_F16, BM, CM, OP, SK, EPI_TMA> (src/cuda/sm90_grouped_gemm.cu): 128 rows, 2-CTA clusters,
# OP MOEX_SM90_EPI_PLAIN = 0 (the plain forward) or SM90_OP_DGRAD + MOEX_SM90_EPI_PLAIN = 8 (the
# plain dgrad), any stream-K
FWD="sm90_rows_kernel<.int.0, .int.128, .int.2, .int.0,"
DGRAD="sm90_rows_kernel<.int.0, .int.128, .int.2, .int.8,"
METRICS=gpu__time_duration.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,\
lts__t_bytes.sum.per_second,dram__bytes.sum.per_second,lts__t_sector_hit_rate.pct
IFS=$'\n'
for spec in $(echo "$SPECS" | sed 's/ \([a-z0-9-]*:\)/\n\1/g'); do
    cfg=${spec%%:*}; rest=${spec#*:}; sp=${rest%%:*}; kre=${rest#*:}
    case $kre in FWD) kre=$FWD ;; DGRAD) kre=$DGRAD ;; esac
    log="$OUT/prof_${cfg}_${sp}_$(echo "$kre" | tr -cd 'a-z0-9_').log"
    timeout 240 ncu --kernel-name-base demangled -k "regex:$kre" --launch-count 1 \
        --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy \
        --metrics "$METRICS" \
        "$BUILD"/moex bench --backend cuda --config "$cfg" --splits "$sp" --iters 1 > "$log" 2>&1
    echo "=== $cfg $sp $kre rc=$?"
    grep -E "^ +(Duration|Compute \(SM\) Throughput|L2 Cache Throughput|DRAM Throughput|Warp Cycles Per Issued)|lts__t_bytes|dram__bytes.sum|hit_rate|gmma|This stall type" "$log" | head -16
done
