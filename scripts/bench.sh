#!/usr/bin/env bash
# Builds and runs the benchmarks, ours and the peers (libtorch 1.13 with OpenBLAS, Eigen) in the
# same runs. Installs the peers from Debian packages first (they are never test dependencies).
#   bash scripts/bench.sh [filter-regex]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PEERS=(libtorch-dev libopenblas0-pthread)
missing=()
for p in "${PEERS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DTPU_BUILD_BENCH=ON >/dev/null
cmake --build build -j"${JOBS:-2}"
FILTER="${1:-.}"
for b in build/bench/bench_* build/bench/peer/bench_*; do
  [ -x "$b" ] || continue
  if [ "$(basename "$b")" = bench_llama_cpp ]; then  # not a Google Benchmark program: rounds of its own
    echo "== bench_llama_cpp: run by scripts/gen_llama_cpp_table.sh (tpucore beside llama.cpp)"
    continue
  fi
  echo "== $(basename "$b")"
  "$b" --benchmark_filter="$FILTER" --benchmark_min_time=0.2
  case "$(basename "$b")" in
    *torch*)
      if [ -n "${OPENBLAS_CORETYPE:-}${OPENBLAS_L2_SIZE:-}" ]; then
        echo "== $(basename "$b") with OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE unset"
        env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$b" --benchmark_filter="$FILTER" --benchmark_min_time=0.2
      fi ;;
  esac
done
# The OpenBLAS peer under each OPENBLAS_CORETYPE this CPU takes (the fastest is named).
if [ -x build/bench/bench_matmul_torch ] || [ -x build/bench/peer/bench_matmul_torch ]; then
  echo "== OpenBLAS core types (scripts/bench_peers.sh)"
  bash scripts/bench_peers.sh
fi
