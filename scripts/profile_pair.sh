#!/usr/bin/env bash
# profile_pair.sh - Nsight Compute on torch._grouped_mm's kernel and the moex sm90 kernel for
# the same op, shape and split values (bench/torch_grouped_mm.py pair): kernel names (torch's
# carries its CUTLASS tile and cluster shape), launch shape, throughputs and warp stalls.
# Usage: scripts/profile_pair.sh [CFG:OP:KIND[:VARIANT,VARIANT...] ...]   (build-gpu already
# built; variants: names of TUNES in bench/torch_grouped_mm.py, profiled after torch's kernel)
# Env: BUILD (default build-gpu), LOGS (default $BUILD/pair_out), NCU_EXTRA (more ncu
# arguments, e.g. "--section SourceCounters" for the top stall locations), METRICS_EXTRA
# (more metrics, comma-separated, e.g. regex:smsp__warp_issue_stalled_.*_per_warp_active.pct).
# SHOW (lines of the summary per spec, default 40).
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-gpu}
LOGS=${LOGS:-$PWD/$BUILD/pair_out}
mkdir -p "$LOGS"
METRICS=gpu__time_duration.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,\
lts__t_bytes.sum,dram__bytes_read.sum,dram__bytes_write.sum,sm__cycles_elapsed.avg.per_second${METRICS_EXTRA:+,$METRICS_EXTRA}
for spec in ${*:-"dsv3-fc2:wgrad:balanced"}; do
    IFS=: read -r cfg op kind variants <<< "$spec"
    log="$LOGS/pair_${cfg}_${op}_${kind}${variants:+_${variants//,/_}}.log"
    timeout 300 ncu --nvtx --nvtx-include "profile/" --section LaunchStats --section SpeedOfLight \
        --section WarpStateStats ${NCU_EXTRA:-} --metrics "$METRICS" \
        python3 bench/torch_grouped_mm.py pair "$BUILD/bench/libmoex_sm90_bench.so" "$cfg" "$op" "$kind" ${variants:+"$variants"} > "$log" 2>&1
    echo "=== $spec rc=$?"
    grep -E "^  [a-zA-Z_].*\(|^    (Duration|Compute \(SM\) Throughput|L2 Cache Throughput|DRAM Throughput|Grid Size|Cluster Size|Registers Per|Warp Cycles Per Issued|Dynamic Shared)|gmma|lts__|dram__bytes|cycles_elapsed|Stall" "$log" | cut -c1-200 | head -${SHOW:-40}
done
