// Matmul and linear on the MXUs of the tiny chip: ragged M/N/K (not multiples of the 8x8 array
// or of the tiles), K accumulation in f32, shapes that need K chunks to fit VMEM, transposed
// operands, batched matmul, bf16 and f32 inputs.
#include "codegen_testing.h"

namespace tpu::testing {
namespace {


// bf16 MXU inputs are rounded to bf16: error grows like sqrt(K) * 2^-8 * |a||b|.
Tol mm_tol(DType dt, int64_t k) {
  if (dt == DType::bf16) return {0.05 * std::sqrt(double(k)), 2e-2};
  return {1e-5 * std::sqrt(double(k)) * 4, 1e-5};
}

}  // namespace

TEST_CASE("codegen: ragged matmul shapes on the tiny chip's MXUs", "[codegen]") {
  TinySim tiny;
  const Device d = tiny.dev();
  Generator g(21);
  struct Case {
    int64_t m, n, k;
  };
  for (Case c : {Case{1, 1, 1}, Case{3, 5, 7}, Case{8, 8, 8}, Case{9, 17, 13}, Case{33, 20, 40}, Case{64, 48, 72}}) {
    for (DType dt : {DType::f32, DType::bf16}) {
      Tensor a = rnd(g, {c.m, c.k}, dt), b = rnd(g, {c.k, c.n}, dt);
      ChipRunProbe probe;
      Tensor got = tpu::matmul(a.to(d), b.to(d));
      CHECK(probe.new_runs() >= 1);
      CHECK(probe.new_fallbacks() == 0);
      check_close(got, ref_of(tpu::matmul(a.to(DType::f32), b.to(DType::f32))), mm_tol(dt, c.k),
                  fmt::format("matmul {}x{}x{} {}", c.m, c.n, c.k, dtype_name(dt)));
    }
  }
}

TEST_CASE("codegen: linear with bias, transposed weights, batched matmul", "[codegen]") {
  TinySim tiny;
  const Device d = tiny.dev();
  Generator g(22);
  Tensor x = rnd(g, {2, 5, 24}), w = rnd(g, {19, 24}), bias = rnd(g, {19});
  ChipRunProbe probe;
  check_close(tpu::linear(x.to(d), w.to(d), bias.to(d)), ref_of(tpu::linear(x, w, bias)), mm_tol(DType::f32, 24),
              "linear");
  Tensor wt = rnd(g, {24, 19});
  check_close(tpu::matmul(x.to(d), wt.to(d)), ref_of(tpu::matmul(x, wt)), mm_tol(DType::f32, 24), "folded batch");
  Tensor q = rnd(g, {3, 10, 16}), k = rnd(g, {3, 12, 16});
  check_close(tpu::matmul(q.to(d), k.to(d).transpose(1, 2)), ref_of(tpu::matmul(q, k.transpose(1, 2))),
              mm_tol(DType::f32, 16), "batched q k^T (transposed view read directly)");
  CHECK(probe.new_fallbacks() == 0);
}

TEST_CASE("codegen: a matmul larger than the tiny chip's VMEM tiles M, N and K", "[codegen]") {
  TinySim tiny;
  const Device d = tiny.dev();
  Generator g(23);
  // A 100x600 and B 600x70 in f32 (240 KiB + 168 KiB) cannot sit in 256 KiB of VMEM at once.
  Tensor a = rnd(g, {100, 600}), b = rnd(g, {600, 70});
  ChipRunProbe probe;
  Tensor got = tpu::matmul(a.to(d), b.to(d));
  CHECK(probe.new_fallbacks() == 0);
  CHECK(probe.new_cycles() > 0);
  check_close(got, ref_of(tpu::matmul(a, b)), mm_tol(DType::f32, 600), "tiled matmul");
  const codegen::MatmulTiling t = codegen::choose_matmul_tiling(
      device::sim_device(1).config(), codegen::MatmulSpec{.m = 100, .n = 70, .k = 600});
  CHECK(t.tk < 600);
}


TEST_CASE("codegen: a panel narrower than the MXUs splits its rows over all of them", "[codegen]") {
  {  // Values: on the tiny chip (two 8-wide MXUs) N <= 8 with M >= 16 takes the row split.
    TinySim tiny;
    const Device d = tiny.dev();
    Generator g(24);
    for (auto [m, n, k] : {std::array<int64_t, 3>{16, 8, 8}, {40, 5, 24}, {37, 8, 19}, {64, 3, 40}}) {
      for (DType dt : {DType::f32, DType::bf16}) {
        Tensor a = rnd(g, {m, k}, dt), b = rnd(g, {k, n}, dt), bt = rnd(g, {n, k}, dt);
        ChipRunProbe probe;
        check_close(tpu::matmul(a.to(d), b.to(d)), ref_of(tpu::matmul(a.to(DType::f32), b.to(DType::f32))),
                    mm_tol(dt, k), fmt::format("narrow matmul {}x{}x{} {}", m, n, k, dtype_name(dt)));
        check_close(tpu::matmul(a.to(d), bt.to(d).t()), ref_of(tpu::matmul(a.to(DType::f32), bt.to(DType::f32).t())),
                    mm_tol(dt, k), fmt::format("narrow matmul, transposed B, {}x{}x{}", m, n, k));
        CHECK(probe.new_fallbacks() == 0);
      }
    }
  }
  // Cycles, on the v5e preset's ideal (event timeline) model: N = 128 is one column tile of four
  // MXUs. On one MXU the rows alone would stream for m * k / 128 cycles; spread over four the
  // matmul must take clearly less.
  const SimChip1 v5e("v5e-ideal");
  const Device d = v5e.dev();
  const int64_t m = 2048, n = 128, k = 1024;
  Tensor a = tpu::zeros({m, k}, {DType::bf16, d}), b = tpu::zeros({k, n}, {DType::bf16, d});
  (void)tpu::matmul(a, b);  // builds the program
  ChipRunProbe probe;
  (void)tpu::matmul(a, b);
  const double one_mxu = double(m) * double(k) / 128;
  INFO("cycles " << probe.new_cycles() << ", one MXU streaming alone " << one_mxu);
  CHECK(probe.new_cycles() < 0.8 * one_mxu);
}

// A row's product does not depend on the rows multiplied with it (a serving step's other
// requests): the MXU sums every output along K in one order whatever the number of LHS rows,
// in each f32 precision (one, three and six bf16 passes) and with bf16 inputs, on the tiny
// chip's 8 x 8 arrays and on v5e's 128 x 128 ones.
TEST_CASE("codegen: a matmul row's bits do not depend on how many rows are multiplied with it", "[codegen]") {
  const KeepPrecision keep;
  Generator g(29);
  for (const char* preset : {"tiny", "v5e"}) {
    const SimChip1 chip(preset);
    const Device d = chip.dev();
    for (const char* precision : {"default", "high", "highest"}) {
      set_float32_matmul_precision(precision);
      for (DType dt : {DType::f32, DType::bf16})
        for (int64_t k : {8, 130, 300}) {
          Tensor a = randn({40, k}, TensorOptions(dt), &g), b = randn({k, 48}, TensorOptions(dt), &g);
          const std::vector<float> all = tpu::matmul(a.to(d), b.to(d)).to(DType::f32).to(Device()).to_vector<float>();
          for (int64_t m : {1, 2, 5, 17}) {
            const std::vector<float> some =
                tpu::matmul(a.narrow(0, 0, m).to(d), b.to(d)).to(DType::f32).to(Device()).to_vector<float>();
            INFO(preset << ", precision " << precision << ", " << dtype_name(dt) << ", k " << k << ", rows " << m);
            CHECK(std::equal(some.begin(), some.end(), all.begin()));
          }
        }
    }
  }
}

}  // namespace tpu::testing
