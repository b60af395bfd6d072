#!/usr/bin/env bash
# Runs one .ir test (tests/ir/*.ir): each "// RUN:" line of the file as a shell pipeline, with
# %s the file, %jvpc the jvpc command and %filecheck jvpc_filecheck; `not CMD` passes when CMD
# fails with an error (exit 1 or 2), as LLVM's `not` does. Usage: ir_test.sh JVPC FILECHECK FILE
set -u -o pipefail
JVPC=$1 FILECHECK=$2 FILE=$3
not() {
  "$@"
  local rc=$?
  [ "$rc" -ne 0 ] && [ "$rc" -lt 128 ]
}
runs=0 fails=0
while IFS= read -r line; do
  cmd=${line#*RUN:}
  cmd=${cmd//%jvpc/$JVPC}
  cmd=${cmd//%filecheck/$FILECHECK}
  cmd=${cmd//%s/$FILE}
  runs=$((runs + 1))
  if eval "$cmd"; then
    echo "ok   RUN:${line#*RUN:}"
  else
    echo "FAIL RUN:${line#*RUN:}"
    fails=$((fails + 1))
  fi
done < <(grep -E '^// RUN:' "$FILE")
if [ "$runs" = 0 ]; then echo "FAIL $FILE has no RUN line"; exit 1; fi
[ "$fails" = 0 ]
