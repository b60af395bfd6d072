#!/usr/bin/env bash
# The side-by-side benchmark: jvpc (build/jvpc_bench) and PyTorch (scripts/bench/torch_reference.py)
# on the same configurations, each in its own process, then a table of ratios (jvpc / PyTorch)
# and a plot of time per jvp call against sequence length.
#
#   scripts/bench.sh [--device cpu|cuda] [--no-setup] [--skip-compile | --compile-only NAME]
#
# --skip-compile leaves out torch.compile(jvp_fn) (its compilation takes a minute or more per
# configuration); --compile-only seed keeps it for that configuration alone.
#
# Configurations: the seed's (sdpa, bsz 1, 5 heads, seq 128, head dim 64), causal, the
# transformer block, and on CUDA a large one (bsz 4, 16 heads, seq 2048, bfloat16); plus an sdpa
# sequence-length sweep for the plot. Results: $JVPC_BENCH_OUT (default build/bench): one JSON
# per run, table.md, seq_sweep.png.
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICE="" SETUP=1 COMPILE="" COMPILE_ONLY=""
while [ $# -gt 0 ]; do
  case $1 in
    --device) DEVICE=$2; shift 2 ;;
    --no-setup) SETUP=""; shift ;;
    --skip-compile) COMPILE=--skip-compile; shift ;;
    --compile-only) COMPILE_ONLY=$2; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$SETUP" ] && scripts/setup.sh
BUILD=${JVPC_BUILD_DIR:-build}
OUT=${JVPC_BENCH_OUT:-$BUILD/bench}
PY=$(cat "$BUILD/.jvpc-python" 2>/dev/null || command -v python3)
[ -n "$DEVICE" ] || DEVICE=$("$PY" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')
mkdir -p "$OUT"
"$PY" -c "import matplotlib" 2>/dev/null || "$PY" -m pip install -q --retries 1 --timeout 15 matplotlib 2>/dev/null ||
  echo "(no matplotlib: no plot)"

run() {  # name example flags...
  local name=$1 example=$2; shift 2
  echo "[bench] $name: $example $*" >&2
  "$BUILD/jvpc_bench" "$example" "$@" --device "$DEVICE" --json "$OUT/jvpc_$name.json" >/dev/null
  local compile=$COMPILE
  [ -n "$COMPILE_ONLY" ] && [ "$name" != "$COMPILE_ONLY" ] && compile=--skip-compile
  "$PY" scripts/bench/torch_reference.py --config "$example" "$@" --device "$DEVICE" $compile \
    --json "$OUT/torch_$name.json" >/dev/null 2>"$OUT/torch_$name.log"
}
sweep() {  # name example flags... (no torch.compile: seconds per point)
  local name=$1 example=$2; shift 2
  echo "[bench] $name: $example $*" >&2
  "$BUILD/jvpc_bench" "$example" "$@" --device "$DEVICE" --fresh 2 --json "$OUT/jvpc_$name.json" >/dev/null
  "$PY" scripts/bench/torch_reference.py --config "$example" "$@" --device "$DEVICE" --skip-compile \
    --json "$OUT/torch_$name.json" >/dev/null 2>"$OUT/torch_$name.log"
}

rm -f "$OUT"/*.json
run seed sdpa
run causal sdpa --causal
run block block
if [ "$DEVICE" = cuda ]; then
  run large sdpa --bsz 4 --model-dim 1024 --head-dim 64 --seq-len 2048 --dtype bfloat16 --repeats 20
  for s in 256 512 1024 2048 4096; do sweep "seq$s" sdpa --seq-len "$s" --repeats 20; done
else
  for s in 64 128 256 512; do sweep "seq$s" sdpa --seq-len "$s" --repeats 20; done
fi
"$PY" scripts/bench/compare.py "$OUT" --markdown "$OUT/table.md" --plot "$OUT/seq_sweep.png"
