#!/usr/bin/env bash
# Runs the test suite on each Spark line given (4, 3.5) at once: their tests mostly wait on JVMs and sockets,
# not the CPU, so two lines take little longer than one. Each output line is prefixed with its Spark line;
# a failure on one line does not stop the other, and the exit code is 1 if any line failed. Each line's
# failures and its summary are printed again at the end, so that the tail of the output (all CI keeps) says
# which tests failed on which line.
set -uo pipefail
cd "$(dirname "$0")/.."
results=$(mktemp -d)
trap 'rm -rf "$results"' EXIT
for line in "$@"; do
  venv=.venv; [ "$line" = 3.5 ] && venv=.venv-spark35
  (
    "$venv/bin/python" -m pytest 2>&1 | sed -u "s/^/[spark $line] /" | tee "$results/$line.log"
    echo "${PIPESTATUS[0]}" > "$results/$line"
  ) &
done
wait
rc=0
for line in "$@"; do
  code=$(cat "$results/$line" 2>/dev/null || echo 1)
  grep -E "^\[spark $line\] (FAILED|ERROR) |^\[spark $line\] =+ .* in [0-9.]+s" "$results/$line.log" 2>/dev/null
  echo "== Spark $line line: pytest exit code $code"
  [ "$code" = 0 ] || rc=1
done
exit $rc
