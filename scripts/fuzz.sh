#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz/ (clang, ASan + UBSan, build dir build-fuzz), replays
# every kept crash input under tests/fuzz/regressions/<target>/ and fuzzes each target from its
# seed corpus (tests/fuzz/corpus/<target>/, read only; new inputs go to build-fuzz/corpus/).
#   bash scripts/fuzz.sh [--ci] [--seconds S | --runs N] [--jobs J] [--seeds] [TARGET...]
#     --ci         build + replay the regressions + 4 s per target (what CI runs)
#     --seconds S  fuzz each target for S seconds (default 60)
#     --runs N     fuzz each target for N inputs instead (e.g. --runs 1000000)
#     --replay     only build and replay the regressions
#     --seeds      rebuild the seed corpora in the tree with fuzz_make_seeds, then stop
#     TARGET       some of: assembly program_json chip_config safetensors idx graph_json tokenizer
#                  chat_template model_config
# A finding stops the script with the input saved as build-fuzz/findings/<target>/crash-*; copy it
# to tests/fuzz/regressions/<target>/ once fixed, so every later run replays it.
# `BUILD_DIR`, `LIB_BUILD_DIR` (the release build whose libtpucore the library's fuzzers use) and
# `JOBS` can be overridden.
set -euo pipefail
cd "$(dirname "$0")/.."
ALL=(assembly program_json chip_config safetensors idx graph_json tokenizer chat_template model_config)
BUILD="${BUILD_DIR:-build-fuzz}"
LIB_BUILD="${LIB_BUILD_DIR:-build}"
JOBS="${JOBS:-2}"
SECONDS_EACH=60
RUNS=""
MODE=fuzz
TARGETS=()
usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --ci) SECONDS_EACH=4 ;;
    --seconds) SECONDS_EACH="${2:?--seconds needs a number}"; shift ;;
    --runs) RUNS="${2:?--runs needs a number}"; shift ;;
    --jobs) JOBS="${2:?--jobs needs a number}"; shift ;;
    --replay) MODE=replay ;;
    --seeds) MODE=seeds ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "fuzz.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    *) [[ " ${ALL[*]} " == *" $1 "* ]] || { echo "fuzz.sh: unknown target '$1' (known: ${ALL[*]})" >&2; exit 2; }
       TARGETS+=("$1") ;;
  esac
  shift
done
[[ ${#TARGETS[@]} -gt 0 ]] || TARGETS=("${ALL[@]}")

bash scripts/setup.sh
# clang-14 and its runtimes (libFuzzer, ASan, UBSan) from Debian, if missing.
missing=()
for p in clang-14 libclang-rt-14-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "== installing ${missing[*]}"
  SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

start=$(date +%s)
# The library's parsers are compiled instrumented into their fuzzers; the rest of libtpucore comes
# from the release build of scripts/test.sh (brought up to date here, a no-op after test.sh).
echo "== libtpucore (release build, $LIB_BUILD)"
cmake -S . -B "$LIB_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTPU_BUILD_BENCH=ON -DTPU_BENCH_PEERS=OFF \
  -DTPU_BUILD_EXAMPLES=ON >/dev/null
cmake --build "$LIB_BUILD" -j"$JOBS" --target tpucore
echo "== fuzz build (clang-14, ASan + UBSan, $BUILD)"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" -DTPU_SANITIZE=ON -DTPU_BUILD_FUZZ=ON -DTPU_BUILD_TESTS=OFF \
  -DTPU_BUILD_BENCH=OFF -DTPU_BUILD_EXAMPLES=OFF -DTPU_FUZZ_LIB="$PWD/$LIB_BUILD/libtpucore.so" >/dev/null
if [[ $MODE == seeds ]]; then
  cmake --build "$BUILD" -j"$JOBS" --target fuzz_make_seeds
  # the tokenizer, chat_template and model_config seeds are written by hand (tests/fuzz/corpus/), the rest by the tool
  for t in assembly program_json chip_config safetensors idx graph_json; do rm -rf "tests/fuzz/corpus/$t"; done
  "$BUILD/tests/fuzz/fuzz_make_seeds" tests/fuzz/corpus
  echo "seeds written to tests/fuzz/corpus"; exit 0
fi
cmake --build "$BUILD" -j"$JOBS" --target $(printf 'fuzz_%s ' "${TARGETS[@]}")
echo "build: $(( $(date +%s) - start )) s"

export ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
echo "== replaying the regression inputs"
for t in "${TARGETS[@]}"; do
  dir=tests/fuzz/regressions/$t
  mapfile -t files < <(find "$dir" -type f ! -name '*.md' 2>/dev/null | sort)
  if [[ ${#files[@]} -gt 0 ]]; then
    "$BUILD/tests/fuzz/fuzz_$t" -runs=1 "${files[@]}" >"$BUILD/replay_$t.log" 2>&1 ||
      { cat "$BUILD/replay_$t.log" >&2; echo "fuzz_$t: a regression input fails again (log above)" >&2; exit 1; }
  fi
  echo "$t: ${#files[@]} regression inputs pass"
done
[[ $MODE == replay ]] && exit 0

echo "== fuzzing (${RUNS:+$RUNS runs}${RUNS:-$SECONDS_EACH s} per target)"
for t in "${TARGETS[@]}"; do
  work="$BUILD/corpus/$t" findings="$BUILD/findings/$t"
  mkdir -p "$work" "$findings"
  limit=(-max_total_time="$SECONDS_EACH")
  [[ -n $RUNS ]] && limit=(-runs="$RUNS")
  log="$BUILD/fuzz_$t.log"
  t0=$(date +%s)
  if ! "$BUILD/tests/fuzz/fuzz_$t" "${limit[@]}" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$findings/" "$work" "tests/fuzz/corpus/$t" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "fuzz_$t: FINDING, input saved under $findings/ (log $log)" >&2
    exit 1
  fi
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
  echo "$t: $runs runs in $(( $(date +%s) - t0 )) s, no finding"
done
echo "== fuzzing passed ($(( $(date +%s) - start )) s in all)"
