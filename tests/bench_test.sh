#!/usr/bin/env bash
# The side-by-side benchmark's pipeline at the seed's configuration, with few repetitions:
# jvpc_bench and torch_reference.py measure, compare.py pairs them. Times vary; the FLOPs and
# residual bytes in the table do not, and are checked exactly; then the long-context pipeline
# (long_context.py) at small sizes. Usage: bench_test.sh BUILD_DIR
set -u
BUILD=$1
SRC=$(cd "$(dirname "$0")/.." && pwd)
PY=$(cat "$BUILD/.jvpc-python" 2>/dev/null || command -v python3)
export PYTHONPATH=$BUILD/python${PYTHONPATH:+:$PYTHONPATH}  # torch_reference.py reads jvpc's list of matmul ops
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
fails=0
check() { if grep -qF -- "$1" "$OUT/table.md"; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi; }

"$BUILD/jvpc_bench" sdpa --device cpu --repeats 2 --warmup 1 --fresh 1 --compile-runs 3 --json "$OUT/jvpc_seed.json" >"$OUT/jvpc.log" 2>&1 ||
  { echo "FAIL jvpc_bench: $(tail -n 3 "$OUT/jvpc.log")"; exit 1; }
"$PY" "$SRC/scripts/bench/torch_reference.py" --config sdpa --device cpu --repeats 2 --warmup 1 --skip-compile \
  --json "$OUT/torch_seed.json" >"$OUT/torch.log" 2>&1 || { echo "FAIL torch_reference.py: $(tail -n 3 "$OUT/torch.log")"; exit 1; }
# The load each side met, as bench.sh records it (load.txt), is shown under the heading.
printf 'seed (jvpc)|1.50\nseed (PyTorch)|2.25\n' >"$OUT/load.txt"
"$PY" "$SRC/scripts/bench/compare.py" "$OUT" --markdown "$OUT/table.md" >/dev/null 2>"$OUT/compare.log" ||
  { echo "FAIL compare.py: $(tail -n 3 "$OUT/compare.log")"; exit 1; }
check "| matmul FLOPs, linearize | 20,971,520 | 83,886,080 | 0.250 |"
check "| matmul FLOPs, first jvp call | 41,943,040 | 62,914,560 | 0.667 |"
check "| matmul FLOPs, later jvp calls | 41,943,040 | 41,943,040 | 1.000 |"
check "| residual bytes held | 640.0 KiB | 4.85 MiB | 0.129 |"
check "|   plus bytes aliasing the caller's inputs | 160.0 KiB | 480.0 KiB | — |"
check "time per jvp call (later calls), vs eager jvp_fn"
check "Load average (1 min) as each side started: jvpc 1.50, PyTorch 2.25 (each side runs in its own process"
check "compile: linearize minus forward (median of the 3 differences)"
check "| matmul FLOPs, linearize at a new point, compiled program | 20,971,520 | 83,886,080 | 0.250 |"
check "time, linearize at a new point, compiled program (vs torch.func.linearize)"

# Two sides that measured different configurations are refused, not compared.
"$PY" - "$OUT/torch_seed.json" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
d["config"] = d["config"].replace("seq=128", "seq=64")
json.dump(d, open(sys.argv[1], "w"))
PYEOF
if "$PY" "$SRC/scripts/bench/compare.py" "$OUT" >/dev/null 2>"$OUT/compare.log"; then
  echo "FAIL compare.py took two different configurations"; fails=$((fails + 1))
elif grep -q "seed: jvpc measured .* but PyTorch .*seq=64" "$OUT/compare.log"; then
  echo "ok   different configurations are refused"
else
  echo "FAIL compare.py's refusal: $(cat "$OUT/compare.log")"; fails=$((fails + 1))
fi
# The long-context benchmark's pipeline (scripts/bench/bench.sh --long) at L = 256 and 512: every row
# runs and fits under 16 GiB; under a 200 MiB limit the watchdog stops the PyTorch rows (their
# process alone is larger) as "does not fit", and does not run them at 512.
long() {  # name limit: runs long_context.py, its table in $OUT/long_$1.md
  "$PY" "$SRC/scripts/bench/long_context.py" --jvpc-bench "$BUILD/jvpc_bench" --out "$OUT/long_$1" --lengths 256,512 \
    --limit "$2" --timeout 120 >"$OUT/long_$1.md" 2>"$OUT/long_$1.log" || echo "FAIL long_context.py: $(tail -n 3 "$OUT/long_$1.log")"
}
lcheck() {  # file pattern
  if grep -qE -- "$2" "$OUT/$1"; then echo "ok   long: $2"; else echo "FAIL long: $2"; fails=$((fails + 1)); fi
}
long fits 16GiB
lcheck long_fits.md "^\| 512 \| 16 \| jvpc O\(L\) \(auto\) \| fits \| fits \| [0-9.]+ GiB \| [0-9.]+ s \| 0.02 GiB \|$"
lcheck long_fits.md "^\| 512 \| 16 \| PyTorch torch.func.linearize \(math\) \| fits \| fits \|"
lcheck long_fits.md "^\| 256 \| 16 \| PyTorch forward AD \(math\) \| — \| fits \|"
[ -f "$OUT/long_fits/long_results.json" ] && lcheck long_fits/long_results.json '"jvp_time_s"'
long tight 200MiB
lcheck long_tight.md "^\| 256 \| 16 \| PyTorch forward AD \(math\) \| — \| does not fit \|"
lcheck long_tight.md "^\| 512 \| 16 \| PyTorch forward AD \(math\) \| — \| does not fit \(not run: L=256 did not"
[ "$fails" = 0 ] && echo "benchmark pipeline checks passed" || { echo "$fails benchmark pipeline checks failed"; exit 1; }
