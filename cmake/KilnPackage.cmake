# SPDX-License-Identifier: Apache-2.0
# Kiln's CMake package for C and C++ consumers (included by CMakeLists.txt after the targets).
# Installs, relative to the install root:
#   plain `cmake --install`:  lib/libkiln.so, lib/libkiln_executorch.so (KILN_EXECUTORCH),
#                             include/kiln/*.h, lib/cmake/Kiln/KilnConfig{,Version}.cmake
#   KILN_DIST=runtime (wheel): the same tree under kiln_executorch_runtime/ (lib/, include/,
#                             lib/cmake/Kiln/), which `python -m kiln_executorch_runtime
#                             --cmake-prefix-path` names
# The config derives every path from its own location, so either tree can be moved.

if(KILN_DIST STREQUAL "runtime")
  set(KILN_PACKAGE_ROOT kiln_executorch_runtime/)
  # The root CMakeLists installs the libraries for the wheel; the headers go here.
  install(DIRECTORY include/kiln DESTINATION ${KILN_PACKAGE_ROOT}include)
else()
  set(KILN_PACKAGE_ROOT "")
  if(TARGET kiln_executorch)
    install(TARGETS kiln_executorch LIBRARY DESTINATION lib)
  endif()
endif()

if(TARGET kiln_executorch)
  set(KILN_HAS_EXECUTORCH_BACKEND TRUE)
  get_target_property(KILN_EXECUTORCH_BUILD_VERSION kiln_executorch KILN_EXECUTORCH_BUILD_VERSION)
else()
  set(KILN_HAS_EXECUTORCH_BACKEND FALSE)
  set(KILN_EXECUTORCH_BUILD_VERSION "")
endif()
# The release consumers must use: the public part of the executorch version the delegate was
# built against (equal to KILN_EXECUTORCH_PIN unless KILN_ALLOW_UNPINNED_EXECUTORCH was set).
if(KILN_EXECUTORCH_BUILD_VERSION)
  string(REGEX REPLACE "\\+.*$" "" KILN_EXECUTORCH_PIN "${KILN_EXECUTORCH_BUILD_VERSION}")
elseif(NOT DEFINED KILN_EXECUTORCH_PIN)
  set(KILN_EXECUTORCH_PIN "1.5.1")
endif()
if(NOT DEFINED KILN_BUILD_VERSION)
  set(KILN_BUILD_VERSION "${PROJECT_VERSION}")
endif()

set(KILN_PACKAGE_BUILD_DIR "${PROJECT_BINARY_DIR}/package")
configure_file(cmake/KilnConfig.cmake.in "${KILN_PACKAGE_BUILD_DIR}/KilnConfig.cmake" @ONLY)
configure_file(cmake/KilnConfigVersion.cmake.in
               "${KILN_PACKAGE_BUILD_DIR}/KilnConfigVersion.cmake" @ONLY)
install(FILES "${KILN_PACKAGE_BUILD_DIR}/KilnConfig.cmake"
              "${KILN_PACKAGE_BUILD_DIR}/KilnConfigVersion.cmake"
        DESTINATION ${KILN_PACKAGE_ROOT}lib/cmake/Kiln)
