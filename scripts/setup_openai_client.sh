#!/usr/bin/env bash
# Installs the official OpenAI client library (npm package `openai`, pinned) into a folder of the
# build tree (never committed), for the tpu-serve client test (tests/serve/openai_client.mjs).
# Safe to run twice.
#   scripts/setup_openai_client.sh DIR      (scripts/test.sh: BUILD/openai-client)
set -euo pipefail
dir="${1:?usage: $0 DIR}"
exec bash "$(dirname "$0")/setup_npm_packages.sh" openai-client "$dir" openai@7.60.0
