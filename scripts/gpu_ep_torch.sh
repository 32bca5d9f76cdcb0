#!/usr/bin/env bash
# gpu_ep_torch.sh - moex.torch's expert parallelism on the GPU machine, one call: builds the
# library and the extension (scripts/gpu_python.sh build, into $BUILD), then
#   worker  tests/python/ep_worker.py under torchrun for each line of $CASES ("W: worker args",
#           W processes, one GPU each; a line starting "net W:" runs with NCCL's peer-to-peer
#           and shared-memory transports off, its network path), each with its full log in $OUT;
#   bench   bench/torch_ep_layer.py (the EP layer's step through moex.torch against the
#           all-to-all EP layer of examples/moe_lm/train_ep.py) for each W of $BENCH_W and each
#           config of $BENCH_CONFIGS (torch_ep_layer.py's arguments, ';'-separated);
#   example examples/moe_lm/compare.py with $EXAMPLE_ARGS (default: moex, torch, ep_moex and
#           ep_torch in bf16 from 3 seeds, 600 steps, EP on 2 GPUs): the EP runs' losses against
#           the one-GPU runs' seed spread, and the two EP layers' step time.
# Last, one line per worker case (ok or FAILED) and the bench tables.
# Usage: BUILD=/tmp/b1 OUT=/tmp/out [CASES=...] [BENCH_W="2 4"] [BENCH_CONFIGS=...] [EXAMPLE_ARGS=...] \
#            [STAGES="worker bench example"] bash scripts/gpu_ep_torch.sh
set -u
cd "$(dirname "$0")/.." || exit 2
BUILD=${BUILD:-/tmp/b1} OUT=${OUT:-/tmp/gpu_ep_torch}
STAGES=" ${STAGES:-worker bench} "   # (example: on request)
NGPU=$(nvidia-smi -L | wc -l)
CASES=${CASES:-"2: --graph
2: --graph --transfer capacity
2: --compile
net 2: --transfer capacity --tokens 300 --empty-rank
4:
4: --transfer capacity --dtype bf16 --empty-rank --tokens 300
4: --graph"}
BENCH_W=${BENCH_W:-"2 4"}
BENCH_CONFIGS=${BENCH_CONFIGS:-"--experts 128 --hidden 2048 --ffn 768 --topk 8 --tokens 4096;\
--experts 256 --hidden 7168 --ffn 2048 --topk 8 --tokens 4096;\
--experts 32 --hidden 2880 --ffn 2880 --topk 4 --tokens 8192"}
mkdir -p "$OUT"
BUILD=$BUILD OUT=$OUT bash scripts/gpu_python.sh build > "$OUT/gpu_python.log" 2>&1 ||
    { tail -30 "$OUT/gpu_python.log"; exit 1; }
export MOEX_LIBRARY=$BUILD/libmoex/libmoex.so MOEX_TORCH_EXTENSION=$BUILD/libmoex_torch.so \
       PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
run() {   # run W LOG ARGS...: torchrun of W processes
    local w=$1 log=$2; shift 2
    timeout 300 python3 -m torch.distributed.run --standalone --nproc_per_node "$w" "$@" > "$log" 2>&1
}
summary=()
if [[ $STAGES == *" worker "* ]]; then
    i=0
    while IFS= read -r line; do
        [ -n "$line" ] || continue
        i=$((i + 1))
        net=0; spec=$line
        if [[ $spec == net\ * ]]; then net=1; spec=${spec#net }; fi
        w=${spec%%:*} args=${spec#*:}
        if [ "$w" -gt "$NGPU" ]; then summary+=("worker $i ($line): skipped, $NGPU GPUs"); continue; fi
        t0=$SECONDS
        # shellcheck disable=SC2086
        if [ $net -eq 1 ]; then NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 run "$w" "$OUT/worker$i.log" tests/python/ep_worker.py $args
        else run "$w" "$OUT/worker$i.log" tests/python/ep_worker.py $args; fi
        rc=$?
        ok=$(grep -m1 "^ok:" "$OUT/worker$i.log")
        if [ $rc -eq 0 ] && [ -n "$ok" ]; then summary+=("worker $i ($line): $ok ($((SECONDS - t0)) s)")
        else summary+=("worker $i ($line): FAILED rc=$rc ($((SECONDS - t0)) s): $(grep -v '^\s*$' "$OUT/worker$i.log" | grep -m3 -i 'error\|assert\|differs' | cut -c1-300)"); fi
    done <<< "$CASES"
fi
if [[ $STAGES == *" bench "* ]]; then
    for w in $BENCH_W; do
        [ "$w" -le "$NGPU" ] || continue
        IFS=';' read -ra cfgs <<< "$BENCH_CONFIGS"
        for c in "${cfgs[@]}"; do
            # shellcheck disable=SC2086
            run "$w" "$OUT/bench_w$w.log.tmp" bench/torch_ep_layer.py $c
            echo "== W=$w $c (rc=$?)" >> "$OUT/bench.log"
            cat "$OUT/bench_w$w.log.tmp" >> "$OUT/bench.log"
        done
    done
    rm -f "$OUT"/bench_w*.log.tmp
fi
if [[ $STAGES == *" example "* ]]; then
    # shellcheck disable=SC2086
    timeout 560 python3 examples/moe_lm/compare.py --device cuda --out-dir "$OUT/moe_lm_ep" \
        ${EXAMPLE_ARGS:---variants moex,torch,ep_moex,ep_torch --ep-ranks 2 --dtypes bf16 --seeds 0,1,2 --steps 600 --gpus 2} \
        > "$OUT/example.log" 2>&1
    summary+=("example: rc=$?")
    sed -n '/^variant/,$p' "$OUT/example.log" | tail -30
fi
printf '%s\n' "${summary[@]}"
[ -f "$OUT/bench.log" ] && grep -v "^\[\|NCCL INFO\|^W1128\|warn" "$OUT/bench.log" | tail -60
