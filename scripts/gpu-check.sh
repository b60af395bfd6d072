#!/usr/bin/env bash
# The GPU check, for the machine with an NVIDIA GPU (no network there): builds jvpc against
# that machine's own python3 torch (2.11.0+cu130), runs the CUDA tests and the benchmark, and
# prints a short table. Not yet run on a GPU machine; the --cpu rehearsal takes 5 to 6 minutes on
# 2 cores with a warm compiler cache, and the GPU run is expected to take 6 to 9 minutes (allow
# 10; the logs in $OUT are written as each step finishes).
#
#   here, once:   scripts/gpu-check.sh --prepare    # unpacks nlohmann-json, CLI11 and googletest
#                                                   # sources from Debian into .deps/ (git-ignored)
#   there:        scripts/gpu-check.sh              # with .deps carried along
#   rehearsal:    scripts/gpu-check.sh --cpu        # the same steps on a machine without a GPU
#
# Results go to $OUT (or build-gpu/out): test and CLI logs, the CUDA linearize report, the
# benchmark table and plot, and bench.tgz with every benchmark JSON.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DEPS=$ROOT/.deps

DEVICE=cuda
if [ "${1:-}" = --cpu ]; then  # a rehearsal on a machine without a GPU: the same steps on the CPU
  DEVICE=cpu
  shift
fi
if [ "${1:-}" = --prepare ]; then
  rm -rf "$DEPS" && mkdir -p "$DEPS/debs" "$DEPS/root"
  (cd "$DEPS/debs" && apt-get download nlohmann-json3-dev libcli11-dev googletest >/dev/null)
  for f in "$DEPS"/debs/*.deb; do dpkg -x "$f" "$DEPS/root"; done
  rm -rf "$DEPS/debs" "$DEPS/root/usr/share/doc"
  du -sh "$DEPS"
  exit 0
fi

OUT=${OUT:-$ROOT/build-gpu/out}  # where the results go; kept to 8 files, for runners that copy few back
mkdir -p "$OUT" build-gpu
PY=${JVPC_PYTHON:-python3}
TORCH_PREFIX=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
  torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")'
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
  -DCMAKE_PREFIX_PATH="$TORCH_PREFIX;$DEPS/root/usr;$DEPS/gtest" >build-gpu/configure.log 2>&1 ||
  { cp build-gpu/configure.log "$OUT/"; tail -30 build-gpu/configure.log; exit 1; }
cmake --build build-gpu -j "$JOBS" >build-gpu/build.log 2>&1 ||
  { cp build-gpu/build.log "$OUT/"; grep -E "error" -A3 build-gpu/build.log | head -40; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
echo "$PY" >build-gpu/.jvpc-python

# From here on a failing step is reported, and the next one still runs.
set +e
# Every unit test, now on a machine with a GPU (the CUDA ones no longer skip), and the CLI checks.
build-gpu/tests/jvpc_tests --gtest_brief=1 >"$OUT/tests.log" 2>&1
tests_rc=$?
grep -E "^\[  (PASSED|SKIPPED|FAILED) " "$OUT/tests.log"
bash tests/cli_test.sh build-gpu/jvpc >"$OUT/cli.log" 2>&1
cli_rc=$?
tail -n 1 "$OUT/cli.log"
build-gpu/jvpc linearize sdpa --device $DEVICE --report "$OUT/linearize_$DEVICE.json" >build-gpu/linearize.log 2>&1
lin_rc=$?
tail -n 6 build-gpu/linearize.log
echo "tests + linearize: $(( $(date +%s) - t0 )) s"

# The benchmark on CUDA: seed, causal, block, the large bf16 configuration and a seq sweep.
# torch.compile(jvp_fn) for the seed's configuration only: it compiles for a minute or more.
JVPC_BUILD_DIR=build-gpu JVPC_BENCH_OUT=build-gpu/bench scripts/bench.sh --device $DEVICE --no-setup --compile-only seed
bench_rc=$?
cp build-gpu/bench/table.md build-gpu/bench/seq_sweep.png "$OUT/" 2>/dev/null
tar czf "$OUT/bench.tgz" -C build-gpu bench linearize.log 2>/dev/null
echo "gpu-check: tests $tests_rc, cli $cli_rc, linearize $lin_rc, bench $bench_rc; total $(( $(date +%s) - t0 )) s"
[ $tests_rc = 0 ] && [ $cli_rc = 0 ] && [ $lin_rc = 0 ] && [ $bench_rc = 0 ]
