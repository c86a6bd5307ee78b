#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Kiln's GPU suite, in two steps.
#
#   tools/gpu_suite.sh --prepare
#       Here, on a machine with the CUDA 13 toolkit (no GPU needed): configures and builds libkiln,
#       the CUDA plugin and the test programs (KILN_CUDA=ON, RelWithDebInfo, sm_90 + PTX) in
#       build-gpu/, checks that libkiln links no CUDA library, and copies what the GPU machine
#       needs into .dev/gpu/ (ignored by git; carry it).
#
#   tools/gpu_suite.sh --run
#       On the GPU machine (repository copied there, .dev/gpu carried; nothing is compiled):
#         1. nvidia-smi summary
#         2. kiln_cuda_smoke    shared libkiln finds the plugin beside it; device auto -> cuda:0
#         3. kiln_cuda_parity --ops   every op vs the CPU reference, every dtype, awkward shapes
#         4. kiln_cuda_parity --e2e   built graphs, cuda:0 vs cpu: host/device I/O, CUDA graphs
#                                     record/replay/re-record, caller's stream, graphs off; then
#                                     with a cold, a warm and a truncated tuning cache
#         5. the variants, each the e2e or op part again with options of the CUDA policy
#            (kiln_cuda_parity --option cuda.NAME=VALUE; docs/options.md): cuBLASLt and cuDNN off
#            (Kiln's own GEMM and conv kernels end to end), NHWC off, the small-M kernels without
#            programmatic dependent launch, the end of an execute through cudaStreamSynchronize
#            instead of the graph's flag, the stem models with the stem kernel off (cuDNN on a
#            channel-padded copy) and in its half and global gather modes, the GEMV models with
#            less L2 kept, the small-M wgmma linear forced (two configurations: it must run) and
#            off, the K split forced (2 slices: it must run) and off, the BERT models untuned
#            (cuDNN's fused attention runs every eligible sdpa, checked) and with cuDNN's
#            attention off, the linear cases with the GEMV off, and the tensor-core sdpa cases at
#            64-, 32- and 16-row CTAs and the split-key kernel with 2, 4 and 8 warps per row
#            block
#         6. kiln_cuda_parity --quick under compute-sanitizer --tool memcheck (if present)
#         7. kiln_cuda_bench: per-model latency (median of 200 executes, device I/O, CUDA
#            graphs) beside the PyTorch anchors; its BENCH lines are repeated in the summary;
#            kiln_launch_latency: a CUDA graph's launch plus the wait for its end, by how the
#            end is observed (bench/launch_latency.cu); kiln_stream_floor: the MLP b64's
#            memory floor (its three weights streamed without math, by access pattern) beside
#            the wgmma linear's configurations on the same weights (bench/stream_floor.cu)
#       Logs go to $OUT (or .dev/gpu/logs); a summary table is printed last. Exit status 0 only
#       when every step passed.
#
# Environment (--prepare): BUILD_DIR (default build-gpu), BUILD_TYPE (default RelWithDebInfo),
# JOBS (default 2), CMAKE (default cmake).
set -uo pipefail

root=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
dev="$root/.dev/gpu"

prepare() {
  set -e
  local build="${BUILD_DIR:-$root/build-gpu}" jobs="${JOBS:-2}" cmake="${CMAKE:-cmake}"
  "$cmake" -S "$root" -B "$build" -DKILN_CUDA=ON -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DKILN_BUILD_TESTS=ON
  "$cmake" --build "$build" -j "$jobs" --target kiln kiln_cuda kiln_cuda_parity kiln_cuda_smoke \
    kiln_cuda_bench kiln_launch_latency kiln_stream_floor
  # libkiln must load where CUDA is absent: no CUDA library among its dependencies.
  if readelf -d "$build"/libkiln.so | grep NEEDED | grep -Eqi 'cuda|cublas|cudnn'; then
    echo "gpu_suite: libkiln.so links a CUDA library:" >&2
    readelf -d "$build"/libkiln.so | grep NEEDED >&2
    exit 1
  fi
  rm -rf "$dev"
  mkdir -p "$dev"
  cp "$build"/kiln_cuda_parity "$build"/kiln_cuda_smoke "$build"/kiln_cuda_bench \
    "$build"/kiln_launch_latency "$build"/kiln_stream_floor "$build"/libkiln_cuda.so "$dev"/
  # The shared libkiln under every name the smoke program may ask for (real files, no links).
  for f in "$build"/libkiln.so*; do cp -L "$f" "$dev/$(basename "$f")"; done
  {
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)$(
      git -C "$root" status --porcelain 2>/dev/null | grep -q . && echo ' (dirty tree)')"
    echo "nvcc: $(nvcc --version 2>/dev/null | tail -1)"
    (cd "$dev" && sha256sum kiln_cuda_parity kiln_cuda_smoke kiln_cuda_bench kiln_launch_latency kiln_stream_floor \
      libkiln_cuda.so libkiln.so*)
  } >"$dev/MANIFEST"
  # A dry run here checks the test cases and the e2e graphs against the CPU reference.
  "$dev"/kiln_cuda_parity --dry >"$build/parity_dry.log" 2>&1 || {
    tail -20 "$build/parity_dry.log" >&2
    echo "gpu_suite: the dry run of the parity program failed (log: $build/parity_dry.log)" >&2
    exit 1
  }
  # The benchmark graphs build and run on the CPU (b1 shapes only: seconds).
  "$dev"/kiln_cuda_bench --dry --filter b1 >"$build/bench_dry.log" 2>&1 || {
    tail -20 "$build/bench_dry.log" >&2
    echo "gpu_suite: the dry run of the benchmark failed (log: $build/bench_dry.log)" >&2
    exit 1
  }
  echo "gpu_suite: prepared $(du -sh "$dev" | cut -f1) in .dev/gpu ($(tail -1 "$build/parity_dry.log") dry)"
  echo "gpu_suite: on the GPU machine run:  tools/gpu_suite.sh --run   (carry: .dev/gpu)"
}

# --- run

declare -a rows=()
fails=0

# step NAME LOG TIMEOUT CMD...: runs CMD with a time limit, records a summary row.
step() {
  local name=$1 log=$2 limit=$3
  shift 3
  local t0=$SECONDS rc
  echo "=== $name: $*" | tee "$log"
  timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1
  rc=$?
  local secs=$((SECONDS - t0))
  local counts
  counts=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -1)
  local status=PASS
  case $rc in
    0) ;;
    77) status=SKIP ;;
    124 | 137) status=TIMEOUT ;;
    *) status="FAIL(rc=$rc)" ;;
  esac
  [[ $status == PASS ]] || fails=$((fails + 1))
  rows+=("$(printf '%-38s %-10s %-24s %5ss' "$name" "$status" "${counts:--}" "$secs")")
  if [[ $status != PASS ]]; then
    grep -m 8 -E '^FAIL|CHECK failed|ERROR SUMMARY|error' "$log" | sed 's/^/    /'
  fi
  tail -3 "$log"
}

run() {
  local out="${OUT:-$dev/logs}"
  mkdir -p "$out"
  [[ -x $dev/kiln_cuda_parity ]] || {
    echo "gpu_suite: $dev/kiln_cuda_parity is missing: run tools/gpu_suite.sh --prepare first and carry .dev/gpu" >&2
    exit 1
  }
  cd "$dev" || exit 1
  export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export KILN_TEST_SEED="${KILN_TEST_SEED:-$(date +%s)}"
  echo "gpu_suite: KILN_TEST_SEED=$KILN_TEST_SEED"
  cat MANIFEST 2>/dev/null | head -3

  {
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,power.draw,temperature.gpu \
      --format=csv 2>&1 || echo "nvidia-smi failed"
    nvidia-smi 2>&1 | head -15
  } >"$out/nvidia-smi.txt"
  head -3 "$out/nvidia-smi.txt"

  KILN_SMOKE_REQUIRE_GPU=1 KILN_LOG_LEVEL=info \
    step "smoke (plugin beside libkiln)" "$out/smoke.log" 120 ./kiln_cuda_smoke
  KILN_CUDA_PLUGIN="$dev/libkiln_cuda.so" \
    step "parity: ops" "$out/parity_ops.log" 360 ./kiln_cuda_parity --ops
  KILN_CUDA_PLUGIN="$dev/libkiln_cuda.so" \
    step "parity: e2e" "$out/parity_e2e.log" 240 ./kiln_cuda_parity --e2e
  # The tuning cache: a cold run writes it, a warm run applies its records (the same parity
  # checks against the CPU reference), a damaged file is discarded and rewritten.
  local tc="$out/tuning_cache/t.kilncache"
  rm -rf "$out/tuning_cache"
  KILN_CUDA_PLUGIN="$dev/libkiln_cuda.so" KILN_LOG_LEVEL=info \
    step "parity: e2e, tuning cache cold" "$out/parity_e2e_tc_cold.log" 240 \
    bash -c "./kiln_cuda_parity --e2e --quick --option tuning_cache=$tc && test -s $tc"
  KILN_CUDA_PLUGIN="$dev/libkiln_cuda.so" KILN_LOG_LEVEL=info \
    step "parity: e2e, tuning cache warm" "$out/parity_e2e_tc_warm.log" 240 \
    bash -c "./kiln_cuda_parity --e2e --quick --option tuning_cache=$tc && grep -q 'from the tuning cache' $out/parity_e2e_tc_warm.log"
  head -c 200 "$tc" >"$tc.cut" && mv "$tc.cut" "$tc"
  KILN_CUDA_PLUGIN="$dev/libkiln_cuda.so" KILN_LOG_LEVEL=info \
    step "parity: e2e, tuning cache truncated" "$out/parity_e2e_tc_cut.log" 240 \
    bash -c "./kiln_cuda_parity --e2e --quick --option tuning_cache=$tc && grep -q 'discarded' $out/parity_e2e_tc_cut.log"
  KILN_CUDA_PLUGIN="$dev/libkiln_cuda.so" \
    step "parity: e2e, own GEMM+conv" "$out/parity_e2e_own_gemm.log" 180 \
    ./kiln_cuda_parity --e2e --quick --option cuda.cublaslt=false --option cuda.cudnn=false
  KILN_CUDA_PLUGIN="$dev/libkiln_cuda.so" \
    step "parity: e2e, NCHW convs (no NHWC)" "$out/parity_e2e_nchw.log" 180 \
    ./kiln_cuda_parity --e2e --quick --option cuda.nhwc=false
  KILN_CUDA_PLUGIN="$dev/libkiln_cuda.so" \
    step "parity: e2e, small-M without PDL" "$out/parity_e2e_nopdl.log" 180 \
    ./kiln_cuda_parity --e2e --quick --option cuda.pdl=false
  # The end of an execute through cudaStreamSynchronize instead of the graph's flag node.
  KILN_CUDA_PLUGIN="$dev/libkiln_cuda.so" \
    step "parity: e2e, stream synchronize" "$out/parity_e2e_noflag.log" 180 \
    ./kiln_cuda_parity --e2e --quick --option cuda.flag_wait=false
  KILN_CUDA_PLUGIN="$dev/libkiln_cuda.so" \
    step "parity: e2e stems, stem kernel off" "$out/parity_e2e_nostem.log" 120 \
    ./kiln_cuda_parity --e2e --filter stems --option cuda.stem_kernel=false
  for gather in half global; do
    KILN_CUDA_PLUGIN="$dev/libkiln_cuda.so" \
      step "parity: e2e stems, $gather gather" "$out/parity_e2e_stem_$gather.log" 120 \
      ./kiln_cuda_parity --e2e --filter stems --option cuda.stem_gather=$gather
  done
  for pct in 1 0; do # the GEMV weights' L2 plan: the second kept in part, then both streamed
    KILN_CUDA_PLUGIN="$dev/libkiln_cuda.so" \
      step "parity: e2e gemv, L2 keep $pct%" "$out/parity_e2e_l2_$pct.log" 120 \
      ./kiln_cuda_parity --e2e --filter gemv --option cuda.l2_keep_pct=$pct
  done
  KILN_CUDA_PLUGIN="$dev/libkiln_cuda.so" \
    step "parity: e2e bert, untuned (cuDNN sdpa)" "$out/parity_e2e_dnn_sdpa.log" 120 \
    ./kiln_cuda_parity --e2e --filter bert --option cuda.tune=false
  KILN_CUDA_PLUGIN="$dev/libkiln_cuda.so" \
    step "parity: e2e bert, Kiln's sdpa (no cuDNN)" "$out/parity_e2e_own_sdpa.log" 120 \
    ./kiln_cuda_parity --e2e --filter bert --option cuda.cudnn_sdpa=false
  KILN_CUDA_PLUGIN="$dev/libkiln_cuda.so" \
    step "parity: linears, GEMV off (cuBLASLt)" "$out/parity_linear_lt.log" 120 \
    ./kiln_cuda_parity --ops --filter linear --option cuda.gemv=false
  # The small-M wgmma linear end to end (graphs, re-records, I/O pointer changes) in two forced
  # configurations (a cluster of 2; clusters of 4 at 2 CTAs per SM), and switched off.
  for cfg in 128,2,1 64,4,2; do
    KILN_CUDA_PLUGIN="$dev/libkiln_cuda.so" \
      step "parity: e2e, wgmma linear $cfg" "$out/parity_e2e_wg_${cfg//,/_}.log" 180 \
      ./kiln_cuda_parity --e2e --quick --option cuda.wgmma_config=$cfg
  done
  KILN_CUDA_PLUGIN="$dev/libkiln_cuda.so" \
    step "parity: e2e, wgmma linear off" "$out/parity_e2e_nowg.log" 180 \
    ./kiln_cuda_parity --e2e --quick --option cuda.wgmma=false
  # The K split (a batched cuBLASLt GEMM over K slices + the reduce kernel) end to end, forced on
  # every linear it can take (2 slices: it must run), and switched off.
  KILN_CUDA_PLUGIN="$dev/libkiln_cuda.so" \
    step "parity: e2e, K split x2 (forced)" "$out/parity_e2e_sk2.log" 180 \
    ./kiln_cuda_parity --e2e --quick --option cuda.splitk=2
  KILN_CUDA_PLUGIN="$dev/libkiln_cuda.so" \
    step "parity: e2e, K split off" "$out/parity_e2e_sk0.log" 180 \
    ./kiln_cuda_parity --e2e --quick --option cuda.splitk=off
  # The tensor-core sdpa at each CTA size (by default the occupancy rule picks 16/32/64 rows).
  KILN_CUDA_PLUGIN="$dev/libkiln_cuda.so" \
    step "parity: tc sdpa, 64-row CTAs" "$out/parity_tc64.log" 120 \
    ./kiln_cuda_parity --ops --filter tc: --option cuda.sdpa_rows=64
  KILN_CUDA_PLUGIN="$dev/libkiln_cuda.so" \
    step "parity: tc sdpa, 32-row CTAs" "$out/parity_tc32.log" 120 \
    ./kiln_cuda_parity --ops --filter tc: --option cuda.sdpa_rows=32
  KILN_CUDA_PLUGIN="$dev/libkiln_cuda.so" \
    step "parity: tc sdpa, 16-row CTAs" "$out/parity_tc16.log" 120 \
    ./kiln_cuda_parity --ops --filter tc: --option cuda.sdpa_rows=16
  # ... and the split-key kernel at each warp count (by default the residency rule picks it)
  for ns in 2 4 8; do
    KILN_CUDA_PLUGIN="$dev/libkiln_cuda.so" \
      step "parity: tc sdpa, split x$ns" "$out/parity_split$ns.log" 120 \
      ./kiln_cuda_parity --ops --filter tc: --option cuda.sdpa_split=$ns
  done

  local sanitizer
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
  if [[ -n $sanitizer ]]; then
    KILN_CUDA_PLUGIN="$dev/libkiln_cuda.so" \
      step "memcheck: parity --quick" "$out/memcheck.log" 420 \
      "$sanitizer" --tool memcheck --error-exitcode 99 --print-limit 20 ./kiln_cuda_parity --quick
  else
    rows+=("$(printf '%-38s %-10s %-24s %5ss' "memcheck" "NOT RUN" "no compute-sanitizer" 0)")
  fi

  # KILN_LOG_LEVEL=info: the plugin logs each planned layer's kernel and decision (a conv2d's cuDNN
  # algorithm, a linear's cuBLASLt algorithm or small-M kernel), the engine's layout summary and
  # each graph's node count, under "== <model>".
  KILN_CUDA_PLUGIN="$dev/libkiln_cuda.so" KILN_LOG_LEVEL=info \
    step "bench: per-model latency" "$out/bench.log" 180 ./kiln_cuda_bench
  # The launch-and-wait floor under every execute (docs/cuda.md "The end of an execute").
  step "bench: graph launch and wait" "$out/launch_latency.log" 120 ./kiln_launch_latency
  # The MLP b64's memory floor beside the wgmma linear (docs/benchmarks.md round 18).
  step "bench: MLP b64 memory floor" "$out/stream_floor.log" 120 ./kiln_stream_floor

  echo
  echo "=== Kiln GPU suite: latency (median of 200 executes, fp16, device I/O, CUDA graphs)"
  grep '^BENCH' "$out/bench.log" 2>/dev/null || echo "(no BENCH lines: see $out/bench.log)"
  echo "--- graph nodes and conv algorithms per model (details: $out/bench.log)"
  grep -E '^== |CUDA graph instantiated|\(conv2d\): cudnn|NHWC: ' "$out/bench.log" 2>/dev/null |
    sed -E 's/^.*(CUDA graph instantiated|layer [0-9]+ \(conv2d\)|CUDA engine on)/  \1/' |
    awk '!seen[$0]++'
  echo "--- CUDA graph launch + wait for its end (median us; details: $out/launch_latency.log)"
  grep -E '^[0-9]+ kernel' "$out/launch_latency.log" 2>/dev/null || echo "(none)"
  echo "--- MLP b64: its weights streamed without math, then the wgmma linear (us; $out/stream_floor.log)"
  grep -E '^(tma2d|bulk1d|ldg|three|wgmma)' "$out/stream_floor.log" 2>/dev/null | cut -c1-200 || echo "(none)"
  echo
  echo "=== Kiln GPU suite summary (seed $KILN_TEST_SEED, logs in $out)"
  printf '%-38s %-10s %-24s %6s\n' step status checks time
  for r in "${rows[@]}"; do echo "$r"; done
  if ((fails == 0)); then echo "ALL PASSED"; else echo "$fails STEP(S) FAILED"; fi
  ((fails == 0))
}

case "${1:-}" in
  --prepare) prepare ;;
  --run) run ;;
  *)
    echo "usage: tools/gpu_suite.sh --prepare | --run" >&2
    exit 2
    ;;
esac
