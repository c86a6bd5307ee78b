#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Prepares the GPU check of the Kiln program C API with device pointers, here (no GPU needed):
#   1. builds tests/consumer/gpu/check_program_cuda.c against the INSTALLED kiln-executorch-runtime
#      wheel (find_package(Kiln) via `python -m kiln_executorch_runtime --cmake-prefix-path`;
#      `make install` installs the current wheels) in build-capi-gpu/;
#   2. exports the programs (export_cases.py: MLP and CNN, fp32 and fp16 Kiln precision, plus an
#      MLP with float16 inputs/outputs; each with I/O memory planning off (devio) and on) with
#      eager PyTorch's outputs;
#   3. bundles everything the GPU machine needs into .dev/capi/: bin/ (the checker, RUNPATH
#      $ORIGIN, beside libkiln.so + libkiln_cuda.so from build-gpu/ (a KILN_CUDA build: the plugin
#      and the libkiln it belongs with), the wheel's libkiln_executorch.so, and libexecutorch.so,
#      libexecutorch_kernels_optimized.so, libexecutorch_threadpool.so), cases/, MANIFEST;
#   4. runs the bundle here on the CPU: host pointers pass, device checks exit 77; and with
#      --fake-device (host memory labelled CUDA) the device-pointer bookkeeping paths run too.
# Then on the GPU machine: run(command="bash tests/consumer/gpu/run.sh", carry=[".dev/capi"]).
#
# Environment: KILN_VENV (default: tools/setup_env.sh's), GPU_BUILD (default build-gpu; built with
# tools/gpu_suite.sh --prepare when its libkiln_cuda.so is missing), BUILD_DIR (build-capi-gpu).
set -euo pipefail

root=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../../.." && pwd -P)
cd "$root"
venv=${KILN_VENV:-$("$root/tools/setup_env.sh" | tail -n 1)}
py="$venv/bin/python"
gpu_build=$(realpath -m "${GPU_BUILD:-$root/build-gpu}")
build=$(realpath -m "${BUILD_DIR:-$root/build-capi-gpu}")
dev="$root/.dev/capi"
export PATH="$venv/bin:$PATH"

if [[ ! -f $gpu_build/libkiln_cuda.so || ! -f $gpu_build/libkiln.so ]]; then
  echo "prepare: $gpu_build/libkiln_cuda.so is missing: running tools/gpu_suite.sh --prepare" >&2
  BUILD_DIR="$gpu_build" "$root/tools/gpu_suite.sh" --prepare
fi

prefix=$("$py" -m kiln_executorch_runtime --cmake-prefix-path)
wheel_lib=$("$py" -c 'import kiln_executorch_runtime as m, os; print(os.path.join(os.path.dirname(m.__file__), "lib"))')
et_lib=$("$py" -c 'import executorch as m, os; print(os.path.join(list(m.__path__)[0], "lib"))')

mkdir -p "$build"
echo "prepare: building check_program_cuda in $build (against $wheel_lib)" >&2
cmake -S "$root/tests/consumer/gpu" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" >"$build/configure.log" 2>&1 ||
  { cat "$build/configure.log" >&2; exit 1; }
cmake --build "$build" -j 2
if readelf -d "$build/check_program_cuda" | grep NEEDED | grep -qi cuda; then
  echo "prepare: check_program_cuda links a CUDA library" >&2
  exit 1
fi

rm -rf "$dev"
mkdir -p "$dev/bin"
echo "prepare: exporting the programs into $dev/cases" >&2
"$py" "$root/tests/consumer/gpu/export_cases.py" "$dev/cases" >"$build/export.log" 2>&1 ||
  { tail -30 "$build/export.log" >&2; exit 1; }

cp "$build/check_program_cuda" "$dev/bin/"
cp -L "$gpu_build/libkiln.so" "$gpu_build/libkiln_cuda.so" "$dev/bin/"
cp -L "$wheel_lib/libkiln_executorch.so" "$dev/bin/"
cp -L "$et_lib/libexecutorch.so" "$et_lib/libexecutorch_kernels_optimized.so" \
  "$et_lib/libexecutorch_threadpool.so" "$dev/bin/"
# Debug info is not needed on the device (build-gpu is RelWithDebInfo).
strip --strip-debug "$dev/bin/libkiln.so" "$dev/bin/libkiln_cuda.so" 2>/dev/null || true
# libkiln_executorch.so must find every libkiln symbol it uses in build-gpu's libkiln.
missing=$(comm -23 <(nm -D --undefined-only "$dev/bin/libkiln_executorch.so" | awk '{print $2}' | grep '^kiln' | sort) \
  <(nm -D --defined-only "$dev/bin/libkiln.so" | awk '{print $3}' | sort))
if [[ -n $missing ]]; then
  echo "prepare: $gpu_build/libkiln.so lacks symbols the wheel's delegate needs: $missing" >&2
  echo "prepare: rebuild it (tools/gpu_suite.sh --prepare) from the checkout the wheel was built from" >&2
  exit 1
fi
{
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)$(
    git -C "$root" status --porcelain 2>/dev/null | grep -q . && echo ' (dirty tree)')"
  echo "libkiln.so + libkiln_cuda.so: $gpu_build; libkiln_executorch.so: $wheel_lib; executorch: $et_lib"
  (cd "$dev/bin" && sha256sum ./*)
} >"$dev/MANIFEST"

echo "prepare: checking the bundle here (device=cpu)" >&2
env -u LD_LIBRARY_PATH "$dev/bin/check_program_cuda" "$dev/cases" --device cpu \
  >"$build/cpu.log" 2>&1 && rc=0 || rc=$?
tail -3 "$build/cpu.log" >&2
if [[ $rc -ne 77 && $rc -ne 0 ]]; then
  grep FAIL "$build/cpu.log" >&2 || true
  echo "prepare: the host-pointer checks failed (rc=$rc, log $build/cpu.log)" >&2
  exit 1
fi
env -u LD_LIBRARY_PATH "$dev/bin/check_program_cuda" "$dev/cases" --device cpu --fake-device \
  >"$build/fake.log" 2>&1 && rc=0 || rc=$?
tail -1 "$build/fake.log" >&2
echo "prepare: --fake-device run: rc=$rc (log $build/fake.log)" >&2
echo "prepare: $dev is $(du -sh "$dev" | cut -f1); on the GPU machine:" >&2
echo "  run(command=\"bash tests/consumer/gpu/run.sh\", carry=[\".dev/capi\"])" >&2
