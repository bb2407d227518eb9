// scaled_dot_product_attention (PyTorch F.scaled_dot_product_attention without dropout, with
// enable_gqa=True): out = softmax(q k^T * scale + mask) v over the last two dims, with
// q [..., Hq, Lq, D], k [..., Hk, Lk, D], v [..., Hk, Lk, Dv] -> out [..., Hq, Lq, Dv]. Query
// head h reads key/value head h / (Hq / Hk) (grouped KV heads; Hq == Hk is plain multi-head).
// `causal` masks key j > query i (top-left aligned, as PyTorch's is_causal); an optional bool
// mask (true = takes part) broadcasts to [..., Hq, Lq, Lk]. Rows with every key masked give NaN
// (softmax of all -inf), Lk == 0 gives zeros, as PyTorch's math path.
//
// Inputs (q, k, v, mask); an absent mask is passed as q with has_mask false (as linear's bias).
// The cpu kernel works per key/value head (in parallel) on f32 copies of its heads: blocks of 64
// query rows, S = Q K^T with the cpu GEMM, scale + mask + softmax per row, O = P V, rounded
// once to the output dtype. Up to 16 query rows (decode) take a path without the copies and the
// GEMM: each key and value row is read once per key/value head, in its dtype, for every query
// head sharing it. The backward formula lives in ops/attention_grad.cpp.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ops/cpu/kernels/gemm.h"
#include "ops/cpu/kernels/half_convert.h"
#include "ops/cpu/kernels/intrin_diagnostics.h"
#include "ops/cpu/loops.h"
#include "ops/cpu/vec_math.h"
#include "ops/meta_util.h"
#include "ops/reduce_engine.h"
#include "ops/registry.h"
#include "tpucore/core/cpu_features.h"
#include "tpucore/ops.h"

TPU_INTRIN_DIAGNOSTICS_PUSH

namespace tpu {
namespace {
using namespace ops;
using reduce::DimGroup;

constexpr const char* kOp = "scaled_dot_product_attention";

void sdpa_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor &q = a.inputs[0], &k = a.inputs[1], &v = a.inputs[2];
  for (const Tensor* t : {&q, &k, &v})
    TPU_CHECK(is_floating(t->dtype()), "{}: q, k and v must be floating point, got q {}, k {}, v {}", kOp,
              describe(q), describe(k), describe(v));
  TPU_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(),
            "{}: q, k and v must have the same dtype, got q {}, k {}, v {}", kOp, describe(q), describe(k),
            describe(v));
  TPU_CHECK(q.dim() >= 2 && k.dim() == q.dim() && v.dim() == q.dim(),
            "{}: q, k and v must have the same rank (at least 2: [..., L, D]), got shapes {}, {}, {}", kOp,
            q.shape().str(), k.shape().str(), v.shape().str());
  const int n = q.dim();
  TPU_CHECK(q.size(-1) == k.size(-1), "{}: q and k must have the same head dim, got shapes {} and {}", kOp,
            q.shape().str(), k.shape().str());
  TPU_CHECK(k.size(-2) == v.size(-2), "{}: k and v must have the same length (dim -2), got shapes {} and {}", kOp,
            k.shape().str(), v.shape().str());
  for (int i = 0; i + 2 < n; ++i) {
    TPU_CHECK(k.shape()[i] == v.shape()[i], "{}: k and v batch/head dims differ: shapes {} and {}", kOp,
              k.shape().str(), v.shape().str());
    if (i + 3 == n) {
      TPU_CHECK(k.shape()[i] > 0 && q.shape()[i] % k.shape()[i] == 0,
                "{}: the number of query heads ({}, dim -3 of q {}) must be a multiple of the number of key/value "
                "heads ({}, dim -3 of k {})",
                kOp, q.shape()[i], q.shape().str(), k.shape()[i], k.shape().str());
    } else {
      TPU_CHECK(q.shape()[i] == k.shape()[i], "{}: batch dims of q {} and k {} differ at dim {}", kOp,
                q.shape().str(), k.shape().str(), i);
    }
  }
  Shape out = q.shape();
  out[n - 1] = v.size(-1);
  if (a.attrs.get_bool("has_mask")) {
    const Tensor& mk = a.inputs[3];
    TPU_CHECK(!a.attrs.get_bool("causal"), "{}: an explicit mask and causal=true cannot be combined", kOp);
    TPU_CHECK(mk.dtype() == DType::boolean, "{}: the mask must be bool (true = takes part), got {}", kOp,
              describe(mk));
    Shape scores = q.shape();
    scores[n - 1] = k.size(-2);
    TPU_CHECK(mk.dim() <= n, "{}: mask of shape {} does not broadcast to the scores' shape {}", kOp,
              mk.shape().str(), scores.str());
    for (int i = 0; i < mk.dim(); ++i) {
      const int64_t d = mk.shape()[i], s = scores[n - mk.dim() + i];
      TPU_CHECK(d == s || d == 1, "{}: mask of shape {} does not broadcast to the scores' shape {}", kOp,
                mk.shape().str(), scores.str());
    }
  }
  TPU_CHECK(std::isfinite(a.attrs.get_float("scale")), "{}: scale must be finite, got {}", kOp,
            a.attrs.get_float("scale"));
  m.out() = {out, q.dtype(), q.device()};
}

// One [L, C] matrix of batch index b as contiguous f32 (any strides, any float dtype).
void load_f32(const Tensor& t, const DimGroup& batch, int64_t b, std::vector<float>& dst) {
  const int64_t L = t.size(-2), C = t.size(-1), rs = t.strides()[t.dim() - 2], cs = t.strides()[t.dim() - 1];
  dst.resize(static_cast<size_t>(L * C));
  dispatch_dtype(t.dtype(), [&](auto z) {
    using T = decltype(z);
    if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
      const T* p = static_cast<const T*>(t.raw_data()) + batch.offset_of(b);
      for (int64_t i = 0; i < L; ++i)
        kernels::load_run_f32<T>(reinterpret_cast<const char*>(p + i * rs), cs * int64_t{sizeof(T)}, C,
                                 dst.data() + i * C);
    }
  });
}

DimGroup batch_of(const Tensor& t) {
  DimGroup g;
  for (int i = 0; i + 2 < t.dim(); ++i) g.add(t.shape()[i], t.strides()[i]);
  return g;
}


// ---- few query rows (decode): every key and value read once per key/value head ----
// The query heads sharing a key/value head (and their Lq rows, Lq <= kFewRows) are scored
// together: each key row is read once, in the cache's dtype (f32 in place, bf16 / f16 widened
// one row at a time into a small buffer, not the whole cache), dotted with every query row,
// then each value row is read once and added, weighted, to every row's output. The softmax
// steps per row are those of the blocked path below.
constexpr int64_t kFewRows = 16;

#define TPU_SDPA_AVX512 __attribute__((target("avx512f,avx512vl,fma")))

TPU_SDPA_AVX512 inline float dot_avx512(const float* a, const float* b, int64_t n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
  }
  for (; i < n; i += 16) {
    const __mmask16 m = static_cast<__mmask16>(n - i >= 16 ? 0xffffu : (1u << (n - i)) - 1u);
    s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

// s[r * ss] = dot(Q row r, kr) for the `rows` rows of Q (row stride n), n values each.
TPU_SDPA_AVX512 void dots_avx512(const float* Q, int64_t rows, int64_t n, const float* kr, float* s, int64_t ss) {
  for (int64_t r = 0; r < rows; ++r) s[r * ss] = dot_avx512(Q + r * n, kr, n);
}

// O row r += p[r * ps] * vr for the `rows` rows of O (row stride n), n values each.
TPU_SDPA_AVX512 void axpys_avx512(const float* p, int64_t ps, int64_t rows, const float* vr, float* O, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    const __m512 vp = _mm512_set1_ps(p[r * ps]);
    float* o = O + r * n;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(o + i, _mm512_fmadd_ps(vp, _mm512_loadu_ps(vr + i), _mm512_loadu_ps(o + i)));
    if (i < n) {
      const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
      _mm512_mask_storeu_ps(o + i, m, _mm512_fmadd_ps(vp, _mm512_maskz_loadu_ps(m, vr + i), _mm512_maskz_loadu_ps(m, o + i)));
    }
  }
}

// Register-blocked forms for head dims of NC x 16 (64 and 128: the usual decode heads). Each
// query row is held in registers and scored against every key, then its output row is summed in
// registers over the values; the sums are those of dot_avx512 / axpys_avx512 (same order), only
// without an output row round trip through memory per key.
// The 16-lane sum of v reduced to 4 lanes as _mm512_reduce_add_ps does (upper half plus lower, twice).
TPU_SDPA_AVX512 inline __m128 fold_to_128(__m512 v) {
  const __m256 lo = _mm512_castps512_ps256(v), hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  const __m256 y = _mm256_add_ps(hi, lo);
  return _mm_add_ps(_mm256_extractf128_ps(y, 1), _mm256_castps256_ps128(y));
}

// 16 values of a key or value row as f32 (bf16 / f16 widened exactly, as their conversions).
template <class T>
TPU_SDPA_AVX512 inline __m512 load16(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return _mm512_loadu_ps(p);
  } else if constexpr (std::is_same_v<T, bf16>) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
  } else {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
}

template <int NC, class T>
TPU_SDPA_AVX512 inline __m512 key_dot(const __m512* qv, const T* kr) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  for (int c = 0; c < NC; c += 2) {
    s0 = _mm512_fmadd_ps(qv[c], load16<T>(kr + 16 * c), s0);
    s1 = _mm512_fmadd_ps(qv[c + 1], load16<T>(kr + 16 * c + 16), s1);
  }
  return _mm512_add_ps(s0, s1);
}

// Scores of four keys at a time: their last reduction steps (lanes 0 + 2 and 1 + 3, then the two
// sums, as _mm512_reduce_add_ps) done together on a 4 x 4 transpose. Keys rows of T (unit column
// stride, row stride k_rs), read in place.
template <int NC, class T>
TPU_SDPA_AVX512 void scores_row_avx512(const float* q, const void* Kv, int64_t k_rs, int64_t lk, float* s) {
  static_assert(NC % 2 == 0, "pairs of 16-float chunks");
  const T* K = static_cast<const T*>(Kv);
  __m512 qv[NC];
  for (int c = 0; c < NC; ++c) qv[c] = _mm512_loadu_ps(q + 16 * c);
  int64_t j = 0;
  for (; j + 4 <= lk; j += 4) {
    __m128 x0 = fold_to_128(key_dot<NC, T>(qv, K + j * k_rs)), x1 = fold_to_128(key_dot<NC, T>(qv, K + (j + 1) * k_rs));
    __m128 x2 = fold_to_128(key_dot<NC, T>(qv, K + (j + 2) * k_rs)),
           x3 = fold_to_128(key_dot<NC, T>(qv, K + (j + 3) * k_rs));
    _MM_TRANSPOSE4_PS(x0, x1, x2, x3);
    _mm_storeu_ps(s + j, _mm_add_ps(_mm_add_ps(x0, x2), _mm_add_ps(x1, x3)));
  }
  for (; j < lk; ++j) s[j] = _mm512_reduce_add_ps(key_dot<NC, T>(qv, K + j * k_rs));
}

template <int NC, class T>
TPU_SDPA_AVX512 void weighted_row_avx512(const float* p, const void* Vv, int64_t v_rs, int64_t lk, float* o) {
  const T* V = static_cast<const T*>(Vv);
  __m512 acc[NC];
  for (int c = 0; c < NC; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t j = 0; j < lk; ++j) {
    const __m512 w = _mm512_set1_ps(p[j]);
    const T* vr = V + j * v_rs;
    for (int c = 0; c < NC; ++c) acc[c] = _mm512_fmadd_ps(w, load16<T>(vr + 16 * c), acc[c]);
  }
  for (int c = 0; c < NC; ++c) _mm512_storeu_ps(o + 16 * c, acc[c]);
}

using ScoresRowFn = void (*)(const float*, const void*, int64_t, int64_t, float*);
using WeightedRowFn = void (*)(const float*, const void*, int64_t, int64_t, float*);

void dots_portable(const float* Q, int64_t rows, int64_t n, const float* kr, float* s, int64_t ss) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = Q + r * n;
    float lane[8] = {};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
      for (int l = 0; l < 8; ++l) lane[l] += a[i + l] * kr[i + l];
    for (; i < n; ++i) lane[0] += a[i] * kr[i];
    float sum = 0;
    for (float x : lane) sum += x;
    s[r * ss] = sum;
  }
}

void axpys_portable(const float* p, int64_t ps, int64_t rows, const float* vr, float* O, int64_t n) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) O[r * n + i] += p[r * ps] * vr[i];
}

// n contiguous bf16 values widened to f32 (the bits shifted up: exact, as bf16's conversion).
TPU_SDPA_AVX512 void bf16_row_avx512(const bf16* src, float* dst, int64_t n) {
  const auto* p = reinterpret_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(
                                  _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i))), 16)));
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

// Row j (row stride rs, column stride cs) from base as f32: in place when T is f32 with unit
// column stride, else widened into buf (C floats; bf16 rows by AVX-512 when `wide`).
template <class T>
const float* row_f32(const T* base, int64_t rs, int64_t cs, int64_t j, int64_t C, float* buf, bool wide) {
  if constexpr (std::is_same_v<T, float>) {
    if (cs == 1) return base + j * rs;
  }
  if constexpr (std::is_same_v<T, bf16>) {
    if (cs == 1 && wide) {
      bf16_row_avx512(base + j * rs, buf, C);
      return buf;
    }
  }
  kernels::load_run_f32<T>(reinterpret_cast<const char*>(base + j * rs), cs * int64_t{sizeof(T)}, C, buf);
  return buf;
}

// Row j as f32 into dst (C floats).
template <class T>
void row_into(const T* base, int64_t rs, int64_t cs, int64_t j, int64_t C, float* dst, bool wide) {
  if constexpr (std::is_same_v<T, bf16>) {
    if (cs == 1 && wide) {
      bf16_row_avx512(base + j * rs, dst, C);
      return;
    }
  }
  kernels::load_run_f32<T>(reinterpret_cast<const char*>(base + j * rs), cs * int64_t{sizeof(T)}, C, dst);
}

// The boolean mask's strides against the scores [..., Hq, Lq, Lk] (0 where it broadcasts): its
// batch dims, and its row / column strides rs and cs.
struct MaskLayout {
  DimGroup batch;
  int64_t rs = 0, cs = 0;
};
MaskLayout mask_layout(const Tensor& q, const Tensor& mk) {
  const int n = q.dim();
  auto st = [&](int d) {  // stride of scores dim d (of n) in the mask
    const int j = d - (n - mk.dim());
    return j >= 0 && mk.shape()[j] != 1 ? mk.strides()[j] : 0;
  };
  MaskLayout m;
  for (int i = 0; i + 2 < n; ++i) m.batch.add(q.shape()[i], st(i));
  m.rs = st(n - 2);
  m.cs = st(n - 1);
  return m;
}

// Row i's scores s[0, lk) turned into softmax weights: scaled, the causal and boolean masks applied
// (mp: the mask's row base, strides m_rs / m_cs; null without one), then exp over the row's max
// and divided by the sum (in double). All keys masked: -inf - -inf is NaN, so the row becomes NaN
// (as softmax).
void masked_softmax_row(float* s, int64_t lk, int64_t i, float scale, bool causal, const bool* mp, int64_t m_rs,
                        int64_t m_cs, cpu::VecUnaryFn exp_fn) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < lk; ++j) {
    float x = s[j] * scale;
    if (causal && j > i) x = -std::numeric_limits<float>::infinity();
    if (mp && !mp[i * m_rs + j * m_cs]) x = -std::numeric_limits<float>::infinity();
    s[j] = x;
    mx = x > mx ? x : mx;
  }
  for (int64_t j = 0; j < lk; ++j) s[j] -= mx;
  exp_fn(s, s, lk);
  double sum = 0;
  for (int64_t j = 0; j < lk; ++j) sum += s[j];
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t j = 0; j < lk; ++j) s[j] *= inv;
}

// masked_softmax_row with AVX-512 (the fast rows' path): the same steps, 16 scores at a time; the
// sum of the exponentials is taken in double over 8 lanes (masked_softmax_row adds them one by
// one in double), so only the order of that double sum differs.
#define TPU_SDPA_AVX512BW __attribute__((target("avx512f,avx512vl,avx512bw,fma")))
TPU_SDPA_AVX512BW void masked_softmax_row_avx512(float* s, int64_t lk, int64_t i, float scale, bool causal,
                                                 const bool* mp, int64_t m_rs, int64_t m_cs, cpu::VecUnaryFn exp_fn) {
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity()), vs = _mm512_set1_ps(scale);
  __m512 vmx = ninf;
  const bool* mrow = mp ? mp + i * m_rs : nullptr;
  for (int64_t j = 0; j < lk; j += 16) {
    const int64_t n = std::min<int64_t>(16, lk - j);
    const __mmask16 live = static_cast<__mmask16>(n == 16 ? 0xffffu : (1u << n) - 1u);
    uint32_t keep = live;
    if (causal) keep &= j > i ? 0u : (i - j >= 15 ? 0xffffu : (1u << (i - j + 1)) - 1u);
    if (mrow) {
      if (m_cs == 1) {
        keep &= _mm_cmpneq_epi8_mask(_mm_maskz_loadu_epi8(live, mrow + j), _mm_setzero_si128());
      } else {
        uint32_t m = 0;
        for (int64_t t = 0; t < n; ++t) m |= (mrow[(j + t) * m_cs] ? 1u : 0u) << t;
        keep &= m;
      }
    }
    const __m512 x = _mm512_mask_mul_ps(ninf, static_cast<__mmask16>(keep), _mm512_maskz_loadu_ps(live, s + j), vs);
    _mm512_mask_storeu_ps(s + j, live, x);
    vmx = _mm512_mask_max_ps(vmx, live, vmx, x);
  }
  const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(vmx));
  for (int64_t j = 0; j < lk; j += 16) {
    const __mmask16 live = static_cast<__mmask16>(lk - j >= 16 ? 0xffffu : (1u << (lk - j)) - 1u);
    _mm512_mask_storeu_ps(s + j, live, _mm512_sub_ps(_mm512_maskz_loadu_ps(live, s + j), mx));
  }
  exp_fn(s, s, lk);
  __m512d sum = _mm512_setzero_pd();
  int64_t j = 0;
  for (; j + 8 <= lk; j += 8) sum = _mm512_add_pd(sum, _mm512_cvtps_pd(_mm256_loadu_ps(s + j)));
  double total = _mm512_reduce_add_pd(sum);
  for (; j < lk; ++j) total += s[j];
  const __m512 inv = _mm512_set1_ps(static_cast<float>(1.0 / total));
  for (j = 0; j < lk; j += 16) {
    const __mmask16 live = static_cast<__mmask16>(lk - j >= 16 ? 0xffffu : (1u << (lk - j)) - 1u);
    _mm512_mask_storeu_ps(s + j, live, _mm512_mul_ps(_mm512_maskz_loadu_ps(live, s + j), inv));
  }
}

template <class T>
void sdpa_few_rows(const KernelArgs& a) {
  const Tensor &q = a.inputs[0], &k = a.inputs[1], &v = a.inputs[2];
  const Tensor& out = a.outputs[0];
  const int n = q.dim();
  const int64_t Lq = q.size(-2), Lk = k.size(-2), D = q.size(-1), Dv = v.size(-1);
  const int64_t hq = n >= 3 ? q.size(-3) : 1, hk = n >= 3 ? k.size(-3) : 1, group = hq / hk, R = group * Lq;
  const bool causal = a.attrs.get_bool("causal"), has_mask = a.attrs.get_bool("has_mask");
  const float scale = static_cast<float>(a.attrs.get_float("scale"));
  const MaskLayout ml = has_mask ? mask_layout(q, a.inputs[3]) : MaskLayout{};
  const DimGroup& mbatch = ml.batch;
  const int64_t m_rs = ml.rs, m_cs = ml.cs;
  const DimGroup qb = batch_of(q), kb = batch_of(k), vb = batch_of(v);
  const int64_t k_rs = k.strides()[n - 2], k_cs = k.strides()[n - 1], v_rs = v.strides()[n - 2],
                v_cs = v.strides()[n - 1];
  const cpu::VecUnaryFn exp_fn = cpu::vec_math().get(cpu::VecUnary::exp);
  const bool wide = cpu_features().avx512f && cpu_features().fma;
  auto dots = wide ? &dots_avx512 : &dots_portable;
  auto axpys = wide ? &axpys_avx512 : &axpys_portable;
  const T* kbase = static_cast<const T*>(k.raw_data());
  const T* vbase = static_cast<const T*>(v.raw_data());
  const T* qbase = static_cast<const T*>(q.raw_data());
  const bool* mbase = has_mask ? static_cast<const bool*>(a.inputs[3].raw_data()) : nullptr;
  T* obase = static_cast<T*>(out.raw_data());
  const int64_t total_kv = kb.numel();
  // Head dims of 64 or 128 (both): the register-blocked row kernels.
  // The row kernels for rows of T read in place (unit column stride) and for f32 rows (widened).
  ScoresRowFn scores_row = nullptr, scores_row_f32 = nullptr;
  WeightedRowFn weighted_row = nullptr, weighted_row_f32 = nullptr;
  const bool bw = wide && cpu_features().avx512bw && cpu_features().avx512vl;
  if (bw && D == Dv && D == 64) {
    scores_row = &scores_row_avx512<4, T>, weighted_row = &weighted_row_avx512<4, T>;
    scores_row_f32 = &scores_row_avx512<4, float>, weighted_row_f32 = &weighted_row_avx512<4, float>;
  }
  if (bw && D == Dv && D == 128) {
    scores_row = &scores_row_avx512<8, T>, weighted_row = &weighted_row_avx512<8, T>;
    scores_row_f32 = &scores_row_avx512<8, float>, weighted_row_f32 = &weighted_row_avx512<8, float>;
  }
  const bool rows_fast = scores_row != nullptr;
  // Work items of at least ~128K multiply-adds each: below that, a pool wake-up (and on a busy
  // machine, waiting for a descheduled worker) costs more than the second thread saves.
  const int64_t per_item = std::max<int64_t>(1, R * Lk * (D + Dv));
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 17) / per_item);
  parallel_for(0, total_kv, grain, [&](int64_t b0, int64_t b1) {
    std::vector<float> Q(static_cast<size_t>(R * D)), S(static_cast<size_t>(R * std::max<int64_t>(Lk, 1))),
        O(static_cast<size_t>(R * Dv)), kbuf(static_cast<size_t>(D)), vbuf(static_cast<size_t>(Dv)), Kf, Vf;
    std::vector<int64_t> lk_of(static_cast<size_t>(group));
    for (int64_t bk = b0; bk < b1; ++bk) {
      const int64_t outer = bk / hk, hkv = bk % hk;
      const int64_t q_rs = q.strides()[n - 2], q_cs = q.strides()[n - 1];
      int64_t lk_max = 0;
      for (int64_t gi = 0; gi < group; ++gi) {
        const int64_t bq = outer * hq + hkv * group + gi;
        for (int64_t i = 0; i < Lq; ++i)
          kernels::load_run_f32<T>(reinterpret_cast<const char*>(qbase + qb.offset_of(bq) + i * q_rs),
                                   q_cs * int64_t{sizeof(T)}, D, Q.data() + (gi * Lq + i) * D);
        // The keys this head scores (as the blocked path: past the last kept one, weight 0).
        int64_t lk = Lk;
        if (causal && !has_mask) {
          lk = std::min(Lk, Lq);
        } else if (has_mask) {
          const bool* mp = mbase + mbatch.offset_of(bq);
          int64_t last = 0;
          for (int64_t r = 0; r < Lq && last < Lk; ++r)
            for (int64_t j = Lk - 1; j >= last; --j)
              if (mp[r * m_rs + j * m_cs]) {
                last = j + 1;
                break;
              }
          if (last > 0) lk = last;
        }
        lk_of[static_cast<size_t>(gi)] = lk;
        lk_max = std::max(lk_max, lk);
      }
      // Every head of the group scores the same keys (the usual case): one pass over its rows.
      const bool uniform = std::all_of(lk_of.begin(), lk_of.end(), [&](int64_t l) { return l == lk_max; });
      std::fill(O.begin(), O.end(), 0.0f);
      if (Lk > 0 && rows_fast) {
        // Row by row with the rows in registers: keys and values read in place in their dtype
        // (unit column stride), else widened to f32 rows once per key/value head.
        const T* kp = kbase + kb.offset_of(bk);
        const T* vp = vbase + vb.offset_of(bk);
        const void* K = kp;
        const void* V = vp;
        int64_t krs = k_rs, vrs = v_rs;
        ScoresRowFn score = scores_row;
        WeightedRowFn weigh = weighted_row;
        if (k_cs != 1) {
          Kf.resize(static_cast<size_t>(lk_max * D));
          for (int64_t j = 0; j < lk_max; ++j) row_into<T>(kp, k_rs, k_cs, j, D, Kf.data() + j * D, wide);
          K = Kf.data(), krs = D, score = scores_row_f32;
        }
        if (v_cs != 1) {
          Vf.resize(static_cast<size_t>(lk_max * Dv));
          for (int64_t j = 0; j < lk_max; ++j) row_into<T>(vp, v_rs, v_cs, j, Dv, Vf.data() + j * Dv, wide);
          V = Vf.data(), vrs = Dv, weigh = weighted_row_f32;
        }
        for (int64_t r = 0; r < R; ++r) {
          const int64_t gi = r / Lq, i = r % Lq, lk = lk_of[static_cast<size_t>(gi)];
          float* srow = S.data() + r * Lk;
          score(Q.data() + r * D, K, krs, lk, srow);
          const bool* mp = has_mask ? mbase + mbatch.offset_of(outer * hq + hkv * group + gi) : nullptr;
          masked_softmax_row_avx512(srow, lk, i, scale, causal, mp, m_rs, m_cs, exp_fn);
          weigh(srow, V, vrs, lk, O.data() + r * Dv);
        }
      } else if (Lk > 0) {
        const T* kp = kbase + kb.offset_of(bk);
        for (int64_t j = 0; j < lk_max; ++j) {
          const float* kr = row_f32<T>(kp, k_rs, k_cs, j, D, kbuf.data(), wide);
          if (uniform) {
            dots(Q.data(), R, D, kr, S.data() + j, Lk);
          } else {
            for (int64_t gi = 0; gi < group; ++gi)
              if (j < lk_of[static_cast<size_t>(gi)]) dots(Q.data() + gi * Lq * D, Lq, D, kr, S.data() + gi * Lq * Lk + j, Lk);
          }
        }
        for (int64_t r = 0; r < R; ++r) {
          const int64_t gi = r / Lq, i = r % Lq, lk = lk_of[static_cast<size_t>(gi)];
          const bool* mp = has_mask ? mbase + mbatch.offset_of(outer * hq + hkv * group + gi) : nullptr;
          masked_softmax_row(S.data() + r * Lk, lk, i, scale, causal, mp, m_rs, m_cs, exp_fn);
        }
        const T* vp = vbase + vb.offset_of(bk);
        for (int64_t j = 0; j < lk_max; ++j) {
          const float* vr = row_f32<T>(vp, v_rs, v_cs, j, Dv, vbuf.data(), wide);
          if (uniform) {
            axpys(S.data() + j, Lk, R, vr, O.data(), Dv);
          } else {
            for (int64_t gi = 0; gi < group; ++gi)
              if (j < lk_of[static_cast<size_t>(gi)]) axpys(S.data() + gi * Lq * Lk + j, Lk, Lq, vr, O.data() + gi * Lq * Dv, Dv);
          }
        }
      }
      for (int64_t gi = 0; gi < group; ++gi) {
        const int64_t bq = outer * hq + hkv * group + gi;
        kernels::store_run_f32<T>(reinterpret_cast<char*>(obase + bq * Lq * Dv), int64_t{sizeof(T)}, Lq * Dv,
                                  O.data() + gi * Lq * Dv);
      }
    }
  });
}

void sdpa_cpu(const KernelArgs& a) {
  const Tensor &q = a.inputs[0], &k = a.inputs[1], &v = a.inputs[2];
  const Tensor& out = a.outputs[0];
  if (out.numel() == 0) return;
  const int n = q.dim();
  const int64_t Lq = q.size(-2), Lk = k.size(-2), D = q.size(-1), Dv = v.size(-1);
  const int64_t hq = n >= 3 ? q.size(-3) : 1, hk = n >= 3 ? k.size(-3) : 1, group = hq / hk;
  if (Lq <= kFewRows) {
    bool done = false;
    dispatch_dtype(q.dtype(), [&](auto z) {
      using T = decltype(z);
      if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
        sdpa_few_rows<T>(a);
        done = true;
      }
    });
    if (done) return;
  }
  const bool causal = a.attrs.get_bool("causal"), has_mask = a.attrs.get_bool("has_mask");
  const float scale = static_cast<float>(a.attrs.get_float("scale"));
  const MaskLayout ml = has_mask ? mask_layout(q, a.inputs[3]) : MaskLayout{};
  const DimGroup& mbatch = ml.batch;
  const int64_t m_rs = ml.rs, m_cs = ml.cs;
  const DimGroup qb = batch_of(q), kb = batch_of(k), vb = batch_of(v);
  const cpu::VecUnaryFn exp_fn = cpu::vec_math().get(cpu::VecUnary::exp);
  const int64_t total_kv = kb.numel();
  parallel_for(0, total_kv, 1, [&](int64_t b0, int64_t b1) {
    std::vector<float> Q, K, V, S, O;
    constexpr int64_t kBlock = 64;
    for (int64_t bk = b0; bk < b1; ++bk) {
      const int64_t outer = bk / hk, hkv = bk % hk;
      if (Lk > 0) {
        load_f32(k, kb, bk, K);
        load_f32(v, vb, bk, V);
      }
      for (int64_t gi = 0; gi < group; ++gi) {
        const int64_t bq = outer * hq + hkv * group + gi;
        // The mask of this head (its batch offset once, not per score).
        const bool* mp = has_mask ? static_cast<const bool*>(a.inputs[3].raw_data()) + mbatch.offset_of(bq) : nullptr;
        load_f32(q, qb, bq, Q);
        O.assign(static_cast<size_t>(Lq * Dv), 0.0f);
        if (Lk > 0) {
          S.resize(static_cast<size_t>(kBlock * Lk));
          for (int64_t i0 = 0; i0 < Lq; i0 += kBlock) {
            const int64_t rows = std::min(kBlock, Lq - i0);
            // Keys past the last one any row of the block keeps (causal: the block's last row;
            // a mask: its last true value in the block's rows) get weight exactly 0 (exp(-inf)) in
            // every row, so they are neither scored nor summed. A block that keeps no key at all
            // takes the full width (its rows become NaN, as softmax over nothing).
            int64_t lk = Lk;
            if (causal && !has_mask) {
              lk = std::min(Lk, i0 + rows);
            } else if (has_mask) {
              int64_t last = 0;
              for (int64_t r = 0; r < rows && last < Lk; ++r)
                for (int64_t j = Lk - 1; j >= last; --j)
                  if (mp[(i0 + r) * m_rs + j * m_cs]) {
                    last = j + 1;
                    break;
                  }
              if (last > 0) lk = last;
            }
            kernels::gemm_f32(rows, lk, D, Q.data() + i0 * D, D, 1, K.data(), 1, D, S.data(), lk, false);
            for (int64_t r = 0; r < rows; ++r)
              masked_softmax_row(S.data() + r * lk, lk, i0 + r, scale, causal, has_mask ? mp : nullptr, m_rs, m_cs,
                                 exp_fn);
            kernels::gemm_f32(rows, Dv, lk, S.data(), lk, 1, V.data(), Dv, 1, O.data() + i0 * Dv, Dv, false);
          }
        }
        dispatch_dtype(out.dtype(), [&](auto z) {
          using T = decltype(z);
          if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
            T* o = static_cast<T*>(out.raw_data()) + bq * Lq * Dv;
            kernels::store_run_f32<T>(reinterpret_cast<char*>(o), int64_t{sizeof(T)}, Lq * Dv, O.data());
          }
        });
      }
    }
  });
}

TPU_DEFINE_OP(sdpa_op, {.name = "scaled_dot_product_attention", .num_inputs = 4, .meta = &sdpa_meta,
                        .cpu = &sdpa_cpu,
                        .doc = "softmax(q k^T * scale + mask) v with grouped KV heads; inputs (q, k, v, mask), an "
                               "absent mask passed as q with has_mask false"});

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask,
                                    bool is_causal, std::optional<double> scale) {
  TPU_CHECK(q.defined() && k.defined() && v.defined(), "{}: q, k and v must be defined tensors", kOp);
  TPU_CHECK(q.dim() >= 1, "{}: q must have at least 2 dims [..., L, D], got shape {}", kOp, q.shape().str());
  const double s = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(1, q.size(-1))));
  const bool hm = attn_mask.defined();
  return ops::call(sdpa_op(), {q, k, v, hm ? attn_mask : q},
                   {{"causal", is_causal}, {"scale", s}, {"has_mask", hm}});
}

}  // namespace tpu

TPU_INTRIN_DIAGNOSTICS_POP
