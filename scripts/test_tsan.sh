#!/usr/bin/env bash
# The ThreadSanitizer pass: builds libtpucore and the concurrency tests (threads running eager
# ops and shared and private compiled functions on cpu, sim:0 and sim:1 at once; randn from
# several threads on the default generator) with -fsanitize=thread and runs them. A data race
# is printed as a "WARNING: ThreadSanitizer" report and makes the run fail (exit code 66).
# `BUILD_DIR` and `JOBS` can be overridden; extra arguments go to the test program (a Catch2
# test name or tag filter).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="${JOBS:-2}"
BUILD="${BUILD_DIR:-build-tsan}"

echo "== ThreadSanitizer build (-O1)"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" \
  -DCMAKE_CXX_FLAGS="-fsanitize=thread -fno-omit-frame-pointer" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread" -DTPU_BUILD_BENCH=OFF -DTPU_BUILD_EXAMPLES=OFF >/dev/null
cmake --build "$BUILD" -j"$JOBS" --target tpucore_concurrency_tests

echo "== concurrency tests under ThreadSanitizer"
export TSAN_OPTIONS="halt_on_error=0:exitcode=66:second_deadlock_stack=1 ${TSAN_OPTIONS:-}"
# TSan maps its shadow memory at fixed addresses; a kernel with a large mmap randomization
# makes it abort at start-up, so run without address-space randomization when setarch can.
run=("$BUILD/tests/tpucore_concurrency_tests" "$@")
if command -v setarch >/dev/null && setarch "$(uname -m)" -R true 2>/dev/null; then
  run=(setarch "$(uname -m)" -R "${run[@]}")
fi
"${run[@]}"
echo "== no data race reported"
