#!/usr/bin/env bash
# Builds the Google Benchmark programs of bench/ into the release build of scripts/test.sh (the
# same build directory, so only the benchmarks compile), so CI checks that they all build; the
# libtorch peer benchmarks are left to scripts/bench.sh. `BUILD_DIR`, `JOBS` and `TPU_WERROR` as
# in scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="${JOBS:-2}"
BUILD="${BUILD_DIR:-build}"
bash scripts/setup.sh >/dev/null
echo "== benchmarks (build only)"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTPU_BUILD_BENCH=ON -DTPU_BENCH_PEERS=OFF \
  -DTPU_BUILD_EXAMPLES=ON -DTPU_WERROR="${TPU_WERROR:-ON}" >/dev/null
cmake --build "$BUILD" -j"$JOBS"
echo "benchmarks: built"
