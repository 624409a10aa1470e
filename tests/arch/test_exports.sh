#!/usr/bin/env bash
# libfuseflow.so and the `fuseflow` command export exactly what include/fuseflow/*.h declares,
# and fuseflow/fuseflow.h alone declares all of it, usable from C11 and C++
# (scripts/check_exports.py); and the check catches what it must: an internal symbol
# exported, a declared function missing, a header fuseflow.h leaves out, a header without
# its extern "C" guards.
set -uo pipefail
SRC=${FF_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
BUILD=${FF_BUILD_DIR:-$SRC/build}
BIN=${FF_BIN:-$BUILD/fuseflow}
PY=${PYTHON:-python3}
check="$SRC/scripts/check_exports.py"
LIB="$BUILD/libfuseflow.so"
TMP=$(mktemp -d /tmp/ff_exports_test.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
FAILS=0
fail() { echo "FAIL: $*" >&2; FAILS=$((FAILS + 1)); }
[[ -f "$LIB" ]] || { echo "no $LIB (build the fuseflow target)" >&2; exit 1; }
CXX=()
if command -v g++ > /dev/null; then CXX=(--cxx g++); else echo "note: no g++, the C++ half is not checked"; fi
CFLAGS=(--cflags=)
# a sanitized library needs its runtime in the program that links it
[[ "${FF_SANITIZED:-0}" == "1" ]] && CFLAGS=(--cflags=-fsanitize=address,undefined)

"$PY" "$check" --include "$SRC/include" --lib "$LIB" --exe "$BIN" "${CXX[@]}" "${CFLAGS[@]}" --tmp "$TMP/real" > "$TMP/out" 2>&1
rc=$?
cat "$TMP/out"
[[ $rc -eq 77 ]] && exit 77
[[ $rc -eq 0 ]] || fail "the build's exports or the public headers are off (above)"

# expect_problem WHAT PATTERN ARGS...: the check fails with a line matching PATTERN
expect_problem() {
  local what=$1 pattern=$2
  shift 2
  "$PY" "$check" "$@" --tmp "$TMP/p" > "$TMP/out" 2>&1
  local rc=$?
  if [[ $rc -ne 1 ]]; then fail "$what: exit $rc, expected 1 ($(head -c 400 "$TMP/out"))"
  elif ! grep -Eq "$pattern" "$TMP/out"; then fail "$what: no line matching '$pattern' in: $(head -c 800 "$TMP/out")"
  else echo "ok: $what: $(grep -E "$pattern" "$TMP/out" | head -n 1 | cut -c1-200)"; fi
}

# a library that leaks an internal symbol and lacks the API
mkdir -p "$TMP/stub"
printf 'const char *ff_version(void) { return "0"; }\nint rt_planted(void) { return 1; }\n' > "$TMP/stub/stub.c"
cc -shared -fPIC -o "$TMP/stub/libfuseflow.so" "$TMP/stub/stub.c" || fail "cannot build the stub library"
expect_problem "an internal symbol exported" '^FAIL: libfuseflow.so exports rt_planted, which' \
  --include "$SRC/include" --lib "$TMP/stub/libfuseflow.so"
expect_problem "a declared function missing" '^FAIL: libfuseflow.so does not export ff_now_ns, declared in include/fuseflow/util.h' \
  --include "$SRC/include" --lib "$TMP/stub/libfuseflow.so"

# fuseflow.h without one of the headers
rm -rf "$TMP/inc1" && cp -r "$SRC/include" "$TMP/inc1"
sed -i '/#include "fuseflow\/plan.h"/d' "$TMP/inc1/fuseflow/fuseflow.h"
expect_problem "fuseflow.h leaves out plan.h" 'implicit declaration of function .ff_plan|ff_plan[a-z_]*. undeclared' \
  --include "$TMP/inc1" --lib "$LIB" "${CFLAGS[@]}"

# a header without its extern "C" guards: C compiles, C++ links mangled names
if [[ ${#CXX[@]} -gt 0 ]]; then
  rm -rf "$TMP/inc2" && cp -r "$SRC/include" "$TMP/inc2"
  sed -i '/^#ifdef __cplusplus$/,/^#endif$/d' "$TMP/inc2/fuseflow/reward_client.h"
  expect_problem "reward_client.h without extern \"C\"" 'undefined reference to .ff_reward_client_[a-z_]*\(' \
    --include "$TMP/inc2" --lib "$LIB" "${CXX[@]}" "${CFLAGS[@]}"
fi

if [[ $FAILS -gt 0 ]]; then
  echo "$FAILS check(s) failed" >&2
  exit 1
fi
echo "all export checks passed"
