#!/usr/bin/env python3
"""Fits the polynomial coefficients of gelu_erf_n in ops/cpu/vec_math_hwy-inl.h (needs mpmath).

    G(u) ~ erfcx(a / sqrt 2) / 2,  u = a / (K + a),  a in [0, A_MAX]
    E(r) ~ exp(r / 2),             |r| <= ln 2

Weighted minimax in relative error by Lawson's algorithm (iteratively reweighted least squares)
on a dense grid, in 40-digit arithmetic. G's weight allows a relative error growing as
1 + a^2 / W2: for x < 0 the test bound grows as 1.5 x^2 ulp (the condition number of the
negative tail), for x > 0 only 1 - c matters, so a fraction of that slack is spent here.

Usage: python3 scripts/fit_gelu.py [degree_G] [K] [W2] [degree_E]   (the shipped fit: 8 3.5 4 5)
Prints the float32 coefficients (highest degree first) and the fit errors in double.
"""
import sys

import mpmath as mp

mp.mp.dps = 40
A_MAX = mp.mpf("14.849242")


def lawson(xs, fs, ws, deg, iters=100):
    """Coefficients c_0..c_deg minimizing max_i ws[i] |sum c_j xs[i]^j / fs[i] - 1|."""
    n = len(xs)
    u = [mp.mpf(1) / n] * n
    best = None
    for _ in range(iters):
        m = mp.zeros(deg + 1, deg + 1)
        v = mp.zeros(deg + 1, 1)
        rows = []
        for i in range(n):
            row = [ws[i] * xs[i] ** j / fs[i] for j in range(deg + 1)]
            rows.append(row)
            for j in range(deg + 1):
                v[j] += u[i] * row[j] * ws[i]
                for k in range(j, deg + 1):
                    m[j, k] += u[i] * row[j] * row[k]
        for j in range(deg + 1):
            for k in range(j):
                m[j, k] = m[k, j]
        c = mp.lu_solve(m, v)
        err = [abs(sum(c[j] * rows[i][j] for j in range(deg + 1)) - ws[i]) for i in range(n)]
        emax = max(err)
        if best is None or emax < best[0]:
            best = (emax, [c[j] for j in range(deg + 1)])
        tot = sum(u[i] * err[i] for i in range(n))
        u = [u[i] * err[i] / tot for i in range(n)]
    return best


def rel_err(coeffs32, xs, fs):
    """Max relative error of the float32-rounded coefficients (evaluated exactly)."""
    worst = 0
    for x, f in zip(xs, fs):
        p = mp.mpf(0)
        for c in reversed(coeffs32):
            p = p * x + c
        worst = max(worst, abs(p / f - 1))
    return worst


def f32(v):
    import struct
    return struct.unpack("f", struct.pack("f", float(v)))[0]


def main():
    deg_g = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    k = mp.mpf(sys.argv[2]) if len(sys.argv) > 2 else mp.mpf("3.5")
    w2 = mp.mpf(sys.argv[3]) if len(sys.argv) > 3 else mp.mpf(4)
    deg_e = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    npts = 240
    # G: grid uniform in u (the polynomial's variable; u = 0 at a = 0, where G is 1/2 and the
    # evaluation in f32 then rounds little).
    u_hi = A_MAX / (k + A_MAX)
    ts = [u_hi * i / (npts - 1) for i in range(npts)]
    a_s = [k * u / (1 - u) for u in ts]
    gs = [mp.erfc(a / mp.sqrt(2)) * mp.exp(a * a / 2) / 2 for a in a_s]
    ws = [1 / (1 + a * a / w2) for a in a_s]
    eg, cg = lawson(ts, gs, ws, deg_g)
    cg32 = [f32(c) for c in cg]
    plain = rel_err(cg32, ts, gs)
    weighted = max(abs(sum(c * t ** j for j, c in enumerate(cg32)) / g - 1) * w for t, g, w in zip(ts, gs, ws))
    print(f"G: degree {deg_g}, K = {float(k)}, weight 1 / (1 + a^2 / {float(w2)})")
    print(f"   max weighted relative error {float(weighted):.3e} (f32 coefficients), unweighted {float(plain):.3e}")
    print("   kG = {" + ", ".join(f"{c:.9e}f" for c in reversed(cg32)) + "}")
    # E: exp(r / 2) on |r| <= ln 2.
    ln2 = mp.log(2)
    rs = [-ln2 + 2 * ln2 * i / (npts - 1) for i in range(npts)]
    es = [mp.exp(r / 2) for r in rs]
    ee, ce = lawson(rs, es, [mp.mpf(1)] * npts, deg_e)
    ce32 = [f32(c) for c in ce]
    print(f"E: degree {deg_e}, max relative error {float(rel_err(ce32, rs, es)):.3e} (f32 coefficients)")
    print("   kE = {" + ", ".join(f"{c:.9e}f" for c in reversed(ce32)) + "}")


if __name__ == "__main__":
    main()
