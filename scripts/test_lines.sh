#!/usr/bin/env bash
# Runs the test suite on each Spark line given (4, 3.5) at once, each line in its two parts at once
# (tests/conftest.py's --part: the tests that start their own processes, and those on the shared Spark
# set-ups). The tests mostly wait on JVMs, sockets and timeouts rather than the CPU: one pytest per line kept
# the two cores about half busy. Each output line is prefixed with its Spark line and part; a failure in one
# does not stop the others, and the exit code is 1 if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
results=$(mktemp -d)
trap 'rm -rf "$results"' EXIT
parts="own-processes shared-setups"
for line in "$@"; do
  venv=.venv; [ "$line" = 3.5 ] && venv=.venv-spark35
  for part in $parts; do
    (
      "$venv/bin/python" -m pytest --part "$part" 2>&1 | sed -u "s/^/[spark $line, $part] /"
      echo "${PIPESTATUS[0]}" > "$results/$line-$part"
    ) &
  done
done
wait
rc=0
for line in "$@"; do
  for part in $parts; do
    code=$(cat "$results/$line-$part" 2>/dev/null || echo 1)
    echo "== Spark $line line, $part: pytest exit code $code"
    [ "$code" = 0 ] || rc=1
  done
done
exit $rc
