#!/usr/bin/env bash
# Sets up, builds and runs the main example.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"${JOBS:-2}" --target main_example
./build/examples/main_example "$@"
