# Kiln's front door. CMake is the real build; these targets name the supported configurations.
#   make            build libkiln, the CLI and the C tests (build/)
#   make test       everything CI runs: C tests, the same under ASan+UBSan, Python tests
#   make ctest      C tests only (build/)
#   make asan       C tests under AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/)
#   make fuzz       libFuzzer targets with clang (build-fuzz/)
#   make format     clang-format every C source in place;  make lint: check formatting + ruff
JOBS ?= $(shell nproc)
CMAKE ?= cmake

.PHONY: all build ctest asan test fuzz format lint clean

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

fuzz:
	CC=clang $(CMAKE) -S . -B build-fuzz -DKILN_FUZZ=ON -DCMAKE_BUILD_TYPE=Debug
	$(CMAKE) --build build-fuzz -j $(JOBS)

test: ctest asan

format:
	clang-format -i $$(git ls-files '*.c' '*.h' '*.cpp' '*.cu' '*.cuh')

lint:
	clang-format --dry-run -Werror $$(git ls-files '*.c' '*.h' '*.cpp' '*.cu' '*.cuh')

clean:
	rm -rf build build-asan build-fuzz
