#!/usr/bin/env bash
# profile_fp8.sh - Nsight Compute profiles of the Hopper FP8 kernels as the grouped MLP's FP8
# (block) step runs them through moex.torch (bench/mlp_bench.py): the first launches of each
# kernel name, with duration, L2 and DRAM throughput and the warps' stall reasons, so that an
# FP8 kernel change is aimed at what actually binds it.
# Usage: scripts/profile_fp8.sh   (MOEX_LIBRARY, MOEX_TORCH_EXTENSION, PYTHONPATH set, as
# scripts/gpu_python.sh exports them). Env: OUT (logs; default build-prof/fp8_out), CONFIGS (default
# qwen3-30b), KERNELS ("regex:count ...", default the weight gradient's two launches of a step
# and the forward kernel's four: FC1 + GLU, FC2, FC2's and FC1's backward data), RECIPES (the FP8
# recipes profiled, default block), SOURCE (when set: also each kernel's first launch with the
# warps' stall samples per SASS instruction, scripts/ncu_source_top.py's table; the page's CSV in OUT),
# BENCH (the program profiled, run in bench/, instead of the MLP step: e.g. "python3 quant_bench.py
# 32768 2048 128"; CONFIGS and RECIPES then only name the logs).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/build-prof/fp8_out}
mkdir -p "$OUT"
CONFIGS=${CONFIGS:-qwen3-30b}
KERNELS=${KERNELS:-"sm90_fp8_wgrad_kernel:2 sm90_fp8_kernel:4"}
STALLS=""
for r in long_scoreboard barrier wait math_pipe_throttle mio_throttle lg_throttle short_scoreboard \
         dispatch_stall no_instruction sleeping membar branch_resolving not_selected selected; do
    STALLS="$STALLS,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"
done
METRICS="gpu__time_duration.sum,\
lts__t_bytes.sum.per_second,dram__bytes.sum.per_second,lts__t_sector_hit_rate.pct,\
smsp__inst_executed.sum$STALLS"
for cfg in $CONFIGS; do
    for recipe in ${RECIPES:-block}; do
        for spec in $KERNELS; do
            kre=${spec%%:*} n=${spec#*:}
            log="$OUT/prof_${cfg}_${recipe}_${kre}.log"
            bench=(python3 mlp_bench.py --configs "$cfg" --splits balanced --fp8 "$recipe" --fp8-only --no-compile --iters 1)
            [ -n "${BENCH:-}" ] && read -r -a bench <<< "$BENCH"
            (cd bench && timeout 240 ncu --kernel-name-base demangled -k "regex:$kre" --launch-count "$n" \
                --section SpeedOfLight --metrics "$METRICS" "${bench[@]}") > "$log" 2>&1
            echo "=== $cfg $recipe $kre x$n rc=$?"
            grep -E "^  [a-z_0-9]+<|^  sm90|Duration|gpu__time_duration|lts__t_bytes|dram__bytes|hit_rate|inst_executed|issue_stalled" "$log" |
                sed -E 's/smsp__average_warps_issue_stalled_(.*)_per_issue_active.ratio/stall_\1/' | head -80
            [ -n "${SOURCE:-}" ] || continue
            rep="$OUT/src_${cfg}_${recipe}_${kre}"
            (cd bench && timeout 240 ncu --kernel-name-base demangled -k "regex:$kre" --launch-count 1 \
                --section SourceCounters --section WarpStateStats -f -o "$rep" "${bench[@]}") > "$rep.log" 2>&1
            ncu --import "$rep.ncu-rep" --page source --print-source sass --csv > "$rep.csv" 2>> "$rep.log"
            rm -f "$rep.ncu-rep"
            echo "=== $cfg $recipe $kre: stall samples by instruction"
            python3 scripts/ncu_source_top.py "$rep.csv" 30
        done
    done
done
