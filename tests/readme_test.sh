#!/usr/bin/env bash
# The README shows what the program prints: its sample output is what `scripts/quickstart.sh
# --device cpu` prints (masked: the check's error figures, which move with the machine's BLAS,
# and the budget and memory limit, which are 3/4 of its memory),
# and its pipeline diagram is `jvpc linearize --list-passes`, exactly. Usage: readme_test.sh JVPC
set -u
JVPC=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
fails=0
# The fenced block of README.md whose first line starts with $1.
block() {
  awk -v first="$1" '
    /^```/ { if (inside) { if (keep) exit; inside = 0 } else { inside = 1; start = 1 }; next }
    inside && start { start = 0; keep = index($0, first) == 1 }
    inside && keep { print }' "$ROOT/README.md"
}
# The check's error figures, and the attention budget and memory limit (3/4 of the machine's memory).
mask() { sed -E 's/[0-9]+\.[0-9]+e[-+][0-9]+/N/g; s/budget [0-9.]+ [KMGT]?i?B \([0-9]+ bytes\)/budget B/g; s/memory limit [0-9.]+[KMGT]?i?B/memory limit M/g'; }
same() {  # name expected actual
  if diff -u "$2" "$3" >"$DIR/diff"; then echo "ok   $1"; else echo "FAIL $1"; cat "$DIR/diff"; fails=$((fails + 1)); fi
}

block "jvpc linearize sdpa" | mask >"$DIR/readme_run"
# quickstart.sh's command after its set-up, on the CPU as the README's block says.
"$JVPC" linearize sdpa --bsz 1 --model-dim 320 --head-dim 64 --seq-len 128 --backend math --device cpu | mask >"$DIR/run"
[ -s "$DIR/readme_run" ] || { echo "FAIL README has no block starting 'jvpc linearize sdpa'"; fails=$((fails + 1)); }
same "README's sample output is quickstart.sh's (masked)" "$DIR/readme_run" "$DIR/run"

block " #  pass" >"$DIR/readme_passes"
"$JVPC" linearize --list-passes >"$DIR/passes"
same "README's pipeline is jvpc linearize --list-passes" "$DIR/readme_passes" "$DIR/passes"
# The banner of passes/linearize_pipeline.h shows the same table.
sed -n 's|^// \{0,1\}||p' "$ROOT/passes/linearize_pipeline.h" | awk '/^ #  pass/ { on = 1 } on && /^$/ { exit } on' >"$DIR/banner"
same "linearize_pipeline.h's banner is jvpc linearize --list-passes" "$DIR/banner" "$DIR/passes"
[ "$fails" = 0 ]
