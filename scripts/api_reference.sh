#!/usr/bin/env bash
# Builds the HTML API reference of the installed public headers with Doxygen (docs/Doxyfile)
# into BUILD_DIR/api_reference/html (BUILD_DIR defaults to build) and fails on any Doxygen
# warning (an undocumented public symbol, a bad doc command), listing them. Also fails when
# the Doxyfile's INPUT and CMakeLists.txt's TPU_PUBLIC_HEADERS (the installed headers) differ.
# scripts/test.sh runs it after the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${BUILD_DIR:-build}"
command -v doxygen >/dev/null || { echo "api_reference: doxygen is not installed (scripts/setup.sh installs it)"; exit 1; }

# The two header lists: CMake's install list and the Doxyfile's INPUT, one name a line, sorted.
cmake_list=$(sed -n '/^set(TPU_PUBLIC_HEADERS/,/)/p' CMakeLists.txt | sed 's/set(TPU_PUBLIC_HEADERS//; s/)//' |
  tr -s ' \t' '\n' | grep -v '^$' | sort)
doxy_list=$(awk '/^INPUT *=/ {on = 1} on {print; if ($0 !~ /\\$/) exit}' docs/Doxyfile | sed 's/^INPUT *=//; s/\\//g' |
  tr -s ' \t' '\n' | grep -v '^$' | sort)
if [ "$cmake_list" != "$doxy_list" ]; then
  echo "api_reference: docs/Doxyfile INPUT differs from TPU_PUBLIC_HEADERS in CMakeLists.txt:"
  diff <(echo "$cmake_list") <(echo "$doxy_list") | grep '^[<>]' | sed 's/^</  only in CMakeLists.txt:/; s/^>/  only in docs\/Doxyfile:/'
  exit 1
fi

OUT="$BUILD/api_reference"
rm -rf "$OUT"
mkdir -p "$OUT"
start=$(date +%s%N)
TPU_DOXYGEN_OUT="$OUT" doxygen docs/Doxyfile >"$OUT/doxygen.log" 2>&1 || {
  echo "api_reference: doxygen failed:"; cat "$OUT/doxygen.log"; exit 1; }
ms=$(( ($(date +%s%N) - start) / 1000000 ))
# Warnings go to warnings.log (WARN_LOGFILE); anything else doxygen printed counts too.
cat "$OUT/doxygen.log" >>"$OUT/warnings.log"
n=$(grep -c . "$OUT/warnings.log" || true)
if [ "$n" -ne 0 ]; then
  echo "api_reference: $n Doxygen warning line(s) (every public symbol needs a doc comment):"
  sed "s|$PWD/||" "$OUT/warnings.log"
  exit 1
fi
echo "api_reference: OK, no warnings (doxygen ${ms} ms); open $OUT/html/index.html"
