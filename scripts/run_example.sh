#!/usr/bin/env bash
# Sets up, builds and runs the main example.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"${JOBS:-2}" --target main_example
# The trained checkpoint is cached in build/fortunes_model (trained on the first run, and again
# when the training recipe changed: examples/fortunes_model.h versions it).
./build/examples/main_example --model build/fortunes_model "$@"
