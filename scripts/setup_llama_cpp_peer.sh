#!/usr/bin/env bash
# Installs llama.cpp's prebuilt CPU library (the npm package @node-llama-cpp/linux-x64, pinned;
# MIT license in the package) into a folder of the build tree (never committed), for the
# llama.cpp peer rows of bench/bench_llama_cpp.cpp. Safe to run twice. The libraries land in
# DIR/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64; the script prints that folder, the
# value the benchmark takes in TPU_LLAMA_CPP_DIR.
#   scripts/setup_llama_cpp_peer.sh DIR      (e.g. build/llama-cpp-peer)
set -euo pipefail
dir="${1:?usage: $0 DIR}"
bash "$(dirname "$0")/setup_npm_packages.sh" llama-cpp-peer "$dir" @node-llama-cpp/linux-x64@3.22.1 >&2
lib="$(cd "$dir" && pwd)/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64"
if [ ! -f "$lib/libllama.v0.5.0.so" ]; then
  echo "llama-cpp-peer: $lib/libllama.v0.5.0.so is missing (package layout changed?)" >&2
  exit 1
fi
echo "$lib"
