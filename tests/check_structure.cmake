# Enforces the layering (arrows point down; nothing points up) and the file-size limit. From the
# bottom: sim/ (stands alone); tpucore/core/ (the core types); device/; ops/; graph/; codegen/;
# then the API layer (tpucore/jit, autograd, nn, optim, io, profiler, runtime, models, dist and
# the public headers tpucore/*.h), which may include everything below it. A file may include
# only the folders its layer allows. Inside the API layer: nn/ includes neither models/ nor serve/,
# models/ does not include serve/ (serving builds on the models, not the reverse), and the
# serving engine's public headers (serve/engine.h, sampling_params.h, json_constraint.h, metrics.h, which
# tools/tpu-serve includes) include only public headers: no code generation or other internals.
# Run as: cmake -DSRC=<repo> -P check_structure.cmake
cmake_policy(SET CMP0007 NEW)
set(MAX_LINES 650)
set(errors "")

file(GLOB_RECURSE files RELATIVE ${SRC}
  ${SRC}/tpucore/*.h ${SRC}/tpucore/*.cpp ${SRC}/ops/*.h ${SRC}/ops/*.cpp ${SRC}/graph/*.h ${SRC}/graph/*.cpp
  ${SRC}/codegen/*.h ${SRC}/codegen/*.cpp ${SRC}/device/*.h ${SRC}/device/*.cpp ${SRC}/sim/*.h ${SRC}/sim/*.cpp
  ${SRC}/tools/*.cpp ${SRC}/tools/*.h ${SRC}/examples/*.cpp ${SRC}/bench/*.cpp ${SRC}/tests/*.cpp ${SRC}/tests/*.h)

foreach(f ${files})
  file(STRINGS ${SRC}/${f} lines)
  list(LENGTH lines n)
  if(n GREATER MAX_LINES)
    string(APPEND errors "  ${f}: ${n} lines (limit ${MAX_LINES}); split it by idea\n")
  endif()
  # ctest's test discovery splits a test name at ';', so such a case would run as an empty
  # filter and pass without running anything.
  if(f MATCHES "^tests/.*\\.cpp$")
    file(READ ${SRC}/${f} content)
    if(content MATCHES "TEST_CASE\\(\"[^\"\n]*;")
      string(APPEND errors "  ${f}: a TEST_CASE name contains ';' (ctest would not run it)\n")
    endif()
  endif()
  set(allowed "")
  if(f MATCHES "^sim/")
    set(allowed "sim/")
  elseif(f MATCHES "^tpucore/core/")
    set(allowed "tpucore/core/")
  elseif(f MATCHES "^device/plugins/")
    # plugins are shared objects of their own, built on the library's public API
    set(allowed "tpucore/|device/|sim/")
  elseif(f MATCHES "^device/")
    set(allowed "tpucore/core/|device/|sim/")
  elseif(f MATCHES "^ops/")
    set(allowed "tpucore/core/|tpucore/ops\\.h|device/|ops/")
  elseif(f MATCHES "^graph/")
    # sim/json_int.h: the bottom layer's header-only reader of integers from outside JSON
    set(allowed "tpucore/core/|tpucore/ops\\.h|device/|ops/|graph/|sim/json_int\\.h")
  elseif(f MATCHES "^codegen/")
    set(allowed "tpucore/core/|tpucore/ops\\.h|device/|ops/|graph/|codegen/|sim/")
  endif()
  if(allowed)
    foreach(line ${lines})
      if(line MATCHES "^[ \t]*#[ \t]*include[ \t]*\"((sim|tpucore|device|ops|graph|codegen)/[^\"]*)\"")
        set(inc ${CMAKE_MATCH_1})
        if(NOT inc MATCHES "^(${allowed})")
          string(APPEND errors "  ${f}: includes an upper layer: ${inc}\n")
        endif()
      endif()
    endforeach()
  endif()
endforeach()

# The API layer's internal arrows.
foreach(f ${files})
  set(forbidden "")
  if(f MATCHES "^tpucore/nn/")
    set(forbidden "^tpucore/(models|serve)/")
    set(why "nn/ includes neither models/ nor serve/")
  elseif(f MATCHES "^tpucore/models/")
    set(forbidden "^tpucore/serve/")
    set(why "models/ does not include serve/")
  elseif(f MATCHES "^tpucore/serve/(engine|sampling_params|metrics|json_constraint)\\.h$")
    set(forbidden "^(codegen|graph|ops|device|sim)/|^tpucore/serve/(paged_|model_runner|scheduler|kv_cache_manager|output|request)")
    set(why "the serving engine's public headers include only public headers")
  endif()
  if(forbidden)
    file(STRINGS ${SRC}/${f} lines)
    foreach(line ${lines})
      if(line MATCHES "^[ \t]*#[ \t]*include[ \t]*\"([^\"]*)\"")
        set(inc ${CMAKE_MATCH_1})
        if(inc MATCHES "${forbidden}")
          string(APPEND errors "  ${f}: includes ${inc} (${why})\n")
        endif()
      endif()
    endforeach()
  endif()
endforeach()

list(LENGTH files nfiles)
if(errors)
  message(FATAL_ERROR "structure check failed:\n${errors}")
endif()
message(STATUS "structure check: ${nfiles} files respect the layering and the ${MAX_LINES}-line limit")
