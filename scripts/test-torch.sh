#!/usr/bin/env bash
# Builds jvpc against another torch release and runs its tests there, in that release's own
# virtual environment and build folder (scripts/setup.sh installs what is missing).
#
#   scripts/test-torch.sh VERSION [--python] [ctest arguments...]
#
#   VERSION    a torch release from 2.11.0 to 2.15.0 (what jvpc builds against)
#   --python   build only what the Python tests need (the module and the CLI) and run only those
#              (CI's stage on torch 2.11.0)
#
# The environment is .venv-VERSION in the checkout (JVPC_VENV names another), the build folder
# build-torch-VERSION; both are kept for the next run.
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { sed -n '2,12s/^# \{0,1\}//p' "$0"; }
case "${1:-}" in
  -h | --help) usage; exit 0 ;;
  2.1[1-5].[0-9]*) VERSION=$1; shift ;;
  "") echo "test-torch.sh: error: which torch release? (scripts/test-torch.sh --help)" >&2; exit 2 ;;
  *) echo "test-torch.sh: error: '$1' is not a torch release from 2.11.0 to 2.15.0" >&2; exit 2 ;;
esac
python_only=""
if [ "${1:-}" = --python ]; then python_only=1; shift; fi

export JVPC_TORCH_VERSION=$VERSION
export JVPC_VENV=${JVPC_VENV:-.venv-$VERSION}
export JVPC_BUILD_DIR=build-torch-$VERSION
if [ -n "$python_only" ]; then
  JVPC_BUILD_TARGETS="jvpc_python jvpc_cli" scripts/setup.sh
  ctest --test-dir "$JVPC_BUILD_DIR" --output-on-failure -j 2 -R '^python_' "$@"
else
  scripts/setup.sh
  ctest --test-dir "$JVPC_BUILD_DIR" --output-on-failure -j 2 "$@"
fi
