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

apt_install() {
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  if ! command -v apt-get >/dev/null 2>&1 || { [ -n "$sudo" ] && ! command -v sudo >/dev/null 2>&1; }; then
    echo "setup: please install $* (no apt-get, or not root and no sudo)" >&2
    exit 1
  fi
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# Java: Spark needs a JVM (17 is what the 3.5 line is tested with here). Checked before the stamp, so a
# machine that lost its Java gets it back.
if ! command -v java >/dev/null 2>&1; then
  echo "setup: installing Java (openjdk-17-jre-headless)"
  apt_install openjdk-17-jre-headless
fi
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

if [ ! -x "$venv/bin/python" ] && ! "$PY" -m venv "$venv"; then
  echo "setup: '$PY -m venv' failed; installing python3-venv" >&2
  rm -rf "$venv"
  apt_install python3-venv
  "$PY" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
"${pip[@]}" -r requirements.lock
"${pip[@]}" --no-deps -e .

# Horovod: built once per (horovod, torch, python) and cached outside the repository.
if wheel=$(bash scripts/build_horovod.sh "$venv/bin/python"); then
  "${pip[@]}" "$wheel" pyyaml
  echo "$want" > "$stamp"
else
  # No stamp: the next set-up tries the build again (it fails fast while g++ or cmake is missing).
  echo "setup: WARNING: the Horovod wheel could not be built; backend='horovod' will be unavailable," >&2
  echo "setup: everything else works. Install a C++ compiler (g++) and cmake (>= 3.13, < 4), then re-run." >&2
fi
