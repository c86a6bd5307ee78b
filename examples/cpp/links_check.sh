#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The GPU check of the links between Kiln delegates (docs/runtime.md, "Between delegates"): a
# program with two Kiln delegates around an op Kiln lacks (examples/cpp/export_for_runner.py
# --model linked) runs on cuda:0 through kiln_runner, its outputs must match eager PyTorch, and
# every tensor one Kiln delegate passes straight to the other must stay on the GPU
# (kiln_runner --expect-linked: no linked input read from host memory, none copied back on
# demand, the output only Kiln reads kept in device memory after the first run). A second run
# with the option link_delegates off shows the copies the links save, and the latency of both.
#
#   examples/cpp/links_check.sh prepare [DIR]          here: export fp32 and fp16 programs,
#                                                      inputs and expected outputs into DIR
#   examples/cpp/links_check.sh run [DIR] [RUNNER]     on the GPU machine
#
# DIR defaults to build-linkrun; RUNNER to build-runner/bundle/kiln_runner (a bundle built from
# this checkout: `make install && cmake --build build-runner`, or examples/cpp/make_bundle.sh).
# Exit status 0 when every check passed.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
mode=${1:-}
dir=${2:-build-linkrun}
case "$mode" in
prepare)
  venv=$("$root/tools/setup_env.sh" | tail -n 1)
  for p in fp32 fp16; do
    "$venv/bin/python" "$root/examples/cpp/export_for_runner.py" --out "$dir/check-$p" \
      --model linked --precision "$p" --batch 8
  done
  echo "links_check: programs in $dir/check-{fp32,fp16}; on the GPU machine run:" \
    "examples/cpp/links_check.sh run $dir RUNNER" >&2
  ;;
run)
  runner=${3:-build-runner/bundle/kiln_runner}
  [ -x "$runner" ] || { echo "links_check: no runner at $runner" >&2; exit 2; }
  export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  status=0
  for p in fp32 fp16; do
    tol=1e-4
    [ "$p" = fp16 ] && tol=2e-2
    d="$dir/check-$p"
    common=(--model "$d/model.pte" --inputs "$d/inputs.bin" --expected "$d/expected.bin"
      --tolerance "$tol" --option device=cuda:0 --iterations 200 --warmup 20)
    echo "== $p, linked (the default)"
    "$runner" "${common[@]}" --expect-linked 2>&1 | grep -v '^[IEWD] [0-9]' || status=1
    echo "== $p, --caller-stream, linked"
    "$runner" "${common[@]}" --caller-stream --expect-linked 2>&1 | grep -v '^[IEWD] [0-9]' ||
      status=1
    echo "== $p, link_delegates=false (every tensor through host memory)"
    "$runner" "${common[@]}" --option link_delegates=false --link-stats 2>&1 |
      grep -v '^[IEWD] [0-9]' || status=1
  done
  echo "links_check: $([ $status = 0 ] && echo OK || echo FAILED)"
  exit $status
  ;;
*)
  echo "usage: $0 prepare [DIR] | $0 run [DIR] [RUNNER]" >&2
  exit 2
  ;;
esac
