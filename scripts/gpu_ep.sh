#!/usr/bin/env bash
# Expert parallelism on the GPU machine (one process per GPU): builds build-gpu (sm_90a, with
# NCCL and MPI), then the stages of $STAGES (default "tests san multi bench"):
#   tests  the GPU tests the EP change touches (the EP test at world size 1, the MoE layer,
#          the CUDA graph test)
#   san    compute-sanitizer memcheck and racecheck over the EP test (world size 1)
#   multi  the EP test under mpirun -np N for N = 2 .. the GPU count (powers of 2)
#   bench  bench/ep_bench.c (moex's PEER and CAPACITY transfers, the NCCL all-to-all and p2p baselines) and bench/ep_torch.py
#          (torch.distributed's all-to-all dispatcher) at each N; EPBENCH lines last
# Logs go to $OUT (or /tmp/gpu_ep). NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
set -u
OUT=${OUT:-/tmp/gpu_ep}
mkdir -p "$OUT"
B=${MOEX_BUILD_DIR:-build-gpu}
STAGES=" ${STAGES:-tests san multi bench} "
T0=$(date +%s)
el() { echo "$(( $(date +%s) - T0 ))s"; }
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
NGPU=$(nvidia-smi -L | wc -l)
MPIRUN="mpirun --oversubscribe --bind-to none -x NCCL_NVLS_ENABLE"

cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEX_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a > $OUT/build.log 2>&1
ninja -C $B -k 0 >> $OUT/build.log 2>&1
grep -E "moex: EP|FAILED" $OUT/build.log | head -8
[ -f $B/libmoex.so ] || { tail -30 $OUT/build.log; exit 1; }
echo "build ok, $NGPU GPUs $(el)"

if [[ $STAGES == *" tests "* ]]; then
  for t in ep moe_layer graph; do
    timeout 300 $B/tests/cuda_test_gpu_$t > $OUT/test_$t.log 2>&1
    echo "test $t rc=$? $(tail -1 $OUT/test_$t.log) $(el)"; grep -m6 FAIL $OUT/test_$t.log | cut -c1-300
  done
fi
if [[ $STAGES == *" san "* ]]; then
  for tool in memcheck racecheck; do
    timeout 300 compute-sanitizer --tool $tool --report-api-errors no $B/tests/cuda_test_gpu_ep > $OUT/${tool}_ep.log 2>&1
    echo "$tool ep rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/${tool}_ep.log) $(el)"
  done
fi
NS=""
for n in 2 4 8; do [ $n -le "$NGPU" ] && NS="$NS $n"; done
if [[ $STAGES == *" multi "* ]]; then
  for n in $NS; do
    timeout 300 $MPIRUN -np $n $B/tests/cuda_test_gpu_ep > $OUT/multi_$n.log 2>&1
    echo "test ep np$n rc=$? $(grep -c 'passed' $OUT/multi_$n.log) ranks: $(grep passed $OUT/multi_$n.log | sort | uniq -c | tr '\n' ' ') $(el)"
    grep -m6 FAIL $OUT/multi_$n.log | cut -c1-300
  done
fi
if [[ $STAGES == *" bench "* ]]; then
  for n in $NS; do
    for tr in peer capacity; do
      timeout 240 $MPIRUN -np $n $B/bench/moex_ep_bench --transfer $tr ${EP_BENCH_ARGS:-} > $OUT/bench_moex_${tr}_$n.log 2>&1
      echo "ep_bench $tr np$n rc=$? $(el)"; grep -E "FAIL|error" $OUT/bench_moex_${tr}_$n.log | head -5
    done
    timeout 240 torchrun --nproc_per_node $n bench/ep_torch.py > $OUT/bench_torch_$n.log 2>&1
    echo "ep_torch np$n rc=$? $(el)"; grep -E "FAIL|Error" $OUT/bench_torch_$n.log | head -5
  done
  cat $OUT/bench_*.log | grep '^EPBENCH' | sort
fi
