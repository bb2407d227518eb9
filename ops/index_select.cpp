// Row selection by an index tensor: index_select(x, dim, index) and embedding(weight, indices).
// Indices are checked against the indexed dim before any is used; rows are copied in
// parallel (memcpy when a row is contiguous in the source).
#include <cstring>

#include "ops/index_common.h"
#include "ops/meta_util.h"
#include "ops/registry.h"
#include "tpucore/ops.h"

namespace tpu {
namespace {
using namespace ops;

// Rows per parallel chunk so that a chunk moves about kParallelGrain elements.
int64_t row_grain(int64_t row_elems) { return std::max<int64_t>(1, cpu::kParallelGrain / std::max<int64_t>(1, row_elems)); }

Shape contiguous_byte_strides(const Shape& s, size_t es) {
  Shape st = contiguous_strides(s);
  for (int i = 0; i < st.ndim(); ++i) st[i] *= static_cast<int64_t>(es);
  return st;
}

void index_select_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor& x = a.inputs[0];
  const Tensor& index = a.inputs[1];
  indexing::check_index_dtype("index_select", "index", index);
  TPU_CHECK(index.dim() <= 1, "index_select: index must be 0-d or 1-d, got shape {}", index.shape().str());
  const int d = wrap_dim(a.attrs.get_int("dim"), x.dim(), "index_select");
  Shape s = x.shape();
  if (x.dim() == 0) {
    TPU_CHECK(index.numel() == 1, "index_select: a 0-d input takes exactly one index, got index shape {}",
              index.shape().str());
  } else {
    s[d] = index.numel();
  }
  m.out() = {s, x.dtype(), x.device()};
  m.cast_mask = 1u << 1;
  m.cast_to = DType::i32;
}

void index_select_cpu(const KernelArgs& a) {
  const Tensor& x = a.inputs[0];
  const Tensor& index = a.inputs[1];
  const Tensor& out = a.outputs[0];
  const int d = wrap_dim(a.attrs.get_int("dim"), x.dim(), "index_select");
  const int64_t size = x.dim() ? x.shape()[d] : 1;
  indexing::check_index_range("index_select", index, size, d, "x of shape " + x.shape().str());
  if (out.numel() == 0) return;
  const size_t es = x.element_size();
  const std::vector<int32_t> idx = indexing::read_indices(index);
  char* obase = cpu::byte_ptr(out);
  const char* xbase = cpu::byte_ptr(x);
  if (x.dim() == 0) {
    std::memcpy(obase, xbase, es);
    return;
  }
  const Shape xst = indexing::byte_strides(x);
  Shape inner, inner_st, outer;
  for (int k = d + 1; k < x.dim(); ++k) {
    inner.push_back(x.shape()[k]);
    inner_st.push_back(xst[k]);
  }
  for (int k = 0; k < d; ++k) outer.push_back(x.shape()[k]);
  const indexing::BlockCopy copy(inner, contiguous_byte_strides(inner, es), inner_st, es);
  const int64_t row = inner.numel();
  // Byte offset in x of each position of the leading dims.
  std::vector<int64_t> xoff(static_cast<size_t>(outer.numel()), 0);
  {
    int64_t pos[kMaxDims] = {}, off = 0;
    for (size_t o = 0; o < xoff.size(); ++o) {
      xoff[o] = off;
      for (int k = d - 1; k >= 0; --k) {
        off += xst[k];
        if (++pos[k] < outer[k]) break;
        off -= xst[k] * outer[k];
        pos[k] = 0;
      }
    }
  }
  const auto J = static_cast<int64_t>(idx.size());
  const int64_t sd = xst[d];
  if (row == 1) {  // selecting along the last dim: one element per (outer, j)
    std::vector<int64_t> joff(idx.size());
    for (size_t j = 0; j < idx.size(); ++j) joff[j] = idx[j] * sd;
    auto run = [&](auto zero) {
      using E = decltype(zero);
      E* o = reinterpret_cast<E*>(obase);
      parallel_for(0, static_cast<int64_t>(xoff.size()), row_grain(J), [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
          const char* src = xbase + xoff[static_cast<size_t>(r)];
          E* dst = o + r * J;
          for (int64_t j = 0; j < J; ++j) std::memcpy(dst + j, src + joff[static_cast<size_t>(j)], sizeof(E));
        }
      });
    };
    if (es == 1) run(uint8_t{});
    else if (es == 2) run(uint16_t{});
    else if (es == 4) run(uint32_t{});
    else run(uint64_t{});
    return;
  }
  const int64_t row_bytes = row * static_cast<int64_t>(es);
  parallel_for(0, static_cast<int64_t>(xoff.size()) * J, row_grain(row), [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      const int64_t o = p / J, j = p % J;
      copy(obase + p * row_bytes, xbase + xoff[static_cast<size_t>(o)] + idx[static_cast<size_t>(j)] * sd);
    }
  });
}
TPU_DEFINE_OP(index_select_op, {.name = "index_select", .num_inputs = 2, .flags = kNone, .meta = &index_select_meta,
                                .cpu = &index_select_cpu, .doc = "the entries of x at the given indices along one dim"});

void embedding_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor& w = a.inputs[0];
  const Tensor& indices = a.inputs[1];
  TPU_CHECK(w.dim() == 2, "embedding: weight must be 2-D [num_embeddings, embedding_dim], got shape {}", w.shape().str());
  indexing::check_index_dtype("embedding", "indices", indices);
  TPU_CHECK(indices.dim() < kMaxDims, "embedding: indices of shape {} would give a result with more than {} dims",
            indices.shape().str(), kMaxDims);
  Shape s = indices.shape();
  s.push_back(w.shape()[1]);
  m.out() = {s, w.dtype(), w.device()};
  // The cpu kernel (also the host fallback of devices without an embedding kernel, e.g. pjrt)
  // reads i32 indices; the sim/tpu chip kernel reads them on the host as given (a cast there
  // would be a host fallback of its own: chips have no i64).
  const DeviceType dt = w.device().type;
  m.cast_mask = (dt == DeviceType::sim || dt == DeviceType::tpu) ? 0u : 1u << 1;
  m.cast_to = DType::i32;
}

void embedding_cpu(const KernelArgs& a) {
  const Tensor& w = a.inputs[0];
  const Tensor& indices = a.inputs[1];
  const Tensor& out = a.outputs[0];
  indexing::check_index_range("embedding", indices, w.shape()[0], 0, "weight of shape " + w.shape().str());
  if (out.numel() == 0) return;
  const size_t es = w.element_size();
  const int64_t D = w.shape()[1];
  const std::vector<int32_t> idx = indexing::read_indices(indices);
  const Shape wst = indexing::byte_strides(w);
  const indexing::BlockCopy copy(Shape{D}, Shape{static_cast<int64_t>(es)}, Shape{wst[1]}, es);
  char* obase = cpu::byte_ptr(out);
  const char* wbase = cpu::byte_ptr(w);
  const int64_t row_bytes = D * static_cast<int64_t>(es);
  parallel_for(0, static_cast<int64_t>(idx.size()), row_grain(D), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) copy(obase + i * row_bytes, wbase + idx[static_cast<size_t>(i)] * wst[0]);
  });
}
TPU_DEFINE_OP(embedding_op, {.name = "embedding", .num_inputs = 2, .flags = kNone, .meta = &embedding_meta,
                             .cpu = &embedding_cpu, .doc = "rows of a [num, dim] weight table at the given indices"});

}  // namespace

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  return ops::call(index_select_op(), {x, index}, {{"dim", dim}});
}

Tensor embedding(const Tensor& weight, const Tensor& indices) { return ops::call(embedding_op(), {weight, indices}); }

}  // namespace tpu
