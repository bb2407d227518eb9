#!/usr/bin/env python3
"""tpu-plan against published production runs.

Each row of bench/data/published_tpu_runs.csv is a published training or serving run on a real
TPU slice (model, chips, batch, sequence length, precision, the recipe's rematerialization mapped
to tpu-plan's nearest policy, the published tokens/s per chip and MFU, the source). This script
runs `tpu-plan --json` on each row with the calibrated and the ideal timing model and compares
tokens/s per chip.

    python3 scripts/plan_vs_published.py --build build              # print the table
    python3 scripts/plan_vs_published.py --build build --write-docs # rewrite docs/simulator.md's region
    python3 scripts/plan_vs_published.py --tpu-plan PATH --check 0.25 --only-test
        # exit 1 when a calibrated prediction of a row marked in_test is outside +-25%

A plan whose activations do not fit the chip's HBM is still priced (the recipes that need it
offload activations to host memory, which the planner does not model); the table says so.
"""
import argparse
import csv
import json
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
DATA = os.path.join(ROOT, "bench", "data", "published_tpu_runs.csv")


def plan_args(row):
    model = row["model"]
    if model.endswith(".json"):
        model = os.path.join(ROOT, model)
    args = ["--model", model, "--chip", row["chip"], "--chips", row["chips"], "--json"]
    if row["kind"] == "train":
        args += ["--global-batch", row["global_batch"], "--seq", row["seq"], "--remat", row["remat"]]
        if row["ep"] and row["ep"] != "1":
            args += ["--ep", row["ep"]]
        if row["slices"] and row["slices"] != "1":
            args += ["--slices", row["slices"]]
    else:
        args += ["--serve", "--input-len", row["input_len"], "--output-len", row["output_len"], "--batch", row["batch"]]
        if row.get("max_batched_tokens"):  # the server's token budget (continuous batching, chunked prefill)
            args += ["--max-batched-tokens", row["max_batched_tokens"]]
    return args


def run_plan(exe, row, ideal):
    cmd = [exe] + plan_args(row) + ["--ideal" if ideal else "--calibrated"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    # exit 1 with a JSON plan is "does not fit": still priced; anything else is an error
    try:
        j = json.loads(r.stdout)
    except json.JSONDecodeError:
        sys.exit(f"plan_vs_published: {' '.join(cmd)} exited {r.returncode}: {r.stderr.strip()}")
    return j


def compare(exe, rows):
    out = []
    for row in rows:
        cal, ide = run_plan(exe, row, False), run_plan(exe, row, True)
        pub = float(row["published_tokens_per_s_per_chip"])
        out.append({"row": row, "cal": cal, "ideal": ide, "pub": pub,
                    "ratio_cal": cal["tokens_per_s_per_chip"] / pub,
                    "ratio_ideal": ide["tokens_per_s_per_chip"] / pub})
    return out


def fmt(x, nd=0):
    return f"{x:,.{nd}f}"


def chips_label(row):
    n = f"{row['chip']}-{row['chips']}"
    return n if row["slices"] in ("", "1") else f"{row['slices']} x {n} (DCN)"


def table(results):
    lines = ["| run | chips | batch x seq (remat) | published tokens/s per chip (MFU) | calibrated tokens/s per chip (MFU) "
             "| ideal tokens/s per chip (MFU) | calibrated / published | ideal / published | step breakdown, calibrated "
             "(MXU / other compute / HBM / exposed ICI, s) | fits HBM |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        row, cal, ide = r["row"], r["cal"], r["ideal"]
        if row["kind"] == "train":
            shape = f"{int(row['global_batch']):,} x {int(row['seq']):,} ({row['remat']})"
            pm = f" ({100 * float(row['published_mfu']):.1f}%)" if row["published_mfu"] else ""
            cm, im = f" ({100 * cal['mfu']:.1f}%)", f" ({100 * ide['mfu']:.1f}%)"
            b = cal["breakdown_s"]
            brk = f"{b['mxu']:.2f} / {b['other_compute']:.2f} / {b['hbm']:.2f} / {b['exposed_ici']:.2f}"
        else:
            shape = f"serve {row['batch']} x ({row['input_len']} in, {row['output_len']} out)"
            if row.get("max_batched_tokens"):
                shape += f", {row['max_batched_tokens']} tokens per step"
            pm = cm = im = ""
            brk = f"TTFT {1e3 * cal['ttft_s']:.0f} ms, TPOT {1e3 * cal['tpot_s']:.1f} ms"
        src = f"[{row['source']}]({row['url']})" if row["url"] else row["source"]
        lines.append(f"| `{row['id']}`: {src} | {chips_label(row)} | {shape} | {fmt(r['pub'])}{pm} | "
                     f"{fmt(cal['tokens_per_s_per_chip'])}{cm} | {fmt(ide['tokens_per_s_per_chip'])}{im} | "
                     f"{r['ratio_cal']:.2f} | {r['ratio_ideal']:.2f} | {brk} | {'yes' if cal['fits'] else 'no'} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--tpu-plan", help="the tpu-plan program (default BUILD/tools/tpu-plan/tpu-plan)")
    ap.add_argument("--data", default=DATA)
    ap.add_argument("--only-test", action="store_true", help="only the rows marked in_test")
    ap.add_argument("--check", type=float, metavar="BAND",
                    help="exit 1 when a calibrated tokens/s per chip is outside published x (1 +- BAND)")
    ap.add_argument("--write-docs", action="store_true", help="rewrite the plan-published region of docs/simulator.md")
    args = ap.parse_args()
    exe = args.tpu_plan or os.path.join(args.build, "tools", "tpu-plan", "tpu-plan")
    if not os.path.exists(exe):
        sys.exit(f"plan_vs_published: {exe} is not built (ninja -C BUILD tpu-plan)")
    with open(args.data, newline="") as f:
        rows = [r for r in csv.DictReader(f) if not args.only_test or r["in_test"] == "1"]
    results = compare(exe, rows)
    text = table(results)
    if args.write_docs:
        sys.dont_write_bytecode = True  # no __pycache__ in scripts/
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import gen_figures
        gen_figures.write_region("simulator.md", "plan-published",
                                 gen_figures.header("Simulated on the host; the figures do not depend on it") + "\n\n" + text)
    else:
        print(text)
    if args.check is not None:
        bad = [r for r in results if abs(r["ratio_cal"] - 1) > args.check]
        for r in results:
            print(f"{r['row']['id']}: calibrated {r['cal']['tokens_per_s_per_chip']:.0f} tokens/s per chip, "
                  f"published {r['pub']:.0f}, ratio {r['ratio_cal']:.3f}"
                  f"{'  OUTSIDE' if r in bad else ''} (band +-{100 * args.check:.0f}%)")
        if bad:
            sys.exit(1)
        print(f"{len(results)} passed, 0 failed")


if __name__ == "__main__":
    main()
