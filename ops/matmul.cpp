// matmul (PyTorch semantics: dot, matrix-vector, vector-matrix, matrix, batched with
// broadcast batch dims), mm, bmm and linear (x W^T + b).
//
// The cpu kernel hands every (batch) product to tpu::kernels::gemm_f32 / gemm_bf16 with the
// operands' own strides, so transposed, sliced and broadcast views need no copy. bf16
// products accumulate in f32 and round once to bf16; f16 inputs of linear go to gemm_f16 (few
// rows read the weight in place), those of matmul are converted to f32 by the front half, and
// the result is rounded to f16; integer products accumulate in 64 bits (wrapping)
// in a plain loop. Mixed input dtypes promote (promote_types); bool is rejected. Many small
// products run in parallel over the batch; a large one is parallelized inside gemm.
#include <algorithm>
#include <cstring>
#include <vector>

#include "ops/cpu/kernels/gemm.h"
#include "ops/cpu/kernels/half_convert.h"
#include "ops/cpu/kernels/scratch.h"
#include "ops/cpu/loops.h"
#include "ops/meta_util.h"
#include "ops/reduce_engine.h"
#include "ops/registry.h"
#include "tpucore/ops.h"

namespace tpu {
namespace {
using namespace ops;
using reduce::DimGroup;

// One side of a (batched) product: element (i, k) of batch b is at
// base + batch.offset_of(b) + i * rs + k * cs.
struct Operand {
  const Tensor* t = nullptr;
  DimGroup batch;
  int64_t rs = 0, cs = 0;
};

struct Problem {
  int64_t nbatch = 1, M = 0, N = 0, K = 0;
  Operand A, B;
};

DType compute_dtype(DType t) { return t == DType::f16 ? DType::f32 : t; }

DType check_dtypes(const char* op, const Tensor& a, const Tensor& b) {
  TPU_CHECK(a.dtype() != DType::boolean && b.dtype() != DType::boolean,
            "{}: bool inputs are not supported (got {} and {})", op, describe(a), describe(b));
  return promote_types(a.dtype(), b.dtype());
}

// Output shape of matmul(a, b), with the checks PyTorch makes.
Shape matmul_shape(const Tensor& a, const Tensor& b) {
  const Shape &sa = a.shape(), &sb = b.shape();
  TPU_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: both arguments need at least 1 dimension, got shapes {} and {}",
            sa.str(), sb.str());
  const int64_t ka = sa[a.dim() - 1];
  const int64_t kb = b.dim() == 1 ? sb[0] : sb[b.dim() - 2];
  TPU_CHECK(ka == kb, "matmul: shapes {} and {} cannot be multiplied (inner dims {} and {} differ)", sa.str(), sb.str(),
            ka, kb);
  Shape ba, bb;
  for (int i = 0; i + 2 < a.dim(); ++i) ba.push_back(sa[i]);
  for (int i = 0; i + 2 < b.dim(); ++i) bb.push_back(sb[i]);
  Shape out;
  const int n = std::max(ba.ndim(), bb.ndim());
  for (int i = 0; i < n; ++i) {
    const int ia = i - (n - ba.ndim()), ib = i - (n - bb.ndim());
    const int64_t da = ia >= 0 ? ba[ia] : 1, db = ib >= 0 ? bb[ib] : 1;
    TPU_CHECK(da == db || da == 1 || db == 1,
              "matmul: batch dims of shapes {} and {} are not broadcastable ({} vs {} at batch dim {})", sa.str(),
              sb.str(), da, db, i);
    out.push_back(da == 1 ? db : da);
  }
  if (a.dim() >= 2) out.push_back(sa[a.dim() - 2]);
  if (b.dim() >= 2) out.push_back(sb[b.dim() - 1]);
  return out;
}

void matmul_meta(const MetaArgs& m_args, MetaResult& m) {
  const Tensor &a = m_args.inputs[0], &b = m_args.inputs[1];
  const DType dt = check_dtypes("matmul", a, b);
  m.out() = {matmul_shape(a, b), dt, a.device()};
  m.cast_mask = 3;
  m.cast_to = compute_dtype(dt);
}

// Batch group of t's leading dims (all but its last `mat_dims`) broadcast to batch shape bs.
DimGroup batch_group(const Tensor& t, int mat_dims, const Shape& bs) {
  DimGroup g;
  const int tb = t.dim() - mat_dims;
  for (int i = 0; i < bs.ndim(); ++i) {
    const int j = i - (bs.ndim() - tb);
    const int64_t st = (j >= 0 && t.shape()[j] != 1) ? t.strides()[j] : 0;
    g.add(bs[i], st);
  }
  return g;
}

Problem matmul_problem(const Tensor& a, const Tensor& b, const Tensor& out) {
  Problem p;
  const int ma = std::min(a.dim(), 2), mb = std::min(b.dim(), 2);
  p.K = a.shape()[a.dim() - 1];
  p.M = a.dim() >= 2 ? a.shape()[a.dim() - 2] : 1;
  p.N = b.dim() >= 2 ? b.shape()[b.dim() - 1] : 1;
  const int out_mat = (a.dim() >= 2) + (b.dim() >= 2);
  Shape bs;
  for (int i = 0; i < out.dim() - out_mat; ++i) bs.push_back(out.shape()[i]);
  p.nbatch = bs.numel();
  p.A = {&a, batch_group(a, ma, bs), a.dim() >= 2 ? a.strides()[a.dim() - 2] : 0, a.strides()[a.dim() - 1]};
  if (b.dim() >= 2) p.B = {&b, batch_group(b, mb, bs), b.strides()[b.dim() - 2], b.strides()[b.dim() - 1]};
  else p.B = {&b, DimGroup{}, b.strides()[0], 0};
  return p;
}

template <class T>
const T* ptr(const Operand& o, int64_t b) {
  return static_cast<const T*>(o.t->raw_data()) + o.batch.offset_of(b);
}

// Integer product of one batch into out (row-major M x N), plus optional bias (N values).
template <class T, class O>
void int_gemm(const Problem& p, int64_t b, O* out, const std::vector<double>& bias) {
  const T* A = ptr<T>(p.A, b);
  const T* B = ptr<T>(p.B, b);
  std::vector<uint64_t> row(static_cast<size_t>(p.N));
  for (int64_t i = 0; i < p.M; ++i) {
    for (int64_t j = 0; j < p.N; ++j) row[j] = bias.empty() ? 0 : static_cast<uint64_t>(static_cast<int64_t>(bias[j]));
    for (int64_t k = 0; k < p.K; ++k) {
      const uint64_t av = static_cast<uint64_t>(static_cast<int64_t>(A[i * p.A.rs + k * p.A.cs]));
      const T* Bk = B + k * p.B.rs;
      for (int64_t j = 0; j < p.N; ++j) row[j] += av * static_cast<uint64_t>(static_cast<int64_t>(Bk[j * p.B.cs]));
    }
    for (int64_t j = 0; j < p.N; ++j) out[i * p.N + j] = static_cast<O>(static_cast<int64_t>(row[j]));
  }
}

// Float product of one batch, columns [j0, j0 + n) of it, into C (f32, row stride ldc), C
// pre-filled when accumulate.
void float_gemm(const Problem& p, int64_t b, DType in, int64_t j0, int64_t n, float* C, int64_t ldc, bool accumulate) {
  const int64_t bo = j0 * p.B.cs;
  if (in == DType::f16) {
    static_assert(sizeof(f16) == sizeof(uint16_t));
    kernels::gemm_f16(p.M, n, p.K, reinterpret_cast<const uint16_t*>(ptr<f16>(p.A, b)), p.A.rs, p.A.cs,
                      reinterpret_cast<const uint16_t*>(ptr<f16>(p.B, b) + bo), p.B.rs, p.B.cs, C, ldc, accumulate);
  } else if (in == DType::f32) {
    kernels::gemm_f32(p.M, n, p.K, ptr<float>(p.A, b), p.A.rs, p.A.cs, ptr<float>(p.B, b) + bo, p.B.rs, p.B.cs, C, ldc,
                      accumulate);
  } else {
    static_assert(sizeof(bf16) == sizeof(uint16_t));
    kernels::gemm_bf16(p.M, n, p.K, reinterpret_cast<const uint16_t*>(ptr<bf16>(p.A, b)), p.A.rs, p.A.cs,
                       reinterpret_cast<const uint16_t*>(ptr<bf16>(p.B, b) + bo), p.B.rs, p.B.cs, C, ldc, accumulate);
  }
}

// f32 results of a bf16 / f16 product pass through this per-thread buffer (never zero-filled,
// kept for reuse) in column slices of at most kMatmulSliceFloats values, small enough to stay
// in the caches until they are rounded to the output dtype. Every element's sum is computed
// exactly as in one call over all columns (the GEMM's order along K does not depend on N).
thread_local kernels::detail::ScratchBuffer t_matmul_f32_out;
constexpr int64_t kMatmulSliceFloats = int64_t{1} << 19;  // 2 MiB

// Columns per slice for an M-row product of N columns: all of them when they fit, else a
// multiple of 64 (whole register tiles of every GEMM kernel), at least 64.
int64_t matmul_slice_cols(int64_t M, int64_t N) {
  if (M * N <= kMatmulSliceFloats) return N;
  return std::min(N, std::max<int64_t>(64, kMatmulSliceFloats / std::max<int64_t>(M, 1) / 64 * 64));
}

// Rounds rows x n f32 values (row stride ls) to the output dtype (bf16 or f16) at o (row stride lo);
// large blocks split their rows over the pool when `parallel`.
void round_f32_block(const float* src, int64_t ls, DType dt, void* o, int64_t lo, int64_t rows, int64_t n,
                     bool parallel) {
  auto body = [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0; i < r1; ++i) {
      const float* s = src + i * ls;
      if (dt == DType::bf16) {
        bf16* d = static_cast<bf16*>(o) + i * lo;
        for (int64_t j = 0; j < n; ++j) d[j] = bf16(s[j]);
      } else {
        kernels::f32_to_f16(s, reinterpret_cast<uint16_t*>(static_cast<f16*>(o) + i * lo), n);
      }
    }
  };
  if (parallel && rows * n >= (int64_t{1} << 15)) parallel_for(0, rows, std::max<int64_t>(1, (int64_t{1} << 14) / n), body);
  else body(0, rows);
}

// Runs every batch product of p into out (contiguous, nbatch x M x N) with an optional bias.
void run_problem(const Problem& p, const Tensor& out, const std::vector<double>& bias) {
  const DType in = p.A.t->dtype();
  const int64_t mn = p.M * p.N;
  if (p.nbatch == 0 || mn == 0) return;
  const double flops = 2.0 * static_cast<double>(p.M) * static_cast<double>(p.N) * static_cast<double>(p.K);
  // Small products in parallel over the batch; a large one is split inside gemm.
  const int64_t grain = flops >= 4e6 ? 1 : std::max<int64_t>(1, static_cast<int64_t>(4e6 / std::max(flops, 1.0)));
  const bool batch_parallel = p.nbatch > 1 && flops < 4e6;
  auto over_batches = [&](auto&& body) {
    if (batch_parallel) parallel_for(0, p.nbatch, grain, body);
    else body(0, p.nbatch);
  };
  if (is_integral(in)) {
    dispatch_dtype(in, [&](auto zi) {
      using T = decltype(zi);
      if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
        T* o = static_cast<T*>(out.raw_data());
        over_batches([&](int64_t b0, int64_t b1) {
          for (int64_t b = b0; b < b1; ++b) int_gemm<T, T>(p, b, o + b * mn, bias);
        });
      }
    });
    return;
  }
  const bool direct = out.dtype() == DType::f32;
  const int64_t slice = direct ? p.N : matmul_slice_cols(p.M, p.N);
  const size_t out_size = dtype_size(out.dtype());
  over_batches([&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      for (int64_t j0 = 0; j0 < p.N; j0 += slice) {
        const int64_t n = std::min(slice, p.N - j0);
        const int64_t ldc = direct ? p.N : n;
        float* C = direct ? out.data<float>() + b * mn : t_matmul_f32_out.get_as<float>(static_cast<size_t>(p.M * n));
        if (!bias.empty())
          for (int64_t i = 0; i < p.M; ++i)
            for (int64_t j = 0; j < n; ++j) C[i * ldc + j] = static_cast<float>(bias[j0 + j]);
        float_gemm(p, b, in, j0, n, C, ldc, !bias.empty());
        if (direct) continue;
        char* o = static_cast<char*>(out.raw_data()) + static_cast<size_t>(b * mn + j0) * out_size;
        round_f32_block(C, n, out.dtype(), o, p.N, p.M, n, !batch_parallel);
      }
    }
  });
}

void matmul_cpu(const KernelArgs& a) {
  run_problem(matmul_problem(a.inputs[0], a.inputs[1], a.outputs[0]), a.outputs[0], {});
}
TPU_DEFINE_OP(matmul_op, {.name = "matmul", .num_inputs = 2, .meta = &matmul_meta, .cpu = &matmul_cpu,
                          .doc = "matrix product with PyTorch's vector and broadcast batch rules"});

// ---- linear: inputs (x, weight, bias); an absent bias is passed as x with has_bias false ----
void linear_meta(const MetaArgs& args, MetaResult& m) {
  const Tensor &x = args.inputs[0], &w = args.inputs[1], &b = args.inputs[2];
  const bool hb = args.attrs.get_bool("has_bias");
  TPU_CHECK(w.dim() == 2, "linear: weight must be 2-D [out_features, in_features], got shape {}", w.shape().str());
  TPU_CHECK(x.dim() >= 1, "linear: the input must have at least 1 dimension, got a 0-d tensor");
  TPU_CHECK(x.shape()[x.dim() - 1] == w.shape()[1],
            "linear: input of shape {} and weight of shape {} do not match (in_features {} vs {})", x.shape().str(),
            w.shape().str(), x.shape()[x.dim() - 1], w.shape()[1]);
  DType dt = check_dtypes("linear", x, w);
  if (hb) {
    TPU_CHECK(b.dim() == 0 || (b.dim() == 1 && b.shape()[0] == w.shape()[0]),
              "linear: bias of shape {} does not match out_features {} (weight shape {})", b.shape().str(),
              w.shape()[0], w.shape().str());
    dt = promote_types(dt, check_dtypes("linear", x, b));
  }
  Shape s = x.shape();
  s[s.ndim() - 1] = w.shape()[0];
  m.out() = {s, dt, x.device()};
  m.cast_mask = hb ? 7 : 3;
  // f16 on the cpu stays f16: the kernel reads the weight in place (no f32 copy of it per call).
  m.cast_to = dt == DType::f16 && x.device().is_cpu() ? DType::f16 : compute_dtype(dt);
}

void linear_cpu(const KernelArgs& a) {
  const Tensor &x = a.inputs[0], &w = a.inputs[1];
  const Tensor& out = a.outputs[0];
  Problem p;
  p.K = w.shape()[1];
  p.N = w.shape()[0];
  // The leading dims of x: the last coalesced one is M, the others are the batch.
  DimGroup lead;
  for (int i = 0; i + 1 < x.dim(); ++i) lead.add(x.shape()[i], x.strides()[i]);
  p.A.t = &x;
  p.A.cs = x.strides()[x.dim() - 1];
  if (lead.n == 0) {
    p.M = 1;  // 1-D x (or leading dims all of size 1)
  } else {
    p.M = lead.size[lead.n - 1];
    p.A.rs = lead.stride[lead.n - 1];
    --lead.n;
  }
  p.A.batch = lead;
  p.nbatch = lead.numel();
  p.B = {&w, DimGroup{}, w.strides()[1], w.strides()[0]};
  std::vector<double> bias;
  if (a.attrs.get_bool("has_bias")) {
    const Tensor& b = a.inputs[2];
    bias.resize(static_cast<size_t>(p.N));
    dispatch_dtype(b.dtype(), [&](auto z) {
      using T = decltype(z);
      const T* bp = static_cast<const T*>(b.raw_data());
      for (int64_t j = 0; j < p.N; ++j) bias[j] = cpu::convert<double>(bp[b.dim() ? j * b.strides()[0] : 0]);
    });
  }
  run_problem(p, out, bias);
}
TPU_DEFINE_OP(linear_op, {.name = "linear", .num_inputs = 3, .meta = &linear_meta, .cpu = &linear_cpu,
                          .doc = "x W^T + b; inputs (x, weight, bias), an absent bias passed as x with has_bias "
                                 "false"});

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) { return ops::call(matmul_op(), {a, b}); }

Tensor mm(const Tensor& a, const Tensor& b) {
  TPU_CHECK(a.dim() == 2 && b.dim() == 2, "mm: expected two 2-D tensors, got shapes {} and {}", a.shape().str(),
            b.shape().str());
  TPU_CHECK(a.shape()[1] == b.shape()[0], "mm: shapes {} and {} cannot be multiplied (inner dims {} and {} differ)",
            a.shape().str(), b.shape().str(), a.shape()[1], b.shape()[0]);
  return ops::call(matmul_op(), {a, b});
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  TPU_CHECK(a.dim() == 3 && b.dim() == 3, "bmm: expected two 3-D tensors, got shapes {} and {}", a.shape().str(),
            b.shape().str());
  TPU_CHECK(a.shape()[0] == b.shape()[0], "bmm: batch sizes differ: shapes {} and {}", a.shape().str(),
            b.shape().str());
  TPU_CHECK(a.shape()[2] == b.shape()[1], "bmm: shapes {} and {} cannot be multiplied (inner dims {} and {} differ)",
            a.shape().str(), b.shape().str(), a.shape()[2], b.shape()[1]);
  return ops::call(matmul_op(), {a, b});
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const bool hb = bias.defined();
  return ops::call(linear_op(), {x, weight, hb ? bias : x}, {{"has_bias", hb}});
}

}  // namespace tpu
