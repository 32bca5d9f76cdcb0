#!/usr/bin/env bash
# The Python package's tests (scripts/test.sh's `python` stage): installs what they need when
# it is missing (pytest and torch from PyPI; hypothesis for tests/python/test_torch_property.py,
# which runs a seeded random driver without it), pip-installs ./python (the CPU backend only,
# unless MOEX_PYTHON_CUDA=1), and runs pytest over tests/python. If torch cannot be
# installed, the tests that need it report skipped (pytest -rs lists them), never passed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}

missing=()
$PY -c "import pytest" 2>/dev/null || missing+=(pytest)
$PY -c "import torch" 2>/dev/null || missing+=(torch)
if [ ${#missing[@]} -gt 0 ]; then
  echo "test_python: pip installing ${missing[*]}" >&2
  $PY -m pip install -q "${missing[@]}" ||
    echo "test_python: could not install ${missing[*]}; the tests that need them report skipped" >&2
fi
$PY -c "import hypothesis" 2>/dev/null || $PY -m pip install -q hypothesis ||
  echo "test_python: could not install hypothesis; test_torch_property.py uses its seeded driver" >&2

cmake_args=-DMOEX_CUDA=OFF
[ "${MOEX_PYTHON_CUDA:-0}" = 1 ] && cmake_args=
CMAKE_ARGS="$cmake_args" $PY -m pip install -q ./python
$PY -m pytest -q -rs tests/python
