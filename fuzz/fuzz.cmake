# SPDX-License-Identifier: Apache-2.0
# Fuzz targets: fuzz/<target>.c defines LLVMFuzzerTestOneInput; fuzz/corpus/<target>/ is its
# committed seed corpus (valid engines, interesting mutations, past crashers).
#
# Every build: <target>_replay (the target + fuzz/replay_main.c) and a ctest case
# <target>_corpus that runs the target over every corpus file, so the corpus is replayed by
# `ctest` (and under ASan+UBSan by `make asan`) without libFuzzer.
# KILN_FUZZ=ON (clang only; `make fuzz`): the library is instrumented
# (-fsanitize=fuzzer-no-link,address,undefined) and each target is also a libFuzzer binary:
#   build-fuzz/fuzz_load -max_len=65536 -timeout=10 -rss_limit_mb=2048 fuzz/corpus/fuzz_load
include_guard(GLOBAL)

set(KILN_FUZZ_TARGETS fuzz_load)
if(EXISTS ${CMAKE_CURRENT_LIST_DIR}/fuzz_build.c)
  list(APPEND KILN_FUZZ_TARGETS fuzz_build)
endif()
list(APPEND KILN_FUZZ_TARGETS fuzz_tune_cache)

if(KILN_FUZZ)
  if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "KILN_FUZZ needs clang (libFuzzer): configure with CC=clang (make fuzz)")
  endif()
  # KILN_FUZZ_SAN_EXTRA: appended sanitizer flags, e.g. "-fsanitize-recover=pointer-overflow"
  # together with UBSAN_OPTIONS=halt_on_error=1:suppressions=FILE to keep fuzzing past a known,
  # reported finding.
  set(KILN_FUZZ_SAN_EXTRA "" CACHE STRING "extra sanitizer flags for KILN_FUZZ builds")
  set(KILN_FUZZ_SAN -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
                    ${KILN_FUZZ_SAN_EXTRA})
  target_compile_options(kiln_objects PRIVATE -fsanitize=fuzzer-no-link ${KILN_FUZZ_SAN})
  target_link_options(kiln_objects INTERFACE -fsanitize=address,undefined)
endif()

foreach(target ${KILN_FUZZ_TARGETS})
  add_executable(${target}_replay fuzz/${target}.c fuzz/replay_main.c)
  target_compile_options(${target}_replay PRIVATE ${KILN_WARNINGS})
  target_include_directories(${target}_replay PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/tests)
  target_link_libraries(${target}_replay PRIVATE kiln_static)
  add_test(NAME ${target}_corpus
           COMMAND ${target}_replay ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/corpus/${target})
  if(KILN_FUZZ)
    add_executable(${target} fuzz/${target}.c)
    target_compile_options(${target} PRIVATE -fsanitize=fuzzer ${KILN_FUZZ_SAN} ${KILN_WARNINGS})
    target_include_directories(${target} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/tests)
    target_compile_definitions(${target} PRIVATE KILN_FUZZ_MUTATOR=1)
    target_link_options(${target} PRIVATE -fsanitize=fuzzer)
    target_link_libraries(${target} PRIVATE kiln_static)
  endif()
endforeach()

# fuzz_program: a .pte + .ptd through the C program API (libkiln_executorch.so), in builds with
# the delegate (KILN_EXECUTORCH). Its corpus is also replayed against the installed package by
# python/tests/test_untrusted.py (tests/consumer/files), so CI replays it without this build.
#   build-fuzz-et/fuzz_program -max_len=1048576 -timeout=20 -rss_limit_mb=4096 \
#       -malloc_limit_mb=1048576 CORPUS_COPY                       (docs/runtime.md, Fuzzing)
if(TARGET kiln_executorch)
  add_executable(fuzz_program_replay fuzz/fuzz_program.c fuzz/replay_main.c src/core/utf8.c)
  target_compile_options(fuzz_program_replay PRIVATE ${KILN_WARNINGS})
  target_include_directories(fuzz_program_replay PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
  kiln_executorch_program(fuzz_program_replay)
  # ExecuTorch's CPU kernels: seeds with an op outside the Kiln delegates (seed-linked) run too.
  if(KILN_EXECUTORCH_KERNELS_LIB)
    target_link_libraries(fuzz_program_replay PRIVATE "${KILN_EXECUTORCH_KERNELS_LIB}")
  endif()
  add_test(NAME fuzz_program_corpus
           COMMAND fuzz_program_replay ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/corpus/fuzz_program)
  if(KILN_FUZZ)
    target_compile_options(kiln_executorch PRIVATE -fsanitize=fuzzer-no-link ${KILN_FUZZ_SAN})
    target_link_options(kiln_executorch PRIVATE -fsanitize=address,undefined)
    add_executable(fuzz_program fuzz/fuzz_program.c src/core/utf8.c)
    target_compile_options(fuzz_program PRIVATE -fsanitize=fuzzer ${KILN_FUZZ_SAN} ${KILN_WARNINGS})
    target_include_directories(fuzz_program PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
    target_compile_definitions(fuzz_program PRIVATE KILN_FUZZ_MUTATOR=1)
    # The delegate is C++: its UBSan checks need the sanitizers' C++ runtime parts too.
    target_link_options(fuzz_program PRIVATE -fsanitize=fuzzer -fsanitize-link-c++-runtime
                        -lstdc++)
    kiln_executorch_program(fuzz_program)
    if(KILN_EXECUTORCH_KERNELS_LIB)
      target_link_libraries(fuzz_program PRIVATE "${KILN_EXECUTORCH_KERNELS_LIB}")
    endif()
  endif()
endif()

# Seed-corpus generator (writes valid engines and targeted mutations): not a test.
#   build/gen_corpus fuzz/corpus
add_executable(gen_corpus fuzz/gen_corpus.c)
target_compile_options(gen_corpus PRIVATE ${KILN_WARNINGS})
target_include_directories(gen_corpus PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/tests)
target_link_libraries(gen_corpus PRIVATE kiln_static)

# `kiln inspect` over the corpus: valid engines print (text and JSON), invalid ones fail with a
# message naming the field.
foreach(fx mlp conv external chain)
  add_test(NAME kiln_inspect_${fx}
           COMMAND kiln_cli inspect ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/corpus/fuzz_load/${fx}-valid.kiln)
  add_test(NAME kiln_inspect_${fx}_json
           COMMAND kiln_cli inspect ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/corpus/fuzz_load/${fx}-valid.kiln
                   --json)
  set_tests_properties(kiln_inspect_${fx}_json PROPERTIES
                       PASS_REGULAR_EXPRESSION "\"format_version\":1,")
endforeach()
add_test(NAME kiln_inspect_invalid
         COMMAND kiln_cli inspect ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/corpus/fuzz_load/conv-dtype9.kiln)
set_tests_properties(kiln_inspect_invalid PROPERTIES WILL_FAIL TRUE)

# Engine strings that are not UTF-8 text (a control byte in a weight name; committed fuzz inputs):
# refused at load, so `kiln inspect` prints the loader's message, never the raw bytes.
foreach(fmt text json)
  set(args)
  if(fmt STREQUAL "json")
    set(args --json)
  endif()
  add_test(NAME kiln_inspect_bad_text_${fmt}
           COMMAND kiln_cli inspect
                   ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/corpus/fuzz_load/c2220e50842f2f4ca4c8fe58c2fef101ffc63e14
                   ${args})
  set_tests_properties(kiln_inspect_bad_text_${fmt} PROPERTIES
                       PASS_REGULAR_EXPRESSION "is not UTF-8 text: byte 0x01 at offset 13 is a control character")
endforeach()
