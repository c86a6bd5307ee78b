#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The other side of an A/B: libkiln and the CUDA plugin of an earlier commit, built here, in the
# folder that bench/run_device.sh's AB_LIB and bench/ab_plugins.py's variants take.
#
#   bench/ab_prepare.sh COMMIT [DIR]
#
# Checks COMMIT out into a git worktree (/tmp/kiln-ab-<commit>; removed afterwards unless KEEP=1),
# builds its `kiln` and `kiln_cuda` targets as `make cuda` does (RelWithDebInfo, sm_90 + PTX) and
# copies libkiln.so and libkiln_cuda.so into DIR (default .dev/ab/<short commit>), with a MANIFEST
# naming the commit. About 10 minutes on 2 cores. Carry DIR beside the bench folder, e.g.
#
#   AB_LIB=.dev/ab/0e5e8d1 BENCH_DIR=.dev/s34 bash bench/run_device.sh
#
# Environment: CMAKE (cmake), JOBS (2), KEEP (0: remove the worktree).
set -euo pipefail

root=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
commit=${1:?usage: bench/ab_prepare.sh COMMIT [DIR]}
short=$(git -C "$root" rev-parse --short "$commit^{commit}") || {
  echo "ab_prepare: '$commit' is not a commit of this repository" >&2
  exit 2
}
dir=${2:-$root/.dev/ab/$short}
command -v nvcc >/dev/null || {
  echo "ab_prepare: no nvcc on PATH: the CUDA plugin needs the CUDA 13 toolkit" \
    "(PATH=/usr/local/cuda/bin:\$PATH)" >&2
  exit 2
}
wt=/tmp/kiln-ab-$short
if [[ ! -d $wt ]]; then
  git -C "$root" worktree add --detach -q "$wt" "$short"
fi
cleanup() { [[ ${KEEP:-0} == 1 ]] || git -C "$root" worktree remove --force "$wt"; }
trap cleanup EXIT
cmake=${CMAKE:-cmake}
"$cmake" -S "$wt" -B "$wt/build-gpu" -DKILN_CUDA=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
"$cmake" --build "$wt/build-gpu" -j "${JOBS:-2}" --target kiln kiln_cuda >/dev/null
mkdir -p "$dir"
cp -L "$wt/build-gpu/libkiln.so" "$wt/build-gpu/libkiln_cuda.so" "$dir/"
{
  echo "commit: $(git -C "$root" rev-parse "$short") ($(git -C "$root" log -1 --format=%s "$short"))"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  (cd "$dir" && sha256sum libkiln.so libkiln_cuda.so)
} >"$dir/MANIFEST"
echo "ab_prepare: $dir holds $short's libkiln.so and libkiln_cuda.so"
