#!/usr/bin/env bash
# Spark GPU discovery script: prints this node's GPUs as one JSON line, e.g.
#   {"name": "gpu", "addresses": ["0","1"]}
# Point spark.worker.resource.gpu.discoveryScript (standalone workers) or
# spark.executor.resource.gpu.discoveryScript (YARN, Kubernetes) at it; it must be executable on every
# node. It lists every GPU nvidia-smi sees: to hand Spark fewer, set the worker/executor gpu.amount.
# Exits non-zero with a message on stderr (which Spark shows in the worker/executor log) when
# nvidia-smi is missing, fails, or lists no GPU: better a clear start-up error than a node that silently
# offers no GPUs and leaves barrier stages waiting for slots.
# Only bash builtins are used besides nvidia-smi, so it runs on minimal container images.
set -uo pipefail

fail() {
  echo "gpu_discovery.sh: $*" >&2
  exit 1
}

command -v nvidia-smi >/dev/null 2>&1 ||
  fail "nvidia-smi not found on PATH ($PATH): install the NVIDIA driver on this node, or do not request GPUs (spark.*.resource.gpu.amount) for it"

output=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>&1)
status=$?
[ "$status" -eq 0 ] || fail "nvidia-smi --query-gpu=index failed (exit $status): ${output}"

addresses=""
while IFS= read -r line; do
  line="${line//[[:space:]]/}"
  [ -z "$line" ] && continue
  [[ "$line" =~ ^[0-9]+$ ]] || fail "unexpected nvidia-smi output line '${line}' (expected GPU indices): ${output}"
  addresses+="${addresses:+,}\"${line}\""
done <<< "$output"

[ -n "$addresses" ] || fail "nvidia-smi lists no GPU on this node: check the driver (nvidia-smi -L), or do not request GPUs for it"

echo "{\"name\": \"gpu\", \"addresses\": [${addresses}]}"
