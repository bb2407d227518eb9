// Joining and splitting: cat and stack (variadic ops with type promotion across inputs),
// split and chunk (views made with slice: no copy).
#include <numeric>

#include "ops/index_common.h"
#include "ops/meta_util.h"
#include "ops/registry.h"
#include "tpucore/ops.h"

namespace tpu {
namespace {
using namespace ops;

// The front half casts at most 32 inputs (cast_mask bits); the public functions convert any
// further inputs before the call so that every kernel input already has the result dtype.
constexpr size_t kMaskedInputs = 32;

uint32_t cast_bits(size_t n) { return n >= kMaskedInputs ? 0xffffffffu : ((1u << n) - 1u); }

// PyTorch keeps accepting 1-D empty tensors ([0]) in cat next to tensors of any rank.
bool legacy_empty(const Tensor& t) { return t.dim() == 1 && t.shape()[0] == 0; }

void cat_meta(const MetaArgs& a, MetaResult& m) {
  const auto& xs = a.inputs;
  int ref = -1;  // the first tensor that fixes the rank and the other sizes
  for (size_t i = 0; i < xs.size(); ++i) {
    TPU_CHECK(xs[i].dim() > 0, "cat: zero-dimensional tensor (input {}) cannot be concatenated; unsqueeze it or use stack",
              i);
    if (ref < 0 && !legacy_empty(xs[i])) ref = static_cast<int>(i);
  }
  const DType dt = result_type(xs);
  const Device dev = xs[0].device();
  if (ref < 0) {  // only [0]-shaped inputs
    wrap_dim(a.attrs.get_int("dim"), 1, "cat");
    m.out() = {Shape{0}, dt, dev};
  } else {
    const Tensor& r = xs[static_cast<size_t>(ref)];
    const int d = wrap_dim(a.attrs.get_int("dim"), r.dim(), "cat");
    Shape s = r.shape();
    s[d] = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      const Tensor& t = xs[i];
      if (legacy_empty(t) && r.dim() != 1) continue;
      TPU_CHECK(t.dim() == r.dim(), "cat: tensor {} has {} dims (shape {}) but tensor {} has {} dims (shape {})", i,
                t.dim(), t.shape().str(), ref, r.dim(), r.shape().str());
      for (int k = 0; k < r.dim(); ++k)
        TPU_CHECK(k == d || t.shape()[k] == r.shape()[k],
                  "cat: sizes of tensors must match except in dim {}: tensor {} has shape {} but tensor {} has shape {} "
                  "(they differ in dim {})",
                  d, i, t.shape().str(), ref, r.shape().str(), k);
      s[d] += t.shape()[d];
    }
    m.out() = {s, dt, dev};
  }
  m.cast_mask = cast_bits(xs.size());
  m.cast_to = dt;
}

// Copies each input into its place in the output along `dim` (memcpy of contiguous runs).
void cat_cpu(const KernelArgs& a) {
  const Tensor& out = a.outputs[0];
  if (out.numel() == 0) return;
  const int nd = out.dim();
  const int d = wrap_dim(a.attrs.get_int("dim"), nd, "cat");
  const size_t es = out.element_size();
  const Shape ost = indexing::byte_strides(out);
  // Start offset of each input along dim.
  std::vector<int64_t> start(a.inputs.size(), 0);
  int64_t pos = 0;
  for (size_t i = 0; i < a.inputs.size(); ++i) {
    const Tensor& t = a.inputs[i];
    TPU_CHECK(t.dtype() == out.dtype(), "internal: cat: input {} is {} but the output is {}", i, dtype_name(t.dtype()),
              dtype_name(out.dtype()));
    start[i] = pos;
    if (t.dim() == nd && !(legacy_empty(t) && nd != 1)) pos += t.shape()[d];
  }
  auto copy_one = [&](size_t i) {
    const Tensor& t = a.inputs[i];
    if (t.numel() == 0) return;
    indexing::strided_copy(t.shape(), cpu::byte_ptr(out) + start[i] * ost[d], ost, cpu::byte_ptr(t),
                           indexing::byte_strides(t), es);
  };
  const auto n = static_cast<int64_t>(a.inputs.size());
  if (n >= 2 * num_threads() && out.numel() >= 2 * cpu::kParallelGrain) {
    // Many inputs: spread them over the threads (each copy then runs inline).
    parallel_for(0, n, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) copy_one(static_cast<size_t>(i));
    });
  } else {
    for (size_t i = 0; i < a.inputs.size(); ++i) copy_one(i);  // each copy is parallel when large
  }
}
TPU_DEFINE_OP(cat_op, {.name = "cat", .num_inputs = -1, .flags = kVariadic, .meta = &cat_meta, .cpu = &cat_cpu,
                       .doc = "concatenates tensors along an existing dim"});

void stack_meta(const MetaArgs& a, MetaResult& m) {
  const auto& xs = a.inputs;
  const Tensor& r = xs[0];
  for (size_t i = 1; i < xs.size(); ++i)
    TPU_CHECK(xs[i].shape() == r.shape(), "stack: expects tensors of equal shape, but tensor {} has shape {} and tensor 0 has shape {}",
              i, xs[i].shape().str(), r.shape().str());
  TPU_CHECK(r.dim() < kMaxDims, "stack: the result would have more than {} dims (input shape {})", kMaxDims,
            r.shape().str());
  const int d = wrap_dim(a.attrs.get_int("dim"), r.dim() + 1, "stack");
  Shape s = r.shape();
  s.insert(d, static_cast<int64_t>(xs.size()));
  const DType dt = result_type(xs);
  m.out() = {s, dt, r.device()};
  m.cast_mask = cast_bits(xs.size());
  m.cast_to = dt;
}

void stack_cpu(const KernelArgs& a) {
  const Tensor& out = a.outputs[0];
  if (out.numel() == 0) return;
  const int d = wrap_dim(a.attrs.get_int("dim"), out.dim(), "stack");
  const size_t es = out.element_size();
  Shape ost = indexing::byte_strides(out);
  const int64_t step = ost[d];
  ost.erase(d);
  auto copy_one = [&](size_t i) {
    const Tensor& t = a.inputs[i];
    TPU_CHECK(t.dtype() == out.dtype(), "internal: stack: input {} is {} but the output is {}", i, dtype_name(t.dtype()),
              dtype_name(out.dtype()));
    indexing::strided_copy(t.shape(), cpu::byte_ptr(out) + static_cast<int64_t>(i) * step, ost, cpu::byte_ptr(t),
                           indexing::byte_strides(t), es);
  };
  const auto n = static_cast<int64_t>(a.inputs.size());
  if (n >= 2 * num_threads() && out.numel() >= 2 * cpu::kParallelGrain) {
    parallel_for(0, n, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) copy_one(static_cast<size_t>(i));
    });
  } else {
    for (size_t i = 0; i < a.inputs.size(); ++i) copy_one(i);
  }
}
TPU_DEFINE_OP(stack_op, {.name = "stack", .num_inputs = -1, .flags = kVariadic, .meta = &stack_meta, .cpu = &stack_cpu,
                         .doc = "joins equally shaped tensors along a new dim"});

// Converts inputs past the front half's 32 cast bits to the common dtype.
std::vector<Tensor> promote_tail(const std::vector<Tensor>& xs, const char* op) {
  std::vector<Tensor> v = xs;
  if (xs.size() <= kMaskedInputs) return v;
  for (size_t i = 0; i < xs.size(); ++i)
    TPU_CHECK(xs[i].defined(), "{}: input {} is an undefined tensor", op, i);
  const DType dt = result_type(xs);
  for (size_t i = kMaskedInputs; i < v.size(); ++i) v[i] = to(v[i], dt);
  return v;
}

Tensor call_variadic(const OpDef& op, const std::vector<Tensor>& xs, int64_t dim) {
  TPU_CHECK(!xs.empty(), "{}: expected a non-empty list of tensors", op.name);
  std::vector<Tensor> ins = promote_tail(xs, op.name.c_str());
  Tensor out[kMaxOutputs];
  ops::call(op, std::span<const Tensor>(ins), Attrs{{"dim", dim}}, out);
  return std::move(out[0]);
}

int split_dim(const Tensor& x, int64_t dim, const char* op) {
  TPU_CHECK(x.dim() > 0, "{}: cannot split a 0-d tensor", op);
  return wrap_dim(dim, x.dim(), op);
}

}  // namespace

Tensor cat(const std::vector<Tensor>& xs, int64_t dim) { return call_variadic(cat_op(), xs, dim); }
Tensor stack(const std::vector<Tensor>& xs, int64_t dim) { return call_variadic(stack_op(), xs, dim); }

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  const int d = split_dim(x, dim, "split");
  const int64_t n = x.shape()[d];
  TPU_CHECK(split_size >= 0, "split: split_size must be non-negative, got {}", split_size);
  TPU_CHECK(split_size > 0 || n == 0, "split: split_size can only be 0 if dim {} has size 0, but it has size {} (shape {})",
            d, n, x.shape().str());
  std::vector<Tensor> parts;
  if (n == 0) {
    parts.push_back(slice(x, d, 0, 0));
    return parts;
  }
  for (int64_t s = 0; s < n; s += split_size) parts.push_back(slice(x, d, s, std::min(n, s + split_size)));
  return parts;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  const int d = split_dim(x, dim, "split");
  const int64_t n = x.shape()[d];
  TPU_CHECK(!sizes.empty(), "split: the list of split sizes is empty (dim {} has size {})", d, n);
  int64_t total = 0;
  for (int64_t s : sizes) {
    TPU_CHECK(s >= 0, "split: split sizes must be non-negative, got [{}]", fmt::join(sizes, ", "));
    total += s;
  }
  TPU_CHECK(total == n, "split: split sizes [{}] sum to {} but dim {} has size {} (shape {})", fmt::join(sizes, ", "),
            total, d, n, x.shape().str());
  std::vector<Tensor> parts;
  int64_t start = 0;
  for (int64_t s : sizes) {
    parts.push_back(slice(x, d, start, start + s));
    start += s;
  }
  return parts;
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  const int d = split_dim(x, dim, "chunk");
  TPU_CHECK(chunks > 0, "chunk: the number of chunks must be positive, got {}", chunks);
  const int64_t n = x.shape()[d];
  if (n == 0) {  // as PyTorch: `chunks` empty pieces
    std::vector<Tensor> parts;
    for (int64_t i = 0; i < chunks; ++i) parts.push_back(slice(x, d, 0, 0));
    return parts;
  }
  return split(x, (n + chunks - 1) / chunks, d);
}

}  // namespace tpu
