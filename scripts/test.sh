#!/usr/bin/env bash
# Sets up and builds jvpc, then runs every test (CUDA tests skip without a GPU), then the Python
# tests against the oldest torch jvpc supports, 2.11.0, in their own virtual environment and build
# folder (scripts/test-torch.sh; JVPC_SKIP_TORCH_2_11=1 skips them; the OpInfo subset runs on the
# default torch only), then the sanitizer build and the fuzzer (scripts/sanitize.sh;
# JVPC_SKIP_SANITIZE=1 skips them).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ctest --test-dir "${JVPC_BUILD_DIR:-build}" --output-on-failure -j 2 "$@"
[ -n "${JVPC_SKIP_TORCH_2_11:-}" ] || scripts/test-torch.sh 2.11.0 --python -E '^python_opinfo'
# The sanitizer build: IR, loader and runtime tests under ASan+UBSan, and a minute of fuzzing.
[ -n "${JVPC_SKIP_SANITIZE:-}" ] || scripts/sanitize.sh
