#!/usr/bin/env bash
# The Clang half of the warning check: builds libtpucore, the simulator, the driver plugins and
# the tools with clang-14 and the project's warning flags as errors (TPU_WERROR), at -O0 with no
# debug info (only the diagnostics are wanted), so a warning that only Clang reports fails CI
# too. The GCC builds of scripts/test.sh (release) and scripts/test_sanitizers.sh (debug) cover
# everything else with -Werror (the tests, examples and benchmarks use C++20 that clang-14 with
# libstdc++ 12 lacks: std::source_location, lambdas capturing structured bindings). About 5
# minutes on two cores (estimated). `CLANG_BUILD_DIR` and `JOBS` can be
# overridden.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="${JOBS:-2}"
BUILD="${CLANG_BUILD_DIR:-build-clang}"
bash scripts/setup.sh
if ! dpkg-query -W -f='${Status}' clang-14 2>/dev/null | grep -q "install ok installed"; then
  echo "== installing clang-14"
  SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends clang-14 >/dev/null
fi

echo "== clang-14 warning check (library, plugins, tools; -Werror)"
start=$(date +%s)
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS_DEBUG="-O0 -g0 -fsyntax-only" -DTPU_WERROR=ON -DTPU_BUILD_TESTS=OFF -DTPU_BUILD_BENCH=OFF \
  -DTPU_BUILD_EXAMPLES=OFF >/dev/null
# Warnings come from compiling, so only the object files are built, and -fsyntax-only skips their
# code generation (no object is written; nothing is linked).
mapfile -t objects < <(ninja -C "$BUILD" -t targets all | sed -n 's/^\(.*\.o\): .*/\1/p')
ninja -C "$BUILD" -j"$JOBS" "${objects[@]}"
echo "== clang-14: no warning ($(( $(date +%s) - start )) s)"
