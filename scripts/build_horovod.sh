#!/usr/bin/env bash
# Prints the path of a Horovod wheel built for this venv's torch and Python, building it on first use.
# horovod 0.28.1 compiles its torch extension as C++14; torch >= 2.1 headers need C++17 (the one-line fix
# merged upstream after the release, horovod PR #3998), so the source package is patched before building.
set -euo pipefail
py=${1:-python3}
hvd_version=0.28.1
torch_version=$("$py" -c 'import torch; print(torch.__version__.split("+")[0])')
py_tag=$("$py" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
cache=${SPARK_DIST_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/spark_dist/wheels}/horovod-$hvd_version-torch$torch_version-$py_tag
found=$(ls "$cache"/horovod-*.whl 2>/dev/null | head -n 1 || true)
if [ -n "$found" ]; then echo "$found"; exit 0; fi

for tool in g++ cmake; do
  command -v $tool >/dev/null 2>&1 || { echo "build_horovod: '$tool' is missing: install it (apt-get install g++ cmake)" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "build_horovod: building horovod $hvd_version for torch $torch_version ($py_tag), ~17 min on 2 cores" >&2
"$py" -m pip download -q --no-deps --no-binary :all: -d "$work" "horovod==$hvd_version" >&2
tar -xzf "$work"/horovod-$hvd_version.tar.gz -C "$work"
src="$work/horovod-$hvd_version"
sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
"$py" -m pip install -q cloudpickle psutil pyyaml packaging wheel >&2
(
  cd "$src"
  export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITH_GLOO=1 \
         HOROVOD_WITHOUT_MPI=1 HOROVOD_CPU_OPERATIONS=GLOO MAKEFLAGS=-j2 CMAKE_POLICY_VERSION_MINIMUM=3.5
  "$py" -m pip wheel -q --no-deps --no-build-isolation -w "$work/dist" . >&2
)
mkdir -p "$cache"
cp "$work"/dist/horovod-*.whl "$cache"/
ls "$cache"/horovod-*.whl | head -n 1
