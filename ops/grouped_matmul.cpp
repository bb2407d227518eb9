// Grouped (ragged) matrix products of mixture-of-experts layers, over rows sorted by group:
//
//   grouped_matmul(x [T, K], w, group_sizes [E])            -> [T, N]
//     rows [o_e, o_e + n_e) of x (o_e = n_0 + ... + n_{e-1}) times w[e]; w is [E, K, N], or
//     [E, N, K] with transpose_w (each expert's weight as a Linear stores it: x w[e]^T).
//   grouped_matmul_weight_grad(x [T, K], dy [T, N], group_sizes [E]) -> [E, K, N] ([E, N, K]
//     with transpose_w): per group x_e^T dy_e (dy_e^T x_e), zero for an empty group; the weight
//     gradient of grouped_matmul.
//
// group_sizes holds integers (i64, i32, i8 or u8) that must be >= 0 and sum to T; they are read
// when the kernel runs (a new routing needs no new program). Floats: f32 and bf16 inputs
// accumulate in f32 (bf16 results rounded once); f16 inputs run in f32; mixed dtypes promote.
// bf16 x W^T (transpose_w, the layout of the MoE layers) on CPUs with AMX, outside batch-invariant
// mode: the groups of up to 128 rows run as one grouped product (kernels/gemm_grouped.h): each
// weight read in place as the tile operand, the threads taking runs of 16 weight rows of all the
// groups from a shared counter (no join between experts), results rounded to bf16 as they are
// stored. Every other group's product is one call of the library's GEMM (tpu::kernels::gemm_f32 /
// gemm_bf16) with the operands' own strides, so the transposed layout and strided views need no
// copy. A large product is split over the threads inside the GEMM (rows, or columns of short wide
// products: the few rows of a MoE layer's groups split the expert's weight rows, each thread
// streaming its part of the weight); small ones run in parallel over the groups. bf16 and f16
// results pass through a per-thread f32 buffer kept between calls.
#include <algorithm>
#include <vector>

#include "ops/cpu/kernels/gemm.h"
#include "ops/cpu/kernels/gemm_grouped.h"
#include "ops/cpu/kernels/scratch.h"
#include "ops/cpu/loops.h"
#include "ops/meta_util.h"
#include "ops/registry.h"
#include "tpucore/core/batch_invariant.h"
#include "tpucore/moe_ops.h"
#include "tpucore/ops.h"

namespace tpu {
namespace {
using namespace ops;

// Below this many FLOPs a product runs on one thread and products run in parallel instead.
constexpr double kParallelFlops = 4e6;

DType gmm_compute_dtype(DType t) { return t == DType::f16 ? DType::f32 : t; }

void check_float(const char* op, const char* arg, const Tensor& t) {
  TPU_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::bf16 || t.dtype() == DType::f16,
            "{}: {} must be f32, bf16 or f16, got {}", op, arg, describe(t));
}

void check_group_sizes(const char* op, const Tensor& gs, int64_t experts, const char* from) {
  TPU_CHECK(gs.dtype() == DType::i64 || gs.dtype() == DType::i32 || gs.dtype() == DType::i8 || gs.dtype() == DType::u8,
            "{}: group_sizes must be an integer tensor (i64, i32, i8 or u8), got {}", op, describe(gs));
  TPU_CHECK(gs.dim() == 1 && gs.size(0) == experts, "{}: group_sizes must be 1-D with one count per group ({} from {}), "
            "got shape {}", op, experts, from, gs.shape().str());
}

// The counts of a 1-D integer cpu tensor, checked: each >= 0, summing to `rows`.
std::vector<int64_t> read_group_sizes(const char* op, const Tensor& gs, int64_t rows) {
  std::vector<int64_t> n(static_cast<size_t>(gs.size(0)));
  dispatch_dtype(gs.dtype(), [&](auto z) {
    using T = decltype(z);
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      const T* p = static_cast<const T*>(gs.raw_data());
      for (size_t e = 0; e < n.size(); ++e) n[e] = static_cast<int64_t>(p[static_cast<int64_t>(e) * gs.strides()[0]]);
    }
  });
  check_group_counts(op, n, rows);
  return n;
}

// One product C (M x N, row-major, f32 or the output's dtype) = A (M x K) B (K x N) with
// element strides; A and B point at elements of the input dtype.
struct Product {
  int64_t M = 0, N = 0, K = 0;
  const char* A = nullptr;
  int64_t a_rs = 0, a_cs = 0;
  const char* B = nullptr;
  int64_t b_rs = 0, b_cs = 0;
  char* C = nullptr;
  double flops() const { return 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K); }
};

// Rounds n f32 values to the output dtype (bf16 or f16) at o.
void round_f32(const float* src, DType out, char* o, int64_t n) {
  if (out == DType::bf16) {
    bf16* d = reinterpret_cast<bf16*>(o);
    for (int64_t i = 0; i < n; ++i) d[i] = bf16(src[i]);
  } else {
    f16* d = reinterpret_cast<f16*>(o);
    for (int64_t i = 0; i < n; ++i) d[i] = f16(src[i]);
  }
}

// Runs one product: straight into an f32 output, else through the calling thread's f32 scratch
// (kept between calls: no allocation or page faults per product) rounded once, over the threads
// when `threaded` (the product ran split over them too).
void run_product(const Product& p, DType in, DType out, bool threaded) {
  if (p.M == 0 || p.N == 0) return;
  thread_local kernels::detail::ScratchBuffer t_f32;
  float* C = out == DType::f32 ? reinterpret_cast<float*>(p.C) : t_f32.get_as<float>(static_cast<size_t>(p.M * p.N));
  if (in == DType::f32) {
    kernels::gemm_f32(p.M, p.N, p.K, reinterpret_cast<const float*>(p.A), p.a_rs, p.a_cs,
                      reinterpret_cast<const float*>(p.B), p.b_rs, p.b_cs, C, p.N, false);
  } else {
    kernels::gemm_bf16(p.M, p.N, p.K, reinterpret_cast<const uint16_t*>(p.A), p.a_rs, p.a_cs,
                       reinterpret_cast<const uint16_t*>(p.B), p.b_rs, p.b_cs, C, p.N, false);
  }
  if (out == DType::f32) return;
  const int64_t n = p.M * p.N, es = static_cast<int64_t>(dtype_size(out));
  if (threaded && n >= (int64_t{1} << 15))
    parallel_for(0, n, int64_t{1} << 14, [&](int64_t b, int64_t e) { round_f32(C + b, out, p.C + b * es, e - b); });
  else
    round_f32(C, out, p.C, n);
}

// Large products one after the other (each split over the threads inside the GEMM), then the
// small ones in parallel over the products.
void run_products(const std::vector<Product>& ps, DType in, DType out) {
  std::vector<const Product*> small;
  double small_flops = 0;
  for (const Product& p : ps) {
    if (p.flops() >= kParallelFlops) {
      run_product(p, in, out, true);
    } else {
      small.push_back(&p);
      small_flops += p.flops();
    }
  }
  if (small.empty()) return;
  const auto n = static_cast<int64_t>(small.size());
  const double mean = std::max(small_flops / static_cast<double>(n), 1.0);
  const int64_t grain = small_flops < kParallelFlops ? n : std::max<int64_t>(1, static_cast<int64_t>(kParallelFlops / mean));
  parallel_for(0, n, grain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) run_product(*small[static_cast<size_t>(i)], in, out, false);
  });
}

const char* elem(const Tensor& t, int64_t offset) {
  return static_cast<const char*>(t.raw_data()) + offset * static_cast<int64_t>(t.element_size());
}

// ---- grouped_matmul: inputs (x, w, group_sizes), attr transpose_w ----
void grouped_matmul_meta(const MetaArgs& a, MetaResult& m) {
  const char* op = "grouped_matmul";
  const Tensor &x = a.inputs[0], &w = a.inputs[1], &gs = a.inputs[2];
  const bool tw = a.attrs.get_bool("transpose_w");
  check_float(op, "x", x);
  check_float(op, "w", w);
  TPU_CHECK(x.dim() == 2, "{}: x must be 2-D [tokens, in_features], got shape {}", op, x.shape().str());
  TPU_CHECK(w.dim() == 3, "{}: w must be 3-D {}, got shape {}", op,
            tw ? "[groups, out_features, in_features]" : "[groups, in_features, out_features]", w.shape().str());
  const int64_t k = tw ? w.size(2) : w.size(1);
  TPU_CHECK(x.size(1) == k, "{}: x of shape {} and w of shape {}{} do not match (in_features {} vs {})", op,
            x.shape().str(), w.shape().str(), tw ? " (transposed)" : "", x.size(1), k);
  check_group_sizes(op, gs, w.size(0), "w's first dim");
  const DType dt = promote_types(x.dtype(), w.dtype());
  m.out() = {Shape{x.size(0), tw ? w.size(1) : w.size(2)}, dt, x.device()};
  m.cast_mask = 3;
  m.cast_to = gmm_compute_dtype(dt);
}

void grouped_matmul_cpu(const KernelArgs& a) {
  const Tensor &x = a.inputs[0], &w = a.inputs[1], &gs = a.inputs[2];
  const Tensor& out = a.outputs[0];
  const bool tw = a.attrs.get_bool("transpose_w");
  const std::vector<int64_t> n = read_group_sizes("grouped_matmul", gs, x.size(0));
  const int64_t N = out.size(1), K = x.size(1);
  // bf16 x W^T on AMX: the groups of up to kAmxWeightInPlaceMaxRows rows in one pass over the
  // threads with their weights read in place (gemm_grouped.h); larger groups as below.
  std::vector<bool> done(n.size(), false);
  if (x.dtype() == DType::bf16 && tw && w.strides()[2] == 1 && (out.dtype() == DType::bf16 || out.dtype() == DType::f32) &&
      N > 0 && K > 0 && !batch_invariant() && kernels::gemm_bf16_amx_available()) {
    std::vector<kernels::WtGroup> groups;
    const int64_t es = static_cast<int64_t>(out.element_size());
    int64_t row = 0;
    for (size_t e = 0; e < n.size(); ++e) {
      if (n[e] > 0 && n[e] <= kernels::kAmxWeightInPlaceMaxRows) {
        kernels::WtGroup g;
        g.rows = n[e];
        g.x = reinterpret_cast<const uint16_t*>(elem(x, row * x.strides()[0]));
        g.w = reinterpret_cast<const uint16_t*>(elem(w, static_cast<int64_t>(e) * w.strides()[0]));
        g.c = static_cast<char*>(out.raw_data()) + row * N * es;
        groups.push_back(g);
        done[e] = true;
      }
      row += n[e];
    }
    if (!groups.empty() &&
        !kernels::gemm_bf16_amx_wt_grouped(N, K, groups.data(), static_cast<int64_t>(groups.size()), x.strides()[0],
                                           x.strides()[1], w.strides()[1], N, out.dtype() == DType::bf16))
      std::fill(done.begin(), done.end(), false);
  }
  std::vector<Product> ps;
  int64_t row = 0;
  for (size_t e = 0; e < n.size(); ++e) {
    if (done[e]) {
      row += n[e];
      continue;
    }
    Product p;
    p.M = n[e];
    p.N = N;
    p.K = K;
    p.A = elem(x, row * x.strides()[0]);
    p.a_rs = x.strides()[0];
    p.a_cs = x.strides()[1];
    p.B = elem(w, static_cast<int64_t>(e) * w.strides()[0]);
    p.b_rs = tw ? w.strides()[2] : w.strides()[1];
    p.b_cs = tw ? w.strides()[1] : w.strides()[2];
    p.C = static_cast<char*>(out.raw_data()) + row * N * static_cast<int64_t>(out.element_size());
    if (p.M > 0) ps.push_back(p);
    row += n[e];
  }
  run_products(ps, x.dtype(), out.dtype());
}
TPU_DEFINE_OP(grouped_matmul_op, {.name = "grouped_matmul", .num_inputs = 3, .meta = &grouped_matmul_meta,
                                  .cpu = &grouped_matmul_cpu,
                                  .doc = "rows of x sorted by group times their group's matrix of w "
                                         "(group_sizes read at run time; transpose_w: w as [E, N, K])"});

// ---- grouped_matmul_weight_grad: inputs (x, dy, group_sizes), attr transpose_w ----
void weight_grad_meta(const MetaArgs& a, MetaResult& m) {
  const char* op = "grouped_matmul_weight_grad";
  const Tensor &x = a.inputs[0], &dy = a.inputs[1], &gs = a.inputs[2];
  check_float(op, "x", x);
  check_float(op, "dy", dy);
  TPU_CHECK(x.dim() == 2 && dy.dim() == 2 && x.size(0) == dy.size(0),
            "{}: x [tokens, in_features] and dy [tokens, out_features] must be 2-D with the same rows, got shapes {} "
            "and {}", op, x.shape().str(), dy.shape().str());
  TPU_CHECK(gs.dim() == 1, "{}: group_sizes must be 1-D, got shape {}", op, gs.shape().str());
  check_group_sizes(op, gs, gs.size(0), "its length");
  const DType dt = promote_types(x.dtype(), dy.dtype());
  const int64_t e = gs.size(0), k = x.size(1), n = dy.size(1);
  m.out() = {a.attrs.get_bool("transpose_w") ? Shape{e, n, k} : Shape{e, k, n}, dt, x.device()};
  m.cast_mask = 3;
  m.cast_to = gmm_compute_dtype(dt);
}

void weight_grad_cpu(const KernelArgs& a) {
  const Tensor &x = a.inputs[0], &dy = a.inputs[1], &gs = a.inputs[2];
  const Tensor& out = a.outputs[0];
  const bool tw = a.attrs.get_bool("transpose_w");
  const std::vector<int64_t> n = read_group_sizes("grouped_matmul_weight_grad", gs, x.size(0));
  // Per group: C [rows_c, cols_c] = L^T R over the group's tokens, L and R being x and dy (or
  // dy and x with transpose_w).
  const Tensor& L = tw ? dy : x;
  const Tensor& R = tw ? x : dy;
  const int64_t rows_c = L.size(1), cols_c = R.size(1);
  const int64_t plane = rows_c * cols_c * static_cast<int64_t>(out.element_size());
  std::vector<Product> ps;
  int64_t row = 0;
  for (size_t e = 0; e < n.size(); ++e) {
    Product p;
    p.M = rows_c;
    p.N = cols_c;
    p.K = n[e];  // an empty group writes zeros
    p.A = elem(L, row * L.strides()[0]);
    p.a_rs = L.strides()[1];
    p.a_cs = L.strides()[0];
    p.B = elem(R, row * R.strides()[0]);
    p.b_rs = R.strides()[0];
    p.b_cs = R.strides()[1];
    p.C = static_cast<char*>(out.raw_data()) + static_cast<int64_t>(e) * plane;
    ps.push_back(p);
    row += n[e];
  }
  run_products(ps, x.dtype(), out.dtype());
}
TPU_DEFINE_OP(grouped_matmul_weight_grad_op,
              {.name = "grouped_matmul_weight_grad", .num_inputs = 3, .meta = &weight_grad_meta,
               .cpu = &weight_grad_cpu,
               .doc = "per group x_e^T dy_e over rows sorted by group ([E, K, N]; transpose_w: dy_e^T x_e, "
                      "[E, N, K]): the weight gradient of grouped_matmul"});

}  // namespace

void ops::check_group_counts(const char* op, const std::vector<int64_t>& n, int64_t rows) {
  int64_t sum = 0;
  for (size_t e = 0; e < n.size(); ++e) {
    TPU_CHECK(n[e] >= 0, "{}: group_sizes[{}] is {}; counts must not be negative", op, e, n[e]);
    sum += n[e];
  }
  TPU_CHECK(sum == rows, "{}: group_sizes sum to {} but x has {} rows (every row belongs to exactly one group)", op,
            sum, rows);
}

Tensor grouped_matmul(const Tensor& x, const Tensor& w, const Tensor& group_sizes, bool transpose_w) {
  return ops::call(grouped_matmul_op(), {x, w, group_sizes}, {{"transpose_w", transpose_w}});
}

Tensor grouped_matmul_weight_grad(const Tensor& x, const Tensor& dy, const Tensor& group_sizes, bool transpose_w) {
  return ops::call(grouped_matmul_weight_grad_op(), {x, dy, group_sizes}, {{"transpose_w", transpose_w}});
}

}  // namespace tpu
