#!/usr/bin/env bash
# Build Kiln's two wheels, or install both, with the packages of an existing environment
# (docs/packaging.md):
#
#   tools/build_wheels.sh PYTHON wheels OUTDIR   # OUTDIR/kiln-*.whl, kiln_executorch_runtime-*.whl
#   tools/build_wheels.sh PYTHON install         # pip install both into PYTHON's environment
#
# PYTHON's environment must hold the build requirements (scikit-build-core, executorch==1.5.1,
# cmake >= 3.28, ninja): the venv from tools/setup_env.sh does. Builds run without isolation
# (`pip wheel --no-build-isolation --no-deps`), so the delegate links the libexecutorch.so of the
# installed executorch wheel, the one its metadata then pins.
#
# CMake build folders persist under build/wheel/<environment>/{kiln,runtime}, so a rebuild only
# recompiles what changed; concurrent runs on one checkout take turns (flock). `install` builds
# the wheels into a temporary folder and installs exactly those files, kiln first: a kiln
# installed before the split owned kiln_executorch_runtime/ too, and removing it must not
# remove the runtime installed after it.
set -euo pipefail

usage() {
  echo "usage: $0 PYTHON wheels OUTDIR | $0 PYTHON install" >&2
  exit 2
}
[ $# -ge 2 ] || usage
python=$1
mode=$2
root=$(cd "$(dirname "$0")/.." && pwd)

env_name=$(basename "$("$python" -c 'import sys; print(sys.prefix)')")
build="$root/build/wheel/$env_name"
mkdir -p "$build"
exec 9>"$build/.lock"
flock 9

pip=("$python" -m pip --disable-pip-version-check --no-input)

build_wheels() { # OUTDIR
  local out=$1
  mkdir -p "$out"
  "${pip[@]}" wheel -q --no-build-isolation --no-deps -w "$out" \
    -C build-dir="$build/kiln" "$root"
  "${pip[@]}" wheel -q --no-build-isolation --no-deps -w "$out" \
    -C build-dir="$build/runtime" "$root/python/runtime_dist"
}

case "$mode" in
wheels)
  [ $# -eq 3 ] || usage
  build_wheels "$3"
  ;;
install)
  [ $# -eq 2 ] || usage
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  build_wheels "$tmp"
  "${pip[@]}" install -q --no-deps --force-reinstall "$tmp"/kiln-*.whl
  "${pip[@]}" install -q --no-deps --force-reinstall "$tmp"/kiln_executorch_runtime-*.whl
  ;;
*)
  usage
  ;;
esac
