// Decode attention on the simulated chip (tiny preset): one query per sequence over a grouped KV
// cache runs as "decode_attention" (the group's query heads folded into query rows), checked
// against a naive loop in double, with and without a padding mask, over cache views narrowed
// from a larger cache and queries split out of a projection; the cache is read from HBM once per
// step (not once per query head); a mask that differs inside a group keeps the per-head kernel.
#include <cmath>

#include "codegen_testing.h"
#include "tpucore/ops.h"

namespace tpu::testing {
namespace {

// q [B, H, 1, D], k/v [B, Hk, S, D] (any views), keep [B, S] (empty: all kept); double.
std::vector<double> naive_decode(const Tensor& q, const Tensor& k, const Tensor& v, const std::vector<int>& keep) {
  const auto qv = dvals(contiguous(q.to(DType::f32))), kv = dvals(contiguous(k.to(DType::f32))),
             vv = dvals(contiguous(v.to(DType::f32)));
  const int64_t B = q.size(0), H = q.size(1), D = q.size(3), Hk = k.size(1), S = k.size(2), g = H / Hk;
  const double scale = 1.0 / std::sqrt(double(D));
  std::vector<double> out(size_t(B * H * D));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kh = h / g;
      std::vector<double> p(static_cast<size_t>(S));
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j < S; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < D; ++d)
          dot += qv[size_t((b * H + h) * D + d)] * kv[size_t(((b * Hk + kh) * S + j) * D + d)];
        p[size_t(j)] = (keep.empty() || keep[size_t(b * S + j)]) ? dot * scale : -INFINITY;
        mx = std::max(mx, p[size_t(j)]);
      }
      for (double& x : p) sum += (x = std::exp(x - mx));
      for (int64_t d = 0; d < D; ++d) {
        double acc = 0;
        for (int64_t j = 0; j < S; ++j) acc += p[size_t(j)] / sum * vv[size_t(((b * Hk + kh) * S + j) * D + d)];
        out[size_t((b * H + h) * D + d)] = acc;
      }
    }
  return out;
}

void check_close(const Tensor& got, const std::vector<double>& want, double tol) {
  const auto g = dvals(got.to(Device("cpu")).to(DType::f32));
  REQUIRE(g.size() == want.size());
  int64_t bad = 0;
  for (size_t i = 0; i < g.size(); ++i)
    if (!(std::fabs(g[i] - want[i]) <= tol + tol * std::fabs(want[i]))) ++bad;
  CHECK(bad == 0);
}

uint64_t decode_runs() {
  const codegen::CodegenStats s = codegen::stats();
  auto it = s.runs_by_kernel.find("decode_attention");
  return it == s.runs_by_kernel.end() ? 0 : it->second;
}

}  // namespace

TEST_CASE("decode attention: single query over a grouped cache on the chip matches naive loops", "[attention][codegen][decode]") {
  TinySim tiny;
  const int64_t B = 2, H = 8, Hk = 2, D = 16, cap = 64, S = 45;
  Generator g(31);
  // The cache holds `cap` positions; the step reads the first S (a narrowed view, read in place).
  const Tensor kc = randn({B, Hk, cap, D}, {}, &g), vc = randn({B, Hk, cap, D}, {}, &g);
  // Queries split out of a projection [B, 1, H * D] as the model does (heads one D apart).
  const Tensor x = randn({B, 1, H * D}, {}, &g);
  std::vector<int> keep(size_t(B * S), 1);
  for (int64_t j = 0; j < 7; ++j) keep[size_t(S + j)] = 0;  // row 1 left-padded by 7
  std::vector<float> kf(keep.begin(), keep.end());
  const Tensor mask = from_vector(kf, Shape{B, 1, 1, S}).to(DType::boolean);
  for (DType dt : {DType::f32, DType::bf16})
    for (bool masked : {false, true}) {
      DYNAMIC_SECTION(dtype_name(dt) << (masked ? " masked" : "")) {
        const Tensor kd = kc.to(dt).to(tiny.dev()), vd = vc.to(dt).to(tiny.dev());
        const Tensor k = narrow(kd, 2, 0, S), v = narrow(vd, 2, 0, S);
        const Tensor q = transpose(reshape(x.to(dt).to(tiny.dev()), Shape{B, 1, H, D}), 1, 2);
        ChipRunProbe probe;
        const uint64_t before = decode_runs();
        const Tensor got = scaled_dot_product_attention(q, k, v, masked ? mask.to(tiny.dev()) : Tensor(), false,
                                                        1.0 / std::sqrt(double(D)));
        ChipRunProbe::sync_all();
        CHECK(probe.new_fallbacks() == 0);
        CHECK(decode_runs() == before + 1);
        CHECK(got.shape() == Shape({B, H, 1, D}));
        const auto want = naive_decode(q.to(Device("cpu")), k.to(Device("cpu")), v.to(Device("cpu")),
                                       masked ? keep : std::vector<int>{});
        check_close(got, want, dt == DType::f32 ? 2e-5 : 2e-2);
      }
    }
}

TEST_CASE("decode attention: the cache is read once per step, not once per query head", "[attention][codegen][decode]") {
  TinySim tiny;
  const int64_t B = 1, H = 8, Hk = 2, D = 16, S = 128;
  const Tensor q = randn({B, H, 1, D}).to(DType::bf16).to(tiny.dev());
  const Tensor k = randn({B, Hk, S, D}).to(DType::bf16).to(tiny.dev());
  const Tensor v = randn({B, Hk, S, D}).to(DType::bf16).to(tiny.dev());
  ChipRunProbe::sync_all();
  codegen::reset_stats();
  const Tensor o = scaled_dot_product_attention(q, k, v);
  ChipRunProbe::sync_all();
  const codegen::CodegenStats s = codegen::stats();
  const uint64_t kv_bytes = uint64_t(2 * B * Hk * S * D * 2), qo_bytes = uint64_t(2 * B * H * D * 2);
  INFO("HBM bytes " << s.hbm_bytes << ", cache " << kv_bytes);
  CHECK(s.runs_by_kernel.count("decode_attention") == 1);
  CHECK(s.hbm_bytes >= kv_bytes + qo_bytes);
  // Per query head the cache would be read H / Hk = 4 times.
  CHECK(double(s.hbm_bytes) <= 1.1 * double(kv_bytes + qo_bytes));
}

TEST_CASE("decode attention: a mask that differs inside a group keeps the per-head kernel", "[attention][codegen][decode]") {
  TinySim tiny;
  const int64_t B = 1, H = 4, Hk = 2, D = 8, S = 20;
  Generator g(3);
  const Tensor q = randn({B, H, 1, D}, {}, &g), k = randn({B, Hk, S, D}, {}, &g), v = randn({B, Hk, S, D}, {}, &g);
  std::vector<float> m(size_t(H * S), 1.0f);
  for (int64_t j = 0; j < 5; ++j) m[size_t(S + j)] = 0;  // head 1 only
  const Tensor mask = from_vector(m, Shape{B, H, 1, S}).to(DType::boolean);
  ChipRunProbe probe;
  const uint64_t before = decode_runs();
  const Tensor got = scaled_dot_product_attention(q.to(tiny.dev()), k.to(tiny.dev()), v.to(tiny.dev()),
                                                  mask.to(tiny.dev()));
  ChipRunProbe::sync_all();
  CHECK(decode_runs() == before);
  CHECK(probe.new_fallbacks() == 0);
  const Tensor want = scaled_dot_product_attention(q, k, v, mask);  // the cpu kernel
  check_close(got, dvals(want), 2e-5);
}

}  // namespace tpu::testing
