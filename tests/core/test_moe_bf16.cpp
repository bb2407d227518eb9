// The mixture-of-experts ops in bf16 at sizes that take the cpu's grouped AMX pass: grouped_matmul
// over strided views against an exact double loop (rounding to nearest even checked), and a bf16
// SparseMoE layer against the per-expert loop over its own routing.
#include "moe_test_util.h"
#include "tpucore/autograd.h"
#include "tpucore/nn/moe.h"

namespace tpu::testing {
namespace {

using namespace moe;

TEST_CASE("grouped_matmul: bf16 groups of strided views, one pass over all groups, round to nearest even",
          "[moe][matmul]") {
  Generator g(21);
  // bf16 x W^T with groups of 0, 1, 17, 130 (over the few-row limit: its own product), 0 and 45
  // rows; N 301 and K 232 (not multiples of 16 and 32); x a transposed view (column stride not
  // 1) and w a narrowed view (rows K + 24 apart). The few-row groups together are large enough to
  // run over the threads (on CPUs with AMX, in one pass with the weights read in place).
  const std::vector<int64_t> counts{0, 1, 17, 130, 0, 45};
  const int64_t T = 193, K = 232, N = 301, E = 6;
  const Tensor x = transpose(uniform_input(g, {K, T}, DType::bf16), 0, 1);
  const Tensor w = narrow(uniform_input(g, {E, N, K + 24}, DType::bf16), 2, 0, K);
  const Tensor y = grouped_matmul(x, w, counts_tensor(counts, DType::i32), true);
  REQUIRE(y.dtype() == DType::bf16);
  REQUIRE(y.shape() == Shape{T, N});
  const Ref exact = grouped_matmul_ref(ref_of(x), ref_of(w), counts, true);
  const std::vector<float> got = y.to(DType::f32).to_vector<float>();
  // Exact products in double; the result must be the nearest bf16 but where the f32 sum lies
  // within its rounding error of a tie between two bf16 values (rare), never further than one
  // bf16 step. Rounding toward zero instead would miss about half of the values.
  size_t off_nearest = 0, off_step = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const float want = static_cast<float>(bf16(static_cast<float>(exact.v[i])));
    off_nearest += got[i] != want;
    off_step += !(std::abs(got[i] - want) <= std::abs(want) * (1.0 / 128) + 1e-6);
  }
  CHECK(off_step == 0);
  CHECK(off_nearest <= got.size() / 100);
}

TEST_CASE("SparseMoE in bf16 equals the per-expert loop over its routing", "[moe]") {
  Generator g(22);
  nn::MoEConfig c;
  c.hidden = 64;
  c.intermediate = 40;  // the down product's K is not a multiple of 32
  c.num_experts = 6;
  c.top_k = 2;
  nn::SparseMoE moe(c, &g);
  moe.to(DType::bf16);
  moe.eval();
  NoGradGuard ng;
  const int64_t T = 37, H = c.hidden, F = c.intermediate;
  const Tensor x = uniform_input(g, {T, H}, DType::bf16);
  const Tensor y = moe(x);
  REQUIRE(y.dtype() == DType::bf16);
  const nn::SparseMoE::Routing r = moe.route(x);
  const std::vector<float> xv = x.to(DType::f32).to_vector<float>();
  const std::vector<float> w1 = moe.experts->gate_up_proj.to(DType::f32).contiguous().to_vector<float>();
  const std::vector<float> w2 = moe.experts->down_proj.to(DType::f32).contiguous().to_vector<float>();
  const std::vector<float> rw = r.weights.to(DType::f32).contiguous().to_vector<float>();
  const std::vector<int64_t> ids = r.experts.to(DType::i64).contiguous().to_vector<int64_t>();
  const std::vector<float> got = y.to(DType::f32).to_vector<float>();
  size_t bad = 0;
  std::vector<double> a(static_cast<size_t>(F));
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> want(static_cast<size_t>(H), 0.0);
    for (int64_t j = 0; j < c.top_k; ++j) {
      const int64_t e = ids[static_cast<size_t>(t * c.top_k + j)];
      for (int64_t f = 0; f < F; ++f) {
        double gate = 0, up = 0;
        for (int64_t h = 0; h < H; ++h) {
          const double xh = xv[static_cast<size_t>(t * H + h)];
          gate += xh * w1[static_cast<size_t>((e * 2 * F + f) * H + h)];
          up += xh * w1[static_cast<size_t>((e * 2 * F + F + f) * H + h)];
        }
        a[static_cast<size_t>(f)] = gate / (1 + std::exp(-gate)) * up;
      }
      for (int64_t h = 0; h < H; ++h) {
        double s = 0;
        for (int64_t f = 0; f < F; ++f) s += a[static_cast<size_t>(f)] * w2[static_cast<size_t>((e * H + h) * F + f)];
        want[static_cast<size_t>(h)] += rw[static_cast<size_t>(t * c.top_k + j)] * s;
      }
    }
    // bf16 intermediates (the gate/up product, the activation, the expert outputs) round at
    // about 2^-9 of each value.
    for (int64_t h = 0; h < H; ++h)
      bad += !(std::abs(got[static_cast<size_t>(t * H + h)] - want[static_cast<size_t>(h)]) <=
               0.03 * std::abs(want[static_cast<size_t>(h)]) + 2e-3);
  }
  CHECK(bad == 0);
}

}  // namespace
}  // namespace tpu::testing
