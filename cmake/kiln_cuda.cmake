# SPDX-License-Identifier: Apache-2.0
# The CUDA backend (KILN_CUDA=ON; included by CMakeLists.txt). Builds:
#   libkiln_cuda.so    the plugin libkiln dlopen()s at run time (src/runtime/backend_cuda.c);
#                      libkiln itself never links a CUDA library
#   kiln_cuda_parity   every op against the CPU reference, plus the end-to-end checks through the
#                      public API (tests/cuda/cuda_parity.c); exits 77 (ctest: skipped) without a GPU
#   kiln_cuda_smoke    links the shared libkiln and finds the plugin beside it (dladdr), as an
#                      installed program would
# Code: sm_90 machine code plus compute_90 PTX (CMAKE_CUDA_ARCHITECTURES=90), -lineinfo (not in
# wheel builds, KILN_DIST).
# The plugin's RUNPATH finds the CUDA 13 libraries that the nvidia pip wheels (torch,
# executorch) install beside the Kiln package, before the system's.

if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 90)
endif()
if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
endif()
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)

set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)

file(GLOB KILN_CUDA_SOURCES CONFIGURE_DEPENDS src/cuda/*.c src/cuda/*.cu)
# The small-M linear's warpgroup MMAs (wgmma) exist only in sm_90a code: that file is built for
# sm_90a SASS (plus compute_90 PTX, where its kernel body is empty and the host never picks it).
list(FILTER KILN_CUDA_SOURCES EXCLUDE REGEX "op_linear_wg[.]cu$")

# Then the toolkit this was built with and the usual system location, as a last resort.
set(KILN_CUDA_RPATH
    "$ORIGIN"
    "$ORIGIN/../nvidia/cu13/lib"
    "$ORIGIN/../../nvidia/cu13/lib"
    "$ORIGIN/../nvidia/cudnn/lib"
    "$ORIGIN/../../nvidia/cudnn/lib"
    "${CUDAToolkit_LIBRARY_DIR}")
if(NOT CUDAToolkit_LIBRARY_DIR STREQUAL "/usr/local/cuda/lib64")
  list(APPEND KILN_CUDA_RPATH "/usr/local/cuda/lib64")
endif()
if(KILN_DIST)
  # A wheel carries no absolute path: only the $ORIGIN entries (the nvidia wheels), then the
  # system's search (ldconfig, LD_LIBRARY_PATH) for a toolkit outside Python.
  list(FILTER KILN_CUDA_RPATH INCLUDE REGEX "^[$]ORIGIN")
endif()

set(KILN_CUDA_FLAGS -Xcompiler=-Wall,-Wextra,-fvisibility=hidden)
if(NOT KILN_DIST)
  # Source lines for profilers; they record absolute source paths, which a wheel must not carry.
  list(PREPEND KILN_CUDA_FLAGS -lineinfo)
endif()
if(KILN_WERROR)
  list(APPEND KILN_CUDA_FLAGS -Werror=all-warnings -Xcompiler=-Werror)
endif()

add_library(kiln_cuda_sm90a OBJECT src/cuda/op_linear_wg.cu)
set_target_properties(kiln_cuda_sm90a PROPERTIES CUDA_ARCHITECTURES OFF
                                                 POSITION_INDEPENDENT_CODE ON
                                                 CUDA_VISIBILITY_PRESET hidden)
target_include_directories(kiln_cuda_sm90a PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/include
                                                   ${CMAKE_CURRENT_SOURCE_DIR}/src)
# (set, not appended: a sanitizer build's -fsanitize options are not for nvcc)
set_property(TARGET kiln_cuda_sm90a PROPERTY COMPILE_OPTIONS ${KILN_CUDA_FLAGS}
  --generate-code=arch=compute_90a,code=sm_90a --generate-code=arch=compute_90,code=compute_90)
target_compile_definitions(kiln_cuda_sm90a PRIVATE KILN_BUILDING_CUDA_PLUGIN)

# The simple-op families' device code (pooling included: CNNs only; the index, resize, logic,
# embedding, data-movement and norm families) and the
# attention kernels' variants (tensor-core, and the fp32-FMA flash kernel that fp16/bf16 engines
# rarely load) are compressed for size (zstd): the driver inflates a module when its first kernel
# loads, a few ms for these, where compressing the whole plugin cost 30-90 ms at the first engine
# load (docs/packaging.md); they keep the runtime wheel under 3 MB. So are Kiln's tiled GEMM
# (gemm_tiled.cu), which runs only what cuBLASLt does not take, and the stem conv kernels
# (conv_stem.cu), which only a CNN's first convolution loads.
set_source_files_properties(src/cuda/gemm_tiled.cu src/cuda/conv_stem.cu
                            src/cuda/op_eltwise.cu src/cuda/op_conv.cu src/cuda/conv_pw.cu src/cuda/op_reduce.cu
                            src/cuda/op_pool.cu src/cuda/op_index.cu src/cuda/attn_tc.cu
                            src/cuda/attn_flash.cu src/cuda/op_resize.cu src/cuda/op_logic.cu
                            src/cuda/op_embed.cu src/cuda/op_shape.cu src/cuda/op_norm.cu
                            PROPERTIES COMPILE_OPTIONS --compress-mode=size)
add_library(kiln_cuda SHARED ${KILN_CUDA_SOURCES} $<TARGET_OBJECTS:kiln_cuda_sm90a>)
if(KILN_SANITIZE)
  # nvcc does not take -fsanitize: the plugin is built uninstrumented (libkiln and the test
  # programs that load it stay instrumented).
  set_property(TARGET kiln_cuda PROPERTY COMPILE_OPTIONS "")
  set_property(TARGET kiln_cuda PROPERTY LINK_OPTIONS "")
endif()
target_include_directories(kiln_cuda PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/include
                                             ${CMAKE_CURRENT_SOURCE_DIR}/src)
target_link_libraries(kiln_cuda PRIVATE CUDA::cudart CUDA::cublasLt Threads::Threads ${CMAKE_DL_LIBS})
# cuDNN: headers at build time only; libcudnn.so.9 is dlopen()ed at run time (src/cuda/cuda_dnn.c),
# so the plugin loads, and runs convolutions on Kiln's kernels, where cuDNN is absent.
find_path(KILN_CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/include
          PATH_SUFFIXES cudnn)
if(KILN_CUDNN_INCLUDE_DIR)
  target_include_directories(kiln_cuda SYSTEM PRIVATE ${KILN_CUDNN_INCLUDE_DIR})
  target_compile_definitions(kiln_cuda PRIVATE KILN_CUDA_HAVE_CUDNN=1)
else()
  message(STATUS "cudnn.h not found: the CUDA plugin is built without cuDNN convolutions")
  target_compile_definitions(kiln_cuda PRIVATE KILN_CUDA_HAVE_CUDNN=0)
endif()
target_compile_options(kiln_cuda PRIVATE
  $<$<COMPILE_LANGUAGE:C>:${KILN_WARNINGS}>
  $<$<COMPILE_LANGUAGE:CUDA>:${KILN_CUDA_FLAGS}>)
target_compile_definitions(kiln_cuda PRIVATE KILN_BUILDING_CUDA_PLUGIN)
# -z defs: the plugin must not depend on libkiln's (hidden) internals; it gets them through
# kiln_cuda_services.
target_link_options(kiln_cuda PRIVATE -Wl,--enable-new-dtags -Wl,-z,defs)
set_target_properties(kiln_cuda PROPERTIES
  C_VISIBILITY_PRESET hidden
  CUDA_VISIBILITY_PRESET hidden
  CUDA_RUNTIME_LIBRARY Shared
  BUILD_WITH_INSTALL_RPATH ON # the same RUNPATH in the build tree and installed
  INSTALL_RPATH "${KILN_CUDA_RPATH}")
# Installed beside libkiln (the loader looks there first).
if(KILN_DIST STREQUAL "runtime")
  install(TARGETS kiln_cuda LIBRARY DESTINATION kiln_executorch_runtime/lib)
else()
  install(TARGETS kiln_cuda LIBRARY DESTINATION lib)
endif()

# --- the parity program (not a *_test.c: CPU builds glob those)
add_executable(kiln_cuda_parity tests/cuda/cuda_parity.c)
target_include_directories(kiln_cuda_parity PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/tests)
target_compile_options(kiln_cuda_parity PRIVATE ${KILN_WARNINGS})
target_link_libraries(kiln_cuda_parity PRIVATE kiln_static CUDA::cudart)
set_target_properties(kiln_cuda_parity PROPERTIES CUDA_RUNTIME_LIBRARY Shared
                                                  BUILD_RPATH "${CUDAToolkit_LIBRARY_DIR}")
add_dependencies(kiln_cuda_parity kiln_cuda)

# --- the smoke program: shared libkiln, plugin found beside it
add_executable(kiln_cuda_smoke tests/cuda/cuda_smoke.c)
target_include_directories(kiln_cuda_smoke PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/tests)
target_compile_options(kiln_cuda_smoke PRIVATE ${KILN_WARNINGS})
target_link_libraries(kiln_cuda_smoke PRIVATE kiln)
target_link_options(kiln_cuda_smoke PRIVATE -Wl,--enable-new-dtags)
set_target_properties(kiln_cuda_smoke PROPERTIES BUILD_RPATH "$ORIGIN" INSTALL_RPATH "$ORIGIN")
add_dependencies(kiln_cuda_smoke kiln_cuda)

if(KILN_BUILD_TESTS)
  enable_testing()
  add_test(NAME kiln_cuda_parity COMMAND kiln_cuda_parity --quick
           WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  add_test(NAME kiln_cuda_smoke COMMAND kiln_cuda_smoke WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(kiln_cuda_parity kiln_cuda_smoke PROPERTIES SKIP_RETURN_CODE 77)
  set_tests_properties(kiln_cuda_parity PROPERTIES
    ENVIRONMENT "KILN_CUDA_PLUGIN=$<TARGET_FILE:kiln_cuda>")
endif()

# --- launch-and-wait latency of CUDA graphs by how their end is observed (bench/launch_latency.cu;
# the GPU suite prints it)
add_executable(kiln_launch_latency bench/launch_latency.cu)
target_compile_options(kiln_launch_latency PRIVATE ${KILN_CUDA_FLAGS})
target_link_libraries(kiln_launch_latency PRIVATE CUDA::cudart)
set_target_properties(kiln_launch_latency PROPERTIES CUDA_RUNTIME_LIBRARY Shared
                                                     BUILD_RPATH "${CUDAToolkit_LIBRARY_DIR}")

# --- the memory floor of the MLP b64 beside Kiln's wgmma linear (bench/stream_floor.cu: streams of
# the three weights into shared memory by access pattern, then the kernel's configurations; the
# GPU suite prints it). sm_90a only, like the kernel it includes.
add_executable(kiln_stream_floor bench/stream_floor.cu)
set_target_properties(kiln_stream_floor PROPERTIES CUDA_ARCHITECTURES OFF
                                                   CUDA_RUNTIME_LIBRARY Shared
                                                   BUILD_RPATH "${CUDAToolkit_LIBRARY_DIR}")
target_include_directories(kiln_stream_floor PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/include
                                                     ${CMAKE_CURRENT_SOURCE_DIR}/src)
set_property(TARGET kiln_stream_floor PROPERTY COMPILE_OPTIONS ${KILN_CUDA_FLAGS}
  --generate-code=arch=compute_90a,code=sm_90a)
target_compile_definitions(kiln_stream_floor PRIVATE WITH_WG)
target_link_libraries(kiln_stream_floor PRIVATE CUDA::cudart)

# --- the latency print of the GPU suite (not a test: tools/gpu_suite.sh --run calls it)
add_executable(kiln_cuda_bench tests/cuda/cuda_bench.c)
target_compile_options(kiln_cuda_bench PRIVATE ${KILN_WARNINGS})
target_link_libraries(kiln_cuda_bench PRIVATE kiln_static CUDA::cudart)
set_target_properties(kiln_cuda_bench PROPERTIES CUDA_RUNTIME_LIBRARY Shared
                                                 BUILD_RPATH "${CUDAToolkit_LIBRARY_DIR}")
add_dependencies(kiln_cuda_bench kiln_cuda)
