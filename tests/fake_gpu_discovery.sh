#!/usr/bin/env bash
# Fake GPU discovery script for Spark resource scheduling on CPU-only machines (Spark runs it
# once per worker, with the worker's environment, and reads one JSON line).
#  - FAKE_GPU_ADDRESS set: print that address (standalone workers each get their own).
#  - else FAKE_GPU_COUNTER names a file: hand out 0, 1, 2, ... in call order. The workers of a
#    local-cluster share one host and one conf, so a fixed answer would give every executor
#    GPU "0"; the counter gives each one a distinct GPU, as separate physical GPUs would.
#  - else print "0".
# FAKE_GPUS_PER_WORKER=n (default 1): n consecutive addresses per call, as a worker with n GPUs would report.
set -euo pipefail
n=${FAKE_GPUS_PER_WORKER:-1}
if [ -n "${FAKE_GPU_ADDRESS:-}" ]; then
  addr=$FAKE_GPU_ADDRESS
elif [ -n "${FAKE_GPU_COUNTER:-}" ]; then
  exec 9>>"$FAKE_GPU_COUNTER.lock"
  flock 9   # workers start concurrently
  addr=$(cat "$FAKE_GPU_COUNTER" 2>/dev/null || echo 0)
  echo $((addr + n)) > "$FAKE_GPU_COUNTER"
else
  addr=0
fi
addresses=$(seq -s '", "' "$addr" $((addr + n - 1)))
echo "{\"name\": \"gpu\", \"addresses\": [\"$addresses\"]}"
