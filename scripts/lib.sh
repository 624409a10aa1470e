#!/usr/bin/env bash
# Sourced by the setup scripts (deps.sh, quickstart.sh): run a step with its output kept in a
# log, so the terminal shows one line per step and, when a step fails, the log's last lines
# and its path. Not a command of its own.

# ff_step LOG WHAT CMD...: CMD's stdout and stderr appended to LOG; prints "WHAT ... ok (N s)",
# or "WHAT ... FAILED" with the tail of LOG and its path, and returns CMD's exit status.
ff_step() {
  local log=$1 what=$2 t0=$SECONDS rc=0
  shift 2
  printf '%s ... ' "$what"
  echo "== $what: $*" >> "$log"
  "$@" >> "$log" 2>&1 || rc=$?
  if [[ $rc -eq 0 ]]; then
    echo "ok ($((SECONDS - t0)) s)"
    return 0
  fi
  echo "FAILED (exit $rc)"
  echo "   the last lines of $log:"
  tail -n "${FF_STEP_TAIL:-25}" "$log" | sed 's/^/   | /'
  echo "   the whole output: $log"
  return "$rc"
}
