#!/usr/bin/env bash
# gpu_python.sh - the Python package on the GPU machine, in one call: build libmoex (Release,
# sm_90a) and the PyTorch extension (python/CMakeLists.txt, as pip builds them), the pytest
# suite on CPU and CUDA (tests/python, through MOEX_LIBRARY and MOEX_TORCH_EXTENSION), the
# host-time benchmark (bench/torch_host_time.py --compare-ctypes, then bench/torch_host_trace.py)
# and the MoE language-model example's comparison (examples/moe_lm/compare.py), then a summary.
# The ctest stage builds the C tests in the same tree and runs those of the CUDA label that
# match CTEST_R, each under compute-sanitizer memcheck too; the stress stage runs
# tests/stress/torch_stress.py through the extension in STRESS_PROCS fresh processes at once.
# The c_example stage installs the built libmoex into a prefix and builds and runs
# examples/c/grouped_mlp.c against it, with find_package and with pkg-config (CUDA=1). The
# separate stage runs bench/torch_separate_weights.py (GroupedLinear's separate weights against
# packed ones and torch._grouped_mm, GPU time; SEPARATE_ARGS). The compare stage times an old
# tree against this one with scripts/compare_builds.sh (COMPARE_ARGS): OLD_TAR, a tarball of the
# old tree (git archive), is built as $BUILD-old (the library and the CLI, during this tree's
# build), and this tree's CLI is built in $BUILD/libmoex.
# The gemm stage runs bench/gemm_bench.py with --torch-path (each grouped GEMM through the C API
# and through moex.torch in one rotation; GEMM_ARGS), the mlp stage bench/mlp_bench.py (MLP_ARGS).
# Usage: scripts/gpu_python.sh [stage ...]   stages: build ctest test stress host separate
# gemm mlp compare example c_example (default build test host example). Logs go to $OUT (the device tool's output folder) or
# $BUILD/py_out: build.log ctest.log memcheck.log pytest.log host.log example.log summary.txt.
# Env: BUILD (default build-py), CTEST_R (default gpu_splits), MEMCHECK_R (the tests of those run
# under memcheck, SAN_TIMEOUT seconds each at most, default 300; default CTEST_R), PYTEST_K (a pytest -k
# expression), STRESS_PROCS (default 4) and STRESS_CALLS (default 1000), HOST_ARGS (default
# --compare-ctypes), EXAMPLE_ARGS (extra compare.py arguments, e.g. --gpus 4 --steps 1200). The
# example's runs stay in $BUILD/moe_lm; its summary.json, loss.svg and a tarball of the runs'
# JSON go to $OUT.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-py}
[[ $BUILD == /* ]] || BUILD=$PWD/$BUILD   # (an absolute path too)
OUT=${OUT:-$BUILD/py_out}
mkdir -p "$OUT"
STAGES=${*:-build test host example}
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
has() { [[ " $STAGES " == *" $1 "* ]]; }
export MOEX_LIBRARY=$BUILD/libmoex/libmoex.so MOEX_TORCH_EXTENSION=$BUILD/libmoex_torch.so \
       PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1

note "gpu_python $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown) stages: $STAGES"
note "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1), torch $(python3 -c 'import torch; print(torch.__version__)')"

if has compare; then   # the old tree's build runs beside this one's
    rm -rf "$BUILD-old.src" && mkdir -p "$BUILD-old.src" && tar -xf "$OLD_TAR" -C "$BUILD-old.src"
    ( cmake -S "$BUILD-old.src" -B "$BUILD-old" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEX_CUDA=ON \
            -DCMAKE_CUDA_ARCHITECTURES=90a -DMOEX_TESTS=OFF && ninja -C "$BUILD-old" moex moex_cli &&
      if [[ " ${COMPARE_ARGS:-} " == *ep* ]]; then ninja -C "$BUILD-old" moex_ep_bench; fi
    ) > "$OUT/build_old.log" 2>&1 &
    old_pid=$!
fi

if has build; then
    t0=$SECONDS
    if has ctest; then tests=ON; else tests=OFF; fi
    { cmake -S python -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEX_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
            -DMOEX_TESTS=$tests -DMOEX_TORCH=ON -DPython_EXECUTABLE="$(command -v python3)" &&
      if has c_example; then ninja -C "$BUILD"
      elif [ $tests = ON ]; then   # the library, the extension and the CUDA tests CTEST_R selects
          ninja -C "$BUILD" moex moex_torch $(ninja -C "$BUILD" -t targets all | grep -oE '^cuda_test_[a-z0-9_]+' |
                                              grep -E "${CTEST_R:-gpu_splits}" | sort -u)
      else ninja -C "$BUILD" moex moex_torch; fi
    } > "$OUT/build.log" 2>&1
    rc=$?
    note "build: rc=$rc in $((SECONDS - t0)) s"
    [ $rc -eq 0 ] || { tail -30 "$OUT/build.log"; exit 1; }
fi

if has c_example; then
    ex=$(mktemp -d)
    { cmake --install "$BUILD/libmoex" --prefix "$ex/prefix" &&
      cmake -S examples/c -B "$ex/cmake" -DCMAKE_PREFIX_PATH="$ex/prefix" && cmake --build "$ex/cmake" &&
      "$ex/cmake/grouped_mlp" &&
      PKG_CONFIG_PATH=$(dirname "$(find "$ex/prefix" -name moex.pc)") make -C "$ex" -f "$PWD/examples/c/Makefile" CUDA=1 &&
      "$ex/grouped_mlp"; } > "$OUT/c_example.log" 2>&1
    note "c_example: rc=$?"
    grep -E "^(cpu|cuda)" "$OUT/c_example.log" | tee -a "$SUMMARY"
fi

if has ctest; then
    t0=$SECONDS
    ctest --test-dir "$BUILD/libmoex" -L cuda -R "${CTEST_R:-gpu_splits}" --output-on-failure > "$OUT/ctest.log" 2>&1
    note "ctest -L cuda -R ${CTEST_R:-gpu_splits}: rc=$? in $((SECONDS - t0)) s: $(grep -E 'tests passed' "$OUT/ctest.log")"
    : > "$OUT/memcheck.log"
    for t in $(ls "$BUILD"/libmoex/tests/cuda_test_* | grep -E "${MEMCHECK_R:-${CTEST_R:-gpu_splits}}"); do
        timeout "${SAN_TIMEOUT:-300}" compute-sanitizer --tool memcheck --error-exitcode 9 "$t" >> "$OUT/memcheck.log" 2>&1
        note "memcheck $(basename "$t"): rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1)"
    done
fi

if has test; then
    t0=$SECONDS
    python3 -m pytest -q -rs -p no:cacheprovider ${PYTEST_K:+-k "$PYTEST_K"} tests/python > "$OUT/pytest.log" 2>&1
    note "pytest: rc=$? in $((SECONDS - t0)) s: $(tail -1 "$OUT/pytest.log")"
    grep -E '^(FAILED|ERROR)' "$OUT/pytest.log" | head -30 | tee -a "$SUMMARY"
fi

if has stress; then
    t0=$SECONDS
    pids=()
    for seed in $(seq 1 "${STRESS_PROCS:-4}"); do
        python3 tests/stress/torch_stress.py --seed "$seed" --calls "${STRESS_CALLS:-1000}" > "$OUT/stress_$seed.log" 2>&1 &
        pids+=($!)
    done
    fails=0
    for pid in "${pids[@]}"; do wait "$pid" || fails=$((fails + 1)); done
    note "stress: ${#pids[@]} processes x ${STRESS_CALLS:-1000} calls, $fails failed, in $((SECONDS - t0)) s"
    tail -qn 1 "$OUT"/stress_*.log | tee -a "$SUMMARY"
fi

if has host; then
    # shellcheck disable=SC2086
    python3 bench/torch_host_time.py ${HOST_ARGS---compare-ctypes} > "$OUT/host.log" 2>&1
    note "host time: rc=$?"
    tee -a "$SUMMARY" < "$OUT/host.log"
    python3 bench/torch_host_trace.py > "$OUT/trace.log" 2>&1
    note "host trace: rc=$?"
    tee -a "$SUMMARY" < "$OUT/trace.log"
fi

if has separate; then
    # shellcheck disable=SC2086
    (cd bench && python3 torch_separate_weights.py ${SEPARATE_ARGS:-}) > "$OUT/separate.log" 2>&1
    note "separate weights bench: rc=$?"
    tee -a "$SUMMARY" < "$OUT/separate.log"
fi

if has gemm; then
    # shellcheck disable=SC2086
    python3 bench/gemm_bench.py --lib "$MOEX_LIBRARY" --out "$OUT" --torch-path ${GEMM_ARGS:-} > "$OUT/gemm.log" 2>&1
    note "gemm bench: rc=$?"
    sed -n '/^TF = /,$p' "$OUT/gemm.log" | tee -a "$SUMMARY"
fi

if has mlp; then
    # shellcheck disable=SC2086
    (cd bench && python3 mlp_bench.py ${MLP_ARGS:-}) > "$OUT/mlp.log" 2>&1
    note "mlp bench: rc=$?"
    tail -40 "$OUT/mlp.log" | tee -a "$SUMMARY"
fi

if has compare; then
    wait "$old_pid"
    note "old build: rc=$?"
    ninja -C "$BUILD" moex_cli >> "$OUT/build.log" 2>&1
    if [[ " ${COMPARE_ARGS:-} " == *ep* ]]; then ninja -C "$BUILD" moex_ep_bench >> "$OUT/build.log" 2>&1; fi
    # shellcheck disable=SC2086
    bash scripts/compare_builds.sh ${COMPARE_ARGS:-} --old-src "$BUILD-old.src" --out "$OUT/compare" "$BUILD-old" \
        "$BUILD/libmoex" \
        > "$OUT/compare.log" 2>&1
    note "compare: rc=$?"
    sed -n '/^config/,$p' "$OUT/compare.log" | tee -a "$SUMMARY"
fi

if has example; then
    t0=$SECONDS
    # shellcheck disable=SC2086
    rm -rf "$BUILD/moe_lm"
    python3 examples/moe_lm/compare.py --device cuda --out-dir "$BUILD/moe_lm" ${EXAMPLE_ARGS:-} > "$OUT/example.log" 2>&1
    note "example: rc=$? in $((SECONDS - t0)) s"
    cp "$BUILD"/moe_lm/summary.json "$BUILD"/moe_lm/loss.svg "$OUT/" 2>/dev/null
    tar -czf "$OUT/moe_lm_runs.tgz" -C "$BUILD" moe_lm
    sed -n '/^variant /,$p' "$OUT/example.log" | tee -a "$SUMMARY"   # the table, the checks, the verdict
fi
