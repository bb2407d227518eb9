// AVX2 + FMA implementation of vec_math.h, for x86-64 CPUs without AVX-512 (AMD Zen 1-3,
// Intel Haswell to Comet Lake). Compiled for the baseline ISA like the rest of the library:
// every function that uses AVX2 carries a target attribute and is only reached through
// vec_math_avx2(), which checks the CPU first.
//
// The approximations are those of vec_math_avx512.cpp (same reductions, same polynomials and
// coefficients, same accuracy contract), except gelu's (see gelu_erf_n); what AVX2 lacks is
// rebuilt from plain operations:
//   2^n scaling (vscalefps): the exponent field is built from integer n. exp may need n down
//     to about -160 (gradual underflow) and up to 128, outside one normal power of two, so
//     2^n is applied as two factors 2^(n - n/2) 2^(n/2), each a normal number: the first
//     product is exact and the second rounds once, to inf, to a denormal or to zero.
//   getexp/getmant (log): x = 2^e m with m in [sqrt(1/2), sqrt 2) from the bit pattern
//     (subtracting the pattern of sqrt(1/2) moves the exponent change to that point);
//     denormal inputs are first scaled by 2^24 to become normal.
//   masked tails: vmaskmovps loads and stores (masked-off lanes do not fault).
//   rcp14 + Newton (erfc): a plain division, as rcpps (12 bits) plus one Newton step would
//     leave an error near one ulp in t.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "ops/cpu/vec_math.h"
#include "tpucore/core/cpu_features.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define TPU_AVX2_FN __attribute__((target("avx2,fma"))) static inline
#define TPU_AVX2_ENTRY __attribute__((target("avx2,fma"))) static

namespace tpu::ops::cpu {
namespace {

TPU_AVX2_FN __m256 splat(float v) { return _mm256_set1_ps(v); }
TPU_AVX2_FN __m256 zero() { return _mm256_setzero_ps(); }
// Lanes of `a`, replaced by `b` where `mask` (a compare result) is set.
TPU_AVX2_FN __m256 select(__m256 a, __m256 mask, __m256 b) { return _mm256_blendv_ps(a, b, mask); }

// 2^k for integer k in [-126, 127] (a normal float).
TPU_AVX2_FN __m256 pow2i(__m256i k) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(127)), 23));
}
// p 2^n for integral n in [-252, 254], rounded once (to inf, a denormal or zero when out of
// range): two normal factors, the first product exact.
TPU_AVX2_FN __m256 scale2(__m256 p, __m256 n) {
  const __m256i k = _mm256_cvtps_epi32(n);
  const __m256i k1 = _mm256_srai_epi32(k, 1);
  const __m256i k2 = _mm256_sub_epi32(k, k1);
  return _mm256_mul_ps(_mm256_mul_ps(p, pow2i(k2)), pow2i(k1));
}

// The long dependency chains of these functions (exp alone: ~50 cycles) leave
// the FMA pipes idle when one vector is computed at a time, so the *_n functions compute N
// independent vectors step by step side by side for the out-of-order core to overlap. Every
// lane gets the same operations whatever N, so results do not depend on the position in the
// array.
#define TPU_EACH _Pragma("GCC unroll 4") for (int u = 0; u < N; ++u)

TPU_AVX2_FN __m256 round_v(__m256 x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }

// e^r for |r| <= ~ln2/2: Taylor polynomial of degree 7 (coefficients from the highest).
constexpr float kExpTaylor[] = {1.0f / 5040.0f, 1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f,
                                1.0f / 6.0f,    0.5f,          1.0f,          1.0f};

// exp(x) = 2^n e^r, n = round(x / ln 2), r = x - n ln 2 (two-part ln 2).
template <int N>
TPU_AVX2_FN void exp_n(__m256 (&x)[N]) {
  __m256 n[N], r[N], p[N];
  // max(lo, x) and min(hi, .) return x when x is NaN (the second operand), so NaN propagates.
  TPU_EACH x[u] = _mm256_min_ps(splat(88.8f), _mm256_max_ps(splat(-104.0f), x[u]));
  TPU_EACH n[u] = round_v(_mm256_mul_ps(x[u], splat(1.44269504088896341f)));
  TPU_EACH r[u] = _mm256_fmadd_ps(n[u], splat(-0.693359375f), x[u]);
  TPU_EACH r[u] = _mm256_fmadd_ps(n[u], splat(2.12194440e-4f), r[u]);
  TPU_EACH p[u] = splat(kExpTaylor[0]);
  for (size_t i = 1; i < sizeof(kExpTaylor) / sizeof(kExpTaylor[0]); ++i) {
    TPU_EACH p[u] = _mm256_fmadd_ps(p[u], r[u], splat(kExpTaylor[i]));
  }
  TPU_EACH x[u] = scale2(p[u], n[u]);
}
TPU_AVX2_FN __m256 log_v(__m256 x) {
  const __m256 one = splat(1.0f);
  // Denormals: scale by 2^24 into the normal range and take 24 off the exponent.
  const __m256 tiny = _mm256_cmp_ps(x, splat(1.17549435e-38f), _CMP_LT_OQ);
  const __m256 xs = select(x, tiny, _mm256_mul_ps(x, splat(16777216.0f)));
  // x = 2^e m, m in [sqrt(1/2), sqrt 2): e from the pattern less that of sqrt(1/2).
  const __m256i ix = _mm256_castps_si256(xs);
  const __m256i k = _mm256_srai_epi32(_mm256_sub_epi32(ix, _mm256_set1_epi32(0x3f3504f3)), 23);
  const __m256 m = _mm256_castsi256_ps(_mm256_sub_epi32(ix, _mm256_slli_epi32(k, 23)));
  const __m256 e = _mm256_sub_ps(_mm256_cvtepi32_ps(k), _mm256_and_ps(tiny, splat(24.0f)));
  const __m256 f = _mm256_sub_ps(m, one);
  const __m256 s = _mm256_div_ps(f, _mm256_add_ps(f, splat(2.0f)));
  const __m256 z = _mm256_mul_ps(s, s);
  __m256 R = splat(2.0f / 11.0f);
  R = _mm256_fmadd_ps(R, z, splat(2.0f / 9.0f));
  R = _mm256_fmadd_ps(R, z, splat(2.0f / 7.0f));
  R = _mm256_fmadd_ps(R, z, splat(2.0f / 5.0f));
  R = _mm256_fmadd_ps(R, z, splat(2.0f / 3.0f));
  R = _mm256_mul_ps(R, z);
  const __m256 hfsq = _mm256_mul_ps(splat(0.5f), _mm256_mul_ps(f, f));
  const __m256 hi = _mm256_fmadd_ps(e, splat(0.693359375f), f);
  const __m256 lo = _mm256_fmadd_ps(s, _mm256_add_ps(hfsq, R), _mm256_fmsub_ps(e, splat(-2.12194440e-4f), hfsq));
  __m256 r = _mm256_add_ps(hi, lo);
  // Special values: log(+-0) = -inf, log(x < 0) = NaN, log(inf) = inf, log(NaN) = NaN.
  const __m256 inf = splat(__builtin_inff());
  r = select(r, _mm256_cmp_ps(x, zero(), _CMP_EQ_OQ), _mm256_sub_ps(zero(), inf));
  r = select(r, _mm256_cmp_ps(x, inf, _CMP_EQ_OQ), inf);
  r = select(r, _mm256_cmp_ps(x, zero(), _CMP_NGE_UQ), splat(__builtin_nanf("")));
  return r;
}

TPU_AVX2_FN __m256 sign_mask() { return _mm256_castsi256_ps(_mm256_set1_epi32(INT32_MIN)); }
TPU_AVX2_FN __m256 abs_v(__m256 x) { return _mm256_andnot_ps(sign_mask(), x); }
TPU_AVX2_FN __m256 sign_bits(__m256 x) { return _mm256_and_ps(x, sign_mask()); }

// tanh(x) = sign(x) m / (m + 2), m = expm1(2|x|) = 2^n (expm1(r) + 1) - 1 with expm1(r) of
// degree 8; |x| capped at 9 (tanh = 1 in f32 beyond, and 2^n stays exact).
template <int N>
TPU_AVX2_FN void tanh_n(__m256 (&x)[N]) {
  __m256 a[N], n[N], r[N], p[N];
  TPU_EACH {
    a[u] = _mm256_min_ps(splat(9.0f), abs_v(x[u]));  // NaN stays NaN
    a[u] = _mm256_add_ps(a[u], a[u]);
  }
  TPU_EACH n[u] = round_v(_mm256_mul_ps(a[u], splat(1.44269504088896341f)));
  TPU_EACH r[u] = _mm256_fmadd_ps(n[u], splat(-0.693359375f), a[u]);
  TPU_EACH r[u] = _mm256_fmadd_ps(n[u], splat(2.12194440e-4f), r[u]);
  static constexpr float kC[] = {1.0f / 40320.0f, 1.0f / 5040.0f, 1.0f / 720.0f, 1.0f / 120.0f,
                                 1.0f / 24.0f,    1.0f / 6.0f,    0.5f};
  TPU_EACH p[u] = splat(kC[0]);
  for (size_t i = 1; i < sizeof(kC) / sizeof(kC[0]); ++i) {
    TPU_EACH p[u] = _mm256_fmadd_ps(p[u], r[u], splat(kC[i]));
  }
  TPU_EACH {
    const __m256 q = _mm256_fmadd_ps(_mm256_mul_ps(p[u], r[u]), r[u], r[u]);  // expm1(r)
    const __m256 t = pow2i(_mm256_cvtps_epi32(n[u]));                        // 2^n, exact
    const __m256 m = _mm256_fmadd_ps(t, q, _mm256_sub_ps(t, splat(1.0f)));
    x[u] = _mm256_or_ps(_mm256_div_ps(m, _mm256_add_ps(m, splat(2.0f))), sign_bits(x[u]));
  }
}

// sigmoid = t = exp(-|x|); 1/(1+t) for x >= 0, t/(1+t) otherwise (no overflow either way).
template <int N>
TPU_AVX2_FN void sigmoid_n(__m256 (&x)[N]) {
  __m256 t[N];
  TPU_EACH t[u] = _mm256_sub_ps(zero(), abs_v(x[u]));
  exp_n<N>(t);
  TPU_EACH {
    const __m256 s = _mm256_div_ps(splat(1.0f), _mm256_add_ps(splat(1.0f), t[u]));
    x[u] = select(s, _mm256_cmp_ps(x[u], zero(), _CMP_NGE_UQ), _mm256_mul_ps(t[u], s));
  }
}

// erf(x) = sign(x) erf(|x|) with, for a = |x| (see the AVX-512 file for the fits):
//   a < 1:  a P(a^2), P of degree 6;
//   a >= 1: 1 - exp(-a^2) Q(1/a), Q ~ erfc(a) exp(a^2) of degree 12 fitted on 1/a in [1/12, 1]
//           (erfc(12) = 0 in f32), with exp(-a^2) = exp(-h) (1 - l) for h + l = a^2 exactly.
template <int N>
TPU_AVX2_FN void erf_n(__m256 (&x)[N]) {
  const __m256 one = splat(1.0f);
  __m256 a[N], b[N], t[N], q[N], h[N], e[N], p[N];
  TPU_EACH {
    a[u] = abs_v(x[u]);
    b[u] = _mm256_min_ps(splat(12.0f), _mm256_max_ps(one, a[u]));  // NaN becomes a number here
    t[u] = _mm256_div_ps(one, b[u]);
    h[u] = _mm256_mul_ps(b[u], b[u]);
    e[u] = _mm256_sub_ps(zero(), h[u]);
  }
  exp_n<N>(e);
  static constexpr float kQ[] = {0.0516736093f,  -0.3338052317f, 0.9068110242f, -1.266714705f,    0.737462849f,
                                 0.4407592784f,  -1.1697602f,    0.8698077682f, -0.1051848597f,   -0.2662518563f,
                                 -0.001479429913f, 0.5642670562f, -1.725435043e-6f};
  TPU_EACH q[u] = splat(kQ[0]);
  for (size_t i = 1; i < sizeof(kQ) / sizeof(kQ[0]); ++i) {
    TPU_EACH q[u] = _mm256_fmadd_ps(q[u], t[u], splat(kQ[i]));
  }
  static constexpr float kP[] = {7.875875063e-5f, -0.0008016864287f, 0.005189087423f, -0.02685421201f,
                                 0.1128359472f,   -0.3761262667f,    1.128379166f};
  // a < 1: a P(a^2) (t is free again).
  TPU_EACH t[u] = _mm256_mul_ps(a[u], a[u]);
  TPU_EACH p[u] = splat(kP[0]);
  for (size_t i = 1; i < sizeof(kP) / sizeof(kP[0]); ++i) {
    TPU_EACH p[u] = _mm256_fmadd_ps(p[u], t[u], splat(kP[i]));
  }
  TPU_EACH {
    const __m256 erf_small = _mm256_mul_ps(a[u], p[u]);
    const __m256 l = _mm256_fmsub_ps(b[u], b[u], h[u]);
    const __m256 erfc_large = _mm256_mul_ps(_mm256_fnmadd_ps(e[u], l, e[u]), q[u]);
    __m256 r = select(_mm256_sub_ps(one, erfc_large), _mm256_cmp_ps(a[u], one, _CMP_LT_OQ), erf_small);
    r = select(r, _mm256_cmp_ps(a[u], a[u], _CMP_UNORD_Q), a[u]);  // NaN in, NaN out
    x[u] = _mm256_or_ps(r, sign_bits(x[u]));
  }
}

// gelu = x Phi(x) with Phi(x) = c for x < 0 and 1 - c otherwise, c = erfc(a / sqrt 2) / 2 for
// a = |x|, computed as c = G(t) exp(-a^2 / 2):
//   G(t) ~ erfcx(a / sqrt 2) / 2 (erfcx(z) = exp(z^2) erfc(z), smooth and between 0.03 and 0.5
//     here) of degree 9 in t = K / (K + a), K = 2 sqrt 2, fitted in relative error on
//     a in [0, 14.85] (erfc underflows to 0 beyond) with float coefficients chosen one at a time;
//   exp(-a^2 / 2) = 2^n E(r2) from h + l = a^2 split exactly (l by an FMA), r2 = -(h + l) - 2n ln2
//     (twice the usual reduced argument, so a^2 is never halved or rounded through 1/sqrt 2), E
//     of degree 6, minimax for exp(r2 / 2) on |r2| <= ln2;
//   n is in [-159, 0], so 2^(n + 64) is a normal number: E 2^(n + 64) is exact, and the 2^-64
//     that is left is folded into G's coefficients (exactly): c = G' (E 2^(n + 64)) rounds once,
//     to a denormal or to zero when it must, without scale2's two factors.
// G and the exponential are independent chains, so the out-of-order core overlaps them; with
// fewer operations in all, this runs 1.5x as fast as the exp(-b^2 + P(t)) form of the AVX-512
// file on Zen 3. Measured on every 97th float of either sign: within 6.3 ulp of the exact
// gelu, beyond the condition number of the negative tail (the old form: 6.8). Results below the
// smallest normal (x < -13.2) round twice (c, then x c) and may be off by up to 8 of the
// smallest denormals.
// gelu(-inf) = -inf * 0 = NaN, as in PyTorch.
template <int N>
TPU_AVX2_FN void gelu_erf_n(__m256 (&x)[N]) {
  constexpr float s = 0x1p-64f;
  static constexpr float kG[] = {-2.791759744e-02f * s, 1.339904666e-01f * s, -2.253055722e-01f * s,
                                 1.163590178e-01f * s,  4.035753664e-03f * s, 9.287657589e-02f * s,
                                 1.241784170e-01f * s,  1.406898201e-01f * s, 1.410953999e-01f * s,
                                 -2.302230087e-06f * s};
  static constexpr float kE[] = {2.161973316e-05f, 2.617181453e-04f, 2.604264999e-03f, 2.083302289e-02f,
                                 1.249999776e-01f, 5.000000000e-01f, 1.000000000e+00f};
  __m256 a[N], t[N], g[N], h[N], n[N], r[N], p[N];
  // NaN becomes 14.85 here and comes back through the final product with x.
  TPU_EACH a[u] = _mm256_min_ps(abs_v(x[u]), splat(14.849242f));
  TPU_EACH t[u] = _mm256_div_ps(splat(2.82842712f), _mm256_add_ps(a[u], splat(2.82842712f)));
  TPU_EACH g[u] = splat(kG[0]);
  for (size_t i = 1; i < sizeof(kG) / sizeof(kG[0]); ++i) {
    TPU_EACH g[u] = _mm256_fmadd_ps(g[u], t[u], splat(kG[i]));
  }
  TPU_EACH h[u] = _mm256_mul_ps(a[u], a[u]);
  TPU_EACH n[u] = round_v(_mm256_mul_ps(h[u], splat(-0.5f * 1.44269504088896341f)));
  TPU_EACH r[u] = _mm256_fmsub_ps(n[u], splat(-2.0f * 0.693359375f), h[u]);  // exact
  TPU_EACH r[u] = _mm256_fmadd_ps(n[u], splat(2.0f * 2.12194440e-4f), r[u]);
  TPU_EACH r[u] = _mm256_sub_ps(r[u], _mm256_fmsub_ps(a[u], a[u], h[u]));  // - l
  TPU_EACH p[u] = splat(kE[0]);
  for (size_t i = 1; i < sizeof(kE) / sizeof(kE[0]); ++i) {
    TPU_EACH p[u] = _mm256_fmadd_ps(p[u], r[u], splat(kE[i]));
  }
  TPU_EACH {
    const __m256i k = _mm256_add_epi32(_mm256_cvtps_epi32(n[u]), _mm256_set1_epi32(127 + 64));
    const __m256 c = _mm256_mul_ps(g[u], _mm256_mul_ps(p[u], _mm256_castsi256_ps(_mm256_slli_epi32(k, 23))));
    // blendv picks by the sign bit: c for x < 0 (and -0), 1 - c otherwise.
    x[u] = _mm256_mul_ps(x[u], _mm256_blendv_ps(_mm256_sub_ps(splat(1.0f), c), c, x[u]));
  }
}

// gelu_tanh = x * sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3)) (= 0.5 x (1 + tanh(...))).
template <int N>
TPU_AVX2_FN void gelu_tanh_n(__m256 (&x)[N]) {
  __m256 s[N];
  TPU_EACH {
    const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x[u], x[u]), x[u]);
    s[u] = _mm256_mul_ps(splat(2.0f * 0.7978845608028654f), _mm256_fmadd_ps(splat(0.044715f), x3, x[u]));
  }
  sigmoid_n<N>(s);
  TPU_EACH x[u] = _mm256_mul_ps(x[u], s[u]);
}

template <int N>
TPU_AVX2_FN void silu_n(__m256 (&x)[N]) {
  __m256 s[N];
  TPU_EACH s[u] = x[u];
  sigmoid_n<N>(s);
  TPU_EACH x[u] = _mm256_mul_ps(x[u], s[u]);
}

TPU_AVX2_FN __m256 relu_v(__m256 x) { return _mm256_max_ps(zero(), x); }  // NaN kept

// Lane mask with the first `left` (< 8) lanes set.
TPU_AVX2_FN __m256i tail_mask(int64_t left) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(left)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

template <__m256 (*F)(__m256)>
TPU_AVX2_ENTRY void unary_loop(float* o, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
    _mm256_storeu_ps(o + i, F(a));
    _mm256_storeu_ps(o + i + 8, F(b));
  }
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(o + i, F(_mm256_loadu_ps(x + i)));
  if (i < n) {
    const __m256i m = tail_mask(n - i);
    _mm256_maskstore_ps(o + i, m, F(_mm256_maskload_ps(x + i, m)));
  }
}

// Four vectors side by side (see exp_n), then one at a time, then the masked tail.
template <void (*F4)(__m256 (&)[4]), void (*F1)(__m256 (&)[1])>
TPU_AVX2_ENTRY void unary_loop_x4(float* o, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256 v[4] = {_mm256_loadu_ps(x + i), _mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(x + i + 16),
                   _mm256_loadu_ps(x + i + 24)};
    F4(v);
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) _mm256_storeu_ps(o + i + 8 * u, v[u]);
  }
  for (; i + 8 <= n; i += 8) {
    __m256 v[1] = {_mm256_loadu_ps(x + i)};
    F1(v);
    _mm256_storeu_ps(o + i, v[0]);
  }
  if (i < n) {
    const __m256i m = tail_mask(n - i);
    __m256 v[1] = {_mm256_maskload_ps(x + i, m)};
    F1(v);
    _mm256_maskstore_ps(o + i, m, v[0]);
  }
}
#define TPU_X4(F) unary_loop_x4<F<4>, F<1>>

// ---- binary arithmetic: memory-bound loops; large outputs bypass the cache ----

// Above this many elements the output is written with non-temporal stores (no
// read-for-ownership of lines that cannot stay in the caches anyway).
constexpr int64_t kStreamThreshold = int64_t{1} << 20;

struct AddOp { TPU_AVX2_FN __m256 f(__m256 a, __m256 b, __m256 al) { return _mm256_fmadd_ps(al, b, a); } };
struct AddOneOp { TPU_AVX2_FN __m256 f(__m256 a, __m256 b, __m256) { return _mm256_add_ps(a, b); } };
struct SubOp { TPU_AVX2_FN __m256 f(__m256 a, __m256 b, __m256 al) { return _mm256_fnmadd_ps(al, b, a); } };
struct SubOneOp { TPU_AVX2_FN __m256 f(__m256 a, __m256 b, __m256) { return _mm256_sub_ps(a, b); } };
struct MulOp { TPU_AVX2_FN __m256 f(__m256 a, __m256 b, __m256) { return _mm256_mul_ps(a, b); } };
struct DivOp { TPU_AVX2_FN __m256 f(__m256 a, __m256 b, __m256) { return _mm256_div_ps(a, b); } };
// max/min return the second operand when either is NaN; a NaN first operand is put back.
struct MaxOp {
  TPU_AVX2_FN __m256 f(__m256 a, __m256 b, __m256) { return select(_mm256_max_ps(a, b), _mm256_cmp_ps(a, a, _CMP_UNORD_Q), a); }
};
struct MinOp {
  TPU_AVX2_FN __m256 f(__m256 a, __m256 b, __m256) { return select(_mm256_min_ps(a, b), _mm256_cmp_ps(a, a, _CMP_UNORD_Q), a); }
};

template <class Op, bool kStream>
TPU_AVX2_FN void binary_body(float* o, const float* x, const float* y, bool ys, __m256 al, int64_t i, int64_t end) {
  const __m256 bs = _mm256_set1_ps(y[0]);
  for (; i + 16 <= end; i += 16) {
    const __m256 y0 = ys ? bs : _mm256_loadu_ps(y + i), y1 = ys ? bs : _mm256_loadu_ps(y + i + 8);
    const __m256 r0 = Op::f(_mm256_loadu_ps(x + i), y0, al), r1 = Op::f(_mm256_loadu_ps(x + i + 8), y1, al);
    if constexpr (kStream) {
      _mm256_stream_ps(o + i, r0);
      _mm256_stream_ps(o + i + 8, r1);
    } else {
      _mm256_storeu_ps(o + i, r0);
      _mm256_storeu_ps(o + i + 8, r1);
    }
  }
}

// Elements [i, end) (fewer than a few vectors) with whole and masked vectors.
template <class Op>
TPU_AVX2_FN void binary_rest(float* o, const float* x, const float* y, bool ys, __m256 al, int64_t i, int64_t end) {
  const __m256 bs = _mm256_set1_ps(y[0]);
  for (; i + 8 <= end; i += 8)
    _mm256_storeu_ps(o + i, Op::f(_mm256_loadu_ps(x + i), ys ? bs : _mm256_loadu_ps(y + i), al));
  if (i < end) {
    const __m256i m = tail_mask(end - i);
    const __m256 b = ys ? bs : _mm256_maskload_ps(y + i, m);
    _mm256_maskstore_ps(o + i, m, Op::f(_mm256_maskload_ps(x + i, m), b, al));
  }
}

template <class Op>
TPU_AVX2_ENTRY void binary_loop(float* o, const float* x, const float* y, bool ys, float alpha, int64_t n) {
  if (n <= 0) return;
  const __m256 al = _mm256_set1_ps(alpha);
  if (n >= kStreamThreshold && (reinterpret_cast<uintptr_t>(o) & 3u) == 0) {
    // Peel to a 32-byte aligned output, stream the body, finish with the rest.
    const int64_t mis = static_cast<int64_t>((reinterpret_cast<uintptr_t>(o) & 31u) / sizeof(float));
    const int64_t head = mis ? 8 - mis : 0;
    binary_rest<Op>(o, x, y, ys, al, 0, head);
    const int64_t body_end = head + ((n - head) / 16) * 16;
    binary_body<Op, true>(o, x, y, ys, al, head, body_end);
    _mm_sfence();
    binary_rest<Op>(o, x, y, ys, al, body_end, n);
    return;
  }
  const int64_t body_end = (n / 16) * 16;
  binary_body<Op, false>(o, x, y, ys, al, 0, body_end);
  binary_rest<Op>(o, x, y, ys, al, body_end, n);
}

TPU_AVX2_ENTRY void add_v(float* o, const float* x, const float* y, bool ys, float alpha, int64_t n) {
  if (alpha == 1.0f) binary_loop<AddOneOp>(o, x, y, ys, alpha, n);
  else binary_loop<AddOp>(o, x, y, ys, alpha, n);
}
TPU_AVX2_ENTRY void sub_v(float* o, const float* x, const float* y, bool ys, float alpha, int64_t n) {
  if (alpha == 1.0f) binary_loop<SubOneOp>(o, x, y, ys, alpha, n);
  else binary_loop<SubOp>(o, x, y, ys, alpha, n);
}

// ---- fused programs: a region's steps over blocks that stay in L1 ----
//
// Each step runs over a whole block of kProgBlock elements (one dispatch per step and block),
// four vectors at a time, reading its operands through plain pointers: memory inputs in
// place, scalars from a slot filled once, computed values from their block slots. A step
// stores its value to its slot when a later step reads it, and to memory as it is computed
// when it is a region output; a multiply and add feeding a unary step fold into that step's
// pass. A block is small enough for the loads of memory operands to overlap the arithmetic of
// the steps before, and large enough that dispatch costs little. The last, partial block
// first copies its memory inputs into slots, so no step needs masks. A program that folds into
// a single step reading memory only (bias and activation) skips the blocks: see single_pass.

constexpr int kProgVecs = 4;
constexpr int kProgSub = 8 * kProgVecs;  // floats per sub-block
constexpr int kProgBlock = kProgSub * 8;  // floats per block
using Block = __m256[kProgVecs];

// Stores a computed sub-block to its slot (unless null) and, for a region output, to memory.
TPU_AVX2_FN void prog_put(const Block& a, float* o, float* m, bool stream, int64_t e) {
  if (o)
    for (int u = 0; u < kProgVecs; ++u) _mm256_store_ps(o + e + 8 * u, a[u]);
  if (!m) return;
  if (stream) {
    for (int u = 0; u < kProgVecs; ++u) _mm256_stream_ps(m + e + 8 * u, a[u]);
  } else {
    for (int u = 0; u < kProgVecs; ++u) _mm256_storeu_ps(m + e + 8 * u, a[u]);
  }
}

// Where a step writes: its slot `o`, and `m` (memory, may be null) for region outputs.
struct ProgDst {
  float* o;
  float* m;
  bool stream;
};

// F(x * a + b) with the multiply and add folded in (kMul, kAdd false: left out, and `a`, `b`
// are not read). Multiply then add round separately, as the steps they replace do (bit for bit
// the eager result). The prologue's shape is a template parameter and F is inlined (flatten):
// with run-time branches in the loop, or F called, GCC keeps the block on the stack instead
// of in registers (30% slower in cache for gelu(x * a + b)).
template <void (*F)(Block&), bool kMul, bool kAdd>
__attribute__((noinline, flatten)) TPU_AVX2_ENTRY void prog_map1_as(const float* x, const float* a, const float* b,
                                                                    ProgDst d, int64_t len) {
  for (int64_t e = 0; e < len; e += kProgSub) {
    Block v;
    for (int u = 0; u < kProgVecs; ++u) v[u] = _mm256_loadu_ps(x + e + 8 * u);
    if constexpr (kMul)
      for (int u = 0; u < kProgVecs; ++u) {
        v[u] = _mm256_mul_ps(v[u], _mm256_loadu_ps(a + e + 8 * u));
        asm("" : "+x"(v[u]));  // the product is rounded: no contraction with the add into an FMA
      }
    if constexpr (kAdd)
      for (int u = 0; u < kProgVecs; ++u) v[u] = _mm256_add_ps(v[u], _mm256_loadu_ps(b + e + 8 * u));
    F(v);
    prog_put(v, d.o, d.m, d.stream, e);
  }
}
// Picks the instance for the prologue at hand (a, b null: left out).
template <void (*F)(Block&)>
TPU_AVX2_ENTRY void prog_map1(const float* x, const float* a, const float* b, ProgDst d, int64_t len) {
  if (a && b) prog_map1_as<F, true, true>(x, a, b, d, len);
  else if (a) prog_map1_as<F, true, false>(x, a, b, d, len);
  else if (b) prog_map1_as<F, false, true>(x, a, b, d, len);
  else prog_map1_as<F, false, false>(x, a, b, d, len);
}
template <class Op>
__attribute__((noinline)) TPU_AVX2_ENTRY void prog_map2(const float* x, const float* y, ProgDst d, float alpha,
                                                        int64_t len) {
  const __m256 al = _mm256_set1_ps(alpha);
  for (int64_t e = 0; e < len; e += kProgSub) {
    Block a;
    for (int u = 0; u < kProgVecs; ++u) a[u] = Op::f(_mm256_loadu_ps(x + e + 8 * u), _mm256_loadu_ps(y + e + 8 * u), al);
    prog_put(a, d.o, d.m, d.stream, e);
  }
}

template <__m256 (*F)(__m256)>
TPU_AVX2_FN void each_v(Block& v) {
  for (int u = 0; u < kProgVecs; ++u) v[u] = F(v[u]);
}
TPU_AVX2_FN __m256 neg_v(__m256 x) { return _mm256_xor_ps(x, sign_mask()); }
TPU_AVX2_FN __m256 sqrt_v(__m256 x) { return _mm256_sqrt_ps(x); }
TPU_AVX2_FN __m256 rsqrt_v(__m256 x) { return _mm256_div_ps(splat(1.0f), _mm256_sqrt_ps(x)); }
TPU_AVX2_FN __m256 recip_v(__m256 x) { return _mm256_div_ps(splat(1.0f), x); }
TPU_AVX2_FN void nop_v(Block&) {}

// A unary step with the multiply and add that feed it folded in (see fold_prologues).
// No default member values: program_v's array of them is set for its steps only.
struct Prologue {
  int16_t x, a, b;  // operands: x * a + b (a, b: -1 when left out)
};

// One step over `len` elements (a multiple of kProgSub) from operand pointers `p`; `m`:
// memory destinations (null: none); `uses`: readers of each operand.
TPU_AVX2_FN void prog_step(const VecStep& s, const Prologue& pro, float* const* p, float* const* m, const bool* stream,
                           const int* uses, int64_t len) {
  const float* x = p[pro.x >= 0 ? pro.x : s.in0];
  // A region output no later step reads goes to memory only.
  const ProgDst o{uses[s.out] > 0 || !m[s.out] ? p[s.out] : nullptr, m[s.out], stream[s.out]};
  if (s.kind == VecStepKind::binary) {
    const float* y = p[s.in1];
    switch (s.bin) {
      case VecBinary::add: (s.alpha == 1.0f ? prog_map2<AddOneOp> : prog_map2<AddOp>)(x, y, o, s.alpha, len); break;
      case VecBinary::sub: (s.alpha == 1.0f ? prog_map2<SubOneOp> : prog_map2<SubOp>)(x, y, o, s.alpha, len); break;
      case VecBinary::mul: prog_map2<MulOp>(x, y, o, s.alpha, len); break;
      case VecBinary::div: prog_map2<DivOp>(x, y, o, s.alpha, len); break;
      case VecBinary::maximum: prog_map2<MaxOp>(x, y, o, s.alpha, len); break;
      case VecBinary::minimum: prog_map2<MinOp>(x, y, o, s.alpha, len); break;
      case VecBinary::count: break;
    }
    return;
  }
  void (*f)(const float*, const float*, const float*, ProgDst, int64_t) = prog_map1<nop_v>;
  switch (s.kind) {
    case VecStepKind::unary:
      switch (s.un) {
        case VecUnary::exp: f = prog_map1<exp_n<kProgVecs>>; break;
        case VecUnary::log: f = prog_map1<each_v<log_v>>; break;
        case VecUnary::tanh: f = prog_map1<tanh_n<kProgVecs>>; break;
        case VecUnary::sigmoid: f = prog_map1<sigmoid_n<kProgVecs>>; break;
        case VecUnary::silu: f = prog_map1<silu_n<kProgVecs>>; break;
        case VecUnary::gelu_erf: f = prog_map1<gelu_erf_n<kProgVecs>>; break;
        case VecUnary::gelu_tanh: f = prog_map1<gelu_tanh_n<kProgVecs>>; break;
        case VecUnary::erf: f = prog_map1<erf_n<kProgVecs>>; break;
        case VecUnary::relu: f = prog_map1<each_v<relu_v>>; break;
        case VecUnary::count: break;
      }
      break;
    case VecStepKind::neg: f = prog_map1<each_v<neg_v>>; break;
    case VecStepKind::abs: f = prog_map1<each_v<abs_v>>; break;
    case VecStepKind::sqrt: f = prog_map1<each_v<sqrt_v>>; break;
    case VecStepKind::rsqrt: f = prog_map1<each_v<rsqrt_v>>; break;
    case VecStepKind::recip: f = prog_map1<each_v<recip_v>>; break;
    case VecStepKind::binary:
    case VecStepKind::copy: break;
  }
  f(x, pro.a >= 0 ? p[pro.a] : nullptr, pro.b >= 0 ? p[pro.b] : nullptr, o, len);
}

// Folds `mul` and `add` steps into the unary step that reads them, when their results have no
// other reader and are not region outputs: F(x * a + b), F(x + b) and F(x * a) run as one
// pass over the block (bias and activation, the most common fused region). Folded steps are
// marked in `skip`.
TPU_AVX2_FN void fold_prologues(const VecStep* steps, int nsteps, const VecOperand* ops, const int* uses, int nops,
                                Prologue* pro, bool* skip) {
  int producer[kVecProgramMaxOperands];
  std::fill_n(producer, nops, -1);
  for (int si = 0; si < nsteps; ++si) producer[steps[si].out] = si;
  // The step computing operand k when it may be folded away: a binary `op` (add: alpha 1).
  auto foldable = [&](int k, VecBinary op) {
    const int si = k >= 0 ? producer[k] : -1;
    if (si < 0 || uses[k] != 1 || ops[k].out || skip[si]) return -1;
    const VecStep& t = steps[si];
    if (t.kind != VecStepKind::binary || t.bin != op || (op == VecBinary::add && t.alpha != 1.0f)) return -1;
    return si;
  };
  for (int si = 0; si < nsteps; ++si) {
    const VecStep& s = steps[si];
    if (s.kind == VecStepKind::binary || s.kind == VecStepKind::copy) continue;
    Prologue& p = pro[si];
    int x = s.in0;
    if (const int ai = foldable(x, VecBinary::add); ai >= 0) {
      const VecStep& add = steps[ai];
      skip[ai] = true;
      // x * a + b when one side of the add is a foldable multiply.
      int mi = foldable(add.in0, VecBinary::mul), b = add.in1;
      if (mi < 0) {
        mi = foldable(add.in1, VecBinary::mul);
        b = add.in0;
      }
      if (mi < 0) {
        x = add.in0;
        b = add.in1;
      } else {
        skip[mi] = true;
        x = steps[mi].in0;
        p.a = steps[mi].in1;
      }
      p.b = static_cast<int16_t>(b);
    } else if (const int mi = foldable(x, VecBinary::mul); mi >= 0) {
      skip[mi] = true;
      x = steps[mi].in0;
      p.a = steps[mi].in1;
    }
    p.x = static_cast<int16_t>(x);
  }
}

// The one step left after folding when it reads memory inputs only and writes only memory
// (a scalar operand lives in a block-sized slot, so it needs the block loop), else -1.
TPU_AVX2_FN int single_pass(const VecStep* steps, int nsteps, const VecOperand* ops, const Prologue* pro,
                            const bool* skip) {
  int si = -1;
  for (int k = 0; k < nsteps; ++k) {
    if (skip[k]) continue;
    if (si >= 0) return -1;
    si = k;
  }
  if (si < 0) return -1;
  const VecStep& s = steps[si];
  auto memory = [&](int k) { return k >= 0 && ops[k].in && !ops[k].scalar; };
  const bool reads_memory = s.kind == VecStepKind::binary
                                ? memory(s.in0) && memory(s.in1)
                                : memory(pro[si].x >= 0 ? pro[si].x : s.in0) && (pro[si].a < 0 || memory(pro[si].a)) &&
                                      (pro[si].b < 0 || memory(pro[si].b));
  return reads_memory && ops[s.out].out ? si : -1;
}

TPU_AVX2_ENTRY void program_v(const VecStep* steps, int nsteps, const VecOperand* ops, int nops, int64_t n) {
  if (n <= 0 || nops > kVecProgramMaxOperands) return;
  // One block slot per operand; scalars are broadcast into theirs once.
  alignas(32) float slots[kVecProgramMaxOperands][kProgBlock];
  float* p[kVecProgramMaxOperands];
  float* m[kVecProgramMaxOperands];
  bool streamed[kVecProgramMaxOperands];
  int mems[kVecProgramMaxOperands], outs[kVecProgramMaxOperands];
  int nmems = 0, nouts = 0;
  bool any_stream = false;
  // Per-call state sized by the program, not by the limit (this runs once per row piece).
  int uses[kVecProgramMaxOperands];
  std::fill_n(uses, nops, 0);
  for (int si = 0; si < nsteps; ++si) {
    ++uses[steps[si].in0];
    if (steps[si].kind == VecStepKind::binary) ++uses[steps[si].in1];
  }
  Prologue pro[kVecProgramMaxOperands];
  std::fill_n(pro, nsteps, Prologue{-1, -1, -1});
  bool skip[kVecProgramMaxOperands];
  std::fill_n(skip, nsteps, false);
  fold_prologues(steps, nsteps, ops, uses, nops, pro, skip);
  for (int k = 0; k < nops; ++k) {
    const VecOperand& o = ops[k];
    p[k] = slots[k];
    m[k] = nullptr;
    streamed[k] = o.out && o.stream && (reinterpret_cast<uintptr_t>(o.out) & 31u) == 0;
    any_stream = any_stream || streamed[k];
    if (o.in && o.scalar) std::fill(slots[k], slots[k] + kProgBlock, o.in[0]);
    else if (o.in) mems[nmems++] = k;
    if (o.out) outs[nouts++] = k;
  }
  int64_t i = 0;
  if (const int si = single_pass(steps, nsteps, ops, pro, skip); si >= 0) {
    // One pass over memory needs no slots: it runs over every whole sub-block in one call and
    // leaves the prefetching to the hardware (per-block dispatch and software prefetches cost
    // a fifth of the time of gelu(x * w + b) out of cache). Only the tail takes the slots.
    for (int j = 0; j < nmems; ++j) p[mems[j]] = const_cast<float*>(ops[mems[j]].in);
    for (int j = 0; j < nouts; ++j) m[outs[j]] = ops[outs[j]].out;
    i = n / kProgSub * kProgSub;
    if (i > 0) prog_step(steps[si], pro[si], p, m, streamed, uses, i);
  }
  for (; i + kProgBlock <= n; i += kProgBlock) {
    for (int j = 0; j < nmems; ++j) {
      p[mems[j]] = const_cast<float*>(ops[mems[j]].in) + i;
      // The lines two blocks ahead, fetched while this block computes (also past the end: the
      // caller's next range usually follows, and a prefetch never faults).
      for (int e = 0; e < kProgBlock; e += 16) _mm_prefetch(reinterpret_cast<const char*>(p[mems[j]] + 2 * kProgBlock + e), _MM_HINT_T0);
    }
    for (int j = 0; j < nouts; ++j) m[outs[j]] = ops[outs[j]].out + i;
    for (int si = 0; si < nsteps; ++si)
      if (!skip[si]) prog_step(steps[si], pro[si], p, m, streamed, uses, kProgBlock);
  }
  if (i < n) {
    // The partial last block runs on slots only (inputs copied in, outputs copied out).
    const int64_t left = n - i, len = (left + kProgSub - 1) / kProgSub * kProgSub;
    for (int j = 0; j < nmems; ++j) {
      const int k = mems[j];
      for (int64_t e = 0; e < len; e += 8)
        _mm256_store_ps(slots[k] + e, _mm256_maskload_ps(ops[k].in + i + e, tail_mask(left - e)));
      p[k] = slots[k];
    }
    for (int j = 0; j < nouts; ++j) m[outs[j]] = nullptr;
    for (int si = 0; si < nsteps; ++si)
      if (!skip[si]) prog_step(steps[si], pro[si], p, m, streamed, uses, len);
    for (int j = 0; j < nouts; ++j)
      for (int64_t e = 0; e < left; e += 8)
        _mm256_maskstore_ps(ops[outs[j]].out + i + e, tail_mask(left - e), _mm256_load_ps(slots[outs[j]] + e));
  }
  if (any_stream) _mm_sfence();
}

const VecMathTable kAvx2Table = {
    "avx2",
    {TPU_X4(exp_n), unary_loop<log_v>, TPU_X4(tanh_n), TPU_X4(sigmoid_n), TPU_X4(silu_n),
     TPU_X4(gelu_erf_n), TPU_X4(gelu_tanh_n), TPU_X4(erf_n), unary_loop<relu_v>},
    {add_v, sub_v, binary_loop<MulOp>, binary_loop<DivOp>, binary_loop<MaxOp>, binary_loop<MinOp>},
    program_v,
};

#undef TPU_X4
#undef TPU_EACH

}  // namespace

const VecMathTable* vec_math_avx2() {
  static const bool ok = cpu_features().avx2 && cpu_features().fma;
  return ok ? &kAvx2Table : nullptr;
}

}  // namespace tpu::ops::cpu

#else  // not x86-64 GCC/Clang: no AVX2 path

namespace tpu::ops::cpu {
const VecMathTable* vec_math_avx2() { return nullptr; }
}  // namespace tpu::ops::cpu

#endif
