#!/usr/bin/env bash
# Every file jvpc opens while it loads and runs a saved graph, recorded by an LD_PRELOAD library
# (tests/open_shim.cpp logs each open/openat/fopen path): `jvpc show|cost|run|linearize` of a
# graph in folder G open nothing outside G but what the process itself needs, and a hostile graph
# whose constants_file leads out of its folder never opens that file.
# Usage: open_test.sh path/to/jvpc path/to/libjvpc_open_shim.so
set -u
JVPC=$1
SHIM=$2
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
DIR=$(cd "$DIR" && pwd -P)  # the logged paths are absolute ones under it
fails=0
pass() { printf 'ok   %s\n' "$1"; }
fail() { printf 'FAIL %s\n' "$1"; fails=$((fails + 1)); }
# An ASan build's runtime must come first among the libraries; it comes from the executable here.
export ASAN_OPTIONS=${ASAN_OPTIONS:-}${ASAN_OPTIONS:+:}verify_asan_link_order=0

# logged LOG CODE -- command...: runs the command under the shim, logging into $DIR/LOG.
logged() {
  local log=$1 code=$2; shift 3
  rm -f "$DIR/$log"
  JVPC_OPEN_LOG="$DIR/$log" LD_PRELOAD="$SHIM" "$@" >"$DIR/out" 2>"$DIR/err"
  local got=$?
  if [ "$got" != "$code" ]; then fail "$*: exit $got, expected $code: $(head -c 300 "$DIR/err")"; return 1; fi
  touch "$DIR/$log"
}

# A graph with constants (the residuals) and a traced graph with its inputs file, each alone in
# its folder; a baseline graph in a folder of its own.
mkdir "$DIR/g" "$DIR/traced" "$DIR/base" "$DIR/hostile"
"$JVPC" linearize sdpa --device cpu --seq-len 16 -o "$DIR/g/t.json" >/dev/null || fail "linearize -o"
"$JVPC" trace sdpa --device cpu --seq-len 16 -o "$DIR/traced/s.json" >/dev/null || fail "trace -o"
python3 - "$DIR/base/sin.json" <<'PY'
import json, sys
m = {"device": "cpu", "dtype": "Float", "sizes": [3], "strides": [1]}
json.dump({"format": "jvpc-graph", "schema_version": 1,
           "inputs": [{"id": 0, "name": "x", "role": "primal", "differentiable": True, "meta": m}],
           "nodes": [{"op": "aten::sin", "args": [{"tensor": 0}], "outputs": [{"id": 1, "meta": m}]}],
           "outputs": [{"id": 1, "name": "y"}]}, open(sys.argv[1], "w"))
PY

# What the process itself opens: a baseline run of a graph elsewhere (its own folder left out),
# and system files by prefix, for opens that differ between runs or machines: the kernel's
# /proc and /sys (CPU counts, cpuinfo), random seeds, and GPU device nodes where CUDA initializes.
logged base.log 0 -- "$JVPC" run "$DIR/base/sin.json"
grep -v "^$DIR/" "$DIR/base.log" | sort -u >"$DIR/allowed"
outside() {  # the paths in log $1 outside folder $2 that are not allowed
  grep -v "^$2/" "$DIR/$1" | grep -v -x -F -f "$DIR/allowed" |
    grep -v -E '^(/proc/|/sys/|/dev/(u?random|null|shm/|nvidia))' || true
}

# check NAME FOLDER LOG FILES...: the log names each of FILES (so the shim saw the opens), and
# nothing outside FOLDER.
check() {
  local name=$1 folder=$2 log=$3; shift 3
  local f missing=""
  for f in "$@"; do grep -q -x -F "$f" "$DIR/$log" || missing="$missing $f"; done
  if [ -n "$missing" ]; then fail "$name: the log lacks$missing (is the shim loaded?)"; return; fi
  local out; out=$(outside "$log" "$folder")
  if [ -n "$out" ]; then fail "$name opened outside its folder: $(echo "$out" | head -5 | tr '\n' ' ')"; else pass "$name"; fi
}

G=$DIR/g
logged show.log 0 -- "$JVPC" show "$G/t.json" && check "show" "$G" show.log "$G/t.json" "$G/t.safetensors"
logged run.log 0 -- "$JVPC" run "$G/t.json" && check "run" "$G" run.log "$G/t.json" "$G/t.safetensors"
logged cost.log 0 -- "$JVPC" cost "$G/t.json" && check "cost" "$G" cost.log "$G/t.json" "$G/t.safetensors"
T=$DIR/traced
logged lin.log 0 -- "$JVPC" linearize "$T/s.json" &&
  check "linearize a traced graph (primals from its inputs file)" "$T" lin.log "$T/s.json" "$T/s.inputs.safetensors"
logged runin.log 0 -- "$JVPC" run "$T/s.json" --inputs "$T/s.inputs.safetensors" &&
  check "run --inputs" "$T" runin.log "$T/s.json" "$T/s.inputs.safetensors"

# Hostile graphs: constants_file out of the folder, by '..', by an absolute path, by a symlink.
# The file they name is a good constants file, so only the confinement stops it.
H=$DIR/hostile
cp "$G/t.safetensors" "$DIR/outside.safetensors"
ln -s ../outside.safetensors "$H/link.safetensors"
for name in ../outside.safetensors "$DIR/outside.safetensors" link.safetensors; do
  python3 - "$G/t.json" "$H/h.json" "$name" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
j["constants_file"] = sys.argv[3]
json.dump(j, open(sys.argv[2], "w"))
PY
  for cmd in show run; do
    logged hostile.log 2 -- "$JVPC" $cmd "$H/h.json"; touch "$DIR/hostile.log"
    if grep -q "outside.safetensors" "$DIR/hostile.log"; then fail "$cmd, constants_file '$name': the outside file was opened"
    elif ! grep -q -x -F "$H/h.json" "$DIR/hostile.log"; then fail "$cmd, constants_file '$name': the log lacks the graph file"
    else pass "$cmd, constants_file '$name': the outside file never opened ($(cat "$DIR/err"))"; fi
  done
done

[ "$fails" = 0 ] && echo "all open checks passed" || { echo "$fails open checks failed"; exit 1; }
