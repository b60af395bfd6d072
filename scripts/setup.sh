#!/usr/bin/env bash
# Installs what jvpc needs and is missing, then configures and builds it into build/.
# Idempotent: quick when everything is already there. Used by quickstart.sh, test.sh and CI.
#
#   Debian packages: cmake, ninja, g++, ccache, nlohmann-json3-dev, libgtest-dev, libcli11-dev
#   Python:          torch==2.15.0 (LibTorch comes from this wheel), numpy; for the Python module
#                    and its tests: CPython's headers (python3-dev where that Python lacks them),
#                    pytest, tabulate (FlopCounterMode's table), expecttest (PyTorch's OpInfo),
#                    safetensors (the tests that move files between Python and the CLI), timm and
#                    diffusers (the models suite and benchmark; with torchvision, which timm needs,
#                    installed in one pip command with torch==$TORCH_VERSION, so that pip keeps it),
#                    scikit-learn, matplotlib and tqdm (examples/meanflow_digits)
#
# Environment: JVPC_PYTHON (a python3 with that torch), JVPC_TORCH_VERSION (default 2.15.0; jvpc
# builds against 2.11.0 to 2.15.0), JVPC_VENV (a virtual environment to make where missing and
# use, instead of JVPC_PYTHON), JVPC_BUILD_DIR (default build),
# JVPC_BUILD_TYPE (default Release), JVPC_CMAKE_ARGS (extra configure arguments),
# JVPC_BUILD_TARGETS (the targets to build; default all), JVPC_EXTRA_PACKAGES (more Debian
# packages), JVPC_SETUP_ONLY=1 (install, do not build).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD_DIR=${JVPC_BUILD_DIR:-build}
TORCH_VERSION=${JVPC_TORCH_VERSION:-2.15.0}

log() { printf '[setup] %s\n' "$*" >&2; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else "$@"; fi; }

# --- Debian packages ------------------------------------------------------------------------
need=()
for pkg in cmake ninja-build g++ ccache nlohmann-json3-dev libgtest-dev libcli11-dev python3 ${JVPC_EXTRA_PACKAGES:-}; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  as_root apt-get update -qq
  as_root apt-get install -y -qq "${need[@]}" >/dev/null
fi

# --- Python with torch $TORCH_VERSION -------------------------------------------------------------
make_venv() {
  [ -x "$1/bin/python" ] && return
  dpkg -s python3-venv >/dev/null 2>&1 || as_root apt-get install -y -qq python3-venv >/dev/null
  log "making the virtual environment $1"
  python3 -m venv "$1"
}
has_torch() { "$1" -c "import torch, sys; sys.exit(0 if torch.__version__.split('+')[0] == '$TORCH_VERSION' else 1)" 2>/dev/null; }
PY=""
if [ -n "${JVPC_VENV:-}" ]; then
  make_venv "$JVPC_VENV"
  PY=$(cd "$JVPC_VENV" && pwd)/bin/python
  has_torch "$PY" || { log "installing torch==$TORCH_VERSION into $JVPC_VENV"; "$PY" -m pip install -q "torch==$TORCH_VERSION" numpy; }
fi
for cand in ${JVPC_PYTHON:-} python3 "$ROOT/.venv/bin/python"; do
  [ -z "$PY" ] || break
  if [ -n "$cand" ] && command -v "$cand" >/dev/null && has_torch "$cand"; then PY=$(command -v "$cand"); fi
done
if [ -z "$PY" ]; then
  log "installing torch==$TORCH_VERSION (several GB with its CUDA runtime packages)"
  # Into JVPC_PYTHON where given; else into python3 where it has no torch yet (another version
  # there is left alone); else, and where Debian's python3 refuses pip installs (PEP 668), into .venv.
  target=${JVPC_PYTHON:-python3}
  if [ -z "${JVPC_PYTHON:-}" ] && python3 -c "import torch" 2>/dev/null; then target=""; fi
  if [ -n "$target" ] && "$target" -m pip install -q "torch==$TORCH_VERSION" numpy 2>/dev/null && has_torch "$target"; then
    PY=$(command -v "$target")
  else
    make_venv "$ROOT/.venv"
    "$ROOT/.venv/bin/python" -m pip install -q "torch==$TORCH_VERSION" numpy
    PY=$ROOT/.venv/bin/python
  fi
fi
"$PY" -c "import numpy" 2>/dev/null || "$PY" -m pip install -q numpy
# The Python module (python/) builds where that Python has its headers: pyenv's and python.org's
# builds ship them, Debian's python3 (and a venv made from it) needs python3-dev.
has_headers() { "$PY" -c 'import os, sys, sysconfig; sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else 1)'; }
if ! has_headers && "$PY" -c 'import sys; sys.exit(0 if sys.base_prefix == "/usr" else 1)'; then
  log "installing python3-dev (CPython's headers, for the Python module)"
  export DEBIAN_FRONTEND=noninteractive
  as_root apt-get install -y -qq python3-dev >/dev/null
fi
PY_PACKAGES="pytest==9.2.0 tabulate==0.9.0 expecttest==0.3.0 safetensors==0.8.0"
# timm and diffusers install beside torch 2.11 to 2.15; pip picks the torchvision that matches
# the torch pinned in the same command (0.29.2 for 2.15.0).
PY_PACKAGES="$PY_PACKAGES timm==1.0.31 diffusers==0.42.1"
# The MeanFlow-on-digits example (examples/meanflow_digits): the digits, the pictures, the progress bar.
PY_PACKAGES="$PY_PACKAGES scikit-learn==1.9.1 matplotlib==3.11.2 tqdm==4.70.1"
if ! "$PY" -c "import sys, importlib.metadata as m; sys.exit(0 if all(m.version(p.split('==')[0]) == p.split('==')[1] for p in sys.argv[1:]) else 1)" $PY_PACKAGES 2>/dev/null; then
  log "installing $PY_PACKAGES"
  # shellcheck disable=SC2086
  "$PY" -m pip install -q "torch==$TORCH_VERSION" $PY_PACKAGES
fi
PY=$("$PY" -c 'import sys; print(sys.executable)')  # the interpreter itself, not a pyenv shim
TORCH_PREFIX=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')
log "torch $("$PY" -c 'import torch; print(torch.__version__)') from $PY"

[ -n "${JVPC_SETUP_ONLY:-}" ] && { mkdir -p "$BUILD_DIR" && echo "$PY" >"$BUILD_DIR/.jvpc-python"; exit 0; }

# --- configure and build --------------------------------------------------------------------
export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
# Paths under the checkout are hashed relative to it, so another clone (CI's) reuses the cache.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.ccache}
if [ ! -f "$BUILD_DIR/build.ninja" ] || [ "$(cat "$BUILD_DIR/.jvpc-prefix" 2>/dev/null)" != "$TORCH_PREFIX" ]; then
  log "configuring $BUILD_DIR"
  # shellcheck disable=SC2086
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="${JVPC_BUILD_TYPE:-Release}" \
    -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" -DPython3_EXECUTABLE="$PY" ${JVPC_CMAKE_ARGS:-} >"$BUILD_DIR.configure.log" 2>&1 ||
    { cat "$BUILD_DIR.configure.log"; exit 1; }
  echo "$TORCH_PREFIX" >"$BUILD_DIR/.jvpc-prefix"
fi
log "building $BUILD_DIR (2 cores: the first build takes several minutes)"
# shellcheck disable=SC2086
cmake --build "$BUILD_DIR" ${JVPC_BUILD_TARGETS:+--target $JVPC_BUILD_TARGETS}
echo "$PY" >"$BUILD_DIR/.jvpc-python"
