#!/usr/bin/env bash
# gpu_ab_torch.sh - one moex.torch benchmark on two builds in one call: an old tree (OLD_TAR, a
# `git archive` of it) against this one, for what the CLI's rows cannot show (compare_builds.sh
# times the CLI's MLP, which has no biases: the bias gradients' kernels, moex.torch's own
# launches). Builds both trees as `pip install ./python` builds them (libmoex and the PyTorch
# extension, Release, sm_90a; in parallel), then runs BENCH with each build in turn, old new new
# old, each in its own tree's bench/ with its own package, and prints each run's kernel
# profile lines and tables. Env: OLD_TAR (required), BENCH (arguments of a script in bench/;
# default: bench/mlp_bench.py, bf16 only, --profile, four configs, balanced), BENCH_TIMEOUT
# (seconds per run, default 150). Logs go to $OUT (the device tool's output folder) or
# build-ab/out: build.log, build_old.log, ab_old_1.log, ab_new_1.log, ...
# Usage: scripts/gpu_ab_torch.sh [build] [run]   (default both: the builds can run in the
# background while the machine does something else, then `run`). RUNS: the order of the runs
# (default "old new new old").
# After it, this tree's build stays in build-ab (MOEX_LIBRARY=build-ab/libmoex/libmoex.so,
# MOEX_TORCH_EXTENSION=build-ab/libmoex_torch.so) for further commands.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/build-ab/out}
BENCH=${BENCH:-mlp_bench.py --configs qwen3-30b,dsv3,gptoss,mixtral --splits balanced --fp8-only --profile --iters 10}
OLD=/tmp/moex-ab-old
STAGES=${*:-build run}
mkdir -p "$OUT"

build() {   # source tree, build directory, log
    { cmake -S "$1/python" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEX_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
            -DMOEX_TESTS=OFF -DMOEX_TORCH=ON -DPython_EXECUTABLE="$(command -v python3)" &&
      ninja -C "$2" moex moex_torch; } > "$3" 2>&1
}
if [[ " $STAGES " == *" build "* ]]; then
    [ -f "${OLD_TAR:-}" ] || { echo "gpu_ab_torch: OLD_TAR (a tarball of the old tree) is required" >&2; exit 2; }
    rm -rf "$OLD" && mkdir -p "$OLD" && tar -xf "$OLD_TAR" -C "$OLD"
    t0=$SECONDS
    build "$OLD" "$OLD/build-ab" "$OUT/build_old.log" &
    old_pid=$!
    build "$ROOT" "$ROOT/build-ab" "$OUT/build.log"
    rc_new=$?
    wait "$old_pid"
    rc_old=$?
    echo "builds: new rc=$rc_new, old rc=$rc_old, in $((SECONDS - t0)) s"
    [ $rc_new -eq 0 ] || { tail -20 "$OUT/build.log"; exit 1; }
    [ $rc_old -eq 0 ] || { tail -20 "$OUT/build_old.log"; exit 1; }
fi
[[ " $STAGES " == *" run "* ]] || exit 0

run() {   # name, source tree, rep
    local log="$OUT/ab_$1_$3.log"
    # shellcheck disable=SC2086
    (cd "$2/bench" && MOEX_LIBRARY="$2/build-ab/libmoex/libmoex.so" MOEX_TORCH_EXTENSION="$2/build-ab/libmoex_torch.so" \
        PYTHONPATH="$2/python" PYTHONUNBUFFERED=1 timeout "${BENCH_TIMEOUT:-150}" python3 $BENCH) > "$log" 2>&1
    echo "== $1 (run $3): rc=$?"
    grep -E "kernels of|^ +[0-9.]+ ms|^[a-z0-9-]+ +(balanced|skewed) |^\| [a-z0-9]" "$log"
}
n_old=0 n_new=0
for w in ${RUNS:-old new new old}; do
    if [ "$w" = old ]; then n_old=$((n_old + 1)); run old "$OLD" $n_old; else n_new=$((n_new + 1)); run new "$ROOT" $n_new; fi
done
