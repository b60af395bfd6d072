#!/usr/bin/env bash
# Sets up and builds jvpc, then linearizes the seed's attention:
# scaled dot-product attention, math backend, bsz 1, 5 heads, seq 128, head dim 64.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec build/jvpc linearize sdpa --bsz 1 --model-dim 320 --head-dim 64 --seq-len 128 --backend math "$@"
