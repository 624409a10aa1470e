#!/usr/bin/env bash
# scripts/deps.sh against a fake package manager (dpkg-query, apt-get and sudo on PATH):
# nothing missing is one line and no apt-get; missing packages are installed with the
# installer's hundreds of lines in the log and a few lines on the terminal; a failing install
# exits non-zero and shows the log's path and its last lines (the error), not all of it.
set -uo pipefail
SRC=${FF_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
TMP=$(mktemp -d /tmp/ff_deps_test.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
FAILS=0
fail() { echo "FAIL: $*" >&2; FAILS=$((FAILS + 1)); }
ok() { echo "ok: $*"; }

mkdir -p "$TMP/bin"
cat > "$TMP/bin/dpkg-query" <<'EOF'
#!/usr/bin/env bash
# the last argument is the package; FAKE_MISSING lists the ones not installed
for m in ${FAKE_MISSING:-}; do [[ "${!#}" == "$m" ]] && { echo -n "unknown ok not-installed"; exit 1; }; done
echo -n "install ok installed"
EOF
cat > "$TMP/bin/apt-get" <<'EOF'
#!/usr/bin/env bash
echo "apt-get $* DEBIAN_FRONTEND=${DEBIAN_FRONTEND:-}" >> "$FAKE_CALLS"
for i in $(seq 1 300); do echo "Unpacking fake-package-$i (1.0-$i) ..."; done
if [[ "$1" == install && -n "${FAKE_INSTALL_FAILS:-}" ]]; then
  echo "E: Unable to locate package libzmq3-dev" >&2
  exit 100
fi
EOF
printf '#!/usr/bin/env bash\nexec "$@"\n' > "$TMP/bin/sudo"
chmod +x "$TMP/bin/"*
export PATH="$TMP/bin:$PATH" FAKE_CALLS="$TMP/calls"

# run_deps NAME: scripts/deps.sh with the fakes; stdout+stderr in $TMP/NAME.out, exit in $rc
run_deps() {
  : > "$FAKE_CALLS"
  bash "$SRC/scripts/deps.sh" > "$TMP/$1.out" 2>&1
  rc=$?
}
lines() { wc -l < "$1" | tr -d ' '; }

FAKE_MISSING="" run_deps all
if [[ $rc -eq 0 && $(lines "$TMP/all.out") -eq 1 && ! -s "$FAKE_CALLS" ]] && grep -q '^deps: all 26 packages installed$' "$TMP/all.out"; then
  ok "nothing missing: one line, no apt-get"
else fail "nothing missing: exit $rc, $(lines "$TMP/all.out") lines, apt-get calls: $(cat "$FAKE_CALLS"): $(head -c 400 "$TMP/all.out")"; fi

FAKE_MISSING="cmake libzmq3-dev" FF_DEPS_LOG="$TMP/deps.log" run_deps some
if [[ $rc -eq 0 && $(lines "$TMP/some.out") -le 3 ]] && ! grep -q Unpacking "$TMP/some.out" &&
   [[ $(grep -c Unpacking "$TMP/deps.log") -eq 600 ]] &&
   grep -q "^deps: installing 2 of 26 packages (cmake libzmq3-dev); the output goes to $TMP/deps.log$" "$TMP/some.out" &&
   grep -q '^deps: apt-get install \.\.\. ok' "$TMP/some.out" &&
   grep -q '^apt-get install -y --no-install-recommends cmake libzmq3-dev DEBIAN_FRONTEND=noninteractive$' "$FAKE_CALLS"; then
  ok "two missing: installed, $(lines "$TMP/some.out") lines here, 600 installer lines in the log"
else fail "two missing: exit $rc: $(head -c 600 "$TMP/some.out") | calls: $(cat "$FAKE_CALLS")"; fi

FAKE_MISSING="libzmq3-dev" FAKE_INSTALL_FAILS=1 FF_DEPS_LOG="$TMP/fail.log" run_deps fail
if [[ $rc -eq 100 && $(lines "$TMP/fail.out") -lt 40 ]] && grep -q 'deps: apt-get install \.\.\. FAILED (exit 100)' "$TMP/fail.out" &&
   grep -q '| E: Unable to locate package libzmq3-dev' "$TMP/fail.out" && grep -q "the whole output: $TMP/fail.log" "$TMP/fail.out"; then
  ok "a failed install: exit 100, the error and the log's path in $(lines "$TMP/fail.out") lines"
else fail "a failed install: exit $rc, $(lines "$TMP/fail.out") lines: $(head -c 1500 "$TMP/fail.out")"; fi

# without FF_DEPS_LOG: a fresh log under TMPDIR, named in the output
FAKE_MISSING="cmake" TMPDIR="$TMP" run_deps default
log=$(sed -n 's/^deps: installing .*; the output goes to \(.*\)$/\1/p' "$TMP/default.out")
if [[ $rc -eq 0 && "$log" == "$TMP"/fuseflow-deps.* && $(grep -c Unpacking "$log" 2>/dev/null) -eq 600 ]]; then
  ok "the default log: $log"
else fail "the default log: exit $rc, log '$log': $(head -c 400 "$TMP/default.out")"; fi

if [[ $FAILS -gt 0 ]]; then
  echo "$FAILS check(s) failed" >&2
  exit 1
fi
echo "all deps.sh checks passed"
