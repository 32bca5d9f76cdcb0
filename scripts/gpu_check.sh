#!/usr/bin/env bash
# gpu_check.sh - everything the GPU machine checks, in one call:
#   build (cmake -G Ninja, CMAKE_CUDA_ARCHITECTURES=90a), ctest (all tests, CPU and `cuda`),
#   compute-sanitizer memcheck, racecheck, synccheck and initcheck over the CUDA tests, `moex check`, a short
#   `moex train --backend cuda`, `moex bench --backend cuda` (balanced and skewed splits;
#   then --ops other: GLU, router, permute, unpermute, MoE layer on $OTHER_CONFIGS) and the
#   PyTorch baselines on the same shapes (bench/torch_baseline.py, both modes, and the grouped
#   GEMMs of bench/gemm_bench.py), then a summary.
# Usage: scripts/gpu_check.sh [stage ...]   stages: build test sanitize fuzz stress check bench
#   (default all)
#   fuzz: tests/fuzz's standalone driver, FUZZ_RUNS (default 20000) inputs on the CUDA backend
#   stress: tests/stress/torch_stress.py in STRESS_PROCS (default 4) fresh processes of
#   STRESS_CALLS (default 1000) mixed moex.torch and C API calls each, through this build's
#   libmoex (MOEX_LIBRARY); any failure fails the stage
# Logs go to $OUT (the device tool's output folder) or $BUILD/gpu_out: build.log ctest.log
# sanitize.log check.log bench.log (portable GEMM runs appended) torch.log (torch baselines and
# bench/gemm_bench.py) gemm_bench.jsonl summary.txt. Env: BUILD (build dir, default
# build-gpu), SAN_TIMEOUT (seconds per sanitizer run, default 300), BENCH_CONFIGS (default the
# CUDA set of tools/bench_configs.h),
# OTHER_CONFIGS (default dsv3-fc1,qwen3-30b-fc1),
# COMMIT (recorded in the summary; default `git rev-parse --short HEAD`).
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-gpu}
OUT=${OUT:-$PWD/$BUILD/gpu_out}
COMMIT=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
SAN_TIMEOUT=${SAN_TIMEOUT:-300}
# default: the CUDA set of tools/bench_configs.h (through bench/configs.py)
BENCH_CONFIGS=${BENCH_CONFIGS:-$(python3 -c 'import sys; sys.path.insert(0, "bench"); import configs; print(",".join(configs.select("CUDA")))')}
OTHER_CONFIGS=${OTHER_CONFIGS:-dsv3-fc1,qwen3-30b-fc1}   # configs of `moex bench --ops other` and its torch baseline
OTHER_OPS=' (glu|router|permute|unpermute|moe)_(fwd|bwd) '
mkdir -p "$OUT"
STAGES=${*:-build test sanitize fuzz stress check bench}
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
has() { [[ " $STAGES " == *" $1 "* ]]; }

note "gpu_check $(date -u +%FT%TZ) commit $COMMIT stages: $STAGES"
note "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"

if has build; then
    t0=$SECONDS
    { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEX_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a &&
      ninja -C "$BUILD" -j "$(nproc)"; } > "$OUT/build.log" 2>&1
    rc=$?
    note "build: rc=$rc in $((SECONDS - t0)) s ($(grep -c 'warning' "$OUT/build.log") warning lines)"
    [ $rc -eq 0 ] || { tail -30 "$OUT/build.log"; exit 1; }
fi

if has test; then
    t0=$SECONDS
    (cd "$BUILD" && ctest --output-on-failure -j 6 --timeout 900) > "$OUT/ctest.log" 2>&1
    note "ctest: rc=$? in $((SECONDS - t0)) s: $(grep -E 'tests passed' "$OUT/ctest.log")"
    grep -E '^ *[0-9]+/[0-9]+ Test' "$OUT/ctest.log" | sed 's/^/  /' | tee -a "$SUMMARY" > /dev/null
fi

if has sanitize; then
    t0=$SECONDS
    : > "$OUT/sanitize.log"
    san_one() {   # tool test [args] -> one block of log, one summary line
        local tool=$1 t=$2 log
        shift 2
        log=$(mktemp)
        timeout "$SAN_TIMEOUT" compute-sanitizer --tool "$tool" --error-exitcode 9 "$t" "$@" > "$log" 2>&1
        local rc=$?
        local res=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)
        [ $rc -eq 124 ] && res="TIMEOUT after ${SAN_TIMEOUT}s (${res:-no summary})"
        { echo "=== $tool $(basename "$t") $* rc=$rc"; tail -60 "$log"; } > "$log.block"
        echo "$tool $(basename "$t") $* rc=$rc $res" > "$log.line"
        echo "$log"
    }
    export -f san_one
    export SAN_TIMEOUT
    # every CUDA test with its defaults, and the Hopper GEMM with stream-K forced on small
    # grids (with and without clusters)
    logs=$(for tool in memcheck racecheck synccheck initcheck; do
               for t in "$BUILD"/tests/cuda_test_*; do echo "$tool $t"; done
               echo "$tool $BUILD/tests/cuda_test_sm90_gemm 1 0 0 0 0 6 2"
               echo "$tool $BUILD/tests/cuda_test_sm90_gemm 1 1 0 0 0 5 2"
           done | xargs -P 16 -L 1 bash -c 'san_one "$0" "$@"')
    for l in $logs; do cat "$l.block" >> "$OUT/sanitize.log"; sed 's/^/  /' "$l.line" | tee -a "$SUMMARY"; rm -f "$l" "$l.block" "$l.line"; done
    note "sanitize: $((SECONDS - t0)) s"
fi

if has fuzz; then   # the API fuzzer's standalone driver against the CUDA backend (device buffers)
    t0=$SECONDS
    { ninja -C "$BUILD" moex_fuzz_run &&
      "$BUILD"/tests/fuzz/moex_fuzz_run --backend cuda --runs "${FUZZ_RUNS:-20000}" tests/fuzz/corpus; } \
        > "$OUT/fuzz.log" 2>&1
    note "fuzz (CUDA backend): rc=$? in $((SECONDS - t0)) s: $(tail -1 "$OUT/fuzz.log")"
fi

if has stress; then   # fresh processes of mixed calls, some on new threads; zero failures allowed
    t0=$SECONDS
    : > "$OUT/stress.log"
    fails=0
    for p in $(seq 1 "${STRESS_PROCS:-4}"); do
        MOEX_LIBRARY=$PWD/$BUILD/libmoex.so PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1 \
            python3 tests/stress/torch_stress.py --calls "${STRESS_CALLS:-1000}" --seed "$p" >> "$OUT/stress.log" 2>&1 ||
            fails=$((fails + 1))
    done
    note "stress: $fails of ${STRESS_PROCS:-4} processes failed, $((SECONDS - t0)) s"
    grep -E '^torch_stress:' "$OUT/stress.log" | sed 's/^/  /' | tee -a "$SUMMARY" > /dev/null
fi

if has check; then
    t0=$SECONDS
    { "$BUILD"/moex check --backend all; echo "rc=$?";
      "$BUILD"/moex train --backend cuda --steps 300 --out "$(mktemp -d)"; echo "train rc=$?"; } > "$OUT/check.log" 2>&1
    note "moex check + train: $((SECONDS - t0)) s: check $(grep -E '^rc=' "$OUT/check.log"), $(grep -E '^train rc=' "$OUT/check.log")"
    grep -E 'checks,|final loss' "$OUT/check.log" | sed 's/^/  /' | tee -a "$SUMMARY" > /dev/null
fi

if has bench; then
    t0=$SECONDS
    : > "$OUT/bench.log"
    PORTABLE_LOG=$(mktemp)
    for cfg in ${BENCH_CONFIGS//,/ }; do
        for sp in balanced skewed; do
            echo "=== moex bench $cfg $sp" >> "$OUT/bench.log"
            "$BUILD"/moex bench --backend cuda --config "$cfg" --splits "$sp" --iters 10 >> "$OUT/bench.log" 2>&1
            echo "=== moex bench $cfg $sp (MOEX_CUDA_GEMM=portable)" >> "$PORTABLE_LOG"
            MOEX_CUDA_GEMM=portable "$BUILD"/moex bench --backend cuda --config "$cfg" --splits "$sp" --iters 10 \
                >> "$PORTABLE_LOG" 2>&1
        done
    done
    for cfg in ${OTHER_CONFIGS//,/ }; do   # GLU, router, permute, unpermute, MoE layer
        echo "=== moex bench $cfg --ops other" >> "$OUT/bench.log"
        "$BUILD"/moex bench --backend cuda --ops other --config "$cfg" --iters 10 >> "$OUT/bench.log" 2>&1
    done
    PYTHONUNBUFFERED=1 python3 bench/torch_baseline.py --configs "$BENCH_CONFIGS" --iters 10 > "$OUT/torch.log" 2>&1
    echo "=== torch_baseline --ops other" >> "$OUT/torch.log"
    PYTHONUNBUFFERED=1 python3 bench/torch_baseline.py --ops other --configs "$OTHER_CONFIGS" --iters 10 \
        >> "$OUT/torch.log" 2>&1
    # the grouped GEMMs against torch._grouped_mm, the per-expert loop and dense cuBLAS (GPU time)
    echo "=== gemm_bench" >> "$OUT/torch.log"
    PYTHONUNBUFFERED=1 python3 bench/gemm_bench.py --lib "$BUILD"/libmoex.so --out "$OUT" \
        --configs "$BENCH_CONFIGS" >> "$OUT/torch.log" 2>&1
    note "bench: $((SECONDS - t0)) s"
    note "moex bench --backend cuda (bf16):"
    grep -m1 '^config' "$OUT/bench.log" | sed 's/^/  /' | tee -a "$SUMMARY" > /dev/null
    grep -E '^ *[a-z0-9-]* +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ +(balanced|skewed) ' "$OUT/bench.log" | grep -vE "$OTHER_OPS" |
        sed 's/^/  /' | tee -a "$SUMMARY" > /dev/null
    note "moex bench --backend cuda --ops other (bf16; GB/s: bytes read and written once, see moex bench --help):"
    grep -m1 -E '^config +E ' "$OUT/bench.log" | sed 's/^/  /' | tee -a "$SUMMARY" > /dev/null
    grep -E "$OTHER_OPS" "$OUT/bench.log" | sed 's/^/  /' | tee -a "$SUMMARY" > /dev/null
    note "moex bench --backend cuda, portable GEMM only (MOEX_CUDA_GEMM=portable):"
    grep -E '^ *[a-z0-9-]* +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ +(balanced|skewed) ' "$PORTABLE_LOG" | sed 's/^/  /' | tee -a "$SUMMARY" > /dev/null
    cat "$PORTABLE_LOG" >> "$OUT/bench.log"
    rm -f "$PORTABLE_LOG"
    note "torch baseline:"
    sed -n '/^torch._grouped_mm/,/^=== /{/^=== /!p}' "$OUT/torch.log" | sed 's/^/  /' | tee -a "$SUMMARY" > /dev/null
    note "torch baseline, other ops:"
    sed -n '/^torch other ops/,/^=== gemm_bench/{/^=== gemm_bench/!p}' "$OUT/torch.log" | sed 's/^/  /' | tee -a "$SUMMARY" > /dev/null
    note "bench/gemm_bench.py (moex vs torch._grouped_mm, per-expert loop, dense cuBLAS; GPU time):"
    tac "$OUT/torch.log" | sed -n '1,/^config  *splits  *op/p' | tac | sed 's/^/  /' | tee -a "$SUMMARY" > /dev/null
fi

echo
echo "================ summary ================"
cat "$SUMMARY"
