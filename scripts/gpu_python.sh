#!/usr/bin/env bash
# gpu_python.sh - the Python package on the GPU machine, in one call: build libmoex (Release,
# sm_90a) and the PyTorch extension (python/CMakeLists.txt, as pip builds them), the pytest
# suite on CPU and CUDA (tests/python, through MOEX_LIBRARY and MOEX_TORCH_EXTENSION), the
# host-time benchmark (bench/torch_host_time.py --compare-ctypes) and the MoE language-model
# example's comparison (examples/moe_lm/compare.py), then a summary.
# Usage: scripts/gpu_python.sh [stage ...]   stages: build test host example (default all)
# Logs go to $OUT (the device tool's output folder) or $BUILD/py_out: build.log pytest.log
# host.log example.log summary.txt. Env: BUILD (default build-py), PYTEST_K (a pytest -k
# expression), EXAMPLE_ARGS (extra compare.py arguments).
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-py}
OUT=${OUT:-$PWD/$BUILD/py_out}
mkdir -p "$OUT"
STAGES=${*:-build test host example}
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
has() { [[ " $STAGES " == *" $1 "* ]]; }
export MOEX_LIBRARY=$PWD/$BUILD/libmoex/libmoex.so MOEX_TORCH_EXTENSION=$PWD/$BUILD/libmoex_torch.so \
       PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1

note "gpu_python $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown) stages: $STAGES"
note "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1), torch $(python3 -c 'import torch; print(torch.__version__)')"

if has build; then
    t0=$SECONDS
    { cmake -S python -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
            -DMOEX_TESTS=OFF -DMOEX_TORCH=ON -DPython_EXECUTABLE="$(command -v python3)" &&
      ninja -C "$BUILD" moex moex_torch; } > "$OUT/build.log" 2>&1
    rc=$?
    note "build: rc=$rc in $((SECONDS - t0)) s"
    [ $rc -eq 0 ] || { tail -30 "$OUT/build.log"; exit 1; }
fi

if has test; then
    t0=$SECONDS
    python3 -m pytest -q -rs -p no:cacheprovider ${PYTEST_K:+-k "$PYTEST_K"} tests/python > "$OUT/pytest.log" 2>&1
    note "pytest: rc=$? in $((SECONDS - t0)) s: $(tail -1 "$OUT/pytest.log")"
    grep -E '^(FAILED|ERROR)' "$OUT/pytest.log" | head -30 | tee -a "$SUMMARY"
fi

if has host; then
    python3 bench/torch_host_time.py --compare-ctypes > "$OUT/host.log" 2>&1
    note "host time: rc=$?"
    tee -a "$SUMMARY" < "$OUT/host.log"
fi

if has example; then
    t0=$SECONDS
    # shellcheck disable=SC2086
    python3 examples/moe_lm/compare.py --device cuda --out-dir "$OUT/moe_lm" ${EXAMPLE_ARGS:-} > "$OUT/example.log" 2>&1
    note "example: rc=$? in $((SECONDS - t0)) s"
    sed -n '/^variant /,$p' "$OUT/example.log" | tee -a "$SUMMARY"   # the table, the checks, the verdict
fi
