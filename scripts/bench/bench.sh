#!/usr/bin/env bash
# The side-by-side benchmark: jvpc (build/jvpc_bench) and PyTorch (scripts/bench/torch_reference.py)
# on the same configurations, each in its own process, then a table of ratios (jvpc / PyTorch)
# and a plot of time per jvp call against sequence length.
#
#   scripts/bench/bench.sh [--device cpu|cuda] [--no-setup] [--skip-compile | --compile-only NAME]
#   scripts/bench/bench.sh --long [--no-setup] [-- long_context.py flags: --lengths 2048 --limit 16GiB ...]
#
# --long runs the long-context benchmark instead (scripts/bench/long_context.py: attention at
# L = 2k to 32k, PyTorch's math path against jvpc's P and O(L) forms, each run in its own process
# under a resident-memory limit; results in $JVPC_BENCH_OUT, default build/bench-long). Runs that
# would start after 30 minutes are not run (--max-minutes); on a loaded machine pass --threads 1
# (docs/benchmarks.md). Not part of CI.
#
# --skip-compile leaves out torch.compile(jvp_fn) (its compilation takes a minute or more per
# configuration); --compile-only seed keeps it for that configuration alone.
#
# Configurations: the seed's (sdpa, bsz 1, 5 heads, seq 128, head dim 64), causal, the
# transformer block, and on CUDA a large one (bsz 4, 16 heads, seq 2048, bfloat16); plus an sdpa
# sequence-length sweep for the plot. Results: $JVPC_BENCH_OUT (default build/bench): one JSON
# per run, table.md, seq_sweep.png, load.txt (the 1-minute load average as each side started,
# which table.md shows: the two sides run one after the other, and their times move with it).
set -euo pipefail
cd "$(dirname "$0")/../.."
DEVICE="" SETUP=1 COMPILE="" COMPILE_ONLY="" LONG=""
while [ $# -gt 0 ]; do
  case $1 in
    --device) DEVICE=$2; shift 2 ;;
    --no-setup) SETUP=""; shift ;;
    --skip-compile) COMPILE=--skip-compile; shift ;;
    --compile-only) COMPILE_ONLY=$2; shift 2 ;;
    --long) LONG=1; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$SETUP" ] && scripts/setup.sh
BUILD=${JVPC_BUILD_DIR:-build}
export PYTHONPATH=$(cd "$BUILD" && pwd)/python${PYTHONPATH:+:$PYTHONPATH}  # torch_reference.py reads jvpc's list of matmul ops
PY=$(cat "$BUILD/.jvpc-python" 2>/dev/null || command -v python3)
if [ -n "$LONG" ]; then
  OUT=${JVPC_BENCH_OUT:-$BUILD/bench-long}
  # A copy of the binary: a rebuild during the run does not change what is measured.
  mkdir -p "$OUT" && cp "$BUILD/jvpc_bench" "$OUT/jvpc_bench"
  exec "$PY" scripts/bench/long_context.py --jvpc-bench "$OUT/jvpc_bench" --out "$OUT" "$@"
fi
[ $# = 0 ] || { echo "bench.sh: arguments after -- go with --long only" >&2; exit 2; }
OUT=${JVPC_BENCH_OUT:-$BUILD/bench}
[ -n "$DEVICE" ] || DEVICE=$("$PY" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')
mkdir -p "$OUT"
if ! "$PY" -c "import matplotlib" 2>/dev/null; then  # for the plot; set-up may install, a run without it doesn't
  { [ -n "$SETUP" ] && "$PY" -m pip install -q --retries 1 --timeout 15 matplotlib 2>/dev/null; } || echo "(no matplotlib: no plot)"
fi
# torch.compile gets less time on a GPU machine, where the whole run has a few minutes.
CTIMEOUT=300; [ "$DEVICE" = cuda ] && CTIMEOUT=120

# A configuration that fails on one side is reported and left out of the table; the rest run.
failed=0
side() {  # name log command...: runs one side, keeping its stderr in log; load.txt: the load it met
  local name=$1 log=$2; shift 2
  echo "$name|$(cut -d' ' -f1 /proc/loadavg 2>/dev/null)" >>"$OUT/load.txt"
  "$@" >/dev/null 2>"$log" || { echo "[bench] $name failed: $(tail -n 1 "$log")" >&2; failed=$((failed + 1)); }
}
run() {  # name example flags...
  local name=$1 example=$2; shift 2
  echo "[bench] $name: $example $*" >&2
  side "$name (jvpc)" "$OUT/jvpc_$name.log" "$BUILD/jvpc_bench" "$example" "$@" --device "$DEVICE" --json "$OUT/jvpc_$name.json"
  local compile=$COMPILE
  [ -n "$COMPILE_ONLY" ] && [ "$name" != "$COMPILE_ONLY" ] && compile=--skip-compile
  side "$name (PyTorch)" "$OUT/torch_$name.log" "$PY" scripts/bench/torch_reference.py --config "$example" "$@" \
    --device "$DEVICE" $compile --compile-timeout "$CTIMEOUT" --json "$OUT/torch_$name.json"
}
sweep() {  # name example flags... (no torch.compile: seconds per point)
  local name=$1 example=$2; shift 2
  echo "[bench] $name: $example $*" >&2
  side "$name (jvpc)" "$OUT/jvpc_$name.log" "$BUILD/jvpc_bench" "$example" "$@" --device "$DEVICE" --fresh 2 \
    --json "$OUT/jvpc_$name.json"
  side "$name (PyTorch)" "$OUT/torch_$name.log" "$PY" scripts/bench/torch_reference.py --config "$example" "$@" \
    --device "$DEVICE" --skip-compile --json "$OUT/torch_$name.json"
}

rm -f "$OUT"/*.json "$OUT"/*.log "$OUT/load.txt"
run seed sdpa
run causal sdpa --causal
if [ "$DEVICE" = cuda ]; then
  # float32: in float16 PyTorch's own forward AD of layer_norm fails on CUDA (its float32
  # statistics meet the float16 weights in the next matmul), on both sides' references.
  run block block --dtype float32
else
  run block block
fi
if [ "$DEVICE" = cuda ]; then
  run large sdpa --bsz 4 --model-dim 1024 --head-dim 64 --seq-len 2048 --dtype bfloat16 --repeats 20
  for s in 256 1024 2048 4096; do sweep "seq$s" sdpa --seq-len "$s" --repeats 20; done
else
  for s in 1 64 128 256 512; do sweep "seq$s" sdpa --seq-len "$s" --repeats 20; done  # seq 1: per-call overhead
fi
"$PY" scripts/bench/compare.py "$OUT" --markdown "$OUT/table.md" --plot "$OUT/seq_sweep.png"
[ "$failed" = 0 ] || { echo "bench.sh: $failed runs failed (logs in $OUT)" >&2; exit 1; }
