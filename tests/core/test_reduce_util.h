// Helpers for the reduction, softmax/norm and matmul tests: a "spec" tensor that carries an
// op's integer arguments through an OpInfo sample (the runner passes only tensors), a naive
// reduction reference that groups the input's values by output index, and an error check.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "opinfo.h"

namespace tpu::testing::red {

inline const std::vector<DType>& every_dtype() { return all_dtypes(); }
inline const std::vector<DType>& float_dtypes() {
  static const std::vector<DType> v{DType::f32, DType::bf16, DType::f16};
  return v;
}

// A 1-D i32 tensor of integer arguments; by convention the last input of a sample.
inline Tensor spec(const std::vector<int64_t>& p) { return params(p); }
inline std::vector<int64_t> spec_of(const Tensor& t) { return params_of(t); }
inline std::vector<int64_t> spec_of(const Ref& r) { return params_of(r); }

// Reduction spec layout: [keepdim, extra, dims...] (extra: correction, dtype code, ...).
struct ReduceSpec {
  bool keepdim = false;
  int64_t extra = 0;
  std::vector<int64_t> dims;
};
inline ReduceSpec reduce_spec(const std::vector<int64_t>& s) {
  ReduceSpec r;
  r.keepdim = s.at(0) != 0;
  r.extra = s.at(1);
  r.dims.assign(s.begin() + 2, s.end());
  return r;
}
inline Tensor rspec(bool keepdim, int64_t extra, const std::vector<int64_t>& dims) {
  std::vector<int64_t> v{keepdim ? 1 : 0, extra};
  v.insert(v.end(), dims.begin(), dims.end());
  return spec(v);
}

// Which dims of an ndim-dim tensor a dim list reduces (empty list: all).
inline std::vector<bool> reduced_mask(int ndim, const std::vector<int64_t>& dims) {
  std::vector<bool> m(static_cast<size_t>(ndim), dims.empty());
  for (int64_t d : dims) {
    if (ndim == 0) continue;
    m[static_cast<size_t>(d < 0 ? d + ndim : d)] = true;
  }
  return m;
}

// out[o] = f(values of x that reduce into o, in row-major order of the reduced dims).
inline Ref reduce_ref(const Ref& x, const std::vector<int64_t>& dims, bool keepdim,
                      const std::function<double(const std::vector<double>&)>& f) {
  const int nd = x.shape.ndim();
  const auto mask = reduced_mask(nd, dims);
  Shape out;
  for (int d = 0; d < nd; ++d) {
    if (!mask[static_cast<size_t>(d)]) out.push_back(x.shape[d]);
    else if (keepdim) out.push_back(1);
  }
  Ref r(out);
  std::vector<std::vector<double>> groups(static_cast<size_t>(r.numel()));
  for (int64_t i = 0; i < x.numel(); ++i) {
    const auto idx = unflatten(x.shape, i);
    std::vector<int64_t> oidx;
    for (int d = 0; d < nd; ++d) {
      if (!mask[static_cast<size_t>(d)]) oidx.push_back(idx[static_cast<size_t>(d)]);
      else if (keepdim) oidx.push_back(0);
    }
    groups[static_cast<size_t>(r.flat(oidx))].push_back(x.v[static_cast<size_t>(i)]);
  }
  for (size_t o = 0; o < groups.size(); ++o) r.v[o] = f(groups[o]);
  return r;
}

// Rounds a double the way a result stored in dtype dt is read back (integers wrap to 32 bits).
inline double as_i32(double v) { return static_cast<double>(static_cast<int32_t>(static_cast<int64_t>(v))); }

}  // namespace tpu::testing::red

namespace tpu::testing::red {

// The reduction cases every reduction's OpInfo entry runs (shapes, layouts, dim lists).
struct ReduceCase {
  Shape shape;
  Layout layout;
  std::vector<int64_t> dims;
  bool keepdim;
};

// small: only cases with few elements per output (for prod); empty_reduction: include
// reductions over a zero-size dim (ops with an identity); big: cases large enough to take
// the parallel, split and vertical paths of the engine.
inline std::vector<ReduceCase> reduce_cases(bool empty_reduction, bool big) {
  using L = Layout;
  std::vector<ReduceCase> c = {
      {{5, 7}, L::contiguous, {1}, false},     {{5, 7}, L::transposed, {0}, true},
      {{5, 7}, L::transposed, {-1}, false},    {{3, 4, 5}, L::sliced, {0, 2}, false},
      {{3, 4, 5}, L::expanded, {-2}, true},    {{3, 4, 5}, L::contiguous, {}, false},
      {{3, 4, 5}, L::transposed, {}, true},    {{2, 3, 4, 5}, L::sliced, {1, -1}, true},
      {{2, 3, 4, 5}, L::contiguous, {0, 3}, false}, {{2, 3, 4, 5}, L::expanded, {0, 1, 2, 3}, false},
      {{}, L::contiguous, {}, false},          {{}, L::contiguous, {0}, true},
      {{}, L::contiguous, {-1}, false},        {{1, 6, 1}, L::contiguous, {0, 2}, false},
      {{33}, L::sliced, {0}, true},            {{0, 4}, L::contiguous, {1}, false},
      {{40, 24}, L::contiguous, {0}, false},   {{24, 40}, L::transposed, {1}, true},
  };
  if (empty_reduction) {
    c.push_back({{0, 4}, L::contiguous, {0}, false});
    c.push_back({{3, 0}, L::contiguous, {1}, true});
    c.push_back({{0, 3}, L::contiguous, {}, false});
    c.push_back({{2, 0, 3}, L::contiguous, {0, 1}, false});
  }
  if (big) {
    c.push_back({{48, 1000}, L::contiguous, {1}, false});
    c.push_back({{40000}, L::contiguous, {}, false});
    c.push_back({{300, 130}, L::contiguous, {0}, false});
    c.push_back({{70, 600}, L::transposed, {1}, false});
    c.push_back({{4, 9000}, L::sliced, {1}, true});
    c.push_back({{2, 40000}, L::expanded, {}, false});
    c.push_back({{3, 20000}, L::contiguous, {-1}, false});
  }
  return c;
}

inline std::string case_desc(const ReduceCase& c) {
  std::string d = fmt::format("{} {} dims [{}]", layout_name(c.layout), c.shape.str(), fmt::join(c.dims, ", "));
  return c.keepdim ? d + " keepdim" : d;
}

// Samples {x, rspec(keepdim, extra, dims)} for the cases; big cases only for f32, bf16, i32.
inline std::vector<OpSample> reduce_samples(DType dt, Generator& g, bool empty_reduction, bool big, int64_t extra = 0,
                                            double lo = -2.0, double hi = 2.0) {
  const bool big_ok = big && (dt == DType::f32 || dt == DType::bf16 || dt == DType::i32);
  std::vector<OpSample> out;
  for (const ReduceCase& c : reduce_cases(empty_reduction, big_ok))
    out.push_back({case_desc(c), {make_input(g, c.shape, dt, c.layout, lo, hi), rspec(c.keepdim, extra, c.dims)}});
  return out;
}

inline double ref_sum(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}
inline double ref_mean(const std::vector<double>& v) {
  return v.empty() ? std::numeric_limits<double>::quiet_NaN() : ref_sum(v) / static_cast<double>(v.size());
}

}  // namespace tpu::testing::red
