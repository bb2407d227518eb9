# Precompiled headers (TPU_PCH, GCC): the test programs and the single-source programs parse the
# standard library, fmt, nlohmann/json, Catch2 and tpucore/tpucore.h from one header image per kind
# instead of once per translation unit (the serving and pod tests are not batched, so each of their
# sources parsed 1.5-5 s of headers). Compile time with the images, user+sys, medians of interleaved
# runs: 12 pod and serving test sources 49.0 -> 43.4 s, a tpucore_tests unity batch 11.6 -> 10.0 s,
# 7 program sources 29.9 -> 24.9 s; one interleaved pass in the sanitizer build (test sources
# uninstrumented): 4 tpucore_tests unity batches, the 9 pod and 10 serving test sources and the chat
# tests 185.1 -> 164.7 s, the image's 6.6 s included (in the release unity build, 3 batches and the
# same sources 132.2 -> 120.7 s, image included). libtpucore has none: its sources spend 90% of
# their time in -O3 code generation, and loading an image cost about what it saved there (a unity
# batch 11.2 -> 11.1 s).
# A source that sets a macro before its includes (which the image would precede) is marked
# SKIP_PRECOMPILE_HEADERS next to where it is added. CMake makes GCC warn about an image it cannot
# use (-Winvalid-pch), an error with TPU_WERROR. Off by default with other compilers (clang builds
# only the fuzzers and the warning check here) and under a compiler launcher such as ccache, which
# does not cache a compile that reads an image unless its sloppiness setting allows it
# (pch_defines,time_macros): there every test object would be compiled again on each build.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND NOT CMAKE_CXX_COMPILER_LAUNCHER
   AND NOT DEFINED ENV{CMAKE_CXX_COMPILER_LAUNCHER})
  set(_tpu_pch_default ON)
else()
  set(_tpu_pch_default OFF)
endif()
option(TPU_PCH "Precompile the headers every test and program includes (a shorter build from scratch)"
  ${_tpu_pch_default})

set(TPU_PCH_STD <algorithm> <array> <atomic> <chrono> <cmath> <cstddef> <cstdint> <cstdlib> <cstring>
  <functional> <map> <memory> <mutex> <optional> <set> <sstream> <stdexcept> <string> <string_view>
  <unordered_map> <unordered_set> <utility> <variant> <vector>)

# The owner of an image: a program of its own (so the position independence flags are those of
# the programs that reuse it) compiled with the usage requirements of the given targets but not
# linked to them. A target that reuses an image waits for its owner to be built; linked to
# libtpucore, the owner would hold back every test and program object until the library is
# linked, and an owner that is itself a test program would make `ninja <other test program>`
# compile and link that one too.
function(_tpu_pch_owner owner)
  add_executable(${owner} EXCLUDE_FROM_ALL ${PROJECT_SOURCE_DIR}/cmake/pch_programs.cpp)
  foreach(_dep ${ARGN})
    target_include_directories(${owner} PRIVATE $<TARGET_PROPERTY:${_dep},INTERFACE_INCLUDE_DIRECTORIES>)
    target_compile_definitions(${owner} PRIVATE $<TARGET_PROPERTY:${_dep},INTERFACE_COMPILE_DEFINITIONS>)
    target_compile_options(${owner} PRIVATE $<TARGET_PROPERTY:${_dep},INTERFACE_COMPILE_OPTIONS>)
  endforeach()
endfunction()

#   tpu_pch_tests(<target>)     test programs (tests/, compiled with that folder's flags) reuse the
#                               image of tpu_pch_tests (Catch2 + tpucore/tpucore.h)
#   tpu_pch_program(<target>)   programs linking libtpucore reuse the image of tpu_pch_programs
function(tpu_pch_tests target)
  if(NOT TPU_PCH)
    return()
  endif()
  if(NOT TARGET tpu_pch_tests)
    _tpu_pch_owner(tpu_pch_tests tpucore tpu_test_main tpu_warnings)
    target_precompile_headers(tpu_pch_tests PRIVATE ${TPU_PCH_STD} <fmt/format.h> <nlohmann/json.hpp>
      <catch2/catch.hpp> [["tpucore/tpucore.h"]])
  endif()
  target_precompile_headers(${target} REUSE_FROM tpu_pch_tests)
endfunction()

function(tpu_pch_program target)
  if(NOT TPU_PCH)
    return()
  endif()
  if(NOT TARGET tpu_pch_programs)
    _tpu_pch_owner(tpu_pch_programs tpucore tpu_warnings)
    target_precompile_headers(tpu_pch_programs PRIVATE ${TPU_PCH_STD} <fmt/format.h> <nlohmann/json.hpp>
      [["tpucore/tpucore.h"]])
  endif()
  target_precompile_headers(${target} REUSE_FROM tpu_pch_programs)
endfunction()
