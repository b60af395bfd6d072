#!/usr/bin/env bash
# Builds examples/embed as an external project, and runs it on a tangent graph and a program the
# CLI compiled.
#   embed_test.sh BUILD_DIR SOURCE_DIR JVPC find_package    # against `cmake --install` of BUILD_DIR
#   embed_test.sh BUILD_DIR SOURCE_DIR JVPC add_subdirectory # with jvpc's sources in the project
set -euo pipefail
BUILD=$1 SRC=$2 JVPC=$3 MODE=$4
WORK=$BUILD/embed-test-$MODE
rm -rf "$WORK" && mkdir -p "$WORK"
PY=$(cat "$BUILD/.jvpc-python" 2>/dev/null || command -v python3)
TORCH_PREFIX=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')
if [ "$MODE" = find_package ]; then
  cmake --install "$BUILD" --prefix "$WORK/install" >/dev/null
  ARGS=(-DCMAKE_PREFIX_PATH="$WORK/install;$TORCH_PREFIX")
else
  ARGS=(-DCMAKE_PREFIX_PATH="$TORCH_PREFIX" -DJVPC_SOURCE_DIR="$SRC")
fi
cmake -S "$SRC/examples/embed" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${ARGS[@]}" \
  >"$WORK/configure.log" 2>&1 || { cat "$WORK/configure.log"; exit 1; }
cmake --build "$WORK/build" >"$WORK/build.log" 2>&1 || { cat "$WORK/build.log"; exit 1; }
"$JVPC" linearize sdpa --device cpu -o "$WORK/tangent.json" >/dev/null
"$WORK/build/embed" "$WORK/tangent.json" 3 | tee "$WORK/out.txt"
grep -q "out0 : f32\[1,5,128,64\]" "$WORK/out.txt" || grep -q "dout0 : f32\[1,5,128,64\]" "$WORK/out.txt"
# A graph that uses the runtime's own operator (jvpc::attention_tangent, the O(L) attention
# tangent): its registration must survive the static link of an application that names only
# Executable and load.
"$JVPC" linearize sdpa --device cpu --backend flash --residual-budget 0 -o "$WORK/tangent-ol.json" >/dev/null
grep -q '"jvpc::attention_tangent"' "$WORK/tangent-ol.json"
"$WORK/build/embed" "$WORK/tangent-ol.json" 3 | tee "$WORK/out-ol.txt"
grep -q "out0 : f32\[1,5,128,64\]" "$WORK/out-ol.txt" || grep -q "dout0 : f32\[1,5,128,64\]" "$WORK/out-ol.txt"
# A compiled program: linearized at two new points, each checked against forward AD.
"$JVPC" compile sdpa --device cpu -o "$WORK/prog.json" >/dev/null
"$WORK/build/embed" --program "$WORK/prog.json" | tee "$WORK/out-prog.txt"
[ "$(grep -c "PASS" "$WORK/out-prog.txt")" = 2 ]
# The same program's graphs as AOTInductor packages, which the runtime loads and runs (written by
# jvpc's Python module: where this build has none, as the sanitizer build, this part is skipped).
if [ "$MODE" = find_package ] && ls "$BUILD"/python/jvpc/_C*.so >/dev/null 2>&1; then
  JVPC_PYTHON=$PY "$JVPC" compile sdpa --device cpu --aoti -o "$WORK/prog-aoti.json" | tee "$WORK/compile-aoti.txt"
  grep -q "check         AOTInductor packages .*: PASS" "$WORK/compile-aoti.txt"
  [ -f "$WORK/prog-aoti.primal.pt2" ] && [ -f "$WORK/prog-aoti.tangent.pt2" ]
  "$WORK/build/embed" --program "$WORK/prog-aoti.json" --aoti | tee "$WORK/out-aoti.txt"
  [ "$(grep -c "(AOTInductor)  PASS" "$WORK/out-aoti.txt")" = 2 ]
fi
# The embedding links the runtime, not the tracer or the passes.
! nm -C "$WORK/build/embed" | grep -q "jvpc::trace\|jvpc::fold\|jvpc::jvp("
echo "embed example built with $MODE and ran"
