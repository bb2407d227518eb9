#!/usr/bin/env bash
# Fair OpenBLAS peer: runs the libtorch (OpenBLAS) f32 GEMM of bench/peer/bench_matmul_torch once
# per OPENBLAS_CORETYPE this CPU can take (from the /proc/cpuinfo flags) and with it unset,
# prints GFLOP per CPU-second per size and thread count for each, names the fastest kernel (per
# case and overall), then runs the whole peer binary once more with that kernel: ours (f32 and
# bf16) against OpenBLAS (f32) and oneDNN (bf16) in one run, as the GEMM table of docs/performance.md.
#   bash scripts/bench_peers.sh [path/to/bench_matmul_torch]
# Needs the peer benchmarks built (cmake -DTPU_BENCH_PEERS=ON with libtorch installed;
# scripts/bench.sh does it). MIN_TIME (default 0.5 s) sets --benchmark_min_time; REPS (default 3)
# the repetitions of the final run, which are interleaved in random order across all cases (ours
# and the peers' alternate, so a burst of load from other work hits both sides alike); each case
# keeps its best repetition, ours and the peers' alike (on a shared host the least disturbed).
# CORETYPE=<name> skips the core-type scan and uses that OpenBLAS kernel. libtorch runs with
# OMP_WAIT_POLICY=PASSIVE, its best setting for CPU time (its OpenMP threads otherwise spin).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${1:-}"
if [ -z "$BIN" ]; then
  for c in build/bench/bench_matmul_torch build/bench/peer/bench_matmul_torch; do
    [ -x "$c" ] && BIN="$c" && break
  done
fi
BIN="${BIN:-build/bench/bench_matmul_torch}"
if [ ! -x "$BIN" ]; then
  echo "bench_peers: $BIN not found; build it with -DTPU_BENCH_PEERS=ON (libtorch-dev installed)" >&2
  exit 1
fi
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
vendor="$(grep -m1 '^vendor_id' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')"
has() { for f in "$@"; do [[ "$flags" == *" $f "* ]] || return 1; done; }
types=()
has avx2 fma && types+=(Haswell)
has avx2 fma && [ "$vendor" = AuthenticAMD ] && types+=(Zen)
has avx512f avx512bw avx512vl avx512dq && types+=(SkylakeX)
has avx512f avx512bw avx512vl avx512dq avx512_bf16 && types+=(Cooperlake)
has avx512f avx512bw avx512vl avx512dq avx512_bf16 amx_tile && types+=(SapphireRapids)
model="$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
echo "CPU: $model ($(nproc) cores); OPENBLAS_CORETYPE candidates: ${types[*]:-none} and unset"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
if [ -n "${CORETYPE:-}" ]; then  # skip the scan: use this core type (e.g. the last scan's best)
  echo "OPENBLAS_CORETYPE=$CORETYPE given (no scan)"
  echo "$CORETYPE" >"$out/best"
fi
for t in unset "${types[@]}"; do
  [ -n "${CORETYPE:-}" ] && break
  if [ "$t" = unset ]; then
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_WAIT_POLICY=PASSIVE "$BIN" --benchmark_filter='BM_torch_f32' \
      --benchmark_min_time="${MIN_TIME:-0.5}" --benchmark_format=json >"$out/$t.json" 2>/dev/null
  else
    env -u OPENBLAS_L2_SIZE OMP_WAIT_POLICY=PASSIVE OPENBLAS_CORETYPE="$t" "$BIN" --benchmark_filter='BM_torch_f32' \
      --benchmark_min_time="${MIN_TIME:-0.5}" --benchmark_format=json >"$out/$t.json" 2>/dev/null
  fi
done
[ -n "${CORETYPE:-}" ] || python3 - "$out" unset "${types[@]}" <<'PY'
import json, sys
d, names = sys.argv[1], sys.argv[2:]
res = {}  # coretype -> {n: GFLOP/s}
for t in names:
    with open(f"{d}/{t}.json") as f:
        js = json.load(f)
    res[t] = {tuple(b["name"].split("/")[1:3]): b["GFLOP/cpu_s"] for b in js["benchmarks"] if "GFLOP/cpu_s" in b}
sizes = sorted({n for r in res.values() for n in r}, key=lambda c: (int(c[1]), int(c[0])))
print("OPENBLAS_CORETYPE  " + "".join(f"{'n=' + c[0] + '/' + c[1] + 't':>12}" for c in sizes) + "   (f32 GEMM GFLOP per CPU-second, libtorch + OpenBLAS)")
for t in names:
    print(f"{t:<18} " + "".join(f"{res[t].get(n, float('nan')):>12.1f}" for n in sizes))
for n in sizes:
    best = max(names, key=lambda t: res[t].get(n, 0))
    print(f"fastest at n={n[0]}, {n[1]} thread(s): {best} ({res[best][n]:.1f})")
import math
overall = max(names, key=lambda t: sum(math.log(max(res[t].get(n, 0), 1e-9)) for n in sizes))  # geometric mean
print(f"fastest overall: OPENBLAS_CORETYPE={overall}")
with open(f"{d}/best", "w") as f:
    f.write(overall)
PY
best="$(cat "$out/best")"
if [ "$best" = unset ]; then run=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_WAIT_POLICY=PASSIVE); else run=(env -u OPENBLAS_L2_SIZE OMP_WAIT_POLICY=PASSIVE OPENBLAS_CORETYPE="$best"); fi
"${run[@]}" "$BIN" --benchmark_min_time="${MIN_TIME:-0.5}" --benchmark_repetitions="${REPS:-3}" \
  --benchmark_enable_random_interleaving=true --benchmark_format=json >"$out/all.json" 2>/dev/null
python3 - "$out/all.json" "$best" "$model" <<'PY'
import json, sys
js = json.load(open(sys.argv[1]))
g = {}
for b in js["benchmarks"]:
    if "GFLOP/cpu_s" in b and b.get("run_type", "iteration") == "iteration":
        name, n, t = b["name"].split("/")[:3]
        g[(name, int(n), int(t))] = max(g.get((name, int(n), int(t)), 0), b["GFLOP/cpu_s"])
print(f"one run, {sys.argv[3]}; GFLOP per CPU-second (process CPU time, all threads), best of the randomly interleaved repetitions")
print(f"| n | threads | ours f32 | OpenBLAS f32 ({sys.argv[2]}) | ratio | ours bf16 | oneDNN bf16 | ratio |")
print("|---|---|---|---|---|---|---|---|")
for t in (1, 2):
    for n in (256, 512, 1024, 2048):
        of, tf = g.get(("BM_ours_f32", n, t), 0), g.get(("BM_torch_f32", n, t), 0)
        ob, tb = g.get(("BM_ours_bf16", n, t), 0), g.get(("BM_torch_bf16", n, t), 0)
        print(f"| {n} | {t} | {of:.1f} | {tf:.1f} | {of / max(tf, 1e-9):.2f}x | {ob:.1f} | {tb:.1f} | {ob / max(tb, 1e-9):.2f}x |")
PY
