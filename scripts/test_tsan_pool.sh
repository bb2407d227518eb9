#!/usr/bin/env bash
# ThreadSanitizer over the host thread pool (tpucore/core/parallel.*: spin-then-futex workers,
# teams, barriers, exceptions from chunks, the few-row products' two-ended runs and idle
# prefetch) and its own tests, built alone (the pool depends only on the core's env, log and
# cpu_features files), with the spin phase on and off and with more threads than cores. About a minute of build on two cores.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
OUT="${BUILD_DIR:-build-tsan}"
mkdir -p "$OUT"
echo "== thread pool under ThreadSanitizer"
printf '#define CATCH_CONFIG_MAIN\n#include <catch2/catch.hpp>\n' >"$OUT/catch_main.cpp"
g++ -std=c++20 -O1 -g -fsanitize=thread -Wall -Wextra -I. "$OUT/catch_main.cpp" tests/core/test_parallel_pool.cpp \
  tpucore/core/parallel.cpp tpucore/core/env.cpp tpucore/core/log.cpp tpucore/core/cpu_features.cpp -o "$OUT/pool_tsan" \
  -lfmt -lspdlog
export TSAN_OPTIONS=halt_on_error=1
"$OUT/pool_tsan"
TPU_POOL_SPIN_US=0 "$OUT/pool_tsan"
TPU_NUM_THREADS=4 "$OUT/pool_tsan"
echo "== thread pool clean under ThreadSanitizer"
