#!/usr/bin/env bash
# The Python package's tests (scripts/test.sh's `python` stage), in a virtual environment in
# the build tree: build/venv (or $MOEX_BUILD_DIR/venv; MOEX_PYTHON_VENV names another), made
# with --system-site-packages so that a torch the system already has is used, not downloaded
# again; nothing is installed into the system's python3. Installs into the venv what the tests
# need when it is missing (pytest; torch: the CPU-only wheel from PyTorch's CPU index where
# there is no GPU (PyPI's default wheel where that index cannot be reached), the default wheel,
# with its CUDA libraries, where there is one; hypothesis
# for tests/python/test_torch_property.py, which runs a seeded random driver without it; mpi4py
# where there is an mpirun, for tests/python/test_torch_ep.py),
# pip-installs ./python there (the CPU backend only, unless MOEX_PYTHON_CUDA=1: MOEX_CUDA=ON),
# and runs pytest over tests/python with the venv's python. If torch cannot be installed, the
# tests that need it report skipped (pytest -rs lists them), never passed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
VENV=${MOEX_PYTHON_VENV:-${MOEX_BUILD_DIR:-build}/venv}

if [ ! -x "$VENV/bin/python" ]; then
  echo "test_python: making the virtual environment $VENV" >&2
  mkdir -p "$(dirname "$VENV")"
  $PY -m venv --system-site-packages "$VENV"
fi
VPY=$VENV/bin/python
pip_install() { "$VPY" -m pip install -q --disable-pip-version-check "$@"; }

"$VPY" -c "import pytest" 2>/dev/null || pip_install pytest ||
  echo "test_python: could not install pytest" >&2
if ! "$VPY" -c "import torch" 2>/dev/null; then
  torch_index=()
  nvidia-smi -L 2>/dev/null | grep -q '^GPU' || torch_index=(--index-url https://download.pytorch.org/whl/cpu)
  echo "test_python: pip installing torch ${torch_index[*]}" >&2
  # where PyTorch's CPU index cannot be reached, the PyPI wheel (it carries CUDA libraries it
  # does not need here, and runs on the CPU all the same)
  pip_install torch "${torch_index[@]}" ||
    { [ ${#torch_index[@]} -gt 0 ] && echo "test_python: pip installing torch from PyPI" >&2 && pip_install torch; } ||
    echo "test_python: could not install torch; the tests that need it report skipped" >&2
fi
"$VPY" -c "import hypothesis" 2>/dev/null || pip_install hypothesis ||
  echo "test_python: could not install hypothesis; test_torch_property.py uses its seeded driver" >&2
if command -v mpirun > /dev/null && ! "$VPY" -c "import mpi4py" 2>/dev/null; then   # MoELayer's EP over MPI
  pip_install mpi4py || echo "test_python: could not install mpi4py; test_torch_ep.py's MPI runs report skipped" >&2
fi

cuda=OFF
[ "${MOEX_PYTHON_CUDA:-0}" = 1 ] && cuda=ON
MOEX_CUDA=$cuda pip_install ./python
"$VPY" -m pytest -q -rs tests/python
