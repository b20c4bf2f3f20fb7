#!/usr/bin/env bash
# Builds the virtual environment of one Spark line with its pinned stack, Java and the Horovod wheel:
#   scripts/setup_env.sh        the Spark 4 line (the default): .venv      from requirements/spark4.lock
#   scripts/setup_env.sh 3.5    the Spark 3.5 line:             .venv-spark35 from requirements/spark35.lock
#   ... --no-horovod            without building Horovod itself (`make demo`): Horovod programs run on
#                               spark_dist.horovod, which needs no build; a later set-up without it adds Horovod
# Idempotent: stamps keyed by the lock file and these scripts skip the work when nothing changed (one for the
# environment, one for the Horovod wheel in it).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
line=${1:-4}
case "$line" in
  4) venv="$root/.venv"; lock=requirements/spark4.lock ;;
  3.5) venv="$root/.venv-spark35"; lock=requirements/spark35.lock ;;
  *) echo "setup: unknown Spark line '$line' (choose 4 or 3.5)" >&2; exit 2 ;;
esac
PY=${PYTHON:-python3}
horovod=1; [ "${2:-}" = "--no-horovod" ] && horovod=0
stamp="$venv/.spark_dist_stamp"
horovod_stamp="$venv/.horovod_stamp"
want=$(cat "$lock" scripts/setup_env.sh scripts/build_horovod.sh setup.py | sha256sum | cut -c1-16)

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

# Java: Spark 4 needs 17 or 21 (3.5 runs on 8, 11 or 17). Checked before the stamp, so a machine that
# lost its Java gets it back.
java_major() { java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n 1; }
if ! command -v java >/dev/null 2>&1 || [ "$(java_major)" -lt 17 ]; then
  echo "setup: installing Java 17 (openjdk-17-jre-headless)"
  apt_install openjdk-17-jre-headless
fi
stamped() { [ -f "$1" ] && [ "$(cat "$1")" = "$want" ]; }
if stamped "$stamp" && { [ "$horovod" = 0 ] || stamped "$horovod_stamp"; }; then
  exit 0
fi
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)

if ! stamped "$stamp"; then
rm -f "$horovod_stamp"
echo "setup: building $(basename "$venv") (Spark $line line, $lock)"
if [ ! -x "$venv/bin/python" ] && ! "$PY" -m venv "$venv"; then
  echo "setup: '$PY -m venv' failed; installing python3-venv" >&2
  rm -rf "$venv"
  apt_install python3-venv
  "$PY" -m venv "$venv"
fi
"${pip[@]}" -r "$lock"
"${pip[@]}" --no-deps -e .

# DeepSpeed's shared-memory all-reduce on CPU is a C++ op that torch compiles on its first use (a minute and
# more on two cores): compiled here, into the environment's own cache (the TORCH_EXTENSIONS_DIR that
# tests/scripts/train_deepspeed.py sets), so that no DeepSpeed run of the tests pays it. Best effort: a run
# compiles it itself when this could not.
TORCH_EXTENSIONS_DIR="$venv/torch_extensions" "$venv/bin/python" - <<'PY' || echo "setup: WARNING: DeepSpeed's CPU op was not compiled ahead; its first run will" >&2
import deepspeed.ops
from deepspeed.accelerator import get_accelerator

builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
if builder is not None and deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
    builder.load(verbose=False)
PY
echo "$want" > "$stamp"
fi

# Horovod itself, beside spark_dist.horovod (the suite runs both): built once per (horovod, torch, python) and
# cached outside the repository; both lines share the wheel when they share torch and Python.
[ "$horovod" = 1 ] || exit 0
if wheel=$(bash scripts/build_horovod.sh "$venv/bin/python"); then
  "${pip[@]}" --no-deps "$wheel"
  echo "$want" > "$horovod_stamp"
else
  # No stamp: the next set-up tries the build again (it fails fast while g++ or cmake is missing).
  echo "setup: WARNING: the Horovod wheel could not be built; Horovod programs run on spark_dist.horovod" >&2
  echo "setup: instead. To build it, install a C++ compiler (g++) and cmake (>= 3.13, < 4), then re-run." >&2
fi
