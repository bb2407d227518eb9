// Naive references of the mixture-of-experts ops (double loops over the values of Refs), shared
// by their OpInfo entries and the op tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "index_test_util.h"
#include "tpucore/moe_ops.h"

namespace tpu::testing::moe {

inline std::vector<int64_t> ints(const Ref& r) {
  std::vector<int64_t> v;
  for (double d : r.v) v.push_back(static_cast<int64_t>(d));
  return v;
}

// grouped_matmul: x [T, K], w [E, K, N] (or [E, N, K] transposed), counts [E] -> [T, N].
inline Ref grouped_matmul_ref(const Ref& x, const Ref& w, const std::vector<int64_t>& counts, bool tw) {
  const int64_t T = x.shape[0], K = x.shape[1], N = tw ? w.shape[1] : w.shape[2];
  Ref out(Shape{T, N});
  int64_t row = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    const auto ee = static_cast<int64_t>(e);
    for (int64_t r = row; r < row + counts[e]; ++r)
      for (int64_t n = 0; n < N; ++n) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) s += x.at({r, k}) * (tw ? w.at({ee, n, k}) : w.at({ee, k, n}));
        out.at({r, n}) = s;
      }
    row += counts[e];
  }
  return out;
}

// grouped_matmul_weight_grad: x [T, K], dy [T, N] -> [E, K, N] (transposed: [E, N, K]).
inline Ref weight_grad_ref(const Ref& x, const Ref& dy, const std::vector<int64_t>& counts, bool tw) {
  const int64_t K = x.shape[1], N = dy.shape[1], E = static_cast<int64_t>(counts.size());
  Ref out(tw ? Shape{E, N, K} : Shape{E, K, N});
  int64_t row = 0;
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t k = 0; k < K; ++k)
      for (int64_t n = 0; n < N; ++n) {
        double s = 0;
        for (int64_t r = row; r < row + counts[static_cast<size_t>(e)]; ++r) s += x.at({r, k}) * dy.at({r, n});
        (tw ? out.at({e, n, k}) : out.at({e, k, n})) = s;
      }
    row += counts[static_cast<size_t>(e)];
  }
  return out;
}

// topk along the last dim of a 2-D x: values (or indices) [R, k]; larger first, ties by index.
inline Ref topk_ref(const Ref& x, int64_t k, bool indices) {
  const int64_t R = x.shape[0], C = x.shape[1];
  Ref out(Shape{R, k});
  for (int64_t r = 0; r < R; ++r) {
    std::vector<int64_t> idx(static_cast<size_t>(C));
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return x.at({r, a}) > x.at({r, b}); });
    for (int64_t j = 0; j < k; ++j) {
      const int64_t i = idx[static_cast<size_t>(j)];
      out.at({r, j}) = indices ? static_cast<double>(i) : x.at({r, i});
    }
  }
  return out;
}

// moe_sort: (order, counts) of flat ids, concatenated as one 1-D Ref [S + E].
inline Ref moe_sort_ref(const Ref& ids, int64_t experts) {
  const int64_t S = ids.numel();
  Ref out(Shape{S + experts});
  int64_t at = 0;
  for (int64_t e = 0; e < experts; ++e) {
    int64_t n = 0;
    for (int64_t s = 0; s < S; ++s)
      if (static_cast<int64_t>(ids.v[static_cast<size_t>(s)]) == e) {
        out.v[static_cast<size_t>(at++)] = static_cast<double>(s);
        ++n;
      }
    out.v[static_cast<size_t>(S + e)] = static_cast<double>(n);
  }
  return out;
}

// moe_permute: row i = x[order[i] / k].
inline Ref permute_ref(const Ref& x, const std::vector<int64_t>& order, int64_t k) {
  const int64_t H = x.shape[1], S = static_cast<int64_t>(order.size());
  Ref out(Shape{S, H});
  for (int64_t i = 0; i < S; ++i)
    for (int64_t h = 0; h < H; ++h) out.at({i, h}) = x.at({order[static_cast<size_t>(i)] / k, h});
  return out;
}

// moe_unpermute: out[order[i] / k] += w.flat[order[i]] * y[i] (w empty: weights of one).
inline Ref unpermute_ref(const Ref& y, const std::vector<int64_t>& order, const Ref* w, int64_t k) {
  const int64_t H = y.shape[1], S = static_cast<int64_t>(order.size());
  Ref out(Shape{S / k, H});
  for (int64_t i = 0; i < S; ++i) {
    const int64_t slot = order[static_cast<size_t>(i)];
    const double wt = w ? w->v[static_cast<size_t>(slot)] : 1.0;
    for (int64_t h = 0; h < H; ++h) out.at({slot / k, h}) += wt * y.at({i, h});
  }
  return out;
}

// The fused MoE layer (moe_ffn) token by token: out[t] = sum_j w[t, j] down[e] (silu(g) * u)
// with e = ids[t, j], g = gate_up[e][:F] x[t], u = gate_up[e][F:] x[t].
inline Ref moe_ffn_ref(const Ref& x, const std::vector<int64_t>& ids, const Ref& w, const Ref& w1, const Ref& w2) {
  const int64_t T = x.shape[0], H = x.shape[1], k = w.shape[1], F = w2.shape[2];
  Ref out(Shape{T, w2.shape[1]});
  std::vector<double> act(static_cast<size_t>(F));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = ids[static_cast<size_t>(t * k + j)];
      for (int64_t f = 0; f < F; ++f) {
        double g = 0, u = 0;
        for (int64_t h = 0; h < H; ++h) {
          g += w1.at({e, f, h}) * x.at({t, h});
          u += w1.at({e, F + f, h}) * x.at({t, h});
        }
        act[static_cast<size_t>(f)] = g / (1.0 + std::exp(-g)) * u;
      }
      for (int64_t o = 0; o < w2.shape[1]; ++o) {
        double s = 0;
        for (int64_t f = 0; f < F; ++f) s += w2.at({e, o, f}) * act[static_cast<size_t>(f)];
        out.at({t, o}) += w.at({t, j}) * s;
      }
    }
  return out;
}

// cumsum along dim: element by element, the sum of the line's elements up to it.
inline Ref cumsum_ref(const Ref& x, int64_t dim) {
  Ref out(x.shape);
  if (x.shape.ndim() == 0) {
    out.v = x.v;
    return out;
  }
  const int d = static_cast<int>(dim < 0 ? dim + x.shape.ndim() : dim);
  int64_t inner = 1;
  for (int i = d + 1; i < x.shape.ndim(); ++i) inner *= x.shape[i];
  const int64_t n = x.shape[d];
  for (int64_t f = 0; f < x.numel(); ++f) {
    const int64_t pos = (f / inner) % n;  // this element's index along dim
    double s = 0;
    for (int64_t j = 0; j <= pos; ++j) s += x.v[static_cast<size_t>(f - (pos - j) * inner)];
    out.v[static_cast<size_t>(f)] = s;
  }
  return out;
}

// A random permutation of [0, n) as an i64 tensor.
inline Tensor random_order(Generator& g, int64_t n, DType dt = DType::i64) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(g.next_double() * static_cast<double>(i + 1));
    std::swap(v[static_cast<size_t>(i)], v[static_cast<size_t>(std::min(j, i))]);
  }
  return from_vector(v, Shape{n}).to(dt);
}

inline Tensor counts_tensor(const std::vector<int64_t>& c, DType dt = DType::i64) {
  return from_vector(c, Shape{static_cast<int64_t>(c.size())}).to(dt);
}

}  // namespace tpu::testing::moe
