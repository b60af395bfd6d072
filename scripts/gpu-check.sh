#!/usr/bin/env bash
# The GPU check, for the machine with an NVIDIA GPU (no network there): builds jvpc against
# that machine's own python3 torch (2.11.0+cu130), runs the CUDA tests and the benchmark, and
# prints a short table. About 8 minutes including the build on 16 cores.
#
#   here, once:   scripts/gpu-check.sh --prepare    # unpacks nlohmann-json, CLI11 and googletest
#                                                   # sources from Debian into .deps/ (git-ignored)
#   there:        scripts/gpu-check.sh              # with .deps carried along
#
# Results go to $OUT (or build-gpu/out): test log, benchmark JSON and table.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DEPS=$ROOT/.deps

if [ "${1:-}" = --prepare ]; then
  rm -rf "$DEPS" && mkdir -p "$DEPS/debs" "$DEPS/root"
  (cd "$DEPS/debs" && apt-get download nlohmann-json3-dev libcli11-dev googletest >/dev/null)
  for f in "$DEPS"/debs/*.deb; do dpkg -x "$f" "$DEPS/root"; done
  rm -rf "$DEPS/debs" "$DEPS/root/usr/share/doc"
  du -sh "$DEPS"
  exit 0
fi

OUT=${OUT:-$ROOT/build-gpu/out}
mkdir -p "$OUT"
PY=${JVPC_PYTHON:-python3}
TORCH_PREFIX=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'
GEN=(-G "Unix Makefiles"); command -v ninja >/dev/null && GEN=(-G Ninja)
JOBS=$(nproc)

# GoogleTest from the carried Debian sources (a static library built here, with this compiler).
if [ ! -f "$DEPS/gtest/lib/cmake/GTest/GTestConfig.cmake" ] && [ ! -f "$DEPS/gtest/lib64/cmake/GTest/GTestConfig.cmake" ]; then
  cmake -S "$DEPS/root/usr/src/googletest" -B "$DEPS/gtest-build" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_GMOCK=OFF -DCMAKE_INSTALL_PREFIX="$DEPS/gtest" >/dev/null
  cmake --build "$DEPS/gtest-build" -j "$JOBS" >/dev/null && cmake --install "$DEPS/gtest-build" >/dev/null
fi

t0=$(date +%s)
cmake -S . -B build-gpu "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DTORCH_CUDA_ARCH_LIST=9.0 \
  -DCMAKE_PREFIX_PATH="$TORCH_PREFIX;$DEPS/root/usr;$DEPS/gtest" >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build build-gpu -j "$JOBS" >"$OUT/build.log" 2>&1 || { grep -E "error" -A3 "$OUT/build.log" | head -40; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
echo "$PY" >build-gpu/.jvpc-python

# CUDA tests (and the rest of the runtime and linearize tests, now on a machine with a GPU).
set +e
build-gpu/tests/jvpc_tests --gtest_filter='*Cuda*:Runtime.*:Linearize.*:Cost.*' --gtest_brief=1 >"$OUT/tests.log" 2>&1
tests_rc=$?
set -e
tail -n 15 "$OUT/tests.log"
build-gpu/jvpc linearize sdpa --device cuda | tail -n 6

# The benchmark on CUDA: seed, causal, block and the large bf16 configuration.
JVPC_BUILD_DIR=build-gpu JVPC_BENCH_OUT="$OUT" scripts/bench.sh --device cuda --no-setup
echo "gpu-check: tests exit $tests_rc; total $(( $(date +%s) - t0 )) s"
exit $tests_rc
