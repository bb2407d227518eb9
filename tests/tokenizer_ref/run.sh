#!/usr/bin/env bash
# Encodes tests/tokenizer_ref/corpus.json with tpu::Tokenizer and with the reference
# (transformers.js' tokenizers, run by node) for each family's tokenizer.json installed by
# scripts/setup_tokenizer_reference.sh, and compares them (tokenizer_compare).
#   run.sh COMPARE_BINARY REFERENCE_DIR FAMILY...
# Exits 77 (skipped) when the reference is not installed.
set -euo pipefail
compare="$1"
ref="$2"
shift 2
here="$(cd "$(dirname "$0")" && pwd)"
module="$ref/node_modules/@huggingface/tokenizers"
if [ ! -d "$module" ] || ! command -v node >/dev/null; then
  echo "skipped: the reference is not installed (scripts/setup_tokenizer_reference.sh)"
  exit 77
fi
status=0
for family in "$@"; do
  file="$ref/node_modules/@lenml/tokenizer-$family/models/tokenizer.json"
  if [ ! -f "$file" ]; then
    echo "skipped: $family is not installed"
    exit 77
  fi
  out="$(mktemp)"
  node "$here/reference.mjs" "$module" "$file" "$here/corpus.json" "$out"
  echo "== $family"
  "$compare" "$file" "$here/corpus.json" "$out" || status=1
  rm -f "$out"
done
exit $status
