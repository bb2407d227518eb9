// The vector math of vec_math.h written once with Google Highway and compiled for every x86
// target (vec_math_hwy.cpp re-includes this file per target: the baseline, SSE4, AVX2, AVX-512).
// No include guard on purpose; the per-target toggle below is Highway's convention.
//
// Approximations (same reductions, polynomials and coefficients on every target, within a few
// ulp of the correctly rounded f32 result; the erf and gelu fits were computed for this
// project in high precision):
//   exp(x)  = 2^n e^r, n = round(x / ln 2), r = x - n ln 2 (two-part ln 2), e^r by its Taylor
//             polynomial of degree 7; 2^n applied as two normal factors 2^(n - n/2) 2^(n/2)
//             (the first product exact, the second rounding once to inf, a denormal or zero),
//             since exp needs n from about -160 (gradual underflow) to 128.
//   log(x)  = e ln 2 + log(1 + f), x = 2^e (1 + f), 1 + f in [sqrt(1/2), sqrt 2) taken from the
//             bit pattern (denormals scaled by 2^24 first; AVX-512: [0.75, 1.5) from vgetmantps and
//             vgetexpps, 1.4x as fast there); log(1 + f) = f - (f^2/2 - s (f^2/2 +
//             R)), s = f / (2 + f), R the odd atanh series in s (the leading term f exact).
//   tanh(x) = sign(x) m / (m + 2), m = expm1(2|x|) = 2^n (expm1(r) + 1) - 1, expm1(r) of degree 8,
//             |x| capped at 9 (tanh = 1 in f32 beyond, and 2^n stays exact).
//   sigmoid = t = exp(-|x|); 1/(1+t) for x >= 0, t/(1+t) otherwise (no overflow either way).
//   erf(x)  = a P(a^2) for a = |x| < 1 (degree 6); 1 - exp(-a^2) Q(1/a) beyond, Q ~ erfc(a)
//             exp(a^2) of degree 12 fitted on 1/a in [1/12, 1] (erfc(12) = 0 in f32), with
//             exp(-a^2) = exp(-h) (1 - l) for h + l = a^2 exactly.
//   gelu    = x Phi(x), Phi(x) = c for x < 0 and 1 - c otherwise, c = erfc(a / sqrt 2) / 2 for
//             a = |x|, computed as c = G(u) exp(-a^2 / 2) (scripts/fit_gelu.py fits both):
//             G(u) ~ erfcx(a / sqrt 2) / 2 of degree 8 in u = a / (K + a), K = 3.5, fitted on a in
//               [0, 14.85] (erfc underflows beyond) in relative error weighted by 1 / (1 + a^2 / 4)
//               (max 5.4e-8 weighted with the f32 coefficients: tight near 0, looser in the tail,
//               where the bound below grows as a^2); u = 0 at a = 0, where G = 1/2 exactly and
//               Horner's rounding errors stay small;
//             exp(-a^2 / 2) = 2^n E(r2), h = a^2 rounded, n = round(-h / (2 ln 2)) by adding a
//               magic constant (whose low bits then hold n + 64, shifted into E's exponent field
//               by an integer add),
//               r2 = -h - 2n ln2 (one FMA), E of degree 5, minimax for exp(r2 / 2) on |r2| <= ln2
//               (1.35e-7 relative);
//               rounding a^2 changes the result as rounding the argument x would (a^2 / 2 ulp at
//               most), which the condition number allowance below covers;
//             n is in [-159, 0], so 2^(n + 64) is normal: E 2^(n + 64) is exact and the 2^-64 left
//               is folded into G's coefficients, so c rounds once (to a denormal or zero when it
//               must). The two chains are independent, so the out-of-order core overlaps them.
//             Within 8 ulp + 1.5 x^2 ulp for x < 0 (the condition number of the negative tail),
//             8 ulp for x >= 0; measured: at most 4.4 ulp beyond the condition number allowance
//             on every target (every 4099th float of [-16, 16], tests/core); gelu(-inf) =
//             -inf * 0 = NaN, as in PyTorch.
//   gelu_tanh = x sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3)) (= 0.5 x (1 + tanh(...))).
//
// Targets without FMA (SSE4, the baseline): MulAdd rounds twice there (the file is compiled without
// floating-point contraction, so each target does exactly what is written); the one place that
// needs an exact product error (a^2 = h + l) uses Veltkamp's splitting instead of an FMA.
//
// The long dependency chains of these functions (exp alone: ~50 cycles) leave the FMA pipes
// idle when one vector is computed at a time, so every function takes N independent vectors and
// runs them step by step side by side. Every lane gets the same operations whatever N, so
// results do not depend on the position in the array.
#if defined(TPU_VEC_MATH_HWY_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TPU_VEC_MATH_HWY_INL_H_
#undef TPU_VEC_MATH_HWY_INL_H_
#else
#define TPU_VEC_MATH_HWY_INL_H_
#endif

#include <hwy/cache_control.h>
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace tpu::ops::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using D = hn::ScalableTag<float>;
using DI = hn::RebindToSigned<D>;
using V = hn::Vec<D>;
using VI = hn::Vec<DI>;
inline constexpr int kLanes = static_cast<int>(hn::MaxLanes(D()));

#ifndef TPU_EACH
#define TPU_EACH _Pragma("GCC unroll 4") for (int u = 0; u < N; ++u)
#endif

#if HWY_TARGET == HWY_SSE4 || HWY_TARGET == HWY_SSSE3 || HWY_TARGET == HWY_EMU128 || HWY_TARGET == HWY_SCALAR
#define TPU_HWY_HAVE_FMA 0
#else
#define TPU_HWY_HAVE_FMA 1
#endif

HWY_INLINE V splat(float v) { return hn::Set(D(), v); }
// min/max with the x86 rule: the second operand when either is NaN (the clamps below keep a NaN
// x by passing it second). The one-lane and emulated targets' Min/Max return the number
// instead, so there it compares.
HWY_INLINE V min_x(V a, V b) {
#if HWY_TARGET == HWY_EMU128 || HWY_TARGET == HWY_SCALAR
  return hn::IfThenElse(hn::Lt(a, b), a, b);
#else
  return hn::Min(a, b);
#endif
}
HWY_INLINE V max_x(V a, V b) {
#if HWY_TARGET == HWY_EMU128 || HWY_TARGET == HWY_SCALAR
  return hn::IfThenElse(hn::Gt(a, b), a, b);
#else
  return hn::Max(a, b);
#endif
}
HWY_INLINE V sign_bits(V x) { return hn::And(x, hn::SignBit(D())); }
// a * a - h exactly, for h = a * a rounded and |a| well inside the range (a <= 16 here).
HWY_INLINE V square_err(V a, V h) {
#if TPU_HWY_HAVE_FMA
  return hn::MulSub(a, a, h);
#else
  const V c = hn::Mul(a, splat(4097.0f));  // Veltkamp: a = hi + lo, each of at most 12 bits
  const V hi = hn::Sub(c, hn::Sub(c, a));
  const V lo = hn::Sub(a, hi);
  const V e = hn::Add(hn::Sub(hn::Mul(hi, hi), h), hn::Mul(hn::Add(hi, hi), lo));
  return hn::Add(e, hn::Mul(lo, lo));
#endif
}

// The integer value of an integral n in int32 range. On x86 one conversion (Highway's
// NearestInt also mends out-of-range lanes, which never occur here: ~5% of exp's time).
HWY_INLINE VI int_of(V n) {
#if HWY_TARGET == HWY_AVX3
  return VI{_mm512_cvtps_epi32(n.raw)};
#elif HWY_TARGET == HWY_AVX2
  return VI{_mm256_cvtps_epi32(n.raw)};
#elif HWY_TARGET == HWY_SSE4
  return VI{_mm_cvtps_epi32(n.raw)};
#else
  return hn::NearestInt(n);
#endif
}
// 2^k for integer k in [-126, 127] (a normal float).
HWY_INLINE V pow2i(VI k) { return hn::BitCast(D(), hn::ShiftLeft<23>(hn::Add(k, hn::Set(DI(), 127)))); }
// p 2^n for integral n in [-252, 254], rounded once: two normal factors, the first product exact
// (AVX-512: vscalefps, the same single rounding in one instruction).
HWY_INLINE V scale2(V p, V n) {
#if HWY_TARGET == HWY_AVX3
  return V{_mm512_scalef_ps(p.raw, n.raw)};
#endif
  const VI k = int_of(n);
  const VI k1 = hn::ShiftRight<1>(k);
  const VI k2 = hn::Sub(k, k1);
  return hn::Mul(hn::Mul(p, pow2i(k2)), pow2i(k1));
}

template <int N>
HWY_INLINE void exp_n(V (&x)[N]) {
  static constexpr float kT[] = {1.0f / 5040.0f, 1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f,
                                 1.0f / 6.0f,    0.5f,          1.0f,          1.0f};
  V n[N], r[N], p[N];
  TPU_EACH x[u] = min_x(splat(88.8f), max_x(splat(-104.0f), x[u]));  // NaN stays
  TPU_EACH n[u] = hn::Round(hn::Mul(x[u], splat(1.44269504088896341f)));
  TPU_EACH r[u] = hn::MulAdd(n[u], splat(-0.693359375f), x[u]);
  TPU_EACH r[u] = hn::MulAdd(n[u], splat(2.12194440e-4f), r[u]);
  TPU_EACH p[u] = splat(kT[0]);
  for (size_t i = 1; i < sizeof(kT) / sizeof(kT[0]); ++i) TPU_EACH p[u] = hn::MulAdd(p[u], r[u], splat(kT[i]));
  TPU_EACH x[u] = scale2(p[u], n[u]);
}

HWY_INLINE V log_v(V x) {
  const V one = splat(1.0f), zero = hn::Zero(D());
#if HWY_TARGET == HWY_AVX3
  // vgetmantps / vgetexpps: m in [0.75, 1.5) (denormals included) in two instructions.
  const V m{_mm512_getmant_ps(x.raw, _MM_MANT_NORM_p75_1p5, _MM_MANT_SIGN_zero)};
  const V e0{_mm512_getexp_ps(x.raw)};
  const V e = hn::IfThenElse(hn::Lt(m, one), hn::Add(e0, one), e0);
#else
  const auto tiny = hn::Lt(x, splat(1.17549435e-38f));
  const V xs = hn::IfThenElse(tiny, hn::Mul(x, splat(16777216.0f)), x);
  const VI ix = hn::BitCast(DI(), xs);
  const VI k = hn::ShiftRight<23>(hn::Sub(ix, hn::Set(DI(), 0x3f3504f3)));
  const V m = hn::BitCast(D(), hn::Sub(ix, hn::ShiftLeft<23>(k)));
  const V e = hn::Sub(hn::ConvertTo(D(), k), hn::IfThenElseZero(tiny, splat(24.0f)));
#endif
  const V f = hn::Sub(m, one);
  const V s = hn::Div(f, hn::Add(f, splat(2.0f)));
  const V z = hn::Mul(s, s);
  V R = splat(2.0f / 11.0f);
  R = hn::MulAdd(R, z, splat(2.0f / 9.0f));
  R = hn::MulAdd(R, z, splat(2.0f / 7.0f));
  R = hn::MulAdd(R, z, splat(2.0f / 5.0f));
  R = hn::MulAdd(R, z, splat(2.0f / 3.0f));
  R = hn::Mul(R, z);
  const V hfsq = hn::Mul(splat(0.5f), hn::Mul(f, f));
  const V hi = hn::MulAdd(e, splat(0.693359375f), f);
  const V lo = hn::MulAdd(s, hn::Add(hfsq, R), hn::MulSub(e, splat(-2.12194440e-4f), hfsq));
  V r = hn::Add(hi, lo);
  // log(+-0) = -inf, log(x < 0) = NaN, log(inf) = inf, log(NaN) = NaN.
  const V inf = splat(__builtin_inff());
  r = hn::IfThenElse(hn::Eq(x, zero), hn::Neg(inf), r);
  r = hn::IfThenElse(hn::Eq(x, inf), inf, r);
  r = hn::IfThenElse(hn::Ge(x, zero), r, splat(__builtin_nanf("")));  // false for x < 0 and NaN
  return r;
}

template <int N>
HWY_INLINE void tanh_n(V (&x)[N]) {
  static constexpr float kC[] = {1.0f / 40320.0f, 1.0f / 5040.0f, 1.0f / 720.0f, 1.0f / 120.0f,
                                 1.0f / 24.0f,    1.0f / 6.0f,    0.5f};
  V a[N], n[N], r[N], p[N];
  TPU_EACH {
    a[u] = min_x(splat(9.0f), hn::Abs(x[u]));  // NaN stays
    a[u] = hn::Add(a[u], a[u]);
  }
  TPU_EACH n[u] = hn::Round(hn::Mul(a[u], splat(1.44269504088896341f)));
  TPU_EACH r[u] = hn::MulAdd(n[u], splat(-0.693359375f), a[u]);
  TPU_EACH r[u] = hn::MulAdd(n[u], splat(2.12194440e-4f), r[u]);
  TPU_EACH p[u] = splat(kC[0]);
  for (size_t i = 1; i < sizeof(kC) / sizeof(kC[0]); ++i) TPU_EACH p[u] = hn::MulAdd(p[u], r[u], splat(kC[i]));
  TPU_EACH {
    const V q = hn::MulAdd(hn::Mul(p[u], r[u]), r[u], r[u]);  // expm1(r)
    const V t = pow2i(int_of(n[u]));                         // 2^n, exact
    const V m = hn::MulAdd(t, q, hn::Sub(t, splat(1.0f)));
    x[u] = hn::Or(hn::Div(m, hn::Add(m, splat(2.0f))), sign_bits(x[u]));
  }
}

template <int N>
HWY_INLINE void sigmoid_n(V (&x)[N]) {
  V t[N];
  TPU_EACH t[u] = hn::Neg(hn::Abs(x[u]));
  exp_n<N>(t);
  TPU_EACH {
    const V s = hn::Div(splat(1.0f), hn::Add(splat(1.0f), t[u]));
    // NaN x: s is NaN either way.
    x[u] = hn::IfThenElse(hn::Lt(x[u], hn::Zero(D())), hn::Mul(t[u], s), s);
  }
}

template <int N>
HWY_INLINE void erf_n(V (&x)[N]) {
  static constexpr float kQ[] = {0.0516736093f,  -0.3338052317f,   0.9068110242f, -1.266714705f,  0.737462849f,
                                 0.4407592784f,  -1.1697602f,      0.8698077682f, -0.1051848597f, -0.2662518563f,
                                 -0.001479429913f, 0.5642670562f, -1.725435043e-6f};
  static constexpr float kP[] = {7.875875063e-5f, -0.0008016864287f, 0.005189087423f, -0.02685421201f,
                                 0.1128359472f,   -0.3761262667f,    1.128379166f};
  const V one = splat(1.0f);
  V a[N], b[N], t[N], q[N], h[N], e[N], p[N];
  TPU_EACH {
    a[u] = hn::Abs(x[u]);
    b[u] = min_x(splat(12.0f), max_x(one, a[u]));  // a NaN is restored below
    t[u] = hn::Div(one, b[u]);
    h[u] = hn::Mul(b[u], b[u]);
    e[u] = hn::Neg(h[u]);
  }
  exp_n<N>(e);
  TPU_EACH q[u] = splat(kQ[0]);
  for (size_t i = 1; i < sizeof(kQ) / sizeof(kQ[0]); ++i) TPU_EACH q[u] = hn::MulAdd(q[u], t[u], splat(kQ[i]));
  TPU_EACH t[u] = hn::Mul(a[u], a[u]);  // a < 1: a P(a^2)
  TPU_EACH p[u] = splat(kP[0]);
  for (size_t i = 1; i < sizeof(kP) / sizeof(kP[0]); ++i) TPU_EACH p[u] = hn::MulAdd(p[u], t[u], splat(kP[i]));
  TPU_EACH {
    const V erf_small = hn::Mul(a[u], p[u]);
    const V l = square_err(b[u], h[u]);
    const V erfc_large = hn::Mul(hn::NegMulAdd(e[u], l, e[u]), q[u]);
    V r = hn::IfThenElse(hn::Lt(a[u], one), erf_small, hn::Sub(one, erfc_large));
    r = hn::IfThenElse(hn::IsNaN(a[u]), a[u], r);
    x[u] = hn::Or(r, sign_bits(x[u]));
  }
}

template <int N>
HWY_INLINE void gelu_erf_n(V (&x)[N]) {
  // scripts/fit_gelu.py 8 3.5 4 5 (G, times 2^-64, see the header comment; E).
  constexpr float s = 0x1p-64f;
  static constexpr float kG[] = {4.008773342e-02f * s, -1.146352515e-01f * s, 3.057785146e-02f * s,
                                 1.796923429e-01f * s, 6.740123034e-02f * s,  -9.729825854e-01f * s,
                                 1.666199923e+00f * s, -1.396297455e+00f * s, 5.000000000e-01f * s};
  static constexpr float kE[] = {2.593025856e-04f, 2.619715640e-03f, 2.083446831e-02f, 1.249972358e-01f,
                                 4.999998510e-01f, 1.000000119e+00f};
  constexpr float kK = 3.5f;
  // Adding this rounds to an integer in [2^23, 2^24), whose low bits then hold n + 64.
  constexpr float kMagic = 12582912.0f + 64.0f;
  V a[N], t[N], g[N], h[N], y[N], r[N], p[N];
  // NaN becomes 14.85 here (on x86: min's second operand) and comes back through the product with x.
  TPU_EACH a[u] = min_x(hn::Abs(x[u]), splat(14.849242f));
  TPU_EACH t[u] = hn::Div(a[u], hn::Add(a[u], splat(kK)));  // the header's u
  TPU_EACH g[u] = splat(kG[0]);
  for (size_t i = 1; i < sizeof(kG) / sizeof(kG[0]); ++i) TPU_EACH g[u] = hn::MulAdd(g[u], t[u], splat(kG[i]));
  TPU_EACH h[u] = hn::Mul(a[u], a[u]);
  TPU_EACH y[u] = hn::MulAdd(h[u], splat(-0.5f * 1.44269504088896341f), splat(kMagic));  // n = round(-h / (2 ln2))
  TPU_EACH r[u] = hn::MulSub(hn::Sub(y[u], splat(kMagic)), splat(-2.0f * 0.693147181f), h[u]);  // -h - 2n ln2
  TPU_EACH p[u] = splat(kE[0]);
  for (size_t i = 1; i < sizeof(kE) / sizeof(kE[0]); ++i) TPU_EACH p[u] = hn::MulAdd(p[u], r[u], splat(kE[i]));
  TPU_EACH {
    // E 2^(n + 64) by adding n + 64 to E's exponent field (E in [0.7, 1.42], so the result is
    // normal and exact: an integer add instead of a multiply).
    const VI e = hn::Add(hn::BitCast(DI(), p[u]), hn::ShiftLeft<23>(hn::BitCast(DI(), y[u])));
    const V c = hn::Mul(g[u], hn::BitCast(D(), e));
    // By the sign bit: c for x < 0 (and -0), 1 - c otherwise.
    x[u] = hn::Mul(x[u], hn::IfNegativeThenElse(x[u], c, hn::Sub(splat(1.0f), c)));
  }
}

template <int N>
HWY_INLINE void gelu_tanh_n(V (&x)[N]) {
  V s[N];
  // 2 sqrt(2/pi) (x + 0.044715 x^3) = x (k1 + k2 x^2): four roundings with or without FMA.
  TPU_EACH s[u] = hn::Mul(x[u], hn::MulAdd(splat(static_cast<float>(2 * 0.7978845608028654 * 0.044715)),
                                           hn::Mul(x[u], x[u]), splat(2.0f * 0.7978845608028654f)));
  sigmoid_n<N>(s);
  TPU_EACH x[u] = hn::Mul(x[u], s[u]);
}

template <int N>
HWY_INLINE void silu_n(V (&x)[N]) {
  V s[N];
  TPU_EACH s[u] = x[u];
  sigmoid_n<N>(s);
  TPU_EACH x[u] = hn::Mul(x[u], s[u]);
}

// The unary functions as types (template arguments of the loops and the fused executor).
#define TPU_HWY_UNARY(Name, body)                  \
  struct Name {                                    \
    template <int N>                               \
    static HWY_INLINE void f(V (&x)[N]) { body; } \
  };
TPU_HWY_UNARY(ExpF, exp_n<N>(x))
// log keeps twelve constants live: four interleaved vectors spill on AVX2, two do not.
TPU_HWY_UNARY(LogF, _Pragma("GCC unroll 2") for (int u = 0; u < N; ++u) x[u] = log_v(x[u]))
TPU_HWY_UNARY(TanhF, tanh_n<N>(x))
TPU_HWY_UNARY(SigmoidF, sigmoid_n<N>(x))
TPU_HWY_UNARY(SiluF, silu_n<N>(x))
TPU_HWY_UNARY(GeluF, gelu_erf_n<N>(x))
TPU_HWY_UNARY(GeluTanhF, gelu_tanh_n<N>(x))
TPU_HWY_UNARY(ErfF, erf_n<N>(x))
TPU_HWY_UNARY(ReluF, TPU_EACH x[u] = max_x(hn::Zero(D()), x[u]))  // NaN kept
TPU_HWY_UNARY(NegF, TPU_EACH x[u] = hn::Neg(x[u]))
TPU_HWY_UNARY(AbsF, TPU_EACH x[u] = hn::Abs(x[u]))
TPU_HWY_UNARY(SqrtF, TPU_EACH x[u] = hn::Sqrt(x[u]))
TPU_HWY_UNARY(RsqrtF, TPU_EACH x[u] = hn::Div(splat(1.0f), hn::Sqrt(x[u])))
TPU_HWY_UNARY(RecipF, TPU_EACH x[u] = hn::Div(splat(1.0f), x[u]))
TPU_HWY_UNARY(NopF, (void)x)
#undef TPU_HWY_UNARY

// Binary operations; `al` is the alpha of add/sub (x + alpha y).
struct AddOp { static HWY_INLINE V f(V a, V b, V al) { return hn::MulAdd(al, b, a); } };
struct AddOneOp { static HWY_INLINE V f(V a, V b, V) { return hn::Add(a, b); } };
struct SubOp { static HWY_INLINE V f(V a, V b, V al) { return hn::NegMulAdd(al, b, a); } };
struct SubOneOp { static HWY_INLINE V f(V a, V b, V) { return hn::Sub(a, b); } };
struct MulOp { static HWY_INLINE V f(V a, V b, V) { return hn::Mul(a, b); } };
struct DivOp { static HWY_INLINE V f(V a, V b, V) { return hn::Div(a, b); } };
// The x86 max/min give the second operand when either is NaN; a NaN first operand is put back.
struct MaxOp { static HWY_INLINE V f(V a, V b, V) { return hn::IfThenElse(hn::IsNaN(a), a, max_x(a, b)); } };
struct MinOp { static HWY_INLINE V f(V a, V b, V) { return hn::IfThenElse(hn::IsNaN(a), a, min_x(a, b)); } };

// ---- one-op kernels over arrays ----

// Above this many elements the output is written with non-temporal stores (no read for
// ownership of lines that cannot stay in the caches anyway).
inline constexpr int64_t kStreamThreshold = int64_t{1} << 20;
// Software prefetch distance (floats ahead of the load) of the large single-pass loops: the
// gelu arithmetic leaves the hardware prefetcher too little slack on a long input stream.
inline constexpr int kPrefetchFloats = 1024;

// Elements [i, end) in groups of four vectors side by side (prefetching ahead when kPrefetch;
// streaming the stores when kStream, `o + i` then vector-aligned); returns where it stopped.
template <class F, bool kStream>
HWY_INLINE int64_t unary_body(float* o, const float* x, int64_t i, int64_t end) {
  const D d;
  for (; i + 4 * kLanes <= end; i += 4 * kLanes) {
    if constexpr (kStream)
      for (int c = 0; c < 4 * kLanes; c += 16) hwy::Prefetch(x + i + kPrefetchFloats + c);
    V v[4];
    for (int u = 0; u < 4; ++u) v[u] = hn::LoadU(d, x + i + u * kLanes);
    F::template f<4>(v);
    for (int u = 0; u < 4; ++u) {
      if constexpr (kStream) hn::Stream(v[u], d, o + i + u * kLanes);
      else hn::StoreU(v[u], d, o + i + u * kLanes);
    }
  }
  return i;
}

// Elements [i, end): one vector at a time, then the tail through a vector-sized buffer (a
// full-width load past the end could fault, and masked loads are not on every target).
template <class F>
HWY_INLINE void unary_rest(float* o, const float* x, int64_t i, int64_t end) {
  const D d;
  for (; i + kLanes <= end; i += kLanes) {
    V v[1] = {hn::LoadU(d, x + i)};
    F::template f<1>(v);
    hn::StoreU(v[0], d, o + i);
  }
  if (i < end) {
    HWY_ALIGN float buf[kLanes] = {};
    const size_t left = static_cast<size_t>(end - i);
    __builtin_memcpy(buf, x + i, left * sizeof(float));
    V v[1] = {hn::Load(d, buf)};
    F::template f<1>(v);
    hn::Store(v[0], d, buf);
    __builtin_memcpy(o + i, buf, left * sizeof(float));
  }
}

// Large arrays (kStreamThreshold) with a float-aligned output: a head up to a vector-aligned
// output, the body streamed, then the rest. out == in is allowed (each group is read before
// it is written).
template <class F>
HWY_NOINLINE void unary_loop(float* o, const float* x, int64_t n) {
  if (n <= 0) return;
  int64_t i = 0;
  if (n >= kStreamThreshold && (reinterpret_cast<uintptr_t>(o) & 3u) == 0) {
    constexpr uintptr_t kAlign = sizeof(float) * kLanes;
    const uintptr_t mis = (reinterpret_cast<uintptr_t>(o) & (kAlign - 1)) / sizeof(float);
    const int64_t head = mis ? kLanes - static_cast<int64_t>(mis) : 0;
    unary_rest<F>(o, x, 0, head);
    i = unary_body<F, true>(o, x, head, n);
    hwy::FlushStream();
  } else {
    i = unary_body<F, false>(o, x, 0, n);
  }
  unary_rest<F>(o, x, i, n);
}

template <class Op, bool kStream>
HWY_INLINE int64_t binary_body(float* o, const float* x, const float* y, bool ys, V al, int64_t i, int64_t end) {
  const D d;
  const V bs = hn::Set(d, y[0]);
  for (; i + 2 * kLanes <= end; i += 2 * kLanes) {
    const V y0 = ys ? bs : hn::LoadU(d, y + i), y1 = ys ? bs : hn::LoadU(d, y + i + kLanes);
    const V r0 = Op::f(hn::LoadU(d, x + i), y0, al), r1 = Op::f(hn::LoadU(d, x + i + kLanes), y1, al);
    if constexpr (kStream) {
      hn::Stream(r0, d, o + i);
      hn::Stream(r1, d, o + i + kLanes);
    } else {
      hn::StoreU(r0, d, o + i);
      hn::StoreU(r1, d, o + i + kLanes);
    }
  }
  return i;
}

// Elements [i, end) (fewer than a few vectors): whole vectors, then the tail through a buffer.
template <class Op>
HWY_INLINE void binary_rest(float* o, const float* x, const float* y, bool ys, V al, int64_t i, int64_t end) {
  const D d;
  const V bs = hn::Set(d, y[0]);
  for (; i + kLanes <= end; i += kLanes) hn::StoreU(Op::f(hn::LoadU(d, x + i), ys ? bs : hn::LoadU(d, y + i), al), d, o + i);
  if (i < end) {
    HWY_ALIGN float bx[kLanes] = {}, by[kLanes] = {};
    const size_t left = static_cast<size_t>(end - i);
    __builtin_memcpy(bx, x + i, left * sizeof(float));
    if (!ys) __builtin_memcpy(by, y + i, left * sizeof(float));
    hn::Store(Op::f(hn::Load(d, bx), ys ? bs : hn::Load(d, by), al), d, bx);
    __builtin_memcpy(o + i, bx, left * sizeof(float));
  }
}

template <class Op>
HWY_NOINLINE void binary_loop(float* o, const float* x, const float* y, bool ys, float alpha, int64_t n) {
  if (n <= 0) return;
  const V al = splat(alpha);
  constexpr uintptr_t kAlign = sizeof(float) * kLanes;
  if (n >= kStreamThreshold && (reinterpret_cast<uintptr_t>(o) & 3u) == 0) {
    // Peel to a vector-aligned output, stream the body, finish with the rest.
    const uintptr_t mis = (reinterpret_cast<uintptr_t>(o) & (kAlign - 1)) / sizeof(float);
    const int64_t head = mis ? kLanes - static_cast<int64_t>(mis) : 0;
    binary_rest<Op>(o, x, y, ys, al, 0, head);
    const int64_t body_end = binary_body<Op, true>(o, x, y, ys, al, head, n);
    hwy::FlushStream();
    binary_rest<Op>(o, x, y, ys, al, body_end, n);
    return;
  }
  const int64_t body_end = binary_body<Op, false>(o, x, y, ys, al, 0, n);
  binary_rest<Op>(o, x, y, ys, al, body_end, n);
}

HWY_NOINLINE void add_v(float* o, const float* x, const float* y, bool ys, float alpha, int64_t n) {
  if (alpha == 1.0f) binary_loop<AddOneOp>(o, x, y, ys, alpha, n);
  else binary_loop<AddOp>(o, x, y, ys, alpha, n);
}
HWY_NOINLINE void sub_v(float* o, const float* x, const float* y, bool ys, float alpha, int64_t n) {
  if (alpha == 1.0f) binary_loop<SubOneOp>(o, x, y, ys, alpha, n);
  else binary_loop<SubOp>(o, x, y, ys, alpha, n);
}

}  // namespace tpu::ops::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#undef TPU_HWY_HAVE_FMA
#endif  // include guard toggle
