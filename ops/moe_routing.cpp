// Routing ops of mixture-of-experts layers:
//
//   topk(x, k, dim)                    -> (values, indices i64): the k largest entries along dim,
//                                         largest first (NaN counts as the largest; ties: lower
//                                         index first)
//   moe_sort(expert_ids, E)            -> (order [S] i32, group_sizes [E] i32): the S = numel
//                                         flat slots of expert_ids (token t's j-th choice is slot
//                                         t * k + j) stably sorted by expert, and each expert's count
//   moe_permute(x [T, H], order, k)    -> [S, H]: row i is x[order[i] / k] (tokens gathered in
//                                         expert order, one row per choice)
//   moe_unpermute(y [S, H], order, w [T, k], k) -> [T, H]: out[t] = sum_j w[t, j] y[i(t, j)]
//                                         with order[i(t, j)] = t * k + j (the weighted sum of
//                                         each token's expert outputs; without w, weights of one)
//   cumsum(x, dim)                     -> inclusive prefix sums along dim (routing's running
//                                         counts and offsets); integers sum exactly (wrapping
//                                         as the dtype does), floats in f32 in index order
//
// order must be a permutation of [0, S) with S = T * k (as moe_sort makes it), which every kernel
// checks before reading through it; the unpermute then gathers per token in a fixed order, so its
// sums do not depend on the threads.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "ops/index_common.h"
#include "ops/meta_util.h"
#include "ops/registry.h"
#include "tpucore/moe_ops.h"
#include "tpucore/ops.h"

namespace tpu {
namespace {

// Offset in x (through its strides) of element 0 of the line (o, i) along dim d: o runs over the
// dims before d, i over the dims after it.
int64_t moe_line_offset(const Tensor& x, int d, int64_t o, int64_t i) {
  int64_t off = 0;
  for (int q = x.dim() - 1; q > d; --q) {
    off += (i % x.size(q)) * x.strides()[q];
    i /= x.size(q);
  }
  for (int q = d - 1; q >= 0; --q) {
    off += (o % x.size(q)) * x.strides()[q];
    o /= x.size(q);
  }
  return off;
}

using namespace ops;

// ---- topk: input x, attrs k, dim ----
void topk_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor& x = a.inputs[0];
  TPU_CHECK(x.dim() >= 1, "topk: x must have at least one dim, got a 0-d tensor");
  TPU_CHECK(x.dtype() != DType::boolean, "topk: bool inputs are not supported (got {})", describe(x));
  const int d = wrap_dim(a.attrs.get_int("dim"), x.dim(), "topk");
  const int64_t k = a.attrs.get_int("k");
  TPU_CHECK(k >= 0 && k <= x.size(d), "topk: k = {} is out of range for dim {} of size {} (x {})", k, d, x.size(d),
            describe(x));
  Shape s = x.shape();
  s[d] = k;
  m.num_outputs = 2;
  m.out(0) = {s, x.dtype(), x.device()};
  m.out(1) = {s, DType::i64, x.device()};
}

template <class T>
bool before(T a, int64_t ia, T b, int64_t ib) {
  if constexpr (std::is_integral_v<T>) {
    return a != b ? a > b : ia < ib;
  } else {
    const float fa = cpu::convert<float>(a), fb = cpu::convert<float>(b);
    const bool na = std::isnan(fa), nb = std::isnan(fb);
    if (na || nb) return na && (!nb || ia < ib);
    return fa != fb ? fa > fb : ia < ib;
  }
}

void topk_cpu(const KernelArgs& a) {
  const Tensor& x = a.inputs[0];
  const int d = wrap_dim(a.attrs.get_int("dim"), x.dim(), "topk");
  const int64_t k = a.attrs.get_int("k"), n = x.size(d);
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < d; ++i) outer *= x.size(i);
  for (int i = d + 1; i < x.dim(); ++i) inner *= x.size(i);
  if (k == 0 || outer * inner == 0) return;
  // Element (o, j, i) of x (o over the leading dims, i over the trailing ones) through strides.
  auto offset = [&](int64_t o, int64_t i) { return moe_line_offset(x, d, o, i); };
  dispatch_dtype(x.dtype(), [&](auto z) {
    using T = decltype(z);
    if constexpr (!std::is_same_v<T, bool>) {
      const T* xp = static_cast<const T*>(x.raw_data());
      T* vals = static_cast<T*>(a.outputs[0].raw_data());
      int64_t* idx = static_cast<int64_t*>(a.outputs[1].raw_data());
      const int64_t sd = x.strides()[d];
      parallel_for(0, outer * inner, std::max<int64_t>(1, cpu::kParallelGrain / std::max<int64_t>(n, 1)),
                   [&](int64_t b, int64_t e) {
                     std::vector<int64_t> ord(static_cast<size_t>(n));
                     for (int64_t s = b; s < e; ++s) {
                       const int64_t o = s / inner, i = s % inner;
                       const T* row = xp + offset(o, i);
                       std::iota(ord.begin(), ord.end(), 0);
                       std::partial_sort(ord.begin(), ord.begin() + k, ord.end(), [&](int64_t p, int64_t q) {
                         return before<T>(row[p * sd], p, row[q * sd], q);
                       });
                       for (int64_t j = 0; j < k; ++j) {
                         const int64_t at = (o * k + j) * inner + i;
                         vals[at] = row[ord[static_cast<size_t>(j)] * sd];
                         idx[at] = ord[static_cast<size_t>(j)];
                       }
                     }
                   });
    }
  });
}
TPU_DEFINE_OP(topk_op, {.name = "topk", .num_inputs = 1, .meta = &topk_meta, .cpu = &topk_cpu,
                        .doc = "the k largest entries along a dim, largest first, and their indices (i64)"});

// ---- moe_sort: input expert_ids, attr num_experts ----
void moe_sort_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor& ids = a.inputs[0];
  indexing::check_index_dtype("moe_sort", "expert_ids", ids);
  const int64_t e = a.attrs.get_int("num_experts");
  TPU_CHECK(e >= 1, "moe_sort: num_experts must be positive, got {}", e);
  m.num_outputs = 2;
  m.out(0) = {Shape{ids.numel()}, DType::i32, ids.device()};
  m.out(1) = {Shape{e}, DType::i32, ids.device()};
  // i64 ids (topk's) reach the kernels as they are (no conversion op on the way); others as i32.
  m.cast_mask = ids.dtype() == DType::i64 ? 0 : 1;
  m.cast_to = DType::i32;
}

void moe_sort_cpu(const KernelArgs& a) {
  const Tensor& ids = a.inputs[0];
  const int64_t e = a.attrs.get_int("num_experts");
  indexing::check_index_range("moe_sort", ids, e, 0, fmt::format("{} experts", e));
  std::vector<int32_t> v;
  if (ids.dtype() == DType::i64) {
    for (int64_t x : ids.to_vector<int64_t>()) v.push_back(static_cast<int32_t>(x));  // in range: checked above
  } else {
    v = indexing::read_indices(ids);
  }
  std::vector<int64_t> start(static_cast<size_t>(e) + 1, 0);
  for (int32_t x : v) ++start[static_cast<size_t>(x) + 1];
  auto* counts = static_cast<int32_t*>(a.outputs[1].raw_data());
  for (int64_t i = 0; i < e; ++i) {
    counts[i] = static_cast<int32_t>(start[static_cast<size_t>(i) + 1]);
    start[static_cast<size_t>(i) + 1] += start[static_cast<size_t>(i)];
  }
  auto* order = static_cast<int32_t*>(a.outputs[0].raw_data());
  for (size_t s = 0; s < v.size(); ++s) order[start[static_cast<size_t>(v[s])]++] = static_cast<int32_t>(s);
}
TPU_DEFINE_OP(moe_sort_op, {.name = "moe_sort", .num_inputs = 1, .flags = kNonDifferentiable, .meta = &moe_sort_meta,
                            .cpu = &moe_sort_cpu,
                            .doc = "flat slots of expert ids stably sorted by expert (i32) and each expert's "
                                   "count (i32)"});

// The order of a permute / unpermute checked to be a permutation of [0, S).
std::vector<int32_t> read_order(const char* op, const Tensor& order) {
  const auto s = order.numel();
  indexing::check_index_range(op, order, s, 0, "the order's own length");
  std::vector<int32_t> v = indexing::read_indices(order);
  std::vector<uint8_t> seen(static_cast<size_t>(s), 0);
  for (int32_t x : v) {
    TPU_CHECK(!seen[static_cast<size_t>(x)], "{}: order holds {} twice; it must be a permutation of [0, {}) "
              "(as moe_sort makes it)", op, x, s);
    seen[static_cast<size_t>(x)] = 1;
  }
  return v;
}

void check_order(const char* op, const Tensor& order, int64_t k) {
  indexing::check_index_dtype(op, "order", order);
  TPU_CHECK(order.dim() == 1, "{}: order must be 1-D, got shape {}", op, order.shape().str());
  TPU_CHECK(k >= 1 && order.numel() % k == 0, "{}: top_k = {} must be positive and divide the {} slots of order", op,
            k, order.numel());
}

// ---- moe_permute: inputs (x, order), attr top_k ----
void moe_permute_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor &x = a.inputs[0], &order = a.inputs[1];
  const int64_t k = a.attrs.get_int("top_k");
  TPU_CHECK(x.dim() == 2, "moe_permute: x must be 2-D [tokens, hidden], got shape {}", x.shape().str());
  check_order("moe_permute", order, k);
  TPU_CHECK(order.numel() == x.size(0) * k, "moe_permute: order has {} slots but x has {} tokens x top_k {}",
            order.numel(), x.size(0), k);
  m.out() = {Shape{order.numel(), x.size(1)}, x.dtype(), x.device()};
  m.cast_mask = 1u << 1;
  m.cast_to = DType::i32;
}

void moe_permute_cpu(const KernelArgs& a) {
  const Tensor& x = a.inputs[0];
  const Tensor& out = a.outputs[0];
  const int64_t k = a.attrs.get_int("top_k"), h = x.size(1);
  const std::vector<int32_t> order = read_order("moe_permute", a.inputs[1]);
  if (out.numel() == 0) return;
  const auto es = static_cast<int64_t>(x.element_size());
  const char* xb = cpu::byte_ptr(x);
  char* ob = cpu::byte_ptr(out);
  const int64_t rs = x.strides()[0] * es, cs = x.strides()[1] * es;
  parallel_for(0, static_cast<int64_t>(order.size()), std::max<int64_t>(1, cpu::kParallelGrain / std::max<int64_t>(h, 1)),
               [&](int64_t b, int64_t e) {
                 for (int64_t i = b; i < e; ++i)
                   indexing::copy_elements(ob + i * h * es, es, xb + (order[static_cast<size_t>(i)] / k) * rs, cs, h,
                                           static_cast<size_t>(es));
               });
}
TPU_DEFINE_OP(moe_permute_op, {.name = "moe_permute", .num_inputs = 2, .meta = &moe_permute_meta,
                               .cpu = &moe_permute_cpu,
                               .doc = "token rows gathered in expert order: row i is x[order[i] / top_k]"});

// ---- moe_unpermute: inputs (y, order, weights), attrs top_k, has_weights (an absent weights
// tensor is passed as y) ----
void moe_unpermute_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor &y = a.inputs[0], &order = a.inputs[1], &w = a.inputs[2];
  const int64_t k = a.attrs.get_int("top_k");
  const bool hw = a.attrs.get_bool("has_weights");
  TPU_CHECK(is_floating(y.dtype()) && y.dtype() != DType::f8e4m3 && y.dtype() != DType::f8e5m2,
            "moe_unpermute: y must be f32, bf16 or f16, got {}", describe(y));
  TPU_CHECK(y.dim() == 2, "moe_unpermute: y must be 2-D [slots, hidden], got shape {}", y.shape().str());
  check_order("moe_unpermute", order, k);
  TPU_CHECK(order.numel() == y.size(0), "moe_unpermute: order has {} slots but y has {} rows", order.numel(),
            y.size(0));
  const int64_t t = order.numel() / k;
  DType dt = y.dtype();
  if (hw) {
    TPU_CHECK(w.dtype() == DType::f32 || w.dtype() == DType::bf16 || w.dtype() == DType::f16,
              "moe_unpermute: weights must be f32, bf16 or f16, got {}", describe(w));
    TPU_CHECK(w.dim() == 2 && w.size(0) == t && w.size(1) == k,
              "moe_unpermute: weights must be [tokens, top_k] = [{}, {}], got shape {}", t, k, w.shape().str());
    dt = promote_types(dt, w.dtype());
  }
  m.out() = {Shape{t, y.size(1)}, dt, y.device()};
  m.cast_mask = 1u << 1;
  m.cast_to = DType::i32;
}

template <class T>
float load_f32(const char* base, int64_t byte_off) {
  T v;
  std::memcpy(&v, base + byte_off, sizeof v);
  return cpu::convert<float>(v);
}

// Reads element byte_off of a float tensor of dtype t as f32.
float load_float(DType t, const char* base, int64_t byte_off) {
  if (t == DType::f32) return load_f32<float>(base, byte_off);
  if (t == DType::bf16) return load_f32<bf16>(base, byte_off);
  return load_f32<f16>(base, byte_off);
}

void moe_unpermute_cpu(const KernelArgs& a) {
  const Tensor &y = a.inputs[0], &w = a.inputs[2];
  const Tensor& out = a.outputs[0];
  const int64_t k = a.attrs.get_int("top_k"), h = y.size(1), t = out.size(0);
  const bool hw = a.attrs.get_bool("has_weights");
  const std::vector<int32_t> order = read_order("moe_unpermute", a.inputs[1]);
  if (out.numel() == 0) return;
  std::vector<int32_t> slot_row(order.size());  // the row of y holding slot t * k + j
  for (size_t i = 0; i < order.size(); ++i) slot_row[static_cast<size_t>(order[i])] = static_cast<int32_t>(i);
  std::vector<float> wv(order.size(), 1.0f);
  if (hw) {
    const auto es = static_cast<int64_t>(w.element_size());
    for (int64_t r = 0; r < t; ++r)
      for (int64_t j = 0; j < k; ++j)
        wv[static_cast<size_t>(r * k + j)] =
            load_float(w.dtype(), cpu::byte_ptr(w), (r * w.strides()[0] + j * w.strides()[1]) * es);
  }
  const auto ye = static_cast<int64_t>(y.element_size());
  const char* yb = cpu::byte_ptr(y);
  const int64_t rs = y.strides()[0] * ye, cs = y.strides()[1] * ye;
  parallel_for(0, t, std::max<int64_t>(1, cpu::kParallelGrain / std::max<int64_t>(h * k, 1)), [&](int64_t b, int64_t e) {
    std::vector<float> acc(static_cast<size_t>(h));
    for (int64_t r = b; r < e; ++r) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j < k; ++j) {
        const auto s = static_cast<size_t>(r * k + j);
        const char* row = yb + slot_row[s] * rs;
        const float wj = wv[s];
        dispatch_dtype(y.dtype(), [&](auto z) {
          using T = decltype(z);
          if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16> || std::is_same_v<T, f16>)
            for (int64_t c = 0; c < h; ++c) acc[static_cast<size_t>(c)] += wj * load_f32<T>(row, c * cs);
        });
      }
      dispatch_dtype(out.dtype(), [&](auto z) {
        using T = decltype(z);
        if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
          T* o = static_cast<T*>(out.raw_data()) + r * h;
          for (int64_t c = 0; c < h; ++c) o[c] = cpu::convert<T>(acc[static_cast<size_t>(c)]);
        }
      });
    }
  });
}
TPU_DEFINE_OP(moe_unpermute_op, {.name = "moe_unpermute", .num_inputs = 3, .meta = &moe_unpermute_meta,
                                 .cpu = &moe_unpermute_cpu,
                                 .doc = "each token's expert outputs summed with its routing weights: out[t] = "
                                        "sum_j w[t, j] y[row of slot t * top_k + j]"});

// ---- cumsum: input x, attr dim ----
void cumsum_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor& x = a.inputs[0];
  TPU_CHECK(x.dtype() != DType::f8e4m3 && x.dtype() != DType::f8e5m2, "cumsum: f8 inputs are not supported (got {})",
            describe(x));
  if (x.dim() > 0) wrap_dim(a.attrs.get_int("dim"), x.dim(), "cumsum");
  // bool sums count, as i64 (torch.cumsum's result for bool); other dtypes keep theirs.
  m.out() = {x.shape(), x.dtype() == DType::boolean ? DType::i64 : x.dtype(), x.device()};
}

void cumsum_cpu(const KernelArgs& a) {
  const Tensor& x = a.inputs[0];
  const Tensor& out = a.outputs[0];
  if (out.numel() == 0) return;
  const int d = x.dim() == 0 ? 0 : wrap_dim(a.attrs.get_int("dim"), x.dim(), "cumsum");
  const int64_t n = x.dim() == 0 ? 1 : x.size(d);
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < d; ++i) outer *= x.size(i);
  for (int i = d + 1; i < x.dim(); ++i) inner *= x.size(i);
  const int64_t sd = x.dim() == 0 ? 0 : x.strides()[d];
  // Element (o, j, i) of x (o over the leading dims, i over the trailing ones) through strides.
  auto offset = [&](int64_t o, int64_t i) { return moe_line_offset(x, d, o, i); };
  dispatch_dtype(x.dtype(), [&](auto zx) {
    using T = decltype(zx);
    dispatch_dtype(out.dtype(), [&](auto zo) {
      using O = decltype(zo);
      constexpr bool kFloat = std::is_same_v<T, float> || std::is_same_v<T, bf16> || std::is_same_v<T, f16>;
      constexpr bool kInt = std::is_integral_v<T> && std::is_integral_v<O> && !std::is_same_v<O, bool>;
      if constexpr ((kFloat && std::is_same_v<T, O>) || kInt) {
        const T* xp = static_cast<const T*>(x.raw_data());
        O* op = static_cast<O*>(out.raw_data());
        parallel_for(0, outer * inner, std::max<int64_t>(1, cpu::kParallelGrain / std::max<int64_t>(n, 1)),
                     [&](int64_t b, int64_t e) {
                       for (int64_t line = b; line < e; ++line) {
                         const int64_t o = line / inner, i = line % inner;
                         const T* src = xp + offset(o, i);
                         O* dst = op + o * n * inner + i;
                         using Acc = std::conditional_t<kFloat, float, uint64_t>;  // unsigned: wraps, never UB
                         Acc acc = 0;
                         for (int64_t j = 0; j < n; ++j) {
                           if constexpr (kFloat) {
                             acc += cpu::convert<float>(src[j * sd]);
                             dst[j * inner] = cpu::convert<O>(acc);
                           } else {
                             acc += static_cast<uint64_t>(static_cast<int64_t>(src[j * sd]));
                             dst[j * inner] = static_cast<O>(static_cast<int64_t>(acc));
                           }
                         }
                       }
                     });
      }
    });
  });
}
TPU_DEFINE_OP(cumsum_op, {.name = "cumsum", .num_inputs = 1, .meta = &cumsum_meta, .cpu = &cumsum_cpu,
                          .doc = "inclusive prefix sums along a dim (as torch.cumsum; bool counts as i64, other "
                                 "dtypes keep theirs)"});

}  // namespace

Tensor cumsum(const Tensor& x, int64_t dim) { return ops::call(cumsum_op(), {x}, {{"dim", dim}}); }

std::tuple<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t dim) {
  Tensor outs[ops::kMaxOutputs];
  const Tensor ins[1] = {x};
  ops::call(topk_op(), ins, {{"k", k}, {"dim", dim}}, outs);
  return {std::move(outs[0]), std::move(outs[1])};
}

std::tuple<Tensor, Tensor> moe_sort(const Tensor& expert_ids, int64_t num_experts) {
  Tensor outs[ops::kMaxOutputs];
  const Tensor ins[1] = {expert_ids};
  ops::call(moe_sort_op(), ins, {{"num_experts", num_experts}}, outs);
  return {std::move(outs[0]), std::move(outs[1])};
}

Tensor moe_permute(const Tensor& x, const Tensor& order, int64_t top_k) {
  return ops::call(moe_permute_op(), {x, order}, {{"top_k", top_k}});
}

Tensor moe_unpermute(const Tensor& y, const Tensor& order, const Tensor& weights, int64_t top_k) {
  const bool hw = weights.defined();
  return ops::call(moe_unpermute_op(), {y, order, hw ? weights : y}, {{"top_k", top_k}, {"has_weights", hw}});
}

}  // namespace tpu
