// AVX-512 implementation of vec_math.h. Compiled for the baseline ISA like the rest of the
// library: every function that uses AVX-512 carries a target attribute and is only reached
// through vec_math_avx512(), which checks the CPU first.
//
// Approximations (derived here; the coefficients of the erf fits were computed for this file
// with a Chebyshev least-squares fit in high precision):
//   exp(x)  = 2^n * e^r, n = round(x / ln 2), r = x - n ln 2 (two-part ln 2), e^r by its Taylor
//             polynomial of degree 7 on |r| <= ln2/2; 2^n applied with vscalefps (handles
//             overflow to inf and gradual underflow).
//   expm1   = the same reduction, 2^n (expm1(r) + 1) - 1 with expm1(r) of degree 8.
//   log(x)  = e ln 2 + log(1 + f), x = 2^e (1 + f), 1 + f in [0.75, 1.5); with s = f / (2 + f),
//             log(1 + f) = f - (f^2/2 - s (f^2/2 + R)), R = 2 s^2/3 + 2 s^4/5 + ... (odd atanh
//             series rewritten so that the leading term f is exact).
//   tanh(x) = sign(x) * m / (m + 2), m = expm1(2|x|), |x| capped at 9 (tanh = 1 in f32 beyond).
//   sigmoid = t = exp(-|x|); 1/(1+t) for x >= 0, t/(1+t) otherwise (no overflow either way).
//   erf(x)  = x P(x^2) for |x| < 1 (degree 6 in x^2); 1 - exp(-x^2) Q(1/|x|) for |x| >= 1,
//             Q ~ erfc(x) exp(x^2) of degree 12 fitted on 1/|x| in [1/12, 1] (erfc(12) = 0 in f32);
//             erfc itself (for gelu) from exp(-x^2) Qmid(x) (degree 7) on [0.5, 1).
//   gelu    = 0.5 x erfc(-x/sqrt 2) with the one-piece erfc of erfc_pos_v (within 8 ulp: the
//             fit's own 1.2e-7 plus f32 evaluation; 1.4x faster than going through erf_parts);
//   gelu_tanh = x * sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3)) (= 0.5 x (1 + tanh(...))).
// GCC 12's AVX-512 headers implement many intrinsics with a deliberately undefined source
// register, which -Wmaybe-uninitialized flags at -O3 (GCC bug 105593); not a real issue.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>

#include "ops/cpu/vec_math.h"
#include "tpucore/core/cpu_features.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define TPU_AVX512_FN __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,fma"))) static inline
#define TPU_AVX512_ENTRY __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,fma"))) static

namespace tpu::ops::cpu {
namespace {

TPU_AVX512_FN __m512 splat(float v) { return _mm512_set1_ps(v); }

// e^r 2^n for |r| <= ~ln2/2: Taylor polynomial of degree 7, 2^n applied with vscalefps.
TPU_AVX512_FN __m512 exp_finish(__m512 n, __m512 r) {
  __m512 p = splat(1.0f / 5040.0f);
  p = _mm512_fmadd_ps(p, r, splat(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, splat(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, splat(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, splat(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, splat(0.5f));
  p = _mm512_fmadd_ps(p, r, splat(1.0f));
  p = _mm512_fmadd_ps(p, r, splat(1.0f));
  return _mm512_scalef_ps(p, n);
}
TPU_AVX512_FN __m512 round_v(__m512 x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
TPU_AVX512_FN __m512 exp_v(__m512 x) {
  // max(lo, x) and min(hi, .) return x when x is NaN, so NaN propagates.
  x = _mm512_min_ps(splat(88.8f), _mm512_max_ps(splat(-104.0f), x));
  const __m512 n = round_v(_mm512_mul_ps(x, splat(1.44269504088896341f)));
  __m512 r = _mm512_fmadd_ps(n, splat(-0.693359375f), x);
  r = _mm512_fmadd_ps(n, splat(2.12194440e-4f), r);
  return exp_finish(n, r);
}
// exp(hi + lo) for a large exact `hi` (in [-104, 0]) and a small `lo` (|lo| < 2): n ln2 is
// taken off hi first (exact for the short high part of ln2), so the rounding of hi + lo, which
// grows with |hi|, never reaches the result.
TPU_AVX512_FN __m512 exp_hl_v(__m512 hi, __m512 lo) {
  const __m512 n = round_v(_mm512_mul_ps(_mm512_add_ps(hi, lo), splat(1.44269504088896341f)));
  __m512 r = _mm512_add_ps(_mm512_fmadd_ps(n, splat(-0.693359375f), hi), lo);
  r = _mm512_fmadd_ps(n, splat(2.12194440e-4f), r);
  return exp_finish(n, r);
}
// expm1 for x in [0, 20] (the range tanh needs).
TPU_AVX512_FN __m512 expm1_pos_v(__m512 x) {
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, splat(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, splat(-0.693359375f), x);
  r = _mm512_fmadd_ps(n, splat(2.12194440e-4f), r);
  __m512 p = splat(1.0f / 40320.0f);
  p = _mm512_fmadd_ps(p, r, splat(1.0f / 5040.0f));
  p = _mm512_fmadd_ps(p, r, splat(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, splat(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, splat(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, splat(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, splat(0.5f));
  const __m512 q = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r);  // expm1(r)
  const __m512 t = _mm512_scalef_ps(splat(1.0f), n);             // 2^n, exact
  return _mm512_fmadd_ps(t, q, _mm512_sub_ps(t, splat(1.0f)));
}

TPU_AVX512_FN __m512 log_v(__m512 x) {
  const __m512 one = splat(1.0f);
  const __m512 m = _mm512_getmant_ps(x, _MM_MANT_NORM_p75_1p5, _MM_MANT_SIGN_zero);
  __m512 e = _mm512_getexp_ps(x);
  e = _mm512_mask_add_ps(e, _mm512_cmp_ps_mask(m, one, _CMP_LT_OQ), e, one);
  const __m512 f = _mm512_sub_ps(m, one);
  const __m512 s = _mm512_div_ps(f, _mm512_add_ps(f, splat(2.0f)));
  const __m512 z = _mm512_mul_ps(s, s);
  __m512 R = splat(2.0f / 11.0f);
  R = _mm512_fmadd_ps(R, z, splat(2.0f / 9.0f));
  R = _mm512_fmadd_ps(R, z, splat(2.0f / 7.0f));
  R = _mm512_fmadd_ps(R, z, splat(2.0f / 5.0f));
  R = _mm512_fmadd_ps(R, z, splat(2.0f / 3.0f));
  R = _mm512_mul_ps(R, z);
  const __m512 hfsq = _mm512_mul_ps(splat(0.5f), _mm512_mul_ps(f, f));
  const __m512 hi = _mm512_fmadd_ps(e, splat(0.693359375f), f);
  const __m512 lo = _mm512_fmadd_ps(s, _mm512_add_ps(hfsq, R), _mm512_fmsub_ps(e, splat(-2.12194440e-4f), hfsq));
  __m512 r = _mm512_add_ps(hi, lo);
  // Special values: log(+-0) = -inf, log(x < 0) = NaN, log(inf) = inf, log(NaN) = NaN.
  const __m512 inf = splat(__builtin_inff());
  r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_EQ_OQ), _mm512_sub_ps(_mm512_setzero_ps(), inf));
  r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(x, inf, _CMP_EQ_OQ), inf);
  r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_NGE_UQ), splat(__builtin_nanf("")));
  return r;
}

TPU_AVX512_FN __m512 abs_v(__m512 x) { return _mm512_abs_ps(x); }
TPU_AVX512_FN __m512 sign_bits(__m512 x) { return _mm512_and_ps(x, _mm512_castsi512_ps(_mm512_set1_epi32(INT32_MIN))); }

TPU_AVX512_FN __m512 tanh_v(__m512 x) {
  const __m512 a = _mm512_min_ps(splat(9.0f), abs_v(x));  // NaN stays NaN
  const __m512 m = expm1_pos_v(_mm512_add_ps(a, a));
  const __m512 t = _mm512_div_ps(m, _mm512_add_ps(m, splat(2.0f)));
  return _mm512_or_ps(t, sign_bits(x));
}

TPU_AVX512_FN __m512 sigmoid_v(__m512 x) {
  const __m512 t = exp_v(_mm512_sub_ps(_mm512_setzero_ps(), abs_v(x)));
  const __m512 s = _mm512_div_ps(splat(1.0f), _mm512_add_ps(splat(1.0f), t));
  return _mm512_mask_mul_ps(s, _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_NGE_UQ), t, s);
}

// For a = |x|: erf(a) and erfc(a), each computed the accurate way for its range.
TPU_AVX512_FN void erf_parts(__m512 a, __m512& erf_a, __m512& erfc_a) {
  const __m512 one = splat(1.0f);
  // |x| < 1: erf(a) = a P(a^2).
  const __m512 u = _mm512_mul_ps(a, a);
  __m512 p = splat(7.875875063e-5f);
  p = _mm512_fmadd_ps(p, u, splat(-0.0008016864287f));
  p = _mm512_fmadd_ps(p, u, splat(0.005189087423f));
  p = _mm512_fmadd_ps(p, u, splat(-0.02685421201f));
  p = _mm512_fmadd_ps(p, u, splat(0.1128359472f));
  p = _mm512_fmadd_ps(p, u, splat(-0.3761262667f));
  p = _mm512_fmadd_ps(p, u, splat(1.128379166f));
  const __m512 erf_small = _mm512_mul_ps(a, p);
  // |x| >= 0.5: erfc(a) = exp(-a^2) Q(a), with Q ~ erfc(a) exp(a^2) fitted on 1/a for a in
  // [1, 12] and on a itself for a in [0.5, 1) (there 1 - erf(a) would lose digits).
  const __m512 b = _mm512_min_ps(splat(12.0f), _mm512_max_ps(splat(0.5f), a));
  const __m512 t = _mm512_div_ps(one, _mm512_max_ps(one, b));
  static constexpr float kQ[] = {0.0516736093f,  -0.3338052317f, 0.9068110242f, -1.266714705f,    0.737462849f,
                                 0.4407592784f,  -1.1697602f,    0.8698077682f, -0.1051848597f,   -0.2662518563f,
                                 -0.001479429913f, 0.5642670562f, -1.725435043e-6f};
  __m512 q = splat(kQ[0]);
  for (size_t i = 1; i < sizeof(kQ) / sizeof(kQ[0]); ++i) q = _mm512_fmadd_ps(q, t, splat(kQ[i]));
  static constexpr float kQmid[] = {-0.006170182657f, 0.04699112101f, -0.170467373f, 0.4006501161f,
                                    -0.7010651264f,   0.9830441183f,  -1.125123988f, 0.9997248905f};
  __m512 qm = splat(kQmid[0]);
  for (size_t i = 1; i < sizeof(kQmid) / sizeof(kQmid[0]); ++i) qm = _mm512_fmadd_ps(qm, b, splat(kQmid[i]));
  q = _mm512_mask_mov_ps(q, _mm512_cmp_ps_mask(b, one, _CMP_LT_OQ), qm);
  // exp(-(h + l)) = exp(-h) (1 - l) with h + l = b^2 exactly.
  const __m512 h = _mm512_mul_ps(b, b);
  const __m512 l = _mm512_fmsub_ps(b, b, h);
  const __m512 eh = exp_v(_mm512_sub_ps(_mm512_setzero_ps(), h));
  const __m512 erfc_large = _mm512_mul_ps(_mm512_fnmadd_ps(eh, l, eh), q);
  const __mmask16 small = _mm512_cmp_ps_mask(a, one, _CMP_LT_OQ);
  erf_a = _mm512_mask_mov_ps(_mm512_sub_ps(one, erfc_large), small, erf_small);
  erfc_a = _mm512_mask_mov_ps(erfc_large, _mm512_cmp_ps_mask(a, splat(0.5f), _CMP_LT_OQ), _mm512_sub_ps(one, erf_small));
  // NaN input: the clamps above turned it into a number; put it back.
  const __mmask16 nan = _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
  erf_a = _mm512_mask_mov_ps(erf_a, nan, a);
  erfc_a = _mm512_mask_mov_ps(erfc_a, nan, a);
}

TPU_AVX512_FN __m512 erf_v(__m512 x) {
  __m512 e, c;
  erf_parts(abs_v(x), e, c);
  return _mm512_or_ps(e, sign_bits(x));
}

// erfc(a) for a >= 0 in one piece: t exp(-a^2 + P(t)), t = 1/(1 + a/2), P the degree-9
// Chebyshev-derived polynomial published in Numerical Recipes (relative error below 1.2e-7 for
// every a >= 0, so the negative tail of gelu keeps its digits). One reciprocal estimate (plus a
// Newton step) and one exp, where erf_parts needs three polynomials, a division and an exp.
TPU_AVX512_FN __m512 erfc_pos_v(__m512 a) {
  const __m512 one = splat(1.0f);
  // Beyond 10.5, t exp(-b^2 + P) underflows to exactly 0 (so gelu(-inf) = -inf * 0 = NaN, as
  // in PyTorch); NaN becomes 10.5 here and is restored by the final product with x.
  const __m512 b = _mm512_min_ps(a, splat(10.5f));
  const __m512 d = _mm512_fmadd_ps(b, splat(0.5f), one);
  __m512 t = _mm512_rcp14_ps(d);
  t = _mm512_mul_ps(t, _mm512_fnmadd_ps(d, t, splat(2.0f)));  // Newton: error ~2^-28
  static constexpr float kP[] = {0.17087277f, -0.82215223f, 1.48851587f, -1.13520398f, 0.27886807f,
                                 -0.18628806f, 0.09678418f,  0.37409196f, 1.00002368f,  -1.26551223f};
  __m512 p = splat(kP[0]);
  for (size_t i = 1; i < sizeof(kP) / sizeof(kP[0]); ++i) p = _mm512_fmadd_ps(p, t, splat(kP[i]));
  // -b^2 = -(h + l) exactly: the exact large part goes to exp_hl_v apart from the small rest.
  const __m512 h = _mm512_mul_ps(b, b);
  const __m512 l = _mm512_fmsub_ps(b, b, h);
  return _mm512_mul_ps(t, exp_hl_v(_mm512_sub_ps(_mm512_setzero_ps(), h), _mm512_sub_ps(p, l)));
}
TPU_AVX512_FN __m512 gelu_erf_v(__m512 x) {
  const __m512 z = _mm512_mul_ps(x, splat(0.70710678118654752f));
  const __m512 a = abs_v(z);
  const __m512 c = erfc_pos_v(a);
  // 1 + erf(z) = erfc(-z): erfc(|z|) for z < 0, 2 - erfc(|z|) otherwise (no cancellation on
  // either side). NaN x stays NaN through the final product.
  const __m512 one_plus = _mm512_mask_mov_ps(_mm512_sub_ps(splat(2.0f), c),
                                       _mm512_cmp_ps_mask(z, _mm512_setzero_ps(), _CMP_LT_OQ), c);
  return _mm512_mul_ps(_mm512_mul_ps(splat(0.5f), x), one_plus);
}
TPU_AVX512_FN __m512 gelu_tanh_v(__m512 x) {
  const __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
  const __m512 u = _mm512_mul_ps(splat(2.0f * 0.7978845608028654f), _mm512_fmadd_ps(splat(0.044715f), x3, x));
  return _mm512_mul_ps(x, sigmoid_v(u));
}

TPU_AVX512_FN __m512 silu_v(__m512 x) { return _mm512_mul_ps(x, sigmoid_v(x)); }
TPU_AVX512_FN __m512 relu_v(__m512 x) { return _mm512_max_ps(_mm512_setzero_ps(), x); }  // NaN kept

template <__m512 (*F)(__m512)>
TPU_AVX512_ENTRY void unary_loop(float* o, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
    _mm512_storeu_ps(o + i, F(a));
    _mm512_storeu_ps(o + i + 16, F(b));
  }
  for (; i < n; i += 16) {
    const int64_t left = n - i;
    const __mmask16 m = left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1u);
    _mm512_mask_storeu_ps(o + i, m, F(_mm512_maskz_loadu_ps(m, x + i)));
  }
}

// ---- binary arithmetic: memory-bound loops; large outputs bypass the cache ----

// Above this many elements in one call the output is written with non-temporal stores: it
// cannot stay in the caches anyway, and skipping the read-for-ownership saves a third of
// the memory traffic.
constexpr int64_t kStreamThreshold = int64_t{1} << 20;

struct AddOp { TPU_AVX512_FN __m512 f(__m512 a, __m512 b, __m512 al) { return _mm512_fmadd_ps(al, b, a); } };
struct AddOneOp { TPU_AVX512_FN __m512 f(__m512 a, __m512 b, __m512) { return _mm512_add_ps(a, b); } };
struct SubOp { TPU_AVX512_FN __m512 f(__m512 a, __m512 b, __m512 al) { return _mm512_fnmadd_ps(al, b, a); } };
struct SubOneOp { TPU_AVX512_FN __m512 f(__m512 a, __m512 b, __m512) { return _mm512_sub_ps(a, b); } };
struct MulOp { TPU_AVX512_FN __m512 f(__m512 a, __m512 b, __m512) { return _mm512_mul_ps(a, b); } };
struct DivOp { TPU_AVX512_FN __m512 f(__m512 a, __m512 b, __m512) { return _mm512_div_ps(a, b); } };
struct MaxOp {
  TPU_AVX512_FN __m512 f(__m512 a, __m512 b, __m512) {
    return _mm512_mask_mov_ps(_mm512_max_ps(a, b), _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), a);
  }
};
struct MinOp {
  TPU_AVX512_FN __m512 f(__m512 a, __m512 b, __m512) {
    return _mm512_mask_mov_ps(_mm512_min_ps(a, b), _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), a);
  }
};

template <class Op, bool kStream>
TPU_AVX512_FN void binary_body(float* o, const float* x, const float* y, bool ys, __m512 al, int64_t i, int64_t end) {
  if (ys) {
    const __m512 b = _mm512_set1_ps(y[0]);
    for (; i + 32 <= end; i += 32) {
      const __m512 r0 = Op::f(_mm512_loadu_ps(x + i), b, al), r1 = Op::f(_mm512_loadu_ps(x + i + 16), b, al);
      if constexpr (kStream) {
        _mm512_stream_ps(o + i, r0);
        _mm512_stream_ps(o + i + 16, r1);
      } else {
        _mm512_storeu_ps(o + i, r0);
        _mm512_storeu_ps(o + i + 16, r1);
      }
    }
  } else {
    for (; i + 32 <= end; i += 32) {
      const __m512 r0 = Op::f(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i), al);
      const __m512 r1 = Op::f(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(y + i + 16), al);
      if constexpr (kStream) {
        _mm512_stream_ps(o + i, r0);
        _mm512_stream_ps(o + i + 16, r1);
      } else {
        _mm512_storeu_ps(o + i, r0);
        _mm512_storeu_ps(o + i + 16, r1);
      }
    }
  }
}

template <class Op>
TPU_AVX512_FN void binary_masked(float* o, const float* x, const float* y, bool ys, __m512 al, int64_t i, int64_t end) {
  while (i < end) {
    const int64_t left = end - i;
    const __mmask16 m = left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1u);
    const __m512 b = ys ? _mm512_set1_ps(y[0]) : _mm512_maskz_loadu_ps(m, y + i);
    _mm512_mask_storeu_ps(o + i, m, Op::f(_mm512_maskz_loadu_ps(m, x + i), b, al));
    i += left >= 16 ? 16 : left;
  }
}

template <class Op>
TPU_AVX512_ENTRY void binary_loop(float* o, const float* x, const float* y, bool ys, float alpha, int64_t n) {
  const __m512 al = _mm512_set1_ps(alpha);
  if (n >= kStreamThreshold) {
    // Peel to a 64-byte aligned output, stream the body, finish with masked stores.
    const int64_t mis = static_cast<int64_t>((reinterpret_cast<uintptr_t>(o) & 63u) / sizeof(float));
    int64_t head = mis ? 16 - mis : 0;
    if ((reinterpret_cast<uintptr_t>(o) & 3u) == 0) {
      binary_masked<Op>(o, x, y, ys, al, 0, head);
      const int64_t body_end = head + ((n - head) / 32) * 32;
      binary_body<Op, true>(o, x, y, ys, al, head, body_end);
      _mm_sfence();
      binary_masked<Op>(o, x, y, ys, al, body_end, n);
      return;
    }
  }
  const int64_t body_end = (n / 32) * 32;
  binary_body<Op, false>(o, x, y, ys, al, 0, body_end);
  binary_masked<Op>(o, x, y, ys, al, body_end, n);
}

TPU_AVX512_ENTRY void add_v(float* o, const float* x, const float* y, bool ys, float alpha, int64_t n) {
  if (alpha == 1.0f) binary_loop<AddOneOp>(o, x, y, ys, alpha, n);
  else binary_loop<AddOp>(o, x, y, ys, alpha, n);
}
TPU_AVX512_ENTRY void sub_v(float* o, const float* x, const float* y, bool ys, float alpha, int64_t n) {
  if (alpha == 1.0f) binary_loop<SubOneOp>(o, x, y, ys, alpha, n);
  else binary_loop<SubOp>(o, x, y, ys, alpha, n);
}

bool avx512_usable() {
  const CpuFeatures& f = cpu_features();
  return f.avx512f && f.avx512bw && f.avx512vl && f.fma;
}

const VecMathTable kAvx512Table = {
    "avx512",
    {unary_loop<exp_v>, unary_loop<log_v>, unary_loop<tanh_v>, unary_loop<sigmoid_v>, unary_loop<silu_v>,
     unary_loop<gelu_erf_v>, unary_loop<gelu_tanh_v>, unary_loop<erf_v>, unary_loop<relu_v>},
    {add_v, sub_v, binary_loop<MulOp>, binary_loop<DivOp>, binary_loop<MaxOp>, binary_loop<MinOp>},
};

}  // namespace

const VecMathTable* vec_math_avx512() {
  static const bool ok = avx512_usable();
  return ok ? &kAvx512Table : nullptr;
}

}  // namespace tpu::ops::cpu

#else  // not x86-64 GCC/Clang: no AVX-512 path

namespace tpu::ops::cpu {
const VecMathTable* vec_math_avx512() { return nullptr; }
}  // namespace tpu::ops::cpu

#endif
