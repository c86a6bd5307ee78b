#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds a self-contained kiln_runner folder: the runner plus every shared library it needs
# (libexecutorch.so, libexecutorch_kernels_optimized.so, libexecutorch_threadpool.so, libkiln.so,
# libkiln_executorch.so and, with CUDA, libkiln_cuda.so), RUNPATH $ORIGIN. The folder runs on a
# machine with neither Python nor ExecuTorch (e.g. the GPU box), given the CUDA 13 runtime
# libraries there (LD_LIBRARY_PATH or /usr/local/cuda/lib64) for a CUDA build.
#
#   examples/cpp/make_bundle.sh [OUT_DIR]        (default: build-bundle/bundle)
#
# Environment: KILN_CUDA=auto|ON|OFF (auto: ON when nvcc is found), JOBS (default 2),
# BUILD_DIR (default build-bundle). Kiln is built from this checkout (Release) and installed into
# BUILD_DIR/prefix; the runner is built against that prefix and the venv's executorch wheel.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(realpath -m "${BUILD_DIR:-$root/build-bundle}")
out=$(realpath -m "${1:-$build/bundle}")
jobs=${JOBS:-2}
venv=$("$root/tools/setup_env.sh" | tail -n 1)
cmake="$venv/bin/cmake"
ninja="$venv/bin/ninja"
purelib=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

cuda=${KILN_CUDA:-auto}
if [ "$cuda" = auto ]; then
    cuda=OFF
    if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then cuda=ON; fi
fi

echo "make_bundle: building Kiln (KILN_CUDA=$cuda) in $build/kiln" >&2
mkdir -p "$build" # (its configure log goes inside it, not beside it in the checkout)
"$cmake" -S "$root" -B "$build/kiln" -G Ninja -DCMAKE_MAKE_PROGRAM="$ninja" \
    -DCMAKE_BUILD_TYPE=Release -DKILN_EXECUTORCH=ON -DKILN_CUDA="$cuda" -DKILN_BUILD_TESTS=OFF \
    -DKILN_WERROR=OFF \
    -DCMAKE_PREFIX_PATH="$purelib" >"$build/kiln-configure.log" 2>&1 ||
    { cat "$build/kiln-configure.log" >&2; exit 1; }
"$cmake" --build "$build/kiln" -j "$jobs"
rm -rf "$build/prefix"
"$cmake" --install "$build/kiln" --prefix "$build/prefix" >/dev/null

echo "make_bundle: building kiln_runner in $build/runner" >&2
"$cmake" -S "$root/examples/cpp" -B "$build/runner" -G Ninja -DCMAKE_MAKE_PROGRAM="$ninja" \
    -DCMAKE_BUILD_TYPE=Release -DKILN_RUNNER_BUNDLE=ON \
    -DCMAKE_PREFIX_PATH="$build/prefix;$purelib/executorch/share/cmake" >/dev/null
"$cmake" --build "$build/runner" -j "$jobs"

if [ "$out" != "$build/runner/bundle" ]; then
    rm -rf "$out"
    mkdir -p "$(dirname "$out")"
    cp -r "$build/runner/bundle" "$out"
fi
echo "make_bundle: $out ($(du -sh "$out" | cut -f1)):" >&2
ls -l "$out" >&2
echo "run: $out/kiln_runner --model MODEL.pte [--inputs in.bin --expected out.bin]" \
    "--iterations 100 --warmup 10" >&2
echo "$out"
