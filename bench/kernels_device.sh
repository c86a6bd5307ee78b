#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Kernel-by-kernel times of benchmark models on the GPU machine (docs/benchmarks.md, round 11):
# Kiln's kernels of one execute through ExecuTorch (kiln_runner under Nsight Compute: each kernel
# alone, `gpu__time_duration`) beside PyTorch's kernels inside its CUDA-graph replay
# (bench/profile_torch.py: torch.profiler).
#
#   run(command="MODELS=encoder_b1,mlp_b64 bash bench/kernels_device.sh", carry=[".dev/bench"])
#
# .dev/bench as bench/run_device.sh needs it (exported here, lib/ with libkiln.so and
# libkiln_cuda.so). First run_device.sh rebuilds the inputs and weights on this machine (graph
# anchor only, no torch.compile), then each model's last execute is profiled. MODELS: bench
# configs (mlp_b1, mlp_b64, bert_b1, bert_b8, encoder_b1 have a PyTorch counterpart in
# profile_torch.py). Files in $OUT: anchors/ (run_device.sh), ncu_<model>.csv, kernels.log.
# GEMM algorithms: under Nsight Compute every kernel is replayed and takes milliseconds, so the
# plugin's candidate timing at context creation means nothing there and its picks are arbitrary.
# The ncu pass therefore runs with KILN_CUDA_TUNE=0 (cuBLASLt's heuristic first choice,
# deterministic; the small-M wgmma kernel is then not used, where a plain run may pick it for a
# layer: its "linear m=" line says so), and a plain run before it logs the algorithms a normal
# run tunes to, with their timed microseconds ("layer N (linear): cublaslt, algo ... candidate i
# of n (x us)" lines in
# kernels.log). Attention
# likewise under ncu (cuDNN's fused attention wherever it accepts the
# shapes, its heuristic's first engine configuration); the plain run logs the timed choice
# ("sdpa at layer ...: cuDNN x us, Kiln's kernel y us").
set -uo pipefail
root=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
BENCH_DIR=${BENCH_DIR:-$root/.dev/bench}
OUT=${OUT:-$BENCH_DIR/out}
WORK=${WORK:-/tmp/kiln_bench}
MODELS=${MODELS:-encoder_b1,mlp_b64}
mkdir -p "$OUT"
log="$OUT/kernels.log"
MODELS=$MODELS ANCHOR_ARGS="--no-compile --systems graph" HOST_IO=0 BUDGET_S=${BUDGET_S:-150} \
  OUT="$OUT/anchors" WORK="$WORK" BENCH_DIR="$BENCH_DIR" bash "$root/bench/run_device.sh" \
  >"$OUT/anchors.log" 2>&1 || echo "kernels_device: run_device.sh failed (see $OUT/anchors.log)" | tee -a "$log"
lib="$BENCH_DIR/lib"
export KILN_LIBRARY="$lib/libkiln.so" KILN_CUDA_PLUGIN="$lib/libkiln_cuda.so"
export LD_LIBRARY_PATH="$lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
IFS=',' read -r -a models <<<"$MODELS"
for m in "${models[@]}"; do
  echo "== Kiln $m: GEMM algorithms a plain run tunes to (timed inside a CUDA graph)" | tee -a "$log"
  KILN_LOG_LEVEL=info timeout 120 "$BENCH_DIR/runner/kiln_runner" \
    --model "$BENCH_DIR/models/$m.devio.pte" --data "$WORK/$m.ptd" --inputs "$WORK/$m.inputs.bin" \
    --iterations 200 --warmup 20 --option device=cuda:0 --device-io 2>&1 |
    grep -E "gemm m=|linear m=|sdpa at|median_ms" | sed 's/.*Kiln: //' | tee -a "$log"
  echo "== Kiln $m: one execute through ExecuTorch, each kernel alone (Nsight Compute; GEMMs:" \
    "the heuristic's first choice)" | tee -a "$log"
  KILN_LOG_LEVEL=info KILN_CUDA_TUNE=0 timeout 300 ncu --clock-control none --cache-control none \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv "$BENCH_DIR/runner/kiln_runner" \
    --model "$BENCH_DIR/models/$m.devio.pte" --data "$WORK/$m.ptd" --inputs "$WORK/$m.inputs.bin" \
    --iterations 2 --warmup 1 --option device=cuda:0 --device-io \
    >"$OUT/ncu_$m.csv" 2>"$OUT/ncu_$m.err"
  python3 "$root/bench/kernels_table.py" "$OUT/ncu_$m.csv" "$OUT/ncu_$m.err" | tee -a "$log"
  case $m in
  encoder_b1) tm=encoder ;;
  bert_b1) tm=bert_layer ;;
  bert_b8) tm=bert_layer_b8 ;;
  mlp_b1 | mlp_b64) tm=$m ;;
  *) tm= ;;
  esac
  if [[ -n $tm ]]; then
    echo "== PyTorch $tm: kernels inside the CUDA-graph replay (torch.profiler)" | tee -a "$log"
    python3 "$root/bench/profile_torch.py" --model "$tm" --replays 50 2>&1 | grep -v Warn | tee -a "$log"
  fi
done
