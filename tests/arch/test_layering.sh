#!/usr/bin/env bash
# The layering of docs/architecture.md holds on the tree, and the check catches what it must:
# a forbidden include across libraries, a transport header in a pure library, a link
# dependency against the arrows, an unowned public header.
set -uo pipefail
SRC=${FF_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
PY=${PYTHON:-python3}
check="$SRC/scripts/check_layering.py"
TMP=$(mktemp -d /tmp/ff_arch_test.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
FAILS=0
fail() { echo "FAIL: $*" >&2; FAILS=$((FAILS + 1)); }

if ! "$PY" "$check" "$SRC" > "$TMP/out" 2>&1; then
  cat "$TMP/out" >&2
  fail "the tree breaks its own layering"
else
  cat "$TMP/out"
fi

# A copy of the tree (sources, headers, table, build file) to plant violations in.
plant() {
  rm -rf "$TMP/t" && mkdir -p "$TMP/t"
  (cd "$SRC" && cp -r docs CMakeLists.txt include common kernels model msgs controller workers dataflow cli "$TMP/t/")
}
# expect_violation WHAT PATTERN: the check fails with a line matching PATTERN
expect_violation() {
  "$PY" "$check" "$TMP/t" > "$TMP/out" 2>&1
  local rc=$?
  if [[ $rc -ne 1 ]]; then fail "$1: exit $rc, expected 1 ($(head -c 400 "$TMP/out"))"
  elif ! grep -Eq "$2" "$TMP/out"; then fail "$1: no line matching '$2' in: $(head -c 600 "$TMP/out")"
  else echo "ok: $1: $(grep -E "$2" "$TMP/out" | head -n 1)"; fi
}

plant
sed -i '0,/^#include "fuseflow\/worker.h"/s//#include "fuseflow\/worker.h"\n#include "controller\/ctl_internal.h"/' "$TMP/t/workers/worker.c"
expect_violation "worker includes the controller's internals" \
  '^workers/worker.c:[0-9]+: ff_worker includes "controller/ctl_internal.h" of ff_controller, but .* no arrow ff_worker -> ff_controller'

plant
sed -i '0,/^#include "fuseflow\/error.h"/s//#include "fuseflow\/error.h"\n#include "fuseflow\/roles.h"/' "$TMP/t/controller/rl/exec_iter.c"
expect_violation "the RL controller includes the workers' engines" 'ff_exec includes "fuseflow/roles.h" of ff_roles'

plant
sed -i '0,/^#include "fuseflow\/error.h"/s//#include "fuseflow\/error.h"\n#include "fuseflow\/model.h"/' "$TMP/t/kernels/backend.c"
expect_violation "a kernel includes the model" 'ff_kernels includes "fuseflow/model.h" of ff_model'

plant
sed -i '0,/^#include <string.h>/s//#include <string.h>\n#include <zmq.h>/' "$TMP/t/dataflow/graph.c"
expect_violation "dataflow includes ZeroMQ" '^dataflow/graph.c:[0-9]+: ff_dataflow includes <zmq.h>'

plant
sed -i 's/^ff_module(ff_model \+DIRS model \+DEPS ff_kernels ff_modelio)/ff_module(ff_model DIRS model DEPS ff_kernels ff_modelio ff_msgs)/' "$TMP/t/CMakeLists.txt"
expect_violation "the model links the wire" 'CMakeLists.txt: ff_model links ff_msgs'

plant
echo '/* a header nobody owns */' > "$TMP/t/include/fuseflow/orphan.h"
expect_violation "an unowned public header" 'include/fuseflow/orphan.h: no library'

if [[ $FAILS -gt 0 ]]; then
  echo "$FAILS check(s) failed" >&2
  exit 1
fi
echo "all layering checks passed"
