#!/usr/bin/env bash
# Sets up and builds jvpc, then runs every test (CUDA tests skip without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ctest --test-dir "${JVPC_BUILD_DIR:-build}" --output-on-failure -j 2 "$@"
