#!/usr/bin/env bash
# Fair OpenBLAS peer: runs the libtorch (OpenBLAS) f32 GEMM of bench/peer/bench_matmul_torch once
# per OPENBLAS_CORETYPE this CPU can take (from the /proc/cpuinfo flags) and with it unset,
# prints GFLOP/s per size for each, and names the fastest kernel (per size and overall).
#   bash scripts/bench_peers.sh [path/to/bench_matmul_torch]
# Needs the peer benchmarks built (cmake -DTPU_BENCH_PEERS=ON with libtorch installed;
# scripts/bench.sh does it). MIN_TIME (default 0.2 s) sets --benchmark_min_time.
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
for t in unset "${types[@]}"; do
  if [ "$t" = unset ]; then
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$BIN" --benchmark_filter='BM_torch_f32' \
      --benchmark_min_time="${MIN_TIME:-0.2}" --benchmark_format=json >"$out/$t.json" 2>/dev/null
  else
    env -u OPENBLAS_L2_SIZE OPENBLAS_CORETYPE="$t" "$BIN" --benchmark_filter='BM_torch_f32' \
      --benchmark_min_time="${MIN_TIME:-0.2}" --benchmark_format=json >"$out/$t.json" 2>/dev/null
  fi
done
python3 - "$out" unset "${types[@]}" <<'PY'
import json, sys
d, names = sys.argv[1], sys.argv[2:]
res = {}  # coretype -> {n: GFLOP/s}
for t in names:
    with open(f"{d}/{t}.json") as f:
        js = json.load(f)
    res[t] = {int(b["name"].split("/")[1]): b["GFLOP/s"] for b in js["benchmarks"] if "GFLOP/s" in b}
sizes = sorted({n for r in res.values() for n in r})
print("OPENBLAS_CORETYPE  " + "".join(f"{'n=' + str(n):>10}" for n in sizes) + "   (f32 GEMM GFLOP/s, libtorch + OpenBLAS)")
for t in names:
    print(f"{t:<18} " + "".join(f"{res[t].get(n, float('nan')):>10.1f}" for n in sizes))
for n in sizes:
    best = max(names, key=lambda t: res[t].get(n, 0))
    print(f"fastest at n={n}: {best} ({res[best][n]:.1f} GFLOP/s)")
overall = max(names, key=lambda t: sum(res[t].get(n, 0) / max(res[u].get(n, 1e-9) for u in names) for n in sizes))
print(f"fastest overall: OPENBLAS_CORETYPE={overall}  (use it for the peer rows)")
PY
