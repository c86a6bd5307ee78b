#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Layer by layer, this build against AB_LIB's (bench/run_device.sh's A/B): for each model of
# MODELS, kiln_runner with each build's libraries at KILN_LOG_LEVEL=debug (the decisions each makes
# at context creation) and then profiled (each layer timed alone). Run after bench/run_device.sh
# has written the .ptd and input files into WORK. Everything goes to $OUT/ab_diag.log.
set -uo pipefail
root=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$root" || exit 1
BENCH_DIR=${BENCH_DIR:-.dev/bench}
WORK=${WORK:-/tmp/kiln_bench}
OUT=${OUT:-$BENCH_DIR/out}
new=$(cd "$BENCH_DIR/lib" && pwd -P)
old=$(cd "${AB_LIB:?AB_LIB: the other build folder}" && pwd -P)
runner=$BENCH_DIR/runner/kiln_runner
log=$OUT/ab_diag.log
: >"$log"
for cfg in ${MODELS//,/ }; do
  for which in new old; do
    lib=$new
    [[ $which == old ]] && lib=$old
    for mode in decisions profile; do
      # decisions at debug level; the profile switch of each build (the option's override, and
      # the older variable)
      prof=(KILN_LOG_LEVEL=debug)
      [[ $mode == profile ]] && prof=(KILN_LOG_LEVEL=info KILN_PROFILE=1 KILN_CUDA_PROFILE=1)
      echo "=== $cfg $which $mode" >>"$log"
      env LD_LIBRARY_PATH="$lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}" \
        KILN_CUDA_PLUGIN="$lib/libkiln_cuda.so" "${prof[@]}" \
        timeout 90 "$runner" --model "$BENCH_DIR/models/$cfg.devio.pte" --data "$WORK/$cfg.ptd" \
        --inputs "$WORK/$cfg.inputs.bin" --iterations 50 --warmup 5 --option device=cuda:0 \
        --device-io >>"$log" 2>&1
    done
  done
done
echo "ab_diag: $(wc -l <"$log") lines in $log"
