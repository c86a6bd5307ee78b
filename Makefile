# Kiln's front door. CMake is the real build; these targets name the supported configurations.
#   make demo       the main job: export a model with Kiln and run it through ExecuTorch
#   make test       everything CI runs: lint, C tests, C tests under ASan+UBSan and under TSan,
#                   the CUDA plugin compiled and linked (where a CUDA toolkit is), Python tests
#   make cuda       the CUDA plugin and the GPU test programs (build-gpu/, .dev/gpu/; no GPU needed)
#   make            build libkiln, the CLI and the C tests (build/)
#   make ctest      C tests only (build/)
#   make asan       C tests under AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/)
#   make tsan       C tests under ThreadSanitizer (build-tsan/)
#   make pytest     install the Python packages into the venv and run python/tests
#   make install    build and install both Python distributions (kiln, kiln-executorch-runtime)
#   make wheels     build both wheels into dist/ (docs/packaging.md)
#   make manylinux  both wheels with manylinux tags into dist/ (auditwheel repair)
#   make fuzz       libFuzzer targets with clang (build-fuzz/)
#   make format     clang-format + ruff format in place;  make lint: check both
# The Python environment (pinned torch, executorch, cmake, pytest) is made by tools/setup_env.sh
# in ~/.cache/kiln/ (keyed by tools/pins.txt) on first use.
JOBS ?= $(shell nproc)
VENV = $(shell tools/setup_env.sh)
CMAKE ?= cmake

.PHONY: all build ctest asan tsan cuda test pytest install wheels manylinux demo fuzz format lint clean

all: build

build:
	$(CMAKE) -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo
	$(CMAKE) --build build -j $(JOBS)

ctest: build
	cd build && ctest --output-on-failure -j $(JOBS)

asan:
	$(CMAKE) -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKILN_SANITIZE=ON
	$(CMAKE) --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
		ctest --output-on-failure -j $(JOBS)

# ThreadSanitizer over every C test (the threaded ones: engine_test's concurrent executes and
# rebinding, thread_stream_test); a report fails the test (halt_on_error).
tsan:
	$(CMAKE) -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_TSAN=ON
	$(CMAKE) --build build-tsan -j $(JOBS)
	cd build-tsan && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
		ctest --output-on-failure -j $(JOBS)

# Both distributions, built by tools/build_wheels.sh (pip wheel --no-build-isolation --no-deps
# with the venv; CMake build folders kept under build/wheel/) and installed from those wheels.
install:
	@venv="$(VENV)"; tools/build_wheels.sh "$$venv/bin/python" install

WHEEL_DIR ?= dist
wheels:
	@venv="$(VENV)"; tools/build_wheels.sh "$$venv/bin/python" wheels "$(WHEEL_DIR)"
	@ls -1 $(WHEEL_DIR)/*.whl

# The two wheels repaired to manylinux tags (auditwheel; ExecuTorch and CUDA libraries excluded).
manylinux:
	@venv="$(VENV)"; tools/build_wheels.sh "$$venv/bin/python" manylinux "$(WHEEL_DIR)"
	@ls -1 $(WHEEL_DIR)/*manylinux*.whl

pytest: install
	@venv="$(VENV)"; cd python/tests && "$$venv/bin/python" -m pytest -q -p no:cacheprovider .

demo: install
	@venv="$(VENV)"; "$$venv/bin/python" examples/export_and_run.py

# The CUDA plugin (every .cu file, warnings as errors, sm_90 + PTX) and the GPU test programs,
# compiled and linked without a GPU, their cases dry-run against the CPU reference:
# tools/gpu_suite.sh --prepare (build-gpu/; .dev/gpu/ is what the H200 run carries). Where no
# CUDA toolkit is installed it says so and builds nothing.
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
cuda:
	@if [ -z "$(NVCC)" ]; then \
		echo "make cuda: no CUDA toolkit (nvcc) found: the CUDA plugin is not compiled" \
			"(install the CUDA 13 toolkit to build it)"; \
	else \
		PATH="$$(dirname "$(NVCC)"):$$PATH" CMAKE="$(CMAKE)" JOBS=$(JOBS) tools/gpu_suite.sh --prepare; \
	fi

test: lint ctest asan tsan cuda pytest

fuzz:
	CC=clang $(CMAKE) -S . -B build-fuzz -DKILN_FUZZ=ON -DCMAKE_BUILD_TYPE=Debug
	$(CMAKE) --build build-fuzz -j $(JOBS)

format:
	clang-format -i $$(git ls-files '*.c' '*.h' '*.cpp' '*.cu' '*.cuh')
	@venv="$(VENV)"; "$$venv/bin/ruff" format python examples bench tools

lint:
	clang-format --dry-run -Werror $$(git ls-files '*.c' '*.h' '*.cpp' '*.cu' '*.cuh')
	@venv="$(VENV)"; "$$venv/bin/ruff" check python examples && \
		"$$venv/bin/ruff" format --check python examples

clean:
	rm -rf build build-asan build-tsan build-fuzz
