#!/usr/bin/env bash
# The main job: builds moex (installing what is missing), then trains a student MoE layer
# to match a teacher (`moex train`). Extra arguments go to `moex train`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh >&2
# The loss curve (CSV, SVG) goes to build/train unless an --out given here says otherwise.
exec "${MOEX_BUILD_DIR:-build}/moex" train --out "${MOEX_BUILD_DIR:-build}/train" "$@"
