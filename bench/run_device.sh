#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The H200 half of Kiln's benchmark (docs/benchmarks.md), in one device call:
#
#   run(command="bash bench/run_device.sh", carry=[".dev/bench"], timeout_s=560)
#
# It expects .dev/bench/ as bench/export_here.py leaves it (models/, lib/libkiln.so +
# libkiln_cuda.so, runner/kiln_runner + its libraries, manifest.json) and runs:
#   1. bench/anchors_device.py: PyTorch eager, eager + CUDA graph, torch.compile reduce-overhead
#      and Kiln through its C API, interleaved in one process, checked against a float64
#      reference; rebuilds each Kiln engine and .ptd from the recording (weights regenerated here)
#      and writes the kiln_runner inputs;
#   2. kiln_runner (ExecuTorch + KilnBackend) per model: the --device-io program, then the host
#      I/O program;
#   3. bench/report.py: results.json and the table (each system's ms, Kiln / best PyTorch, floor).
# Files back in $OUT: run.log, anchors.json, runner.log, results.json (and pylibs.log: the
# model libraries' wheels carried with --carry-libs, installed ahead of the device's own).
#
# Environment: BENCH_DIR (.dev/bench), OUT, WORK (/tmp/kiln_bench), MODELS (the configs the
# manifest holds, i.e. those exported; or e.g. "bert,mlp_b1", "all": the eight benchmark models), BUDGET_S (450: the whole script; torch.compile runs that would overrun it are
# skipped), ITERS (200) and WARMUP (20) for kiln_runner, ANCHOR_ARGS (extra anchors_device.py
# arguments, e.g. "--no-compile" or "--compile-models resnet50"), HOST_IO (1: also run the host I/O
# program), TOLERANCE (5e-2: kiln_runner's check, relative to the output's largest |reference|),
# RUNNER_DEVICE (cuda:0; "cpu" with ANCHOR_ARGS=--dry-run tests the script without a GPU).
set -uo pipefail

root=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$root" || exit 1
BENCH_DIR=${BENCH_DIR:-.dev/bench}
OUT=${OUT:-$BENCH_DIR/out}
WORK=${WORK:-/tmp/kiln_bench}
MODELS=${MODELS:-}
BUDGET_S=${BUDGET_S:-450}
ITERS=${ITERS:-200}
WARMUP=${WARMUP:-20}
ANCHOR_ARGS=${ANCHOR_ARGS:-}
HOST_IO=${HOST_IO:-1}
RUNNER_RESERVE_S=${RUNNER_RESERVE_S:-90}
TOLERANCE=${TOLERANCE:-5e-2}
RUNNER_DEVICE=${RUNNER_DEVICE:-cuda:0}
mkdir -p "$OUT" "$WORK"
# inputs left by an earlier run would be measured as if this run's anchors had written them
rm -f "$WORK"/*.inputs.bin "$WORK"/*.expected.bin "$WORK"/*.ptd
export PYTHONUNBUFFERED=1

main() {
  local t0=$SECONDS
  [[ -f $BENCH_DIR/manifest.json ]] || {
    echo "run_device: $BENCH_DIR/manifest.json is missing: run bench/export_here.py here first and carry $BENCH_DIR" >&2
    return 1
  }
  if [[ -z $MODELS ]]; then # every config exported into BENCH_DIR
    MODELS=$(python3 -c 'import json, sys; print(",".join(sorted(json.load(open(sys.argv[1]))["models"])))' \
      "$BENCH_DIR/manifest.json") || return 1
  fi
  echo "=== bench/run_device.sh: $(date -u +%FT%TZ), models=$MODELS, budget ${BUDGET_S}s"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,power.draw,temperature.gpu \
    --format=csv 2>&1 | head -3

  local lib
  lib="$(cd "$BENCH_DIR" && pwd -P)/lib"
  if [[ -f $lib/libkiln.so ]]; then
    export KILN_LIBRARY="$lib/libkiln.so"
    # The same libkiln for the C API path and for kiln_runner (same SONAME: it takes precedence
    # over the runner bundle's copy), and the one the export used (manifest: libkiln_sha256).
    export LD_LIBRARY_PATH="$lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    if [[ -f $lib/libkiln_cuda.so ]]; then
      export KILN_CUDA_PLUGIN="$lib/libkiln_cuda.so"
    else
      echo "run_device: WARNING: no $lib/libkiln_cuda.so: Kiln cannot use the GPU" >&2
    fi
    python3 - "$lib/libkiln.so" "$BENCH_DIR/manifest.json" <<'EOF'
import hashlib, json, sys
want = json.load(open(sys.argv[2])).get("libkiln_sha256")
got = hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest()
print("run_device: libkiln", "is the exporting one" if got == want else
      f"DIFFERS from the exporting one ({got[:12]} vs {str(want)[:12]}): engine rebuilds will be checked")
EOF
  else
    echo "run_device: WARNING: no $lib/libkiln.so: Kiln is not run (anchors only)" >&2
    ANCHOR_ARGS="$ANCHOR_ARGS --systems eager,graph,compile --no-runner-io"
  fi

  # The model libraries' wheels carried from the export (export_here.py --carry-libs), ahead of
  # the device's own: the same parameter names, so the weights regenerate as exported. Left out,
  # with a warning, when they do not install or import here.
  if compgen -G "$BENCH_DIR/pylibs/*.whl" >/dev/null; then
    local pyl="$WORK/pylibs"
    rm -rf "$pyl"
    if python3 -m pip install -q --no-deps --no-index --target "$pyl" "$BENCH_DIR"/pylibs/*.whl \
      >"$OUT/pylibs.log" 2>&1 &&
      PYTHONPATH="$pyl${PYTHONPATH:+:$PYTHONPATH}" python3 -c \
        'import importlib, sys; [importlib.import_module(n) for n in ("timm", "transformers")]' \
        >>"$OUT/pylibs.log" 2>&1; then
      export PYTHONPATH="$pyl${PYTHONPATH:+:$PYTHONPATH}"
      echo "run_device: the export's model libraries: $(cd "$BENCH_DIR/pylibs" && echo *.whl)"
    else
      echo "run_device: WARNING: the carried model libraries did not install or import (pylibs.log): the device's own are used" >&2
    fi
  fi

  # 1. anchors + Kiln's C API
  local budget=$((BUDGET_S - RUNNER_RESERVE_S - (SECONDS - t0)))
  if ((budget < 30)); then # BUDGET_S under RUNNER_RESERVE_S would leave the anchors nothing
    echo "run_device: WARNING: ${budget}s left for the anchors (BUDGET_S ${BUDGET_S}, RUNNER_RESERVE_S ${RUNNER_RESERVE_S}): given 30s; raise BUDGET_S or lower RUNNER_RESERVE_S" >&2
    budget=30
  fi
  echo "=== anchors (budget ${budget}s)"
  # shellcheck disable=SC2086
  timeout --kill-after=15 $((budget + 60)) python3 bench/anchors_device.py --out "$OUT" \
    --bench-dir "$BENCH_DIR" --workdir "$WORK" --models "$MODELS" --budget-s "$budget" $ANCHOR_ARGS
  echo "=== anchors exit status $? after $((SECONDS - t0))s"

  # 2. kiln_runner through ExecuTorch
  local runner="$BENCH_DIR/runner/kiln_runner" log="$OUT/runner.log"
  : >"$log"
  if [[ -x $runner ]]; then
    local cfgs
    cfgs=$(python3 -c "import json,sys; print(' '.join(json.load(open(sys.argv[1]))['models']))" \
      "$BENCH_DIR/manifest.json")
    for cfg in $cfgs; do
      [[ -f $WORK/$cfg.ptd && -f $WORK/$cfg.inputs.bin ]] || continue
      local variants=(devio)
      ((HOST_IO)) && variants+=(host)
      for v in "${variants[@]}"; do
        if ((SECONDS - t0 > BUDGET_S)); then
          echo "run_device: budget spent: kiln_runner $cfg $v skipped"
          continue
        fi
        local pte="$BENCH_DIR/models/$cfg.pte" extra=()
        if [[ $v == devio ]]; then
          pte="$BENCH_DIR/models/$cfg.devio.pte"
          extra=(--device-io)
        fi
        local t1=$SECONDS rc
        {
          echo "=== runner $cfg $v"
          timeout --kill-after=5 90 "$runner" --model "$pte" --data "$WORK/$cfg.ptd" \
            --inputs "$WORK/$cfg.inputs.bin" --expected "$WORK/$cfg.expected.bin" \
            --tolerance "$TOLERANCE" --max-relative --iterations "$ITERS" --warmup "$WARMUP" \
            --option device="$RUNNER_DEVICE" --save-outputs "$WORK/$cfg.et_$v.bin" "${extra[@]}" 2>&1
          rc=$?
          echo "=== end rc=$rc s=$((SECONDS - t1))"
        } >>"$log"
        echo "kiln_runner $cfg $v: $(grep -E 'median_ms|error' "$log" | tail -1)"
      done
    done
  else
    echo "run_device: no $runner: the ExecuTorch path is not run"
  fi

  # 2b. A/B against another build's libraries (same runner, engines and inputs)
  if [[ -n ${AB_LIB:-} && -x $runner ]]; then
    ab_runs "$runner" "$t0"
  fi

  # 3. report
  echo "=== report ($((SECONDS - t0))s)"
  python3 bench/report.py --out "$OUT" --workdir "$WORK" --markdown
}

# ab_runs RUNNER T0: the --device-io program of each model with this build's libraries ("new")
# and AB_LIB's ("old"), alternating, AB_ROUNDS rounds; the medians as AB lines.
ab_runs() {
  local runner=$1 t0=$2 log="$OUT/runner_ab.log" ab
  ab=$(cd "$AB_LIB" && pwd -P)
  : >"$log"
  local cfgs
  cfgs=$(python3 -c "import json,sys; print(' '.join(json.load(open(sys.argv[1]))['models']))" \
    "$BENCH_DIR/manifest.json")
  for cfg in $cfgs; do
    [[ -f $WORK/$cfg.ptd && -f $WORK/$cfg.inputs.bin ]] || continue
    local new_ms=() old_ms=()
    for ((r = 0; r < ${AB_ROUNDS:-2}; r++)); do
      for which in new old; do
        if ((SECONDS - t0 > BUDGET_S + ${AB_EXTRA_S:-120})); then
          echo "run_device: A/B budget spent at $cfg"
          break 3
        fi
        local env=() out
        if [[ $which == old ]]; then
          env=(LD_LIBRARY_PATH="$ab:$LD_LIBRARY_PATH" KILN_CUDA_PLUGIN="$ab/libkiln_cuda.so")
        fi
        out=$(env "${env[@]}" timeout --kill-after=5 90 "$runner" \
          --model "$BENCH_DIR/models/$cfg.devio.pte" --data "$WORK/$cfg.ptd" \
          --inputs "$WORK/$cfg.inputs.bin" --expected "$WORK/$cfg.expected.bin" \
          --tolerance "$TOLERANCE" --max-relative --iterations "$ITERS" --warmup "$WARMUP" \
          --option device="$RUNNER_DEVICE" --device-io 2>&1)
        echo "=== ab $cfg $which round $r" >>"$log"
        echo "$out" >>"$log"
        local ms
        ms=$(echo "$out" | grep -oE 'median_ms[^0-9]*[0-9.]+' | grep -oE '[0-9.]+$' | tail -1)
        if [[ $which == new ]]; then new_ms+=("${ms:-nan}"); else old_ms+=("${ms:-nan}"); fi
      done
    done
    python3 - "$cfg" "${new_ms[*]}" "${old_ms[*]}" <<'PY' | tee -a "$log"
import statistics, sys
def med(t):
    v = [float(x) for x in t.split() if x not in ("", "nan")]
    return statistics.median(v) if v else float("nan")
n, o = med(sys.argv[2]), med(sys.argv[3])
print(f"AB {sys.argv[1]} new {n:.4f} ms old {o:.4f} ms new/old {n / o if o == o and o > 0 else float('nan'):.3f}"
      f" (rounds new {sys.argv[2]} old {sys.argv[3]})")
PY
  done
}

main 2>&1 | tee "$OUT/run.log"
