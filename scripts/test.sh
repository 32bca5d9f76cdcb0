#!/usr/bin/env bash
# Runs every test: builds (installing what is missing), then CTest. GPU tests report
# skipped where there is no GPU.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh
ctest --test-dir "${MOEX_BUILD_DIR:-build}" --output-on-failure -j 2 "$@"
