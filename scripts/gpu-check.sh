#!/usr/bin/env bash
# The GPU check, for the machine with an NVIDIA GPU (no network there): builds jvpc against
# that machine's own python3 torch (2.11.0+cu130), runs the CUDA tests and the benchmark, and
# prints a short table. The --cpu rehearsal takes about 11 minutes on 2 cores (7 of them
# building, 4.4 for the steps after the build, the batched step included); the GPU run is
# expected to take 6 to 9 minutes (allow 10; the logs in $OUT are written as each step finishes).
#
#   here, once:   scripts/gpu-check.sh --prepare    # unpacks nlohmann-json, CLI11 and googletest
#                                                   # sources from Debian into .deps/ (git-ignored)
#   there:        scripts/gpu-check.sh              # with .deps carried along
#   rehearsal:    scripts/gpu-check.sh --cpu        # the same steps on a machine without a GPU
#   short slot:   scripts/gpu-check.sh [--cpu] --kernels   # the build and the attention kernels' step only
#
# Results go to $OUT (or build-gpu/out): test and CLI logs, the CUDA linearize report, the
# benchmark table and plot, long.log (attention's tangent at long context: the operator's CUDA
# checks and jvpc_bench at L = 32k, H16, bfloat16, both forms), and bench.tgz with every
# benchmark JSON and python_bench.py's log (jvpc's jvp_fn from Python beside torch.func's and
# beside its own matmuls alone, on the GPU), and batched_bench.py's (K tangents in one call).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DEPS=$ROOT/.deps

DEVICE=cuda
if [ "${1:-}" = --cpu ]; then  # a rehearsal on a machine without a GPU: the same steps on the CPU
  DEVICE=cpu
  shift
fi
KERNELS_ONLY=0
if [ "${1:-}" = --kernels ]; then  # the build, then attention's Triton kernels alone (a short GPU slot)
  KERNELS_ONLY=1
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
  -DCMAKE_PREFIX_PATH="$TORCH_PREFIX;$DEPS/root/usr;$DEPS/gtest" -DPython3_EXECUTABLE="$(command -v "$PY")" >build-gpu/configure.log 2>&1 ||
  { cp build-gpu/configure.log "$OUT/"; tail -30 build-gpu/configure.log; exit 1; }
cmake --build build-gpu -j "$JOBS" >build-gpu/build.log 2>&1 ||
  { cp build-gpu/build.log "$OUT/"; grep -E "error" -A3 build-gpu/build.log | head -40; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
echo "$PY" >build-gpu/.jvpc-python

# From here on a failing step is reported, and the next one still runs.
set +e
tests_rc=0 cli_rc=0 lin_rc=0
if [ $KERNELS_ONLY = 0 ]; then
# Every unit test, the CUDA ones included (they skip only without a GPU), and the CLI checks.
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
fi

# Attention's tangent in the fused Triton kernels (jvpc/_attention_triton.py): correctness against
# the ATen route (float32, bfloat16), then time and peak memory beside SDPA's flash kernels at L 2k
# to 32k, H 16 and 24, D 64 and 128, bfloat16, and the anchors' configurations (--cpu: Triton's
# interpreter at small sizes). Before the long-context step: it is the first thing a GPU must confirm.
kernels_rc=0
mkdir -p build-gpu/bench
if PYTHONPATH=build-gpu/python "$PY" -c "import jvpc, triton" 2>/dev/null; then
  PYTHONPATH=build-gpu/python timeout 240 "$PY" scripts/bench/attention_kernels.py --device $DEVICE \
    --json build-gpu/bench/attention_kernels.json >"$OUT/attention_kernels.log" 2>&1 || kernels_rc=$?
  grep -E "^(check .*FAIL|L |tvm|amorehead|anchor|attention kernels)" "$OUT/attention_kernels.log" |
    cut -c1-220 || tail -n 5 "$OUT/attention_kernels.log"
  # The operator's tests, its CUDA ones included (the Triton kernels through the dispatcher, and
  # tangent_grad's fused route on CUDA against the CPU in float64); they skip without a GPU.
  PYTHONPATH=build-gpu/python timeout 240 "$PY" -m pytest -q -p no:cacheprovider -rs \
    python/tests/test_attention_tangent_backward.py >>"$OUT/attention_kernels.log" 2>&1 || kernels_rc=1
  tail -n 1 "$OUT/attention_kernels.log"
else
  echo "attention kernels: skipped (no jvpc module or no Triton for $PY)"
fi
if [ $KERNELS_ONLY = 1 ]; then
  echo "gpu-check --kernels: kernels $kernels_rc; total $(( $(date +%s) - t0 )) s"
  exit $kernels_rc
fi

# Long context: jvpc::attention_tangent on CUDA. Its unit tests (O(L) form against the
# P form and forward AD, FLOPs on the kernels that ran), the linearize check of both forms at
# L = 8k (forward AD of the math path still fits there), then the benchmark point L = 32k, H16,
# D64, bfloat16 in each form (--lean: one linearize, one warm-up and three timed calls; the P
# form holds 32 GiB of probabilities and may not fit: reported, not fatal).
long_rc=0
LONG_CHECK_L=8192 LONG_L=32768
[ "$DEVICE" = cpu ] && LONG_CHECK_L=1024 LONG_L=2048  # the rehearsal: the same steps, small
{
  build-gpu/tests/jvpc_tests --gtest_brief=1 --gtest_filter='AttentionTangent*:AttentionForm*:FusedEmulated*' ||
    long_rc=1
  for budget in 0 inf; do
    build-gpu/jvpc linearize sdpa --device $DEVICE --bsz 1 --model-dim 1024 --head-dim 64 --seq-len $LONG_CHECK_L \
      --dtype bfloat16 --residual-budget $budget >build-gpu/long_linearize.log 2>&1 || long_rc=1
    grep -E "^(attention|reference|check) |error" build-gpu/long_linearize.log
  done
  mkdir -p build-gpu/bench-long
  for budget in 0 inf; do
    timeout 180 build-gpu/jvpc_bench sdpa --device $DEVICE --bsz 1 --model-dim 1024 --head-dim 64 --seq-len $LONG_L \
      --dtype bfloat16 --backend auto --residual-budget $budget --lean --warmup 1 --repeats 3 \
      --json "build-gpu/bench-long/long_L${LONG_L}_budget_$budget.json" >/dev/null ||
      echo "jvpc_bench L=$LONG_L budget $budget: failed or did not fit (rc $?)"
    [ -f "build-gpu/bench-long/long_L${LONG_L}_budget_$budget.json" ] &&
      "$PY" -c 'import json, sys; j = json.load(open(sys.argv[1])); print(sys.argv[2], j["attention"][0]["choice"],
        "linearize %.2f s, jvp %.4f s per call" % (j["linearize_s"], j["jvp_time_s"]), j["predicted"])' \
        "build-gpu/bench-long/long_L${LONG_L}_budget_$budget.json" "L=$LONG_L H16 bf16 budget $budget:"
  done
} >"$OUT/long.log" 2>&1
grep -E "^(\[  (PASSED|FAILED)|L=[0-9]+ H16|jvpc_bench)" "$OUT/long.log"

# The benchmark on CUDA: seed, causal, block, the large bf16 configuration and a seq sweep.
# torch.compile(jvp_fn) for the seed's configuration only: it compiles for a minute or more.
JVPC_BUILD_DIR=build-gpu JVPC_BENCH_OUT=build-gpu/bench scripts/bench/bench.sh --device $DEVICE --no-setup --compile-only seed
bench_rc=$?
cp build-gpu/bench/table.md build-gpu/bench/seq_sweep.png "$OUT/" 2>/dev/null

# From Python: jvpc's jvp_fn beside torch.func's eager one and beside its own matmuls
# alone, at the seed's configuration (float16 on CUDA, as the seed's script), short rounds, no
# torch.compile; the log and JSON go into bench.tgz. Skipped where the module was not built.
py_rc=0
mkdir -p build-gpu/bench
if PYTHONPATH=build-gpu/python "$PY" -c "import jvpc" 2>/dev/null; then
  PYTHONPATH=build-gpu/python "$PY" scripts/bench/python_bench.py --config sdpa --device $DEVICE --rounds 50 \
    --warmup 10 --skip-compile --json build-gpu/bench/python_seed.json >build-gpu/bench/python_seed.log 2>&1
  py_rc=$?
  grep -E "^(jvpc|torch.func|floor|matmul throughput|target)" build-gpu/bench/python_seed.log || tail -n 3 build-gpu/bench/python_seed.log
else
  echo "python_bench: skipped (no jvpc module in build-gpu/python for $PY)"
fi

# Many tangents per call: the seed's batched tangent graph for K = 16 on the device (a
# CUDA graph there), checked by the CLI against 16 single calls, then timed per tangent beside K
# single calls, torch.func's vmap and its own matmuls alone (float16 on CUDA).
batched_rc=0
build-gpu/jvpc linearize sdpa --device $DEVICE --tangents 16 >build-gpu/bench/batched_linearize.log 2>&1 || batched_rc=1
grep -E "^ *(tangents|unrolled|vs 16)" build-gpu/bench/batched_linearize.log || tail -n 3 build-gpu/bench/batched_linearize.log
if PYTHONPATH=build-gpu/python "$PY" -c "import jvpc" 2>/dev/null; then
  PYTHONPATH=build-gpu/python "$PY" scripts/bench/batched_bench.py --config sdpa --device $DEVICE --tangents 1,4,16,64 \
    --rounds 30 --json build-gpu/bench/batched_seed.json >build-gpu/bench/batched_seed.log 2>&1 || batched_rc=1
  grep -vE "^(sdpa|matmuls alone)" build-gpu/bench/batched_seed.log | tail -n 6
fi
tar czf "$OUT/bench.tgz" -C build-gpu bench bench-long linearize.log 2>/dev/null
echo "gpu-check: tests $tests_rc, cli $cli_rc, linearize $lin_rc, kernels $kernels_rc, long $long_rc, bench $bench_rc," \
  "python $py_rc, batched $batched_rc; total $(( $(date +%s) - t0 )) s"
[ $tests_rc = 0 ] && [ $cli_rc = 0 ] && [ $lin_rc = 0 ] && [ $kernels_rc = 0 ] && [ $long_rc = 0 ] && [ $bench_rc = 0 ] &&
  [ $py_rc = 0 ] && [ $batched_rc = 0 ]
