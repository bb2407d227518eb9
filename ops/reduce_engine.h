// The cpu reduction engine shared by the reduction ops (sum, prod, amax, argmax, var, ...).
//
// A reduction splits the input's dims into kept dims (they index the output, row-major) and
// reduced dims (they are folded into one accumulator per output). Both groups are coalesced
// separately, keeping their row-major order, so the flat index within the reduced group is
// the index PyTorch reports for argmax/argmin. A reducer R supplies
//   using Acc;                                        accumulator
//   static Acc init();                                the empty fold
//   static void run(Acc&, const T* p, int64_t n, int64_t stride, int64_t idx0);
//                                                     folds n elements p[0], p[stride], ...
//                                                     whose first has reduced index idx0
//   static void merge(Acc& left, const Acc& right);  right covers indices after left's
// and optionally, for elementwise folds, `static constexpr bool kVertical = true` with
//   static void step(Acc&, T)                         which lets the engine reduce over an
// outer dim with the kept inner dim vectorized (sum over dim 0 of a row-major matrix).
//
// Work is split over the thread pool by outputs, or for few long reductions by chunks of
// the reduced range whose partial accumulators are merged in order; small work runs inline.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "ops/cpu/loops.h"
#include "tpucore/core/parallel.h"
#include "tpucore/core/tensor.h"

namespace tpu::ops::reduce {

// A coalesced group of dims (row-major order), strides in elements.
struct DimGroup {
  int n = 0;
  int64_t size[kMaxDims] = {};
  int64_t stride[kMaxDims] = {};

  void add(int64_t sz, int64_t st) {
    if (sz == 1) return;
    if (n > 0 && stride[n - 1] == st * sz) {
      size[n - 1] *= sz;
      stride[n - 1] = st;
      return;
    }
    size[n] = sz;
    stride[n] = st;
    ++n;
  }
  int64_t numel() const {
    int64_t r = 1;
    for (int i = 0; i < n; ++i) r *= size[i];
    return r;
  }
  // Element offset of the flat (row-major) index within the group.
  int64_t offset_of(int64_t flat) const {
    int64_t off = 0;
    for (int i = n - 1; i >= 0; --i) {
      off += (flat % size[i]) * stride[i];
      flat /= size[i];
    }
    return off;
  }
};

struct ReducePlan {
  DimGroup kept, red;
  int64_t n_out = 0, n_red = 0;
};

// dims: sorted, normalized reduced dims of x (empty only for a 0-d x).
inline ReducePlan make_plan(const Tensor& x, const std::vector<int>& dims) {
  ReducePlan p;
  size_t j = 0;
  int64_t n_out = 1, n_red = 1;
  for (int d = 0; d < x.dim(); ++d) {
    const bool red = j < dims.size() && dims[j] == d;
    if (red) ++j;
    (red ? p.red : p.kept).add(x.shape()[d], x.strides()[d]);
    (red ? n_red : n_out) *= x.shape()[d];
  }
  p.n_out = n_out;
  p.n_red = n_red;
  return p;
}

// Calls f(offset, n, stride, flat_start) for the runs of the innermost dim covering the
// flat range [b, e) of group g (a group without dims holds one element at offset 0).
template <class F>
void visit_runs(const DimGroup& g, int64_t b, int64_t e, F&& f) {
  if (b >= e) return;
  if (g.n == 0) {
    f(int64_t{0}, int64_t{1}, int64_t{0}, int64_t{0});
    return;
  }
  const int nd = g.n;
  const int64_t inner = g.size[nd - 1], inner_stride = g.stride[nd - 1];
  int64_t idx[kMaxDims];
  int64_t rem = b, off = 0;
  for (int d = nd - 1; d >= 0; --d) {
    idx[d] = rem % g.size[d];
    rem /= g.size[d];
    off += idx[d] * g.stride[d];
  }
  int64_t pos = b;
  while (pos < e) {
    const int64_t run = std::min(inner - idx[nd - 1], e - pos);
    f(off, run, inner_stride, pos);
    pos += run;
    if (pos >= e) break;
    idx[nd - 1] += run;
    off += run * inner_stride;
    for (int d = nd - 1; d > 0 && idx[d] == g.size[d]; --d) {
      idx[d] = 0;
      ++idx[d - 1];
      off += g.stride[d - 1] - g.size[d] * g.stride[d];
    }
  }
}

template <class R, class = void>
struct has_vertical : std::false_type {};
template <class R>
struct has_vertical<R, std::void_t<decltype(R::kVertical)>> : std::bool_constant<R::kVertical> {};

// Runs reducer R over x (element type T, cpu) and calls emit(out_index, acc) once per output.
template <class R, class T, class Emit>
void run_reduce(const Tensor& x, const std::vector<int>& dims, Emit&& emit) {
  using Acc = typename R::Acc;
  const ReducePlan P = make_plan(x, dims);
  if (P.n_out == 0) return;
  const T* base = static_cast<const T*>(x.raw_data());
  const int64_t grain = cpu::kParallelGrain;

  auto fold_range = [&](int64_t out_off, int64_t b, int64_t e, Acc& acc) {
    visit_runs(P.red, b, e, [&](int64_t roff, int64_t n, int64_t s, int64_t i0) {
      R::run(acc, base + out_off + roff, n, s, i0);
    });
  };

  if (P.n_red == 0) {
    for (int64_t o = 0; o < P.n_out; ++o) emit(o, R::init());
    return;
  }

  // Vertical: the innermost kept dim is contiguous and the reduction runs across rows.
  if constexpr (has_vertical<R>::value) {
    const DimGroup& K = P.kept;
    if (K.n >= 1 && K.stride[K.n - 1] == 1 && K.size[K.n - 1] >= 16 && P.red.n >= 1 &&
        P.red.stride[P.red.n - 1] != 1) {
      constexpr int64_t J = 256;  // kept outputs per task: 1 KiB of f32 per row visited
      const int64_t kin = K.size[K.n - 1];
      const int64_t blocks = (kin + J - 1) / J;
      const int64_t tasks = (P.n_out / kin) * blocks;
      const int64_t task_grain = std::max<int64_t>(1, grain / (J * P.n_red));
      parallel_for(0, tasks, task_grain, [&](int64_t tb, int64_t te) {
        Acc acc[J];
        for (int64_t t = tb; t < te; ++t) {
          const int64_t o0 = (t / blocks) * kin + (t % blocks) * J;
          const int64_t jn = std::min<int64_t>(J, kin - (t % blocks) * J);
          const int64_t out_off = K.offset_of(o0);
          for (int64_t j = 0; j < jn; ++j) acc[j] = R::init();
          visit_runs(P.red, 0, P.n_red, [&](int64_t roff, int64_t n, int64_t s, int64_t) {
            for (int64_t r = 0; r < n; ++r) {
              const T* p = base + out_off + roff + r * s;
              for (int64_t j = 0; j < jn; ++j) R::step(acc[j], p[j]);
            }
          });
          for (int64_t j = 0; j < jn; ++j) emit(o0 + j, acc[j]);
        }
      });
      return;
    }
  }

  const int nt = num_threads();
  if (P.n_red > grain && P.n_out < 2 * nt && nt > 1) {
    // Few long reductions: split each one over the pool and merge the parts in order.
    const int64_t chunks = std::min<int64_t>(nt, (P.n_red + grain - 1) / grain);
    std::vector<Acc> parts(static_cast<size_t>(chunks));
    for (int64_t o = 0; o < P.n_out; ++o) {
      const int64_t out_off = P.kept.offset_of(o);
      parallel_for(0, chunks, 1, [&](int64_t cb, int64_t ce) {
        for (int64_t c = cb; c < ce; ++c) {
          Acc a = R::init();
          fold_range(out_off, P.n_red * c / chunks, P.n_red * (c + 1) / chunks, a);
          parts[static_cast<size_t>(c)] = a;
        }
      });
      Acc total = parts[0];
      for (int64_t c = 1; c < chunks; ++c) R::merge(total, parts[static_cast<size_t>(c)]);
      emit(o, total);
    }
    return;
  }

  const int64_t out_grain = std::max<int64_t>(1, grain / P.n_red);
  parallel_for(0, P.n_out, out_grain, [&](int64_t ob, int64_t oe) {
    for (int64_t o = ob; o < oe; ++o) {
      Acc a = R::init();
      fold_range(P.kept.offset_of(o), 0, P.n_red, a);
      emit(o, a);
    }
  });
}

}  // namespace tpu::ops::reduce
