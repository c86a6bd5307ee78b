#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Per-layer GPU profile of Kiln's benchmark layers beside PyTorch's kernels, on the GPU machine:
#
#   run(command="bash tools/profile_device.sh", carry=[".dev/gpu"])
#
# Kiln: kiln_cuda_bench (built by tools/gpu_suite.sh --prepare) with the option profile, KILN_PROFILE=1 (graphs
# off, one event per layer, launches queued behind a delay kernel; docs/cuda.md), per-layer means
# logged at INFO. PyTorch: bench/profile_torch.py (the same layer in a CUDA graph, kernel times
# from torch.profiler). FILTERS: kiln_cuda_bench --filter values; TORCH_MODELS: profile_torch.py
# models; NCU=1 adds Nsight Compute kernel names and durations for the first filter.
set -uo pipefail
root=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
dev="$root/.dev/gpu"
out="${OUT:-$dev/logs}"
mkdir -p "$out"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cudnn=$(python3 -c "import nvidia.cudnn as m,os;print(os.path.join(list(m.__path__)[0],'lib'))" 2>/dev/null) &&
  export LD_LIBRARY_PATH="$cudnn:$LD_LIBRARY_PATH"
IFS=';' read -r -a filters <<<"${FILTERS:-encoder;bert-base layer s128 b1;bert-base layer s128 b8;mlp 1024-4096-4096-1024 b1}"
for f in "${filters[@]}"; do
  echo "=== kiln profile: $f"
  (cd "$dev" && KILN_CUDA_PLUGIN="$dev/libkiln_cuda.so" KILN_PROFILE=1 KILN_LOG_LEVEL=info \
    ./kiln_cuda_bench --filter "$f" --runs 50 2>&1 | grep -E "profile|BENCH|gemm|graph") | tee -a "$out/profile_kiln.log"
done
for m in ${TORCH_MODELS:-encoder bert_layer bert_layer_b8 mlp_b1}; do
  python3 "$root/bench/profile_torch.py" --model "$m" 2>&1 | tee -a "$out/profile_torch.log"
done
if [[ ${NCU:-0} == 1 ]] && command -v ncu >/dev/null; then
  (cd "$dev" && KILN_CUDA_PLUGIN="$dev/libkiln_cuda.so" timeout 240 ncu --clock-control none \
    --cache-control none --metrics gpu__time_duration.sum -c 40 --csv \
    ./kiln_cuda_bench --filter "${filters[0]}" --runs 10 >"$out/ncu.csv" 2>"$out/ncu.err")
  python3 - "$out/ncu.csv" <<'PY' | tee -a "$out/profile_kiln.log"
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if rows:
    h = rows[0]
    ki, vi = h.index("Kernel Name"), h.index("Metric Value")
    for r in rows[1:]:
        print(f"ncu {r[vi]:>10} ns  {r[ki][:120]}")
PY
fi
