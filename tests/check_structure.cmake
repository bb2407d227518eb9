# Enforces the layering of DESIGN.md (arrows point down; nothing points up) and the file-size
# limit. Run as: cmake -DSRC=<repo> -P check_structure.cmake
cmake_policy(SET CMP0007 NEW)
set(MAX_LINES 650)
set(CORE_HEADERS error.h dtype.h half.h shape.h device.h storage.h tensor.h scalar.h parallel.h
    allocator.h cpu_features.h log.h)
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
  set(forbidden "")
  if(f MATCHES "^sim/")
    set(forbidden "tpucore/|ops/|graph/|codegen/|device/")
  elseif(f MATCHES "^tpucore/([^/]+\\.h)$")
    get_filename_component(name ${f} NAME)
    list(FIND CORE_HEADERS ${name} is_core)
    if(NOT is_core EQUAL -1)
      set(forbidden "ops/|graph/|codegen/|device/|tpucore/ops\\.h|tpucore/compile")
    endif()
  elseif(f MATCHES "^device/")
    set(forbidden "ops/|graph/|codegen/")
  elseif(f MATCHES "^ops/")
    set(forbidden "graph/|codegen/")
  elseif(f MATCHES "^graph/")
    set(forbidden "codegen/")
  endif()
  if(forbidden)
    foreach(line ${lines})
      if(line MATCHES "^[ \t]*#[ \t]*include[ \t]*\"(${forbidden})")
        string(APPEND errors "  ${f}: includes an upper layer: ${line}\n")
      endif()
    endforeach()
  endif()
endforeach()

list(LENGTH files nfiles)
if(errors)
  message(FATAL_ERROR "structure check failed:\n${errors}")
endif()
message(STATUS "structure check: ${nfiles} files respect the layering and the ${MAX_LINES}-line limit")
