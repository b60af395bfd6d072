#!/usr/bin/env bash
# The jvpc command line: every command's --help, the main flows, and bad input (one-line
# error, exit code 2). Usage: cli_test.sh path/to/jvpc [PART]: PART 1 (the flows), 2 (bad input,
# files and paths) or 3 (limits on memory and time) alone, as ctest runs them (cli_1 to cli_3);
# all three without it.
set -u
JVPC=$1
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
fails=0
pass() { printf 'ok   %s\n' "$1"; }
fail() { printf 'FAIL %s\n' "$1"; fails=$((fails + 1)); }

# expect CODE NAME -- command...: exit code, and for errors a single-line "jvpc: error:" message
expect() {
  local code=$1 name=$2; shift 3
  "$@" >"$DIR/out" 2>"$DIR/err"
  local got=$?
  if [ "$got" != "$code" ]; then fail "$name: exit $got, expected $code: $(head -c 300 "$DIR/err")"; return; fi
  if [ "$code" = 2 ]; then
    if [ "$(wc -l <"$DIR/err")" != 1 ] || ! grep -q '^jvpc: error: ' "$DIR/err"; then
      fail "$name: error is not one 'jvpc: error:' line: $(head -c 300 "$DIR/err")"; return
    fi
  fi
  pass "$name"
}
contains() { if grep -q -- "$2" "$DIR/$1"; then pass "  ...$1 has '$2'"; else fail "  ...$1 lacks '$2'"; fi; }

ONLY=${2:-}
want() { [ -z "$ONLY" ] || [ "$ONLY" = "$1" ]; }

# The files the parts share: a graph that maps a file (aten::from_file), zeroes it and adds the
# input, and (for parts 2 and 3, which part 1 would otherwise have made them for) the traced sdpa
# graph and its tangent graph.
printf '0123456789abcdef' >"$DIR/victim"
u8='"meta": {"sizes": [16], "strides": [1], "dtype": "Byte", "device": "cpu"}'
cat >"$DIR/from_file.json" <<EOF
{"format": "jvpc-graph", "schema_version": 1,
 "inputs": [{"name": "x", "id": 0, "role": "primal", "differentiable": false, $u8}],
 "nodes": [{"op": "aten::from_file", "args": [{"str": "$DIR/victim"}, {"bool": true}, {"int": 16}, {"scalar_type": "Byte"},
                                              {"none": null}, {"none": null}, {"none": null}], "outputs": [{"id": 1, $u8}]},
           {"op": "aten::mul.Scalar", "args": [{"tensor": 1}, {"int": 0}], "outputs": [{"id": 2, $u8}]},
           {"op": "aten::add.Tensor", "args": [{"tensor": 2}, {"tensor": 0}, {"int": 1}], "outputs": [{"id": 3, $u8}]}],
 "outputs": [{"name": "y", "id": 3}]}
EOF
if [ -n "$ONLY" ] && [ "$ONLY" != 1 ]; then
  "$JVPC" trace sdpa --device cpu -o "$DIR/sdpa.json" >/dev/null &&
    "$JVPC" linearize sdpa --device cpu -o "$DIR/tangent.json" >/dev/null || fail "the shared files"
fi

if want 1; then
expect 0 "jvpc --help" -- "$JVPC" --help; contains out "sdpa: at::scaled_dot_product_attention"
torch_re=${JVPC_TORCH_VERSION:-[0-9.]*}  # the release built against (ctest sets it)
expect 0 "jvpc --version" -- "$JVPC" --version; contains out "^jvpc [0-9.]* (LibTorch ${torch_re//./\\.}, graph schema 1, CUDA"
for cmd in trace show run cost linearize rules compile jvp opt; do expect 0 "jvpc $cmd --help" -- "$JVPC" "$cmd" --help; done
expect 0 "trace --help lists the examples' flags" -- "$JVPC" trace --help; contains out "--kv-heads"

expect 0 "trace sdpa" -- "$JVPC" trace sdpa --device cpu -o "$DIR/sdpa.json"
expect 0 "an example's flags before its name" -- "$JVPC" trace --device cpu --seq-len 16 sdpa; contains out "f32\[1,5,16,64\]"
expect 0 "... for linearize too" -- "$JVPC" linearize --bsz 2 mlp; contains out "PASS"
expect 0 "rules" -- "$JVPC" rules; contains out "^aten::bmm$"; contains out "ops with a JVP rule"
expect 0 "rules --json" -- "$JVPC" rules --json; contains out '"aten::_safe_softmax"'
expect 2 "rules with an argument" -- "$JVPC" rules sdpa
expect 0 "rules --loadable" -- "$JVPC" rules --loadable; contains out "^aten::_softmax_backward_data$"; contains out "ops graph files may use"

# A graph that maps a file (aten::from_file), zeroes it and adds the input: refused by name; as
# trusted it runs, and the runtime still never writes through the mapping.
expect 2 "a graph that reads a file" -- "$JVPC" run "$DIR/from_file.json"; contains err "aten::from_file is not on the list of ops graph files may use"
expect 2 "... and linearize of it" -- "$JVPC" linearize "$DIR/from_file.json"; contains err "aten::from_file is not on the list"
expect 0 "... run as --trusted" -- "$JVPC" run --trusted "$DIR/from_file.json"
if [ "$(cat "$DIR/victim")" = 0123456789abcdef ]; then pass "  ...the mapped file is unchanged"; else fail "  ...the mapped file was written"; fi
expect 0 "show text" -- "$JVPC" show "$DIR/sdpa.json"; contains out "aten::bmm"
expect 0 "show dot" -- "$JVPC" show "$DIR/sdpa.json" --format dot; contains out "digraph"
expect 0 "show json" -- "$JVPC" show "$DIR/sdpa.json" --format json; contains out '"schema_version": 1'
expect 0 "cost --json" -- "$JVPC" cost "$DIR/sdpa.json" --json; contains out '"matmul_flops": 20971520'
expect 0 "cost table" -- "$JVPC" cost "$DIR/sdpa.json" --nodes; contains out "aten::bmm×2"
expect 0 "run" -- "$JVPC" run "$DIR/sdpa.json" --seed 3; contains out "out0"
expect 0 "linearize sdpa with report and tangent graph" -- \
  "$JVPC" linearize sdpa --device cpu --report "$DIR/report.json" -o "$DIR/tangent.json"
contains out "PASS"; contains out "other_flops     transc"
python3 - "$DIR/report.json" <<'PY' && pass "report fields and numbers" || fail "report fields and numbers"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["forward"]["matmul_flops"] == 20971520
assert r["linearize"]["matmul_flops"] == 20971520
assert r["jvp"]["matmul_flops"] == 41943040 and r["jvp"]["ops"]["aten::bmm"] + r["jvp"]["ops"]["aten::baddbmm"] == 4
assert r["check"]["reference"] == "forward_ad" and r["check"]["passed"] is True
for p in r["passes"]:
    for k in ("name", "nodes", "matmul_flops", "other_flops", "bytes", "residual_bytes", "peak_bytes"):
        assert k in p, k
PY
expect 0 "run the tangent graph" -- "$JVPC" run "$DIR/tangent.json"
# The saved tangent graph holds the probabilities once (as [1,5,128,128] and [5,128,128]) plus a copy of v.
expect 0 "cost of the saved tangent graph" -- "$JVPC" cost "$DIR/tangent.json" --json
contains out '"residual_bytes": 819200'; contains out '"aliased_input_bytes": 0'
# Attention's tangent under a residual budget: 0 forces the O(L) form (5 bmms: 52,428,800 FLOPs
# at the seed's size), inf the P form (41,943,040); the report lists each attention's choice.
expect 0 "linearize --residual-budget 0" -- "$JVPC" linearize sdpa --device cpu --backend flash --residual-budget 0 \
  -o "$DIR/ol.json" --report "$DIR/ol-report.json"
contains out "52428800"; contains out "attention  O(L) form"; contains out "PASS"
python3 - "$DIR/ol-report.json" <<'PY' && pass "  ...--report has the attention list" || fail "  ...--report has the attention list"
import json, sys
a = json.load(open(sys.argv[1]))["attention"]
assert len(a) == 1 and a[0]["choice"] == "O(L)" and a[0]["matmul_flops"] == 52428800, a
assert a[0]["forms"]["P"]["matmul_flops"] == 41943040 and a[0]["residual_bytes"] > 0 and a[0]["reason"], a
PY
expect 0 "cost of the O(L) tangent graph" -- "$JVPC" cost "$DIR/ol.json"; contains out "O(L) form, scores \[1,5,128,128\]"
expect 0 "run the O(L) tangent graph" -- "$JVPC" run "$DIR/ol.json"
expect 0 "linearize --residual-budget inf" -- "$JVPC" linearize sdpa --device cpu --backend flash --residual-budget inf
contains out "41943040"; contains out "attention  P form"
expect 0 "linearize --residual-budget 64MiB" -- "$JVPC" linearize sdpa --device cpu --backend flash --residual-budget 64MiB
contains out "the tangent graph with the P form takes .* within the budget 64.00 MiB"
# The math path (the seed's configuration) is recognized by attention-match: the same O(L) form,
# with linearize's FLOPs still the forward's.
expect 0 "linearize --backend math --residual-budget 0" -- "$JVPC" linearize sdpa --device cpu --backend math \
  --residual-budget 0 -o "$DIR/ol-math.json"
contains out "attention  O(L) form"; contains out "jvpc::attention_tangent ×1"; contains out "PASS"
contains out "linearize  matmul FLOPs       20971520"; contains out "jvp call   matmul FLOPs       52428800"
expect 0 "run the math path's O(L) tangent graph" -- "$JVPC" run "$DIR/ol-math.json"
expect 0 "linearize --disable-pass attention-match" -- "$JVPC" linearize sdpa --device cpu --residual-budget 0 \
  --disable-pass attention-match
contains out "jvp call   matmul FLOPs       41943040"
expect 2 "a residual budget nothing meets" -- "$JVPC" linearize sdpa --device cpu --backend flash --residual-budget 1000
contains err "residual budget 1000 bytes is too small: the tangent graph needs at least"
# The check's reference: LibTorch's forward AD of the math path (O(L²) memory) where its
# predicted memory fits the memory limit, else central differences in float64 through the
# function's own fused kernels (O(L)); forced either way by --check-reference.
expect 0 "linearize: the check's reference" -- "$JVPC" linearize sdpa --device cpu --backend flash
contains out "^reference  LibTorch forward AD: it fits: about"; contains out "check      vs LibTorch forward AD"
expect 0 "linearize --check-reference central-differences" -- "$JVPC" linearize sdpa --device cpu --backend flash \
  --check-reference central-differences --report "$DIR/cd-report.json"
contains out "^reference  central differences in float64: --check-reference central-differences"
contains out "check      vs central differences in float64 through the example's own kernels: .*PASS"
python3 - "$DIR/cd-report.json" <<'PY' && pass "  ...--report names the reference" || fail "  ...--report names the reference"
import json, sys
c = json.load(open(sys.argv[1]))["check"]
assert c["reference"] == "central_differences" and c["reference_dtype"] == "float64" and c["passed"], c
assert c["forward_ad_bytes_estimate"] > 0 and c["memory_limit"] > 0 and c["tolerance"] == 1e-5, c
PY
# seq 512: forward AD of the math path would hold 5·512² scores several times over (about 36 MiB),
# over a 24 MiB limit that the O(L) tangent graph fits: the check takes central differences.
expect 0 "linearize: forward AD would not fit, central differences" -- "$JVPC" linearize sdpa --device cpu \
  --backend flash --seq-len 512 --residual-budget 0 --max-memory 24MiB --report "$DIR/cd-auto.json"
contains out "^reference  central differences in float64: forward AD of the math path would need about .*, over the memory limit 24.00MiB"
contains out "PASS"
python3 - "$DIR/cd-auto.json" <<'PY' && pass "  ...--report says why" || fail "  ...--report says why"
import json, sys
c = json.load(open(sys.argv[1]))["check"]
assert c["reference"] == "central_differences" and c["memory_limit"] == 24 << 20, c
assert c["forward_ad_bytes_estimate"] > c["memory_limit"] and "would need" in c["reference_reason"], c
PY
expect 0 "linearize --check-reference forward-ad" -- "$JVPC" linearize sdpa --device cpu --backend flash \
  --check-reference forward-ad; contains out "^reference  LibTorch forward AD: --check-reference forward-ad"
expect 2 "a bad --check-reference" -- "$JVPC" linearize sdpa --check-reference nearby
expect 2 "a residual budget that is not a size" -- "$JVPC" linearize sdpa --device cpu --residual-budget lots
contains err "--residual-budget: 'lots' is not a size"
# --tangents K: K random tangents in one batched call, its matmul FLOPs measured (4x one call's
# with the P form; the O(L) form recomputes its scores once for all K) and checked.
expect 0 "linearize --tangents 4" -- "$JVPC" linearize sdpa --device cpu --tangents 4 --report "$DIR/batched.json"
contains out "tangents   K=4 in one batched call: matmul FLOPs 167772160 (167.772M; measured, cost model 167.772M, 4.00x one call)"
contains out "unrolled (no batching rule): none"; contains out "vs 4 single calls: rel_error .*: PASS"
python3 - "$DIR/batched.json" <<'PY' && pass "  ...--report has the batched call" || fail "  ...--report has the batched call"
import json, sys
b = json.load(open(sys.argv[1]))["batched"]
assert b["tangents"] == 4 and b["matmul_flops"] == b["model_matmul_flops"] == 4 * b["single_call_matmul_flops"], b
assert b["passed"] and b["unrolled"] == [] and b["ms"] > 0, b
PY
expect 0 "linearize --tangents 4, O(L) form" -- "$JVPC" linearize sdpa --device cpu --backend flash --residual-budget 0 --tangents 4
contains out "matmul FLOPs 178257920"; contains out "3.40x one call"; contains out "single calls: .*PASS"
expect 0 "linearize --tangents 3, the block" -- "$JVPC" linearize block --device cpu --seq-len 16 --tangents 3; contains out "3.00x one call"
expect 2 "--tangents 0" -- "$JVPC" linearize sdpa --device cpu --tangents 0; contains err "tangents"
expect 0 "linearize a graph file" -- "$JVPC" linearize "$DIR/sdpa.json"; contains out "41943040"
contains out "primals from $DIR/sdpa.inputs.safetensors"
expect 0 "linearize a graph file, --inputs" -- "$JVPC" linearize "$DIR/sdpa.json" --inputs "$DIR/sdpa.inputs.safetensors"
expect 0 "linearize a graph file against central differences" -- "$JVPC" linearize "$DIR/sdpa.json" \
  --check-reference central-differences; contains out "through the graph's own kernels: .*PASS"
expect 2 "--inputs with an example" -- "$JVPC" linearize sdpa --inputs "$DIR/sdpa.inputs.safetensors"
expect 1 "non-finite values are counted, and fail" -- "$JVPC" linearize sdpa --device cpu --seq-len 16 --scale 1e37
contains out "non-finite values: "
expect 0 "linearize --wrt v --dump-after fold" -- "$JVPC" linearize sdpa --device cpu --seq-len 16 --wrt v --dump-after fold
contains out "IR after pass 'fold'"
expect 0 "--dump-after all --dump-format json: one JSON object per line" -- \
  "$JVPC" linearize sdpa --device cpu --seq-len 16 --dump-after all --dump-format json
if grep '^{' "$DIR/out" | python3 -c '
import json, sys
d = [json.loads(l) for l in sys.stdin]
assert d[0]["after"] == "trace" and d[0]["position"] == 0, d[0]["after"]
assert [x["position"] for x in d] == list(range(len(d))) and len(d) == 19, len(d)
assert [x["after"] for x in d].count("dce") == 2 and all("nodes" in x["graph"] for x in d)'; then
  pass "  ...19 dumps, trace first, positions in order"; else fail "  ...the JSON dumps"; fi
expect 1 "a failed check exits 1" -- "$JVPC" linearize sdpa --device cpu --seq-len 16 --tolerance 0; contains out "FAIL"
contains err "^jvpc: check failed: rel_error .* against LibTorch forward AD is over the tolerance 0.0e+00$"
expect 1 "a failed check of a program exits 1" -- "$JVPC" compile sdpa --device cpu --seq-len 16 --tolerance 0
contains err "^jvpc: check failed: at a new point: rel_error .* is over the tolerance 0.0e+00$"
expect 1 "a failed batched check exits 1" -- "$JVPC" linearize sdpa --device cpu --seq-len 16 --tangents 3 --tolerance 0
contains err "^jvpc: check failed: 3 tangents in one batched call: rel_error .* against single calls, tolerance 0.0e+00, FLOPs equal to the cost model's$"
expect 0 "linearize mlp" -- "$JVPC" linearize mlp --device cpu --seq-len 16
expect 0 "linearize block" -- "$JVPC" linearize block --device cpu --seq-len 16 --causal
expect 0 "linearize block in float16" -- "$JVPC" linearize block --device cpu --seq-len 16 --dtype float16
contains out "math backend, in float32"  # half-precision examples are checked against a float32 reference

fi

if want 2; then
# Bad input: one line, exit 2.
printf '{"schema_version": 1, "nodes": [' >"$DIR/truncated.json"
printf '{"schema_version": 7, "inputs": [], "nodes": [], "outputs": []}' >"$DIR/version.json"
sed 's/aten::bmm/aten::bmmm/' "$DIR/sdpa.json" >"$DIR/unknown_op.json"
expect 2 "missing file" -- "$JVPC" run "$DIR/nope.json"
expect 2 "truncated JSON" -- "$JVPC" show "$DIR/truncated.json"
printf '{"schema_version": 1, "x": 0.3E535533905932738}' >"$DIR/overflow.json"
expect 2 "a number past double's range" -- "$JVPC" show "$DIR/overflow.json"; contains err "number overflow"
expect 2 "wrong schema version" -- "$JVPC" cost "$DIR/version.json"
expect 2 "unknown op" -- "$JVPC" run "$DIR/unknown_op.json"
expect 2 "unknown example" -- "$JVPC" linearize attention
expect 2 "bad example flag" -- "$JVPC" trace sdpa --bsz 0; contains err "must be a whole number from 1 up, not '0'"
expect 2 "non-finite --scale" -- "$JVPC" trace sdpa --scale nan
expect 2 "negative --seed" -- "$JVPC" run "$DIR/sdpa.json" --seed -1
expect 2 "--tolerance inf" -- "$JVPC" linearize sdpa --device cpu --tolerance inf
# linearize and compile share one declaration of the target, --device and --tolerance.
for cmd in linearize compile; do
  expect 2 "$cmd: negative --tolerance" -- "$JVPC" $cmd sdpa --tolerance -1; contains err "^jvpc: error: --tolerance: must be 0 or more, not '-1'"
  expect 2 "$cmd: unknown --device" -- "$JVPC" $cmd sdpa --device tpu; contains err "^jvpc: error: --device: tpu not in {cpu,cuda}"
  expect 2 "$cmd: no target" -- "$JVPC" $cmd --device cpu; contains err "target is required"
  expect 0 "$cmd --help" -- "$JVPC" $cmd --help
  contains out "an example (sdpa, mlp, block) or a graph .json from \`jvpc trace\`"
  contains out "largest rel_error that passes (default by dtype: float64 1e-10, float32 1e-5, float16/bfloat16 2e-2)"
  contains out "cpu or cuda: where a graph file runs, or the example's --device"
done
expect 0 "--disable-pass shows what a pass does" -- "$JVPC" linearize sdpa --device cpu --disable-pass scale-to-residual
contains out "41943040  (41.943M; 14 nodes"
expect 2 "--disable-pass of a pass linearize needs" -- "$JVPC" linearize sdpa --device cpu --disable-pass fold
contains err "pass 'fold' cannot be disabled"
expect 2 "unknown pass for --dump-after" -- "$JVPC" linearize sdpa --device cpu --dump-after nopass; contains err "no pass is named 'nopass'"
expect 2 "--wrt naming nothing" -- "$JVPC" linearize sdpa --device cpu --wrt ,
expect 2 "empty -o" -- "$JVPC" trace sdpa -o ''
expect 2 "--disable-pass of no pass" -- "$JVPC" linearize sdpa --device cpu --disable-pass nope
contains err "no optional pass is named 'nope'"
expect 2 "-o into a missing directory fails before the work" -- "$JVPC" linearize sdpa --device cpu -o "$DIR/no/t.json"
contains err "no directory"
if [ -s "$DIR/out" ]; then fail "  ...printed a summary before failing"; else pass "  ...nothing printed"; fi
expect 2 "a CUDA-only SDPA kernel on the CPU" -- "$JVPC" trace sdpa --device cpu --backend efficient
contains err "that SDPA kernel runs on CUDA only"
expect 0 "a --scale that underflows to a denormal is a number" -- "$JVPC" trace sdpa --device cpu --seq-len 8 --scale 1e-320
expect 2 "an option before the command" -- "$JVPC" --bogus
expect 2 "a directory as the graph" -- "$JVPC" show "$DIR"; contains err "is a directory"
JVPC_MAX_INPUT_BYTES=1e9 expect 2 "a malformed JVPC_MAX_INPUT_BYTES" -- "$JVPC" run "$DIR/sdpa.json"
expect 2 "unknown command" -- "$JVPC" frobnicate; contains err "unknown command 'frobnicate'"
expect 2 "incompatible sizes" -- "$JVPC" trace sdpa --device cpu --model-dim 100 --head-dim 64
expect 2 "unknown wrt" -- "$JVPC" linearize sdpa --device cpu --wrt mask
# The pipeline, listed; jvpc opt runs its passes on the text form (the pass tests: tests/ir/*.ir).
expect 0 "linearize --list-passes" -- "$JVPC" linearize --list-passes; contains out "^14  fold  "
expect 2 "--list-passes with a target" -- "$JVPC" linearize sdpa --list-passes; contains err "takes no target"
"$JVPC" trace sdpa --device cpu --seq-len 8 >"$DIR/sdpa8.ir"
expect 0 "opt on a traced graph's text" -- "$JVPC" opt --passes=jvp,drop-primal-outputs,dce,attention-form,fold,15 "$DIR/sdpa8.ir"
contains out "^// fold: changed"; contains out "dq \[tangent, tangent_of q\]"
expect 0 "opt reads stdin" -- sh -c "'$JVPC' opt --passes=cse - <'$DIR/sdpa8.ir'"; contains out "^// cse: no change"
expect 2 "opt: stdin past its limit" -- sh -c "head -c 70000000 /dev/zero | '$JVPC' opt --passes=cse -"; contains err "more than 67108864 bytes"
expect 2 "opt: an empty pass name" -- "$JVPC" opt --passes=cse, "$DIR/sdpa8.ir"; contains err "an empty name"
expect 2 "opt: an unknown pass" -- "$JVPC" opt --passes=cse,nope "$DIR/sdpa8.ir"; contains err "no pass is named 'nope' (passes: jvp,"
expect 2 "opt: a row past the table" -- "$JVPC" opt --passes=19 "$DIR/sdpa8.ir"; contains err "or a row number 1 to 18"
printf 'graph(%%0 : f32[4] x):\n  %%1 : f32[5] = aten::exp(%%0)\n  return (%%1 out0)\n' >"$DIR/bad.ir"
expect 2 "opt: a graph that does not verify" -- "$JVPC" opt --passes=cse "$DIR/bad.ir"; contains err "f32\[5\]"
printf 'graph(%%0 : f32[4] x):\n  %%1 : f32[4] = aten::nope(%%0)\n  return (%%1 out0)\n' >"$DIR/bad.ir"
expect 2 "opt: an unknown op, by line and column" -- "$JVPC" opt --passes=cse "$DIR/bad.ir"; contains err "line 2, column 17: unknown op 'aten::nope'"
python3 - "$DIR/sin.json" <<'PY'
import json, sys
m = {"device": "cpu", "dtype": "Float", "sizes": [3], "strides": [1]}
json.dump({"format": "jvpc-graph", "schema_version": 1,
           "inputs": [{"id": 0, "name": "x", "role": "primal", "differentiable": True, "meta": m}],
           "nodes": [{"op": "aten::sin", "args": [{"tensor": 0}], "outputs": [{"id": 1, "meta": m}]}],
           "outputs": [{"id": 1, "name": "y"}]}, open(sys.argv[1], "w"))
PY
expect 0 "linearize a graph without matmuls" -- "$JVPC" linearize "$DIR/sin.json"; contains out "1 nodes: no matmuls"
expect 2 "a name twice in --wrt" -- "$JVPC" linearize sdpa --device cpu --wrt q,q; contains err "names 'q' twice"
expect 2 "an empty name in --wrt" -- "$JVPC" linearize sdpa --device cpu --wrt q,; contains err "an empty name"
# Graph files with fused attention (no forward AD in LibTorch) are checked with attention on the
# math path, half precision in float32, at the traced example's values.
for cfg in "sdpa --backend flash --dtype float64" "block --backend flash" "block --dtype float16"; do
  "$JVPC" trace $cfg --device cpu --seq-len 8 --model-dim 16 --head-dim 8 -o "$DIR/fused.json" >/dev/null
  expect 0 "linearize a traced graph: $cfg" -- "$JVPC" linearize "$DIR/fused.json"
  contains out "vs LibTorch forward AD of the graph (attention on the math path"
done
expect 2 "inputs file missing tensors" -- "$JVPC" run "$DIR/sdpa.json" --inputs "$DIR/tangent.safetensors"
if python3 -c 'import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  expect 0 "run on cuda" -- "$JVPC" run "$DIR/sdpa.json" --device cuda
  expect 0 "linearize an example on cuda" -- "$JVPC" linearize sdpa --device cuda --seq-len 16; contains out " cuda backend"
else
  expect 2 "cuda without a GPU" -- "$JVPC" run "$DIR/sdpa.json" --device cuda
  expect 2 "an example on cuda without a GPU" -- "$JVPC" linearize sdpa --device cuda; contains err "CUDA is not available"
fi
JVPC_MAX_INPUT_BYTES=1000 expect 2 "inputs over the size limit" -- "$JVPC" run "$DIR/sdpa.json"

# Files and paths. A FIFO is refused at once (a plain std::ifstream would wait for a writer forever).
F=$DIR/files; mkdir "$F"
mkfifo "$F/fifo.json"
expect 2 "a FIFO as the graph (show)" -- timeout 20 "$JVPC" show "$F/fifo.json"; contains err "is not a regular file (a FIFO)"
expect 2 "a FIFO as the graph (run)" -- timeout 20 "$JVPC" run "$F/fifo.json"
expect 2 "a FIFO as the inputs file" -- timeout 20 "$JVPC" run "$DIR/sdpa.json" --inputs "$F/fifo.json"
set_constants_file() {  # FILE NAME: the tangent graph with "constants_file": NAME
  python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); j["constants_file"] = sys.argv[3]; json.dump(j, open(sys.argv[2], "w"))' \
    "$DIR/tangent.json" "$1" "$2"
}
set_constants_file "$F/t.json" t.safetensors; mkfifo "$F/t.safetensors"
expect 2 "a FIFO as the constants file" -- timeout 20 "$JVPC" run "$F/t.json"; contains err "constants file '$F/t.safetensors' is not a regular file (a FIFO)"
rm "$F/t.safetensors"
set_constants_file "$F/abs.json" /etc/passwd
expect 2 "an absolute constants_file" -- "$JVPC" show "$F/abs.json"; contains err "must be a plain file name in the folder of"
if grep -q root "$DIR/err"; then fail "  ...the error shows the file's contents"; else pass "  ...no contents in the error"; fi
set_constants_file "$F/up.json" ../../../../../../etc/passwd
expect 2 "a constants_file with '..'" -- "$JVPC" run "$F/up.json"; contains err "must be a plain file name"
ln -s "$DIR/tangent.safetensors" "$F/out.safetensors"; set_constants_file "$F/link.json" out.safetensors
expect 2 "a constants_file symlink out of the folder" -- "$JVPC" run "$F/link.json"; contains err "is a symlink that leads out of the folder"
# Destinations: a directory or a FIFO is refused before the work; a symlink is replaced.
mkdir "$F/dir.json"
expect 2 "-o a directory" -- "$JVPC" linearize sdpa --device cpu -o "$F/dir.json"; contains err "it is a directory, not a regular file"
if [ -s "$DIR/out" ]; then fail "  ...printed a summary before failing"; else pass "  ...nothing printed"; fi
expect 2 "--report a FIFO" -- timeout 20 "$JVPC" linearize sdpa --device cpu --report "$F/fifo.json"; contains err "it is a FIFO"
mkdir "$F/x.inputs.safetensors"
expect 2 "trace -o whose inputs file would be a directory" -- "$JVPC" trace sdpa --device cpu -o "$F/x.json"
contains err "cannot write '$F/x.inputs.safetensors': it is a directory"
if [ -e "$F/x.json" ]; then fail "  ...wrote the graph before failing"; else pass "  ...wrote nothing"; fi
echo "the target's bytes" >"$F/target.json"; ln -s target.json "$F/sym.json"
expect 0 "-o a symlink to a file" -- "$JVPC" trace sdpa --device cpu --seq-len 8 -o "$F/sym.json"
if [ ! -L "$F/sym.json" ] && [ "$(cat "$F/target.json")" = "the target's bytes" ]; then pass "  ...the symlink is replaced, its target untouched"
else fail "  ...wrote through the symlink"; fi
# A failed write (a file-size limit, as a full disk): exit 2 with the reason, the previous files
# byte for byte, no temporary file left. `ulimit -f` counts 1024-byte blocks in bash.
mkdir "$F/lim"
"$JVPC" trace sdpa --device cpu --seq-len 8 -o "$F/lim/s.json" >/dev/null
"$JVPC" linearize sdpa --device cpu --seq-len 8 -o "$F/lim/t.json" --report "$F/lim/r.json" >/dev/null
cp -r "$F/lim" "$F/lim.before"
expect 2 "trace -o past a file-size limit" -- bash -c 'ulimit -f 16; exec "$@"' - "$JVPC" trace sdpa --device cpu --seq-len 64 -o "$F/lim/s.json"
contains err "cannot write '$F/lim/s.inputs.safetensors': File too large"
expect 2 "linearize -o past a file-size limit" -- bash -c 'ulimit -f 16; exec "$@"' - "$JVPC" linearize sdpa --device cpu --seq-len 64 -o "$F/lim/t.json"
contains err "cannot write '$F/lim/t.safetensors': File too large"
expect 2 "--report past a file-size limit" -- bash -c 'ulimit -f 1; exec "$@"' - "$JVPC" linearize sdpa --device cpu --seq-len 8 --report "$F/lim/r.json"
contains err "cannot write '$F/lim/r.json': File too large"
if diff -r "$F/lim.before" "$F/lim" >/dev/null; then pass "  ...the previous files intact, no temporary file left"
else fail "  ...the folder changed: $(diff -r "$F/lim.before" "$F/lim" | head -3 | tr '\n' ' ')"; fi
# Control characters in a file name reach the terminal escaped, on one line.
expect 2 "control characters in a file name" -- "$JVPC" show "$F/a"$'\e[31m\n'"b.json"; contains err 'a\\x1b\[31m\\x0ab.json'
expect 2 "control characters in -o" -- "$JVPC" trace sdpa -o "$F/no"$'\e'"/x.json"; contains err 'no\\x1b'

fi

if want 3; then
# Limits on memory and time: graph files of a few hundred bytes that ask for terabytes, or for
# hours of work, are refused before anything is allocated or run.
python3 - "$DIR" <<'PY'
import json, sys
d = sys.argv[1]
def meta(sizes, dtype="Float", strides=None):
    st, acc = [], 1
    for s in reversed(sizes):
        st.insert(0, acc); acc *= s
    return {"device": "cpu", "dtype": dtype, "sizes": sizes, "strides": st if strides is None else strides}
def graph(inputs, nodes, out):
    return {"format": "jvpc-graph", "schema_version": 1, "inputs": inputs, "nodes": nodes, "outputs": [{"id": out, "name": "y"}]}
x = lambda m: {"id": 0, "name": "x", "role": "primal", "differentiable": True, "meta": m}
N = 2 ** 20  # aten::zeros of [2^20, 2^20] floats: 4 TiB
json.dump(graph([], [{"op": "aten::zeros", "args": [{"ints": [N, N]}, {"scalar_type": "Float"}, {"none": None}, {"device": "cpu"}, {"none": None}],
                      "outputs": [{"id": 0, "meta": meta([N, N])}]}], 0), open(d + "/zeros.json", "w"))
# sum(expand(x, [2^40])): 8 bytes of memory, 2^40 additions
json.dump(graph([x(meta([1]))], [
    {"op": "aten::expand", "args": [{"tensor": 0}, {"ints": [2 ** 40]}, {"bool": False}], "outputs": [{"id": 1, "meta": meta([2 ** 40], strides=[0])}]},
    {"op": "aten::sum", "args": [{"tensor": 1}, {"none": None}], "outputs": [{"id": 2, "meta": meta([])}]}], 2), open(d + "/sum_expand.json", "w"))
# an input of 4 TiB
json.dump(graph([x(meta([N, N]))], [{"op": "aten::sin", "args": [{"tensor": 0}], "outputs": [{"id": 1, "meta": meta([N, N])}]}], 1),
          open(d + "/big_input.json", "w"))
# a float16 input of 200 MB, summed
json.dump(graph([x(meta([100000000], "Half"))], [{"op": "aten::sum", "args": [{"tensor": 0}, {"none": None}], "outputs": [{"id": 1, "meta": meta([], "Half")}]}], 1),
          open(d + "/f16.json", "w"))
# LibTorch's temporaries: mvlgamma(expand(x + 100, [n]), 64) builds a [n, 64] temporary;
# mse_loss(expand(x, [n]), expand(t, [n])) terms as large as the expand.
def expanded(src, n, i):
    return {"op": "aten::expand", "args": [{"tensor": src}, {"ints": [n]}, {"bool": False}], "outputs": [{"id": i, "meta": meta([n], strides=[0])}]}
for n in (16, 2 ** 16, 2 ** 20):
    json.dump(graph([x(meta([1]))], [
        {"op": "aten::add.Scalar", "args": [{"tensor": 0}, {"int": 100}, {"int": 1}], "outputs": [{"id": 1, "meta": meta([1])}]},
        expanded(1, n, 2),
        {"op": "aten::mvlgamma", "args": [{"tensor": 2}, {"int": 64}], "outputs": [{"id": 3, "meta": meta([n])}]}], 3),
        open(d + "/mvlgamma%d.json" % n, "w"))
for n in (2 ** 21, 2 ** 28):
    t = {"id": 1, "name": "t", "role": "primal", "differentiable": True, "meta": meta([1])}
    json.dump(graph([x(meta([1])), t], [expanded(0, n, 2), expanded(1, n, 3),
        {"op": "aten::mse_loss", "args": [{"tensor": 2}, {"tensor": 3}, {"int": 1}], "outputs": [{"id": 4, "meta": meta([])}]}], 4),
        open(d + "/mse%d.json" % n, "w"))
PY
# peak_rss FILE command...: runs the command, writes its peak resident set in KiB to FILE, and
# exits as it did.
peak_rss() { python3 -c 'import resource, subprocess, sys
code = subprocess.call(sys.argv[2:])
open(sys.argv[1], "w").write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
sys.exit(code if code >= 0 else 128 - code)' "$@"; }
# rss_within NAME FILE MIB: the peak in FILE is at most MIB above the small run's ($DIR/rss0).
rss_within() {
  local d=$(( ($(cat "$2") - $(cat "$DIR/rss0")) / 1024 ))
  if [ "$d" -le "$3" ]; then pass "  ...$1: resident set $d MiB above a small run's"; else fail "  ...$1: resident set $d MiB above a small run's, more than $3"; fi
}
for cmd in show cost run; do
  expect 2 "$cmd of a 4 TiB graph file is refused" -- "$JVPC" $cmd "$DIR/zeros.json"
  contains err "graph needs 4.00 TiB (4398046511104 bytes) at its peak (constants 0 bytes, inputs 0 bytes, intermediates 4.00 TiB) but the memory limit on cpu is "
  contains err "3/4 of its memory by default (LoadOptions::max_memory, --max-memory)"
done
if [ "$(wc -c <"$DIR/zeros.json")" -lt 1024 ]; then pass "  ...from a file under 1 KB"; else fail "  ...the file is 1 KB or more"; fi
expect 2 "linearize of a 4 TiB graph file is refused" -- "$JVPC" linearize "$DIR/big_input.json"
contains err "graph needs 8.00 TiB (8796093022208 bytes) at its peak (constants 0 bytes, inputs 4.00 TiB, intermediates 4.00 TiB)"
expect 2 "--max-memory sets the limit" -- "$JVPC" run "$DIR/zeros.json" --max-memory 1.5G
contains err "but the memory limit on cpu is 1.50 GiB (1610612736 bytes) (LoadOptions::max_memory, --max-memory)"
expect 0 "cost --max-memory inf costs it" -- "$JVPC" cost "$DIR/zeros.json" --max-memory inf --json
contains out '"peak_bytes": 4398046511104'
expect 2 "run --max-memory 1TiB" -- "$JVPC" run "$DIR/zeros.json" --max-memory 1TiB; contains err "1.00 TiB (1099511627776 bytes)"
expect 2 "--max-memory below a small graph's need" -- "$JVPC" run "$DIR/sdpa.json" --max-memory 1KiB; contains err "but the memory limit on cpu is 1.00 KiB (1024 bytes)"
expect 0 "--max-memory above it" -- "$JVPC" run "$DIR/sdpa.json" --max-memory 64MiB
expect 2 "linearize of an example: the tangent graph's runtime checks --max-memory" -- "$JVPC" linearize sdpa --device cpu --max-memory 100KiB
contains err "(ExecutableOptions::max_memory, --max-memory)"
for bad in 12XB -1 1e9 '' 1..5G; do
  expect 2 "--max-memory '$bad' is refused" -- "$JVPC" run "$DIR/sdpa.json" --max-memory "$bad"; contains err "is not a size"
done
expect 2 "--max-memory past 2^63" -- "$JVPC" show "$DIR/sdpa.json" --max-memory 9000000PiB; contains err "more than 2^63 bytes"
expect 0 "cost of sum(expand(x, [2^40])): 2^40 FLOPs" -- "$JVPC" cost "$DIR/sum_expand.json" --json; contains out '"other_flops": 1099511627776'
expect 2 "run refuses it over --max-flops" -- "$JVPC" run "$DIR/sum_expand.json" --max-flops 1e12
contains err "graph needs 1099511627776 FLOPs by the cost model (1.1e+12: matmul 0, other 1099511627776), more than --max-flops 1e12 allows"
expect 2 "linearize refuses it over --max-flops" -- "$JVPC" linearize "$DIR/sum_expand.json" --max-flops 1000000; contains err "more than --max-flops 1000000 allows"
# avg_pool2d of a 1024x1024 input with a 512 window: 513² outputs of 512² additions each (it ran
# 60 s under --max-flops 2e6 when one FLOP per output was counted).
f32m() { printf '"meta": {"sizes": [%s], "strides": [%s], "dtype": "Float", "device": "cpu"}' "$1" "$2"; }
cat >"$DIR/pool.json" <<EOF
{"format": "jvpc-graph", "schema_version": 1,
 "inputs": [{"name": "x", "id": 0, "role": "primal", $(f32m 1,1,1024,1024 1048576,1048576,1024,1)}],
 "nodes": [{"op": "aten::avg_pool2d", "args": [{"tensor": 0}, {"ints": [512, 512]}, {"ints": [1, 1]}, {"ints": [0, 0]},
            {"bool": false}, {"bool": true}, {"none": null}], "outputs": [{"id": 1, $(f32m 1,1,513,513 263169,263169,513,1)}]}],
 "outputs": [{"name": "y", "id": 1}]}
EOF
expect 2 "avg_pool2d with a large window is refused by --max-flops, within 20 s" -- timeout 20 "$JVPC" run "$DIR/pool.json" --max-flops 2e6
contains err "graph needs 68988174336 FLOPs by the cost model"
# Kernels' temporaries count against --max-memory: mvlgamma over an expand of 2^20 (its [n, 64]
# temporary: 1 to 2 GB resident under --max-memory 64MiB) and mse_loss over one of 2^28 (up to
# 4.5 GB) are refused; of 2^16 and 2^21 they run; the resident set stays within the limit.
expect 0 "a small run" -- peak_rss "$DIR/rss0" "$JVPC" run "$DIR/mvlgamma16.json" --max-memory 64MiB
expect 2 "mvlgamma's temporary counts against --max-memory" -- peak_rss "$DIR/rss" "$JVPC" run "$DIR/mvlgamma1048576.json" --max-memory 64MiB
contains err "(constants 0 bytes, inputs 4 bytes, intermediates 520.00 MiB) but the memory limit on cpu is 64.00 MiB"; rss_within "refused" "$DIR/rss" 16
expect 0 "mvlgamma within --max-memory runs" -- peak_rss "$DIR/rss" "$JVPC" run "$DIR/mvlgamma65536.json" --max-memory 64MiB
rss_within "mvlgamma ran" "$DIR/rss" 64
expect 2 "mse_loss's terms count against --max-memory" -- peak_rss "$DIR/rss" "$JVPC" run "$DIR/mse268435456.json" --max-memory 64MiB
contains err "but the memory limit on cpu is 64.00 MiB"; rss_within "refused" "$DIR/rss" 16
expect 0 "mse_loss within --max-memory runs" -- peak_rss "$DIR/rss" "$JVPC" run "$DIR/mse2097152.json" --max-memory 64MiB
rss_within "mse_loss ran" "$DIR/rss" 64
# Parsing takes at most 16 bytes of memory per byte of the file, and the file itself: 50 MB and
# 150 MB of empty objects (96 bytes per 3) took 2 GB and aborted; they are refused halfway, with
# a resident set at most 18 times the file's size (out of memory while parsing:
# Parse.RunningOutOfMemoryIsAnError).
for mb in 50 150; do
  python3 -c 'import sys; n = int(sys.argv[1]) * 1000000 // 3; sys.stdout.write("[" + "{},"*n + "{}]")' "$mb" >"$DIR/objects.json"
  expect 2 "$mb MB of empty objects are refused" -- peak_rss "$DIR/rss" "$JVPC" show "$DIR/objects.json"
  contains err "bytes of memory (16 per byte of text, and 1 MiB)"; rss_within "$mb MB of JSON" "$DIR/rss" $((18 * mb * 1000000 / 1048576))
done
rm -f "$DIR/objects.json"
for bad in abc -1 1e400 nan ''; do
  expect 2 "--max-flops '$bad' is refused" -- "$JVPC" run "$DIR/sdpa.json" --max-flops "$bad"; contains err "is not a number of FLOPs"
done
# Under the default 1e15 it runs (for hours): the count is printed on one line before it starts.
timeout 3 "$JVPC" run "$DIR/sum_expand.json" >"$DIR/out" 2>"$DIR/err"
if [ $? = 124 ] && [ "$(wc -l <"$DIR/err")" = 1 ]; then pass "run above 1e12 FLOPs says so and starts"; else fail "run above 1e12 FLOPs: $(head -c 300 "$DIR/err")"; fi
contains err "^jvpc: graph costs 1099511627776 FLOPs by the cost model (1.1e+12: matmul 0, other 1099511627776); running it$"
expect 0 "run below 1e12 FLOPs prints no count" -- "$JVPC" run "$DIR/sdpa.json"
if [ -s "$DIR/err" ]; then fail "  ...printed to stderr: $(head -c 200 "$DIR/err")"; else pass "  ...stderr is empty"; fi
for cmd in show cost run linearize; do
  expect 0 "$cmd --help names --max-memory" -- "$JVPC" $cmd --help; contains out "--max-memory SIZE"
done
for cmd in run linearize; do
  expect 0 "$cmd --help names --max-flops" -- "$JVPC" $cmd --help; contains out "--max-flops N"
done
# The input limit counts what is allocated: a float16 input of 200 MB is drawn as float16, not
# as float64 first (which took 1 GB more).
python3 - "$JVPC" "$DIR" <<'PY' && pass "random float16 inputs take their own size" || fail "random float16 inputs take their own size"
import resource, subprocess, sys
jvpc, d = sys.argv[1:]
def peak(graph):  # the largest RSS of any child so far, in bytes
    subprocess.run([jvpc, "run", graph], check=True, stdout=subprocess.DEVNULL)
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
base = peak(d + "/sdpa.json")
big = peak(d + "/f16.json")
assert big - base < 500e6, (base, big)
PY
JVPC_MAX_INPUT_BYTES=199999999 expect 2 "the input limit counts float16 bytes" -- "$JVPC" run "$DIR/f16.json"
contains err "would take the inputs past 199999999 bytes (JVPC_MAX_INPUT_BYTES)"
JVPC_MAX_INPUT_BYTES=200000000 expect 0 "  ...and admits exactly them" -- "$JVPC" run "$DIR/f16.json"

# Compiled programs (jvpc compile, jvpc jvp): checked at a new point, written, run at given
# primals and tangents; the primal graph's matmul FLOPs are what linearize at a new point runs.
for cmd in compile jvp; do expect 0 "jvpc $cmd --help" -- "$JVPC" "$cmd" --help; done
expect 0 "compile sdpa" -- "$JVPC" compile sdpa --device cpu -o "$DIR/prog.json"
contains out "check         at a new point vs LibTorch forward AD"; contains out "PASS"
contains out "linearize matmul FLOPs       20971520"; contains out "       20971520  (20.972M; measured"
contains out "jvp call matmul FLOPs        41943040"; contains out "program -> "
contains out "^peak          .* allocated at once by linearize at a new point (measured); the forward's own peak "
if [ ! -e "$DIR/prog.safetensors" ]; then pass "  ...sdpa captures no tensor: no constants file"; else fail "  ...prog.safetensors written"; fi
# The block's primal graph holds gelu's derivative (gelu_backward), which linearize's fold
# evaluates away but a program's primal graph runs: it is on the list of ops graph files may
# use, so the program saves and loads untrusted.
expect 0 "compile block -o" -- "$JVPC" compile block --seq-len 8 --device cpu -o "$DIR/block-prog.json"
contains out "PASS"
expect 0 "  ...it runs untrusted" -- "$JVPC" jvp "$DIR/block-prog.json"; contains out "dout0 *f32\[1,8,320\]"
expect 0 "compile a traced graph" -- "$JVPC" compile "$DIR/sdpa.json"; contains out "PASS"
expect 0 "jvp of a program" -- "$JVPC" jvp "$DIR/prog.json" -o "$DIR/jvp-out.safetensors"
contains out "^out0 *f32\[1,5,128,64\]"; contains out "linearize matmul FLOPs       20971520  (20.972M; measured"
contains out "jvp matmul FLOPs             41943040"
python3 - "$JVPC" "$DIR" <<'PY' && pass "jvp at given primals and tangents matches forward AD" || fail "jvp at given primals and tangents matches forward AD"
import json, struct, subprocess, sys
import torch
from torch.func import jvp
jvpc, d = sys.argv[1:]
def save(path, tensors):  # safetensors, by hand: jvpc's reader needs nothing else
    header, blobs, off = {}, [], 0
    for k, t in tensors.items():
        b = t.contiguous().numpy().tobytes()
        header[k] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b); off += len(b)
    h = json.dumps(header).encode()
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
def load(path):
    raw = open(path, "rb").read(); n = struct.unpack("<Q", raw[:8])[0]; header = json.loads(raw[8:8 + n])
    return {k: torch.frombuffer(bytearray(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]), dtype=torch.float32).view(v["shape"])
            for k, v in header.items() if k != "__metadata__"}
torch.manual_seed(3)
x = {k: torch.randn(1, 5, 128, 64) for k in "qkv"}
t = {"d" + k: torch.randn(1, 5, 128, 64) for k in "qkv"}
save(d + "/x.safetensors", x); save(d + "/t.safetensors", t)
subprocess.run([jvpc, "jvp", d + "/prog.json", "--primals", d + "/x.safetensors", "--tangents", d + "/t.safetensors",
                "-o", d + "/y.safetensors"], check=True, stdout=subprocess.DEVNULL)
y = load(d + "/y.safetensors")
with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
    out, dout = jvp(torch.nn.functional.scaled_dot_product_attention, (x["q"], x["k"], x["v"]), (t["dq"], t["dk"], t["dv"]))
assert torch.allclose(y["out0"], out, atol=1e-5), (y["out0"] - out).abs().max()
tangent = [v for k, v in y.items() if k != "out0"][0]
assert torch.allclose(tangent, dout, atol=1e-4), (tangent - dout).abs().max()
PY
"$JVPC" trace sdpa --device cpu --seq-len 64 -o "$DIR/sdpa64.json" >/dev/null
expect 2 "jvp with primals of another shape" -- "$JVPC" jvp "$DIR/prog.json" --primals "$DIR/sdpa64.inputs.safetensors"
contains err "primal 'q': expected shape \[1,5,128,64\] but got \[1,5,64,64\]"
expect 2 "jvp of a graph file" -- "$JVPC" jvp "$DIR/sdpa.json"; contains err "format is not \"jvpc-program\""
expect 2 "a program given to run" -- "$JVPC" run "$DIR/prog.json"; contains err "is a compiled program, not a graph"
expect 2 "compile of a graph that reads a file" -- "$JVPC" compile "$DIR/from_file.json"; contains err "aten::from_file is not on the list"

fi

[ "$fails" = 0 ] && echo "all CLI checks passed" || { echo "$fails CLI checks failed"; exit 1; }
