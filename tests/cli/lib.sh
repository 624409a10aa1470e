# Sourced by tests/cli/test_*.sh: a temp folder, and checks that print what failed.
# Environment (set by ctest): FF_BIN (the fuseflow binary), FF_SOURCE_DIR.
set -uo pipefail
: "${FF_BIN:?FF_BIN must point at the fuseflow binary}"
FF_BIN=$(realpath "$FF_BIN" 2>/dev/null || echo "$FF_BIN")
[[ -x "$FF_BIN" ]] || { echo "FF_BIN=$FF_BIN is not an executable" >&2; exit 1; }
SRC=${FF_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
TMP=$(mktemp -d /tmp/ff_cli_test.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
FAILS=0

ok() { echo "ok: $*"; }
fail() {
  echo "FAIL: $*" >&2
  FAILS=$((FAILS + 1))
}

# expect_ok WHAT CMD...: exit status 0
expect_ok() {
  local what=$1
  shift
  if "$@" >"$TMP/out" 2>"$TMP/err"; then ok "$what"; else fail "$what: exit $? ($(head -c 600 "$TMP/err"))"; fi
}

# expect_error WHAT PATTERN CMD...: non-zero exit and stderr matching PATTERN (grep -E)
expect_error() {
  local what=$1 pat=$2
  shift 2
  "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  if ((rc == 0)); then
    fail "$what: exited 0, expected an error matching /$pat/"
    return
  fi
  if grep -qE -- "$pat" "$TMP/err"; then
    if grep -qE "AddressSanitizer|runtime error|Segmentation" "$TMP/err"; then fail "$what: crashed: $(head -c 600 "$TMP/err")"; else ok "$what (exit $rc)"; fi
  else
    fail "$what: stderr does not match /$pat/: $(head -c 600 "$TMP/err")"
  fi
}

# expect_absent WHAT PATH...: no such files (no partial output)
expect_absent() {
  local what=$1
  shift
  for p in "$@"; do
    if compgen -G "$p" >/dev/null; then fail "$what: $p exists"; return; fi
  done
  ok "$what"
}

finish() {
  if ((FAILS)); then
    echo "$FAILS check(s) failed"
    exit 1
  fi
  echo "all checks passed"
  exit 0
}
