#!/usr/bin/env python3
"""Price the square-grid matmul sets (matmul_128, matmul_1024, matmul_4096) by alternative
hardware / compiler rules and report MAPE, R^2 and split-half cross-validation per set.

Input: the per-kernel work and the per-row times tpu-calib writes for those sets, e.g.

    tpu-calib --sets matmul_128,matmul_1024,matmul_4096,matmul_large --paths compiled --folds 0 \
        --works works.txt --csv rows.csv
    python3 tools/tpu-calib/grid_forms.py works.txt rows.csv

The calibrated price is recomputed from the counted work with the v4 preset's constants (below)
and checked against tpu-calib's simulated times, so the rules are applied to the same work the
simulator counts. Each rule changes one mechanism; a rule with a constant fits it on the rows
(by MAPE, golden-section on one variable) and reports split-half cross-validation (the constant
fitted on alternate rows of the set, the other rows predicted, pooled). The free forms at the end
fit every coefficient on the set by weighted least squares (relative error): what the set's rows
would need, not a model (they ignore every other set). For matmul_1024 it also prints what any shape-only
rule can reach: tile-quantized core-split and wave forms with leave-one-K-plane-out CV, the best
a slow-cell rule does with the cells picked from the measured times, and how those cells move
between K planes. matmul_large's rows, when present, are
priced by the conversion-bound form too (their dims and layouts from
sim/calibration/tpu_v4/matmul_large.csv). Only the Python standard library is used.
"""
import csv
import math
import os
import re
import sys

# v4 preset (sim/presets.cpp, calibrated timing model): checked against tpu-calib's prices below.
LAUNCH, FILL, MXU_EFF, HBM_EFF, WIDE_EFF = 957.0, 128.0, 0.829, 0.307, 0.697
MXUS_PER_CORE, CORES, CLOCK_GHZ, HBM_GBS = 4, 2, 1.05, 1200.0
BW = HBM_GBS / CLOCK_GHZ  # device HBM bytes per cycle
SETS = ("matmul_128", "matmul_1024", "matmul_4096")


DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "sim", "calibration", "tpu_v4", "matmul_large.csv")


def load(works_path, csv_path):
    large = {r["kernel_name"]: r for r in csv.DictReader(open(DATA))}
    sim_us = {}
    for r in csv.DictReader(open(csv_path)):
        if r["path"] == "compiled":
            sim_us[(r["set"], r["kernel"])] = float(r["simulated_us"])
    rows = []
    for line in open(works_path):
        f = next(csv.reader([line]))
        if f[2] != "compiled" or f[0] not in SETS + ("matmul_large",):
            continue
        layouts = None
        if f[0] == "matmul_large":
            d = large[f[1]]
            m, n, k = int(d["dim_m"]), int(d["dim_n"]), int(d["dim_k"])
            layouts = dict(pre=d["prefetched"], a=d["a_layout"] == "{0,1}", b=d["b_layout"] == "{0,1}", c=d["out_layout"] == "{0,1}")
        else:
            m, n, k = map(int, re.findall(r"\d+", f[1])[-3:])
        cores = []
        for i in range(int(f[5])):
            b = 6 + 6 * i
            cores.append(dict(mxu=float(f[b]), vec=float(f[b + 1]), wl=float(f[b + 2]), narrow=float(f[b + 4])))
        rd, wr, traffic = map(float, f[-3:])
        rows.append(dict(set=f[0], m=m, n=n, k=k, layouts=layouts, meas=float(f[3]) * CLOCK_GHZ * 1e3, cores=cores,
                         rd=rd, wr=wr, traffic=traffic, sim=sim_us[(f[0], f[1])] * CLOCK_GHZ * 1e3))
    return rows


def terms(r, split="library", wl=0.0):
    """Compute and memory cycles of the calibrated model (sim/timing_model.cpp)."""
    if split == "library":  # the busiest core of the library kernel's own split
        c = max((co["mxu"] + wl * co["wl"]) / (MXUS_PER_CORE * MXU_EFF) for co in r["cores"])
    else:  # XLA's: the MXU work spread evenly over both TensorCores
        c = sum(co["mxu"] + wl * co["wl"] for co in r["cores"]) / CORES / (MXUS_PER_CORE * MXU_EFF)
    c = max([c] + [co["vec"] for co in r["cores"]])
    narrow = sum(co["narrow"] for co in r["cores"])
    share = min(1.0, narrow / r["wr"]) if r["wr"] else 0.0
    mem = (r["rd"] + r["wr"]) / BW * (share / HBM_EFF + (1 - share) / WIDE_EFF)
    return c, mem


def preset(r, _=None):
    c, mem = terms(r)
    return LAUNCH + max(FILL + c + mem, r["traffic"] / BW)


def stats(rows, pred):
    y = [r["meas"] for r in rows]
    mape = 100 * sum(abs(p - a) / a for p, a in zip(pred, y)) / len(y)
    mean = sum(y) / len(y)
    r2 = 1 - sum((p - a) ** 2 for p, a in zip(pred, y)) / sum((a - mean) ** 2 for a in y)
    return mape, r2


def fit1(rows, rule, lo, hi):
    """The rule's one constant minimizing MAPE on rows (golden-section over [lo, hi])."""
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    f = lambda x: stats(rows, [rule(r, x) for r in rows])[0]
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(60):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    return (a + b) / 2


def cv_rule(rows, rule, lo, hi):
    halves = (rows[0::2], rows[1::2])
    pred, held = [], []
    for i in (0, 1):
        x = fit1(halves[i], rule, lo, hi)
        held += halves[1 - i]
        pred += [rule(r, x) for r in halves[1 - i]]
    return stats(held, pred)


def lstsq(X, y):
    n = len(X[0])
    A = [[0.0] * n for _ in range(n)]
    b = [0.0] * n
    for xi, yi in zip(X, y):
        w = 1 / yi ** 2
        for i in range(n):
            b[i] += w * xi[i] * yi
            for j in range(n):
                A[i][j] += w * xi[i] * xi[j]
    for i in range(n):
        for j in range(i + 1, n):
            f = A[j][i] / A[i][i]
            for k in range(n):
                A[j][k] -= f * A[i][k]
            b[j] -= f * b[i]
    x = [0.0] * n
    for i in reversed(range(n)):
        x[i] = (b[i] - sum(A[i][j] * x[j] for j in range(i + 1, n))) / A[i][i]
    return x


def free_form(rows, feat):
    X = [feat(r) for r in rows]
    y = [r["meas"] for r in rows]
    co = lstsq(X, y)
    fit = stats(rows, [sum(a * b for a, b in zip(co, x)) for x in X])
    idx = (list(range(0, len(rows), 2)), list(range(1, len(rows), 2)))
    held, pred = [], []
    for i in (0, 1):
        c2 = lstsq([X[j] for j in idx[i]], [y[j] for j in idx[i]])
        for j in idx[1 - i]:
            held.append(rows[j])
            pred.append(sum(a * b for a, b in zip(c2, X[j])))
    return co, fit, stats(held, pred)


def limits(m1024, mem, convert_price, deep):
    """What any shape-only rule can reach on matmul_1024: tile-quantized core-split and wave forms
    (free fits, with split-half and leave-one-K-plane-out CV), the best a slow-cell term can do
    when the cells are picked from the measured times, how the slow cells move between K, and
    the best predicates of one to three threshold conditions (searched on the whole half, and on
    three K planes predicting the fourth). `deep`: the three-condition search too (about a minute)."""
    y = [r["meas"] for r in m1024]
    ks = sorted({r["k"] for r in m1024})
    ce = math.ceil

    def free_cv(feat):
        X = [feat(r) for r in m1024]

        def pred(train):
            co = lstsq([X[i] for i in train], [y[i] for i in train])
            return [sum(a * b for a, b in zip(co, x)) for x in X]
        idx = range(len(m1024))
        fit = stats(m1024, pred(list(idx)))
        folds = []
        for i in (0, 1):
            p, te = pred(list(idx)[i::2]), list(idx)[1 - i::2]
            folds.append(stats([m1024[j] for j in te], [p[j] for j in te]))
        held, hp = [], []
        for k in ks:
            p = pred([i for i in idx if m1024[i]["k"] != k])
            held += [r for r in m1024 if r["k"] == k]
            hp += [p[i] for i in idx if m1024[i]["k"] == k]
        return fit, folds, stats(held, hp)

    def tiles(r, tm, tn, how):  # the busiest core's output tiles times the tile's work
        a, b = ce(r["m"] / tm), ce(r["n"] / tn)
        per = {"N": ce(b / CORES) * a, "M": ce(a / CORES) * b, "larger": ce(b / CORES) * a if r["n"] >= r["m"] else ce(a / CORES) * b,
               "evenly by tile": ce(a * b / CORES), "waves of 8 MXUs": ce(a * b / (CORES * MXUS_PER_CORE)) * MXUS_PER_CORE}[how]
        return per * tm * tn * r["k"] / 1e6

    print("\nmatmul_1024: tile-quantized core split and waves (launch + a work + b memory, fitted on the set;"
          " CV split-half folds; LKO = each K plane predicted from the other three)")
    for tm, tn in ((128, 128), (256, 256)):
        for how in ("N", "M", "larger", "evenly by tile", "waves of 8 MXUs"):
            fit, folds, lko = free_cv(lambda r: [1, tiles(r, tm, tn, how), mem(r)])
            print(f"  {tm}x{tn} tiles, split {how:<16} {fit[0]:6.2f}% {fit[1]:.3f}  folds {folds[0][0]:5.2f}% {folds[0][1]:.3f},"
                  f" {folds[1][0]:5.2f}% {folds[1][1]:.3f}  LKO {lko[0]:6.2f}% {lko[1]:.3f}")

    def refeed(r, rate):
        return LAUNCH + r["m"] * r["n"] * r["k"] / 128 / rate

    print("\nmatmul_1024: the best a slow-cell rule can do, the cells picked from the measured times")
    price = [preset(r) for r in m1024]
    best = None
    for rate in range(100, 400, 2):
        p = [min(q, max(q, refeed(r, rate)), key=lambda v: abs(v - t)) for r, q, t in zip(m1024, price, y)]
        f = stats(m1024, p)
        if best is None or f[1] > best[1][1]:
            best = (rate, f, sum(a != b for a, b in zip(p, price)))
    print(f"  the model, re-feed floor M N K / 128 / r on the {best[2]} cells it brings closer (r {best[0]}):"
          f" {best[1][0]:.2f}% / {best[1][1]:.4f}")
    for thr in (1.1, 1.2, 1.3):
        p = [t if t > thr * q else q for q, t in zip(price, y)]
        print(f"  the model, the {sum(t > thr * q for q, t in zip(price, y))} cells measured over {thr} x its price"
              f" set to their measured time: {stats(m1024, p)[0]:.2f}% / {stats(m1024, p)[1]:.4f}")
    slow = {(r["m"], r["n"], r["k"]) for r, q, t in zip(m1024, price, y) if t > 1.2 * q}
    plane = {k: {(m, n) for m, n, kk in slow if kk == k} for k in ks}
    print("  cells measured over 1.2 x the model's price, per K: " + ", ".join(f"{k}: {len(plane[k])}" for k in ks)
          + "; in both of two adjacent planes: " + ", ".join(f"{a}/{b}: {len(plane[a] & plane[b])}" for a, b in zip(ks, ks[1:])))
    dom = [(a, b) for a in slow for b in ((r["m"], r["n"], r["k"]) for r in m1024) if b != a and all(x >= z for x, z in zip(b, a))]
    cell = {(r["m"], r["n"], r["k"]): (t, q) for r, q, t in zip(m1024, price, y)}
    print("  at K 1024 (measured us, measured / price): " + ", ".join(
        f"{m} x {n}: {cell[(m, n, 1024)][0] / 1e3 / CLOCK_GHZ:.1f}, {cell[(m, n, 1024)][0] / cell[(m, n, 1024)][1]:.2f}"
        for m, n in ((384, 768), (640, 640), (896, 512))))
    print(f"  pairs (slow cell, a cell at least as large in M, N and K): {len(dom)}, the larger one not slow in"
          f" {sum(b not in slow for a, b in dom)}")
    print(f"  LKO, the model as it is (no fitted constant): {stats(m1024, price)[0]:.2f}% / {stats(m1024, price)[1]:.4f}")
    for mode in ("either", "both"):  # a K plane's slow cells guessed from its neighbours', r fitted on the other planes
        held, hp = [], []
        for k in ks:
            train = [(r, q) for r, q in zip(m1024, price) if r["k"] != k and (r["m"], r["n"], r["k"]) in slow]
            rate = min(range(100, 400, 2), key=lambda v: sum(abs(max(q, refeed(r, v)) - r["meas"]) / r["meas"] for r, q in train))
            nb = [plane[j] for j in (k - 256, k + 256) if j in plane]
            for r, q in zip(m1024, price):
                if r["k"] == k:
                    hit = [(r["m"], r["n"]) in s for s in nb]
                    held.append(r)
                    hp.append(max(q, refeed(r, rate)) if (any(hit) if mode == "either" else all(hit)) else q)
        f = stats(held, hp)
        print(f"  LKO, a plane's slow cells taken as those slow in {mode} neighbouring plane(s): {f[0]:.2f}% / {f[1]:.4f}")

    print("  one slow-mode term on the cells it brings closer (picked from the measured times), its constant"
          " fitted by R^2:")
    terms_ = {"floor M N K / 128 / q": None, "+ A / q": lambda m, n, k: m * k, "+ B / q": lambda m, n, k: k * n,
              "+ C / q": lambda m, n, k: m * n, "+ (A + B) / q": lambda m, n, k: m * k + k * n,
              "+ M N K / 128 / q": lambda m, n, k: m * n * k / 128, "+ q cycles": lambda m, n, k: 1.0}
    bases = (("the model", price), ("conversion-bound", convert_price))
    for bname, base in bases:
        figs = []
        for tname, f in terms_.items():
            if f is None:
                grid = range(100, 320, 4)
            else:  # geometric grids over the constant's plausible range
                grid = [1e3 * 1.1 ** i for i in range(40)] if tname == "+ q cycles" else [10 * 1.06 ** i for i in range(80)]
            best = None
            for q in grid:
                p = []
                for r, b, t in zip(m1024, base, y):
                    m, n, k = r["m"], r["n"], r["k"]
                    v = max(b, refeed(r, q)) if f is None else b + (q if tname == "+ q cycles" else f(m, n, k) / q)
                    p.append(min(b, v, key=lambda u: abs(u - t)))
                fit = stats(m1024, p)
                if best is None or fit[1] > best[1]:
                    best = fit
            figs.append(f"{tname} {best[0]:.2f}% / {best[1]:.4f}")
        best = None
        for q1 in range(100, 320, 4):
            for q2 in range(q1, 320, 4):
                p = [min(b, max(b, refeed(r, q1)), max(b, refeed(r, q2)), key=lambda u: abs(u - t)) for r, b, t in zip(m1024, base, y)]
                fit = stats(m1024, p)
                if best is None or fit[1] > best[1][1]:
                    best = ((q1, q2), fit)
        print(f"    {bname}: " + "; ".join(figs) + f"; two floors (q {best[0][0]}, {best[0][1]}, each cell the closer)"
              f" {best[1][0]:.2f}% / {best[1][1]:.4f}")

    feats = {"M": lambda m, n, k: m, "N": lambda m, n, k: n, "K": lambda m, n, k: k, "A": lambda m, n, k: m * k,
             "B": lambda m, n, k: k * n, "C": lambda m, n, k: m * n, "MNK": lambda m, n, k: m * n * k,
             "M-N": lambda m, n, k: m - n, "max(M,N)": lambda m, n, k: max(m, n), "min(M,N)": lambda m, n, k: min(m, n),
             "A+B": lambda m, n, k: m * k + k * n, "A+C": lambda m, n, k: m * k + m * n, "B+C": lambda m, n, k: k * n + m * n,
             "A+B+C": lambda m, n, k: m * k + k * n + m * n, "M%256": lambda m, n, k: m % 256, "N%256": lambda m, n, k: n % 256,
             "tiles%8": lambda m, n, k: (m // 128) * (n // 128) % 8}

    def singles(idx):  # (name, test, bitset over idx) for thresholds at up to 16 quantiles of each feature
        out = []
        for fn, f in feats.items():
            vals = sorted({f(m1024[i]["m"], m1024[i]["n"], m1024[i]["k"]) for i in idx})
            if len(vals) > 17:
                vals = [vals[j * (len(vals) - 1) // 16] for j in range(17)]
            for t in vals[1:]:
                ge = sum(1 << j for j, i in enumerate(idx) if f(m1024[i]["m"], m1024[i]["n"], m1024[i]["k"]) >= t)
                out.append((f"{fn} >= {t}", lambda r, f=f, t=t: f(r["m"], r["n"], r["k"]) >= t, ge))
                out.append((f"{fn} < {t}", lambda r, f=f, t=t: f(r["m"], r["n"], r["k"]) < t, ((1 << len(idx)) - 1) ^ ge))
        return out

    def byte_tables(d):  # sums of d over the set bits, eight rows at a time
        return [[sum(d[b * 8 + j] for j in range(8) if v >> j & 1 and b * 8 + j < len(d)) for v in range(256)]
                for b in range((len(d) + 7) // 8)]

    def bsum(tab, bits):
        s, b = 0.0, 0
        while bits:
            s, bits, b = s + tab[b][bits & 255], bits >> 8, b + 1
        return s

    def search(idx, base, q, depth):
        """The predicate (1-3 conditions, AND / OR) whose cells priced at the re-feed floor give the
        best R^2 on rows idx; three conditions greedily from the 300 best pairs."""
        mean = sum(y[i] for i in idx) / len(idx)
        sst = sum((y[i] - mean) ** 2 for i in idx)
        fast = [(base[i] - y[i]) ** 2 for i in idx]
        tab = byte_tables([(max(base[i], refeed(m1024[i], q)) - y[i]) ** 2 - e for i, e in zip(idx, fast)])
        r2 = lambda bits: 1 - (sum(fast) + bsum(tab, bits)) / sst
        sg = singles(idx)
        cand = [(r2(b), n, t, b) for n, t, b in sg]
        for a in range(len(sg)):
            for b in range(a + 1, len(sg)):
                (na, ta, ba), (nb, tb, bb) = sg[a], sg[b]
                cand.append((r2(ba & bb), f"{na} and {nb}", lambda r, ta=ta, tb=tb: ta(r) and tb(r), ba & bb))
                cand.append((r2(ba | bb), f"{na} or {nb}", lambda r, ta=ta, tb=tb: ta(r) or tb(r), ba | bb))
        cand.sort(key=lambda c: -c[0])
        best = cand[0]
        if depth == 3:
            for _, n, t, b in cand[:300]:
                for n2, t2, b2 in sg:
                    for v, nm, tt, bits in ((r2(b & b2), f"({n}) and {n2}", lambda r, t=t, t2=t2: t(r) and t2(r), b & b2),
                                            (r2(b | b2), f"({n}) or {n2}", lambda r, t=t, t2=t2: t(r) or t2(r), b | b2)):
                        if v > best[0]:
                            best = (v, nm, tt, bits)
        return best

    print("  predicates searched (thresholds on M, N, K, A, B, C, their sums, MNK, M - N, max / min of M and N,"
          " M and N mod 256, output tiles mod 8; AND / OR), the re-feed floor at q 180 on the cells they select:")
    idx = list(range(len(m1024)))
    for bname, base in bases:
        for depth in ((2, 3) if deep else (2,)):
            v, name, test, _ = search(idx, base, 180, depth)
            whole = stats(m1024, [max(b, refeed(r, 180)) if test(r) else b for r, b in zip(m1024, base)])
            held, hp, names = [], [], []
            for k in ks:
                _, nk, tk, _ = search([i for i in idx if m1024[i]["k"] != k], base, 180, depth)
                names.append(nk)
                for r, b in zip(m1024, base):
                    if r["k"] == k:
                        held.append(r)
                        hp.append(max(b, refeed(r, 180)) if tk(r) else b)
            lko = stats(held, hp)
            print(f"    {bname}, up to {depth} conditions: best on the half \"{name}\" {whole[0]:.2f}% / {whole[1]:.4f};"
                  f" LKO (searched per fold) {lko[0]:.2f}% / {lko[1]:.4f}")

def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    rows = load(sys.argv[1], sys.argv[2])
    large = [r for r in rows if r["set"] == "matmul_large"]
    rows = [r for r in rows if r["set"] != "matmul_large"]
    worst = max(abs(preset(r) - r["sim"]) / r["sim"] for r in rows)
    if worst > 1e-3:
        sys.exit(f"grid_forms: the preset's price differs from tpu-calib's by {100 * worst:.2f}%: constants changed?")
    by_set = {s: [r for r in rows if r["set"] == s] for s in SETS}
    m1024 = by_set["matmul_1024"]

    print("the model's bias on matmul_1024 (mean of simulated / measured - 1; MAPE), per dimension")
    for key in ("m", "n", "k"):
        cells = []
        for v in sorted({r[key] for r in m1024}):
            e = [(preset(r) - r["meas"]) / r["meas"] for r in m1024 if r[key] == v]
            cells.append(f"{v}: {100 * sum(e) / len(e):+.1f}% ({100 * sum(map(abs, e)) / len(e):.1f})")
        print(f"  {key.upper()}  " + ", ".join(cells))

    def split_rule(r, _=None):
        c, mem = terms(r, "xla")
        return LAUNCH + max(FILL + c + mem, r["traffic"] / BW)

    def wl_rule(r, w):
        c, mem = terms(r, "library", w)
        return LAUNCH + max(FILL + c + mem, r["traffic"] / BW)

    def read_rule(r, er):  # operand reads at their own HBM fraction, C's 16-bit writes at hbm_efficiency
        c, _ = terms(r)
        narrow = sum(co["narrow"] for co in r["cores"])
        share = min(1.0, narrow / r["wr"]) if r["wr"] else 0.0
        mem = r["rd"] / BW / er + r["wr"] / BW * (share / HBM_EFF + (1 - share) / WIDE_EFF)
        return LAUNCH + max(FILL + c + mem, r["traffic"] / BW)

    def hide_rule(r, p):  # the smaller of compute and memory exposed by (smaller / larger)^p
        c, mem = terms(r)
        lo, hi = min(c, mem), max(c, mem)
        return LAUNCH + max(FILL + hi + lo * (lo / hi) ** p, r["traffic"] / BW)

    print("\nrules on the preset's constants (constant fitted on matmul_1024 by MAPE; CV = split-half)")
    print(f"  {'rule':<46} {'const':>7}  {'matmul_1024':>14} {'CV':>14}  {'matmul_128':>14} {'matmul_4096':>14}")
    rules = [("the model", lambda r, _: preset(r), None),
             ("XLA's even split of the MXU work over 2 cores", split_rule, None),
             ("weight loads exposed (weight_load_exposed)", wl_rule, (0.0, 1.0)),
             ("operand reads at their own HBM fraction", read_rule, (0.2, 1.0)),
             ("memory-bound rows hide compute, exponent p", hide_rule, (0.0, 3.0))]
    for name, rule, rng in rules:
        x = fit1(m1024, rule, *rng) if rng else None
        cv = cv_rule(m1024, rule, *rng) if rng else stats(m1024, [rule(r, None) for r in m1024])
        figs = [stats(by_set[s], [rule(r, x) for r in by_set[s]]) for s in SETS]
        const = f"{x:.3f}" if rng else "-"
        print(f"  {name:<46} {const:>7}  {figs[1][0]:6.2f}% {figs[1][1]:.3f} {cv[0]:6.2f}% {cv[1]:.3f}"
              f"  {figs[0][0]:6.2f}% {figs[0][1]:.3f} {figs[2][0]:6.2f}% {figs[2][1]:.3f}")

    def lib_c(r):
        return terms(r)[0]

    def even_c(r):
        return terms(r, "xla")[0]

    def mem(r):
        return terms(r)[1]

    def mnk(r):
        return r["m"] * r["n"] * r["k"] / (128 * 128 * MXUS_PER_CORE * CORES)

    def convert_bound(r, rate=310.0, wide=lambda m, n, k, pre: False):
        """XLA's float16 kernel paced by the vector unit's float16 -> bf16 conversion (the MXUs
        hidden under it): every element of A, B and C once, plus the streamed operand (the
        smaller one; A when M < N) again for every panel of the prefetched one, at `rate`
        elements per cycle; or by HBM when that is longer. Panels 128 wide, 256 where `wide`."""
        m, n, k = r["m"], r["n"], r["k"]
        pre = "B" if m < n else "A"
        panel = 256 if wide(m, n, k, pre) else 128
        passes = m * k * math.ceil(n / panel) if pre == "B" else k * n * math.ceil(m / panel)
        return LAUNCH + FILL + max((passes + m * k + k * n + m * n) / rate, terms(r)[1])

    def prefetched_over_2mib(m, n, k, pre):
        return (k * n if pre == "B" else m * k) > 2 ** 20

    panel_rules = [("128 everywhere", lambda m, n, k, pre: False),
                   ("256 where the prefetched operand > 2^20 elements", prefetched_over_2mib),
                   ("256 where the panelled dimension > 1024", lambda m, n, k, pre: (m if pre == "A" else n) > 1024),
                   ("256 where the panelled dimension is a multiple of 256", lambda m, n, k, pre: (m if pre == "A" else n) % 256 == 0),
                   ("256 where K > 1024", lambda m, n, k, pre: k > 1024)]
    print("\nconversion-bound form (no MXU term; convert_elems_per_cycle 310, launch and fill the preset's)")
    print(f"  {'panel width':<54} {'matmul_128':>14} {'matmul_1024':>14} {'matmul_4096':>14}")
    for name, wide in panel_rules:
        figs = [stats(by_set[s], [convert_bound(r, 310.0, wide) for r in by_set[s]]) for s in SETS]
        print(f"  {name:<54} " + " ".join(f"{f[0]:6.2f}% {f[1]:.3f}" for f in figs))
    allrows = [r for s in SETS for r in by_set[s]]
    for name, price in (("the model", preset), ("conversion-bound, 2^20 rule", lambda r: convert_bound(r, 310.0, prefetched_over_2mib))):
        f = stats(allrows, [price(r) for r in allrows])
        print(f"  all three sets ({len(allrows)} rows), {name}: {f[0]:.2f}% / {f[1]:.4f}")
    cells = []
    for v in sorted({r["m"] for r in m1024}):
        e = [(convert_bound(r, 310.0) - r["meas"]) / r["meas"] for r in m1024 if r["m"] == v]
        cells.append(f"{v}: {100 * sum(e) / len(e):+.1f}% ({100 * sum(map(abs, e)) / len(e):.1f})")
    print("  matmul_1024 bias per M, conversion-bound: " + ", ".join(cells))
    for s in ("matmul_1024", "matmul_4096"):
        rule = lambda r, x: convert_bound(r, x, prefetched_over_2mib)
        x = fit1(by_set[s], rule, 150.0, 600.0)
        fit = stats(by_set[s], [rule(r, x) for r in by_set[s]])
        cv = cv_rule(by_set[s], rule, 150.0, 600.0)
        folds = [fit1(by_set[s][i::2], rule, 150.0, 600.0) for i in (0, 1)]
        print(f"  {s}: rate fitted on the set {x:.0f} per cycle (folds {folds[0]:.0f}, {folds[1]:.0f}): "
              f"{fit[0]:.2f}% / {fit[1]:.3f}, CV {cv[0]:.2f}% / {cv[1]:.3f}")

    limits(m1024, mem, [convert_bound(r, 310.0, prefetched_over_2mib) for r in m1024], "--deep" in sys.argv[3:])

    if large:  # the same form on matmul_large's rows, its re-feed floor (restream 192) kept
        def large_price(r, rate, transposed_c):
            lay, m, n, k = r["layouts"], r["m"], r["n"], r["k"]
            a_streams = lay["pre"] == "B"
            streamed, other = (m * k, n) if a_streams else (k * n, m)
            panel = 256 if (k * n if a_streams else m * k) > 2 ** 20 else 128
            work = m * k + k * n + m * n + streamed * math.ceil(other / panel)
            if transposed_c and not a_streams and lay["c"] and not (lay["a"] and lay["b"]):
                work += m * n
            t = LAUNCH + FILL + max(work / rate, terms(r)[1])
            if not (not a_streams and lay["a"] and lay["b"] and lay["c"]) and (lay["a"] if a_streams else lay["b"]):
                second_minor, free = (k, m) if a_streams else (n, n)
                if (second_minor + 7) // 8 % 2 == 1 or free < 2048:
                    t = max(t, streamed * math.ceil(other / 128) / 192)
            return t
        f = stats(large, [r["sim"] for r in large])
        print(f"  matmul_large ({len(large)} rows): the model (feed rules) {f[0]:.2f}% / {f[1]:.3f}; conversion-bound, 2^20 rule:", end="")
        for rate in (250, 310):
            for tc in (True, False):
                f = stats(large, [large_price(r, rate, tc) for r in large])
                print(f" {rate}{' with' if tc else ' without'} the transposed C {f[0]:.2f}% / {f[1]:.3f};", end="")
        print()

    fast = [r for r in m1024 if r["meas"] / preset(r) < 1.15]
    print("\nfree forms (every coefficient fitted on the set alone, relative least squares; cycles)")
    forms = [("launch + a c + b m (library split)", lambda r: [1, lib_c(r), mem(r)]),
             ("launch + a c + b m (even split)", lambda r: [1, even_c(r), mem(r)]),
             ("launch + a MNK/peak + b A + c B + d C (elements)", lambda r: [1, mnk(r), r["m"] * r["k"], r["k"] * r["n"], r["m"] * r["n"]])]
    for label, rs in (("matmul_1024", m1024), (f"matmul_1024, {len(fast)} rows within 15% of the model", fast),
                      ("matmul_4096", by_set["matmul_4096"])):
        for name, feat in forms:
            co, fit, cv = free_form(rs, feat)
            cs = ", ".join(f"{c:.4g}" for c in co)
            print(f"  {label:<42} {name:<50} {fit[0]:6.2f}% {fit[1]:.3f}  CV {cv[0]:6.2f}% {cv[1]:.3f}  [{cs}]")


if __name__ == "__main__":
    main()
