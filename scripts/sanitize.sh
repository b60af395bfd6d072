#!/usr/bin/env bash
# One clang-14 build with AddressSanitizer and UndefinedBehaviorSanitizer (build-asan/) that
# serves the two fuzzers and the GoogleTest suite (all of it: about 20 s). The JSON-loader fuzzer
# runs for JVPC_FUZZ_SECONDS (default 60) from the examples' JSON and tests/fuzz/seeds/; the
# fuzzer over the loadable ops (tests/fuzz/fuzz_loadable_ops.cpp) runs every op on the list
# with JVPC_FUZZ_OP_BASES (default 16) bases each, and each base once with every argument made
# adversarial (the same 22,911 graphs on every run; about 70 s on 2 cores). A crash, a sanitizer report, a leak
# or a fuzzer's finding fails the script. Called by scripts/test.sh unless JVPC_SKIP_SANITIZE=1.
set -euo pipefail
cd "$(dirname "$0")/.."
JVPC_EXTRA_PACKAGES="clang-14 libclang-rt-14-dev" JVPC_SETUP_ONLY=1 scripts/setup.sh
PY=$(cat build/.jvpc-python 2>/dev/null || command -v python3)
TORCH_PREFIX=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')
BUILD=build-asan
export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
# Paths under the checkout are hashed relative to it, so another clone (CI's) reuses the cache.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CCACHE_NOHASHDIR=1
if [ ! -f "$BUILD/build.ninja" ]; then
  CC=clang-14 CXX=clang++-14 cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" -DJVPC_SANITIZE=ON -DJVPC_FUZZ=ON -DJVPC_PYTHON=OFF >"$BUILD.configure.log" 2>&1 ||
    { cat "$BUILD.configure.log"; exit 1; }
fi
cmake --build "$BUILD" --target jvpc_tests fuzz_graph_json fuzz_loadable_ops jvpc_cli

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:detect_odr_violation=0
export LSAN_OPTIONS=suppressions=$PWD/tests/fuzz/lsan.supp:print_suppressions=0
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
start=$(date +%s)
echo "[sanitize] the GoogleTest suite under ASan+UBSan"
# One intra-op thread, as ctest runs every test (docs/design.md, "Checking").
OMP_NUM_THREADS=1 "$BUILD/tests/jvpc_tests" --gtest_brief=1

echo "[sanitize] fuzzing the JSON loader for ${JVPC_FUZZ_SECONDS:-60} s"
CORPUS=$BUILD/fuzz-corpus
mkdir -p "$CORPUS"
for ex in "sdpa" "sdpa --mask bool" "sdpa --causal --kv-heads 1" "sdpa --backend flash" "mlp" "block"; do
  name=$(echo "$ex" | tr ' -' '__')
  # shellcheck disable=SC2086
  "$BUILD/jvpc" trace $ex --device cpu --seq-len 8 -o "$CORPUS/$name.json" >/dev/null
  rm -f "$CORPUS/$name.safetensors"
done
cp tests/fuzz/seeds/*.json "$CORPUS/"  # the hostile files the tests use (tests/fuzz/seeds/README.md)
"$BUILD/tests/fuzz/fuzz_graph_json" -max_total_time="${JVPC_FUZZ_SECONDS:-60}" -rss_limit_mb=4096 \
  -artifact_prefix="$BUILD/" "$CORPUS" 2>&1 | tail -n 5
echo "[sanitize] fuzzing every loadable op (${JVPC_FUZZ_OP_BASES:-16} bases each)"
# (LibTorch's warnings about the adversarial arguments left out)
"$BUILD/tests/fuzz_loadable_ops" --cases "${JVPC_FUZZ_OP_BASES:-16}" --slow 10 --quiet 2>&1 | grep -v '^\[W.* Warning: '
echo "[sanitize] passed in $(( $(date +%s) - start )) s after the build"
