#!/usr/bin/env bash
# Sets up and builds jvpc, then runs every test (CUDA tests skip without a GPU), then the Python
# tests against the oldest torch jvpc supports, 2.11.0, in their own virtual environment and build
# folder (scripts/test-torch.sh; JVPC_SKIP_TORCH_2_11=1 skips them; the OpInfo subset runs on the
# default torch only, as do the suites run again with backend="inductor"), then the sanitizer build and the fuzzer (scripts/sanitize.sh;
# JVPC_SKIP_SANITIZE=1 skips them). Every stage runs, whichever failed before it; the script
# names the stages that failed at the end and then fails.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
failed=()
stage() {  # stage NAME COMMAND...: runs it, notes a failure, goes on
  local name=$1
  shift
  echo "[test] $name" >&2
  "$@" || failed+=("$name")
}
stage "the test suite (torch ${JVPC_TORCH_VERSION:-2.15.0})" ctest --test-dir "${JVPC_BUILD_DIR:-build}" --output-on-failure -j 2 "$@"
[ -n "${JVPC_SKIP_TORCH_2_11:-}" ] || stage "the Python tests on torch 2.11.0" scripts/test-torch.sh 2.11.0 --python -E '^python_opinfo|_inductor$'
# The sanitizer build: IR, loader and runtime tests under ASan+UBSan, and a minute of fuzzing.
[ -n "${JVPC_SKIP_SANITIZE:-}" ] || stage "the sanitizer build and the fuzzers" scripts/sanitize.sh
if [ ${#failed[@]} -gt 0 ]; then
  printf '[test] failed: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "[test] every stage passed" >&2
