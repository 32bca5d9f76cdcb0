#!/usr/bin/env bash
# gpu_kernel_ab.sh - one device call for kernel work that must show its effect where users
# call it: both trees (OLD_TAR, a `git archive` of the old one, and this one) build as pip
# builds them (scripts/gpu_ab_torch.sh build) in the background while scripts/sm90_quick.sh
# builds this tree with its tests, runs the sm90 tests in every kernel variant, the CUDA tests
# of CTEST_R and the GEMM comparisons of COMPARE; then each moex.torch benchmark of BENCHES
# ("ARGS;ARGS": a script in bench/ with its arguments; default: gpu_ab_torch.sh's BENCH) runs on
# each build (gpu_ab_torch.sh run, RUNS; the i-th one's logs in $OUT/ab/i), and where SAN_TEST
# names one, a CUDA test under compute-sanitizer. Env: those of the two scripts and SAN_* below.
# Logs in $OUT.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/build-ab/out}
mkdir -p "$OUT/ab"
t0=$SECONDS
OUT=$OUT/ab bash scripts/gpu_ab_torch.sh build > "$OUT/ab_build.log" 2>&1 &
ab=$!
OUT=$OUT bash scripts/sm90_quick.sh
echo "sm90_quick done at $((SECONDS - t0)) s"
wait $ab
cat "$OUT/ab_build.log"
IFS=';' read -r -a benches <<< "${BENCHES:-${BENCH:-}}"
[ ${#benches[@]} -gt 0 ] || benches=("")
for i in "${!benches[@]}"; do
    mkdir -p "$OUT/ab/$i"
    echo "== bench $i: ${benches[$i]:-the default}"
    BENCH=${benches[$i]:-${BENCH:-}} OUT=$OUT/ab/$i bash scripts/gpu_ab_torch.sh run
done
echo "gpu_kernel_ab done at $((SECONDS - t0)) s"
# then, where asked, one CUDA test under compute-sanitizer (SAN_TEST: its build-gpu/tests name
# with its arguments, e.g. "cuda_test_sm90_epilogue 2"; SAN_TOOL: memcheck by default,
# SAN_TIMEOUT seconds at most, default 120)
if [ -n "${SAN_TEST:-}" ]; then
    timeout "${SAN_TIMEOUT:-120}" compute-sanitizer --tool "${SAN_TOOL:-memcheck}" --error-exitcode 9 \
        build-gpu/tests/$SAN_TEST > "$OUT/sanitizer.log" 2>&1   # unquoted: the test's arguments
    echo "compute-sanitizer ${SAN_TOOL:-memcheck} $SAN_TEST: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer.log" | tail -1)"
fi
