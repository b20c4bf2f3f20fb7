#!/usr/bin/env bash
# Creates .venv at the repository root with the pinned stack, Java and the Horovod wheel.
# Idempotent: a stamp keyed by requirements.lock and this script skips the work when nothing changed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
PY=${PYTHON:-python3}
venv="$root/.venv"
stamp="$venv/.spark_dist_stamp"
want=$(cat requirements.lock scripts/setup_env.sh scripts/build_horovod.sh setup.py | sha256sum | cut -c1-16)

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

# Java: Spark needs a JVM (17 is what the 3.5 line is tested with here).
if ! command -v java >/dev/null 2>&1; then
  echo "setup: installing Java (openjdk-17-jre-headless)"
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless >/dev/null
  else sudo apt-get update -qq && sudo apt-get install -y -qq openjdk-17-jre-headless >/dev/null; fi
fi

[ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
"${pip[@]}" -r requirements.lock
"${pip[@]}" --no-deps -e .

# Horovod: built once per (horovod, torch, python) and cached outside the repository.
if wheel=$(bash scripts/build_horovod.sh "$venv/bin/python"); then
  "${pip[@]}" "$wheel" pyyaml
else
  echo "setup: WARNING: the Horovod wheel could not be built; backend='horovod' will be unavailable," >&2
  echo "setup: everything else works. Install a C++ compiler (g++) and cmake (>= 3.13, < 4), then re-run." >&2
fi
echo "$want" > "$stamp"
