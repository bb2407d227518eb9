#!/usr/bin/env bash
# Installs pinned npm packages (test data and reference implementations) into a folder of the
# build tree, never into the repository. Safe to run twice: a folder whose stamp names the same
# packages is left as it is.
#   scripts/setup_npm_packages.sh NAME DIR PACKAGE@VERSION...
set -euo pipefail
name="${1:?usage: $0 NAME DIR PACKAGE@VERSION...}"
dir="${2:?usage: $0 NAME DIR PACKAGE@VERSION...}"
shift 2
pkgs=("$@")
if ! command -v npm >/dev/null; then
  echo "$name: npm is missing (scripts/setup.sh installs it)" >&2
  exit 1
fi
stamp="$dir/.installed"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "${pkgs[*]}" ]; then
  echo "$name: installed"
  exit 0
fi
mkdir -p "$dir"
[ -f "$dir/package.json" ] || echo "{\"name\": \"$name\", \"private\": true}" >"$dir/package.json"
npm install --prefix "$dir" --no-audit --no-fund --ignore-scripts --loglevel=error "${pkgs[@]}"
echo "${pkgs[*]}" >"$stamp"
