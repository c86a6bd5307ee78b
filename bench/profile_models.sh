#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Per-layer GPU profile of the exported benchmark models through ExecuTorch, on the H200:
#
#   run(command="bash bench/profile_models.sh", carry=[".dev/bench"])
#
# Rebuilds each model's .ptd and inputs (bench/anchors_device.py with the Kiln system only, one
# short round), then runs kiln_runner --device-io with the option profile (KILN_PROFILE=1, docs/options.md): the
# mean GPU time of every launched layer, logged when the runner frees the context.
# MODELS: configs (default: all); ITERS: profiled executes (default 10); PROFILE_US: the delay
# ahead of each layer (default 100; cuDNN convolutions need ~3000, their host set-up is long).
set -uo pipefail
root=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$root" || exit 1
BENCH_DIR=${BENCH_DIR:-.dev/bench}
WORK=${WORK:-/tmp/kiln_bench}
OUT=${OUT:-$BENCH_DIR/out}
MODELS=${MODELS:-all}
mkdir -p "$OUT" "$WORK"
lib="$(cd "$BENCH_DIR" && pwd -P)/lib"
export KILN_LIBRARY="$lib/libkiln.so" KILN_CUDA_PLUGIN="$lib/libkiln_cuda.so"
export LD_LIBRARY_PATH="$lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
python3 bench/anchors_device.py --out "$OUT/profile_anchors" --bench-dir "$BENCH_DIR" --workdir "$WORK" \
  --models "$MODELS" --systems kiln --rounds 1 --calls 5 --warmup 2 --no-compile >"$OUT/profile_anchors.log" 2>&1 ||
  { tail -20 "$OUT/profile_anchors.log"; exit 1; }
for pte in "$BENCH_DIR"/models/*.devio.pte; do
  cfg=$(basename "$pte" .devio.pte)
  [[ -f $WORK/$cfg.ptd ]] || continue
  echo "=== $cfg"
  KILN_PROFILE=1 KILN_CUDA_PROFILE_DELAY_US="${PROFILE_US:-100}" KILN_LOG_LEVEL=info "$BENCH_DIR/runner/kiln_runner" --model "$pte" \
    --data "$WORK/$cfg.ptd" --inputs "$WORK/$cfg.inputs.bin" --iterations "${ITERS:-10}" --warmup 2 \
    --option device=cuda:0 --device-io 2>&1 | grep -E "CUDA profile|median_ms" | sed 's/^kiln info: CUDA profile: //'
done 2>&1 | tee "$OUT/profile_models.log"
# summary: GPU time per op (with its fused tail) and model
python3 - "$OUT/profile_models.log" <<'PY'
import re, sys, collections
cfg, agg, tot, mb = None, collections.OrderedDict(), {}, {}
for line in open(sys.argv[1]):
    if line.startswith("=== "):
        cfg = line.split()[1]; agg[cfg] = collections.Counter(); continue
    line = re.sub(r"^.*CUDA profile: ", "", line.strip())  # runner log prefixes, if any
    m = re.match(r"layer\s+\d+\s+(\S+)\s+(\+\S+)?\s*->\s+\S+\s+([\d.]+) us", line)
    if m and cfg:
        agg[cfg][m.group(1) + (m.group(2) or "")] += float(m.group(3))
        b = re.search(r"([\d.]+) MB", line)
        if b: mb[cfg] = mb.get(cfg, 0.0) + float(b.group(1))
    m = re.search(r"([\d.]+) us of GPU time per execute", line)
    if m and cfg: tot[cfg] = float(m.group(1))
for cfg, c in agg.items():
    us = tot.get(cfg, 0)
    moved = f", {mb[cfg]:.1f} MB moved ({mb[cfg] / us * 1e3:.0f} GB/s)" if us and cfg in mb else ""
    print(f"{cfg}: {us:.1f} us GPU per execute (layers timed alone){moved}: " +
          ", ".join(f"{k} {v:.1f}" for k, v in c.most_common(8)))
PY
