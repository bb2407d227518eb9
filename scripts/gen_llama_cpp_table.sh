#!/usr/bin/env bash
# Regenerates the tpucore-beside-llama.cpp table of docs/quantization.md (the region
# "llama-cpp"): installs llama.cpp's prebuilt CPU library into the build tree
# (scripts/setup_llama_cpp_peer.sh), builds bench/bench_llama_cpp and runs it (both engines on
# the same ~125M-parameter model, same run, interleaved rounds). Run it on a quiet machine: the
# table's header names the machine, CPU, date, commit and the load average seen before the run.
#   bash scripts/gen_llama_cpp_table.sh [--no-build] [bench_llama_cpp options...]
#   bash scripts/gen_llama_cpp_table.sh --rounds 1 --small     # checks the script, not figures
# The default 2 threads fill the region "llama-cpp"; --threads N another, "llama-cpp-threads-N";
# REGION=NAME names the region instead (a table of another machine beside the others).
# LLAMA_CPP_BACKEND=NAME keeps llama.cpp to its CPU backend NAME (libggml-cpu-NAME.so, e.g.
# haswell: AVX2 + FMA), with TPU_CPU_FEATURES=avx2 for tpucore: both engines as on an AVX2-only
# CPU, on a wider one.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${BUILD:-build}"
build=1
if [ "${1:-}" = "--no-build" ]; then build=0; shift; fi
lib="$(bash scripts/setup_llama_cpp_peer.sh "$BUILD/llama-cpp-peer")"
if [ -n "${LLAMA_CPP_BACKEND:-}" ]; then
  test -f "$lib/libggml-cpu-$LLAMA_CPP_BACKEND.so" || { echo "no llama.cpp backend $LLAMA_CPP_BACKEND in $lib" >&2; exit 1; }
  only="$BUILD/llama-cpp-peer/only-$LLAMA_CPP_BACKEND"
  rm -rf "$only" && mkdir -p "$only"
  for f in "$lib"/*.so*; do
    case "$(basename "$f")" in libggml-cpu-*) ;; *) ln -s "$(realpath "$f")" "$only/" ;; esac
  done
  ln -s "$(realpath "$lib/libggml-cpu-$LLAMA_CPP_BACKEND.so")" "$only/"
  lib="$only"
fi
if [ "$build" = 1 ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTPU_BUILD_BENCH=ON >/dev/null
  cmake --build "$BUILD" -j"${JOBS:-2}" --target bench_llama_cpp
fi
load="$(cut -d' ' -f1-3 /proc/loadavg)"
if [ -n "${LLAMA_CPP_BACKEND:-}" ]; then
  out="$(TPU_CPU_FEATURES=avx2 TPU_LLAMA_CPP_DIR="$lib" "$BUILD/bench/bench_llama_cpp" "$@")"
else
  out="$(TPU_LLAMA_CPP_DIR="$lib" "$BUILD/bench/bench_llama_cpp" "$@")"
fi
printf '%s\n' "$out"
LOAD="$load" OUT="$out" ARGS="$*" BACKEND="${LLAMA_CPP_BACKEND:-}" python3 - <<'PY'
import os, sys
sys.path.insert(0, "scripts")
import gen_figures as g
args = os.environ["ARGS"].strip()
only = os.environ["BACKEND"]
kind = "bench/bench_llama_cpp" + (f" {args}" if args else "") + \
       f", llama.cpp from @node-llama-cpp/linux-x64 3.22.1" + \
       (f" held to its {only} backend, tpucore to TPU_CPU_FEATURES=avx2" if only else "") + \
       f"; load average before the run {os.environ['LOAD']}"
a = args.split()
threads = a[a.index("--threads") + 1] if "--threads" in a[:-1] else "2"
region = "llama-cpp" if threads == "2" else f"llama-cpp-threads-{threads}"  # other thread counts: a region each
region = os.environ.get("REGION") or region
g.write_region("quantization.md", region, g.header(kind) + "\n\n" + os.environ["OUT"].strip() + "\n")
PY
