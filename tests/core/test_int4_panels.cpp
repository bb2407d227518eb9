// The int4 product on the repacked panel layout (ops/cpu/kernels/gemv_int4.h, gemv_int4_panels)
// and the cpu linear_int4 op's cache of repacked weights (ops/int4_repack.h), against a naive
// double-precision loop over the weight dequantized here from the documented canonical layout
// and the rows of x quantized in blocks of 32 as the vnni kernels do (quant_act_ref.h).
#include <array>
#include <cmath>
#include <thread>
#include <vector>

#include "ops/cpu/kernels/gemv_int4.h"
#include "ops/int4_repack.h"
#include "quant_act_ref.h"
#include "testing.h"
#include "tpucore/core/parallel.h"
#include "tpucore/quantize.h"

namespace tpu::testing {
namespace {

// Weight k of row j of a canonical packed weight (16 bytes per block of 32: byte b holds weight
// b in its low nibble, weight b + 16 in its high one, each as w + 8).
int canonical_value(const std::vector<uint8_t>& q, int64_t K, int64_t j, int64_t k) {
  const uint8_t b = q[static_cast<size_t>(j * (K / 2) + (k / 32) * 16 + (k % 32) % 16)];
  return ((k % 32) < 16 ? b & 0xF : b >> 4) - 8;
}

// Outputs farther from the naive product of xq (x as the kernel sees it) and the dequantized
// weight than the f32 accumulation allows.
int mismatches(const std::vector<float>& xq, const std::vector<uint8_t>& q, const std::vector<float>& s, int64_t M,
               int64_t N, int64_t K, int64_t group, const std::vector<float>& out) {
  int bad = 0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double acc = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double w = canonical_value(q, K, j, k) * static_cast<double>(s[static_cast<size_t>(j * (K / group) + k / group)]);
        const double p = xq[static_cast<size_t>(i * K + k)] * w;
        acc += p;
        mag += std::fabs(p);
      }
      bad += !(std::fabs(out[static_cast<size_t>(i * N + j)] - acc) <= 2e-6 * mag + 1e-30);
    }
  return bad;
}

std::vector<float> uniform(Generator& g, size_t n, double lo, double hi) {
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(lo + (hi - lo) * g.next_double());
  return v;
}

TEST_CASE("gemv_int4_panels: rows, shapes, groups, scale dtypes and threads against the naive product",
          "[quant][gemv][int4panel]") {
  if (!kernels::int4_panel_supported(32, 32)) {
    WARN("no AVX-512 VNNI: the panel kernel is not used here");
    return;
  }
  Generator g(101);
  const int saved = num_threads();
  int checked = 0;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    // N below, at and past one panel of 16 (short last panels); K of one block, three, and 4096.
    for (auto [N, K, group] : {std::array<int64_t, 3>{5, 32, 32}, {16, 96, 32}, {37, 128, 128}, {21, 4096, 32},
                               {18, 4096, 128}})
      for (bool f16_scales : {false, true})
        for (int64_t M : {1, 2, 3, 4, 16}) {
          if (K == 4096 && M == 16 && threads == 1) continue;  // the biggest case once
          const std::vector<float> x = uniform(g, static_cast<size_t>(M * K), -2, 2);
          std::vector<uint8_t> q(static_cast<size_t>(N * K / 2));
          for (uint8_t& v : q) v = static_cast<uint8_t>(g.next_u64() & 0xFF);  // nibble 0 (-8) included
          std::vector<float> s = uniform(g, static_cast<size_t>(N * (K / group)), 0.001, 0.05);
          std::vector<f16> sh(s.size());
          for (size_t i = 0; i < s.size(); ++i) {
            sh[i] = f16(s[i]);
            if (f16_scales) s[i] = sh[i].to_f32();  // the reference takes the scales as stored
          }
          const kernels::Int4Scales sc = f16_scales ? kernels::Int4Scales(sh.data()) : kernels::Int4Scales(s.data());
          std::vector<uint8_t> panels(static_cast<size_t>(kernels::int4_panel_bytes(N, K, group, f16_scales)));
          kernels::int4_pack_panels(N, K, group, q.data(), sc, panels.data());
          // An output row stride past N: the columns between stay untouched.
          const int64_t ldc = N + 3;
          std::vector<float> out(static_cast<size_t>(M * ldc), -7.0f);
          kernels::gemv_int4_panels(M, N, K, group, x.data(), K, panels.data(), f16_scales, out.data(), ldc);
          std::vector<float> dense(static_cast<size_t>(M * N));
          int untouched = 0;
          for (int64_t i = 0; i < M; ++i) {
            for (int64_t j = 0; j < N; ++j) dense[static_cast<size_t>(i * N + j)] = out[static_cast<size_t>(i * ldc + j)];
            for (int64_t j = N; j < ldc && i + 1 < M; ++j) untouched += out[static_cast<size_t>(i * ldc + j)] == -7.0f;
          }
          INFO("threads " << threads << " M " << M << " N " << N << " K " << K << " group " << group << " f16 "
                          << f16_scales);
          CHECK(untouched == (M - 1) * 3);
          CHECK(mismatches(blockwise_q8_rows(x, M, K), q, s, M, N, K, group, dense) == 0);
          ++checked;
        }
  }
  set_num_threads(saved);
  CHECK(checked == 2 * 5 * 2 * 5 - 4);

  // A row's result does not depend on the number of rows (batch-invariant): 9 rows at once
  // against each row alone, bit for bit.
  const int64_t M = 9, N = 19, K = 128, group = 64;
  const std::vector<float> x = uniform(g, static_cast<size_t>(M * K), -1, 1);
  std::vector<uint8_t> q(static_cast<size_t>(N * K / 2));
  for (uint8_t& v : q) v = static_cast<uint8_t>(g.next_u64() & 0xFF);
  const std::vector<float> s = uniform(g, static_cast<size_t>(N * (K / group)), 0.01, 0.02);
  std::vector<uint8_t> panels(static_cast<size_t>(kernels::int4_panel_bytes(N, K, group, false)));
  kernels::int4_pack_panels(N, K, group, q.data(), s.data(), panels.data());
  std::vector<float> all(static_cast<size_t>(M * N)), one(static_cast<size_t>(N));
  kernels::gemv_int4_panels(M, N, K, group, x.data(), K, panels.data(), false, all.data(), N);
  int differ = 0;
  for (int64_t i = 0; i < M; ++i) {
    kernels::gemv_int4_panels(1, N, K, group, x.data() + i * K, K, panels.data(), false, one.data(), N);
    for (int64_t j = 0; j < N; ++j) differ += all[static_cast<size_t>(i * N + j)] != one[static_cast<size_t>(j)];
  }
  CHECK(differ == 0);
}

// linear_int4 of x [M, K] by w, checked against the naive product.
int op_mismatches(const Tensor& x, const Int4Weight& w) {
  const int64_t M = x.shape()[0], K = x.shape()[1], N = w.q.shape()[0];
  const std::vector<float> out = linear_int4(x, w).to_vector<float>();
  const std::vector<float> s = w.scale.to(DType::f32).to_vector<float>();
  return mismatches(int4_rows_as_seen(x.to_vector<float>(), M, K), w.q.to_vector<uint8_t>(), s, M, N, K, w.group, out);
}

TEST_CASE("linear_int4: the cache of repacked weights follows writes, frees and its budget",
          "[quant][gemv][int4panel]") {
  if (!kernels::int4_panel_supported(32, 32)) {
    WARN("no AVX-512 VNNI: the panel kernel is not used here");
    return;
  }
  struct CapScope {
    ~CapScope() { ops::set_int4_repack_cap_mb(-1); }
  } restore;
  ops::set_int4_repack_cap_mb(64);
  const int64_t N = 40, K = 256;
  const Tensor x = randn({3, K});
  const ops::Int4RepackStats before = ops::int4_repack_stats();
  const int64_t bytes = kernels::int4_panel_bytes(N, K, 32, true);
  {
    Int4Weight w = quantize_int4(randn({N, K}), 32, DType::f16);
    CHECK(op_mismatches(x, w) == 0);
    ops::Int4RepackStats st = ops::int4_repack_stats();
    CHECK(st.entries == before.entries + 1);
    CHECK(st.bytes == before.bytes + bytes);
    CHECK(op_mismatches(x, w) == 0);  // from the cache
    CHECK(ops::int4_repack_stats().entries == before.entries + 1);

    // In-place writes to the weight and to its scales (version bumps): the new values are used.
    const Int4Weight other = quantize_int4(randn({N, K}), 32, DType::f16);
    w.q.copy_(other.q);
    CHECK(op_mismatches(x, w) == 0);
    w.scale.mul_(Scalar(-2.0));
    CHECK(op_mismatches(x, w) == 0);
    st = ops::int4_repack_stats();
    CHECK(st.entries == before.entries + 1);  // replaced, not added
    CHECK(st.bytes == before.bytes + bytes);

    // A view of rows of the weight (another offset, another shape): its own entry.
    Int4Weight rows{w.q.narrow(0, 16, 16), w.scale.narrow(0, 16, 16), 32};
    CHECK(op_mismatches(x, rows) == 0);
    CHECK(ops::int4_repack_stats().entries == before.entries + 2);
  }
  // The weight died: its entries are dropped.
  ops::Int4RepackStats st = ops::int4_repack_stats();
  CHECK(st.entries == before.entries);
  CHECK(st.bytes == before.bytes);

  // Several threads' first products of one weight at once: right answers, one entry.
  {
    const Int4Weight w = quantize_int4(randn({N, K}), 32, DType::f16);
    std::vector<Tensor> xs;
    for (int t = 0; t < 4; ++t) xs.push_back(randn({1 + t, K}));
    std::array<int, 4> bad{};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&, t] { bad[static_cast<size_t>(t)] = op_mismatches(xs[static_cast<size_t>(t)], w); });
    for (std::thread& t : threads) t.join();
    CHECK(bad == std::array<int, 4>{});
    CHECK(ops::int4_repack_stats().entries == before.entries + 1);
  }

  // Scales cast on every call (bf16): seen as transient after one miss, not kept.
  {
    Int4Weight w = quantize_int4(randn({N, K}), 32);
    w.scale = w.scale.to(DType::bf16);
    for (int i = 0; i < 3; ++i) CHECK(op_mismatches(x, w) == 0);
    st = ops::int4_repack_stats();
    CHECK(st.entries == before.entries);
    CHECK(st.bytes == before.bytes);
  }

  // Budget 0: nothing cached (entries dropped), the in-place kernel, the same answers.
  const Int4Weight w = quantize_int4(randn({N, K}), 128);
  CHECK(op_mismatches(x, w) == 0);
  CHECK(ops::int4_repack_stats().entries == before.entries + 1);
  const std::vector<float> cached = linear_int4(x, w).to_vector<float>();
  ops::set_int4_repack_cap_mb(0);
  st = ops::int4_repack_stats();
  CHECK(st.entries == 0);
  CHECK(st.bytes == 0);
  CHECK(op_mismatches(x, w) == 0);
  CHECK(ops::int4_repack_stats().entries == 0);
  const std::vector<float> in_place = linear_int4(x, w).to_vector<float>();
  double worst = 0;
  for (size_t i = 0; i < cached.size(); ++i) worst = std::max(worst, std::fabs(double{cached[i]} - in_place[i]));
  CHECK(worst < 1e-4);

  // A budget smaller than the weight (1 MB of nibbles and its scales): not cached, still right.
  ops::set_int4_repack_cap_mb(1);
  const Int4Weight big = quantize_int4(randn({1024, 2048}), 32);
  CHECK(op_mismatches(randn({1, 2048}), big) == 0);
  CHECK(ops::int4_repack_stats().entries == 0);
}

}  // namespace
}  // namespace tpu::testing
