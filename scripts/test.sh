#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite:
#   1. Release build + all tests (ctest)
#   2. AddressSanitizer + UndefinedBehaviorSanitizer build + all tests
#   3. install to a temporary prefix and build/run an out-of-tree consumer with find_package(tpucore)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
JOBS="${JOBS:-2}"
bash scripts/setup.sh

echo "== release build"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DTPU_BUILD_BENCH=ON >/dev/null
cmake --build build -j"$JOBS"
echo "== release tests"
(cd build && ctest --output-on-failure -j"$JOBS" --timeout 600)

echo "== sanitizer build (ASan + UBSan)"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DTPU_SANITIZE=ON -DTPU_BUILD_BENCH=OFF \
  -DTPU_BUILD_EXAMPLES=OFF -DCMAKE_CXX_FLAGS="-O1" >/dev/null
cmake --build build-asan -j"$JOBS"
echo "== sanitizer tests"
(cd build-asan && ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --output-on-failure -j"$JOBS" --timeout 900)

echo "== install + out-of-tree consumer"
PREFIX="$(mktemp -d)"
trap 'rm -rf "$PREFIX"' EXIT
cmake --install build --prefix "$PREFIX/usr" >/dev/null
cmake -S tests/consumer -B "$PREFIX/consumer-build" -G Ninja -DCMAKE_PREFIX_PATH="$PREFIX/usr" >/dev/null
cmake --build "$PREFIX/consumer-build" -j"$JOBS"
LD_LIBRARY_PATH="$PREFIX/usr/lib:${LD_LIBRARY_PATH:-}" "$PREFIX/consumer-build/consumer"
echo "== all test stages passed"
