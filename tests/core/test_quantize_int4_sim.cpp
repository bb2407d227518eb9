// linear_int4 on the simulated chip (codegen/quantized_linear.cpp, MatmulSpec::b_int4_group): the
// product against a naive loop over weights decoded here from the documented packing (x rounded
// to bf16 as the default f32 matmul precision does; with more rows than half a group each
// dequantized weight rounded to bf16 too, as the kernel's VMEM panel holds it, with fewer the
// exact q s, which the kernel applies per group after the MXUs), with no host fallback, eager and
// compiled, and the HBM traffic of the program in closed form (the weights read packed).
#include <cmath>
#include <cstring>
#include <iterator>

#include "codegen_testing.h"
#include "codegen/precision.h"
#include "sim/chip.h"
#include "sim/presets.h"
#include "testing.h"
#include "llm_reference.h"
#include "tpucore/compile.h"
#include "tpucore/models/causal_lm.h"
#include "tpucore/quantize.h"

namespace tpu::testing {
namespace {

std::vector<float> q4s_random(Generator& g, size_t n, double lo, double hi) {
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(lo + (hi - lo) * g.next_double());
  return v;
}

// The f32 matmul precision at "default" (x rounded to bf16, one pass) for the scope of a test.
struct Int4DefaultPrecision {
  std::string prev = float32_matmul_precision();
  Int4DefaultPrecision() { set_float32_matmul_precision("default"); }
  ~Int4DefaultPrecision() { set_float32_matmul_precision(prev); }
};

// The chip's product, naive in double: Wd[j, k] = bf16(f32(nibble - 8) * scale) (round_w; else
// (nibble - 8) * scale exactly), the nibble read from the layout of ops/cpu/kernels/gemv_int4.h
// (byte 16 (k / 32) + k % 16, low nibble for k % 32 < 16), x rounded to bf16. `mag` sums |x w|
// for the accumulation tolerance. The chip rounds the weights when M > group / 2.
void int4_chip_ref(const std::vector<float>& x, const std::vector<uint8_t>& q, const std::vector<float>& s, int64_t M,
                   int64_t N, int64_t K, int64_t group, std::vector<double>& ref, std::vector<double>& mag) {
  const bool round_w = M > group / 2;
  ref.assign(static_cast<size_t>(M * N), 0);
  mag.assign(static_cast<size_t>(M * N), 0);
  for (int64_t j = 0; j < N; ++j)
    for (int64_t k = 0; k < K; ++k) {
      const uint8_t b = q[static_cast<size_t>(j * (K / 2) + (k / 32) * 16 + k % 16)];
      const int v = ((k % 32) < 16 ? (b & 0xF) : (b >> 4)) - 8;
      const double sv = s[static_cast<size_t>(j * (K / group) + k / group)];
      const double w = round_w ? static_cast<double>(static_cast<float>(bf16(static_cast<float>(v) * static_cast<float>(sv))))
                               : v * sv;
      for (int64_t i = 0; i < M; ++i) {
        const double p = static_cast<double>(static_cast<float>(bf16(x[static_cast<size_t>(i * K + k)]))) * w;
        ref[static_cast<size_t>(i * N + j)] += p;
        mag[static_cast<size_t>(i * N + j)] += std::fabs(p);
      }
    }
}

// Random packed bytes (every nibble, 0 = -8 included) and positive group scales, on the host.
struct RandomInt4 {
  std::vector<uint8_t> q;
  std::vector<float> s;
  Tensor tq, ts;
  RandomInt4(Generator& g, int64_t N, int64_t K, int64_t group) : q(static_cast<size_t>(N * K / 2)) {
    for (uint8_t& v : q) v = static_cast<uint8_t>(g.next_u64() & 0xFF);
    s = q4s_random(g, static_cast<size_t>(N * K / group), 0.01, 0.1);
    tq = from_vector(q, {N, K / 2});
    ts = from_vector(s, {N, K / group});
  }
};

TEST_CASE("linear_int4 on the chip: the nibbles unpacked in VMEM against the decode-then-float loop, packed HBM reads",
          "[quant][sim]") {
  Int4DefaultPrecision precision;
  TinySim sim;
  Generator g(41);
  for (const int64_t group : {32, 128})
    for (const int64_t K : {128, 256})
      for (const int64_t N : {5, 17})
        for (const int64_t M : {1, 3, 13, 70}) {
          const RandomInt4 w(g, N, K, group);
          const std::vector<float> xv = q4s_random(g, static_cast<size_t>(M * K), -2, 2);
          const Tensor xd = from_vector(xv, {M, K}).to(sim.dev());
          const Tensor qd = w.tq.to(sim.dev()), sd = w.ts.to(sim.dev());
          ChipRunProbe probe;
          const uint64_t bytes0 = codegen::stats().hbm_bytes;
          const Tensor y = linear_int4(xd, qd, sd);
          ChipRunProbe::sync_all();
          const uint64_t bytes = codegen::stats().hbm_bytes - bytes0;
          const std::vector<float> got = y.to_vector<float>();
          INFO("group " << group << " M " << M << " N " << N << " K " << K);
          CHECK(probe.new_fallbacks() == 0);
          CHECK(probe.new_runs() == 1);
          // x and y in f32, the weight at half a byte per value, one f32 scale per group: every
          // byte once (one block of rows, the whole K in VMEM).
          CHECK(bytes == static_cast<uint64_t>(4 * M * K + N * K / 2 + 4 * N * (K / group) + 4 * M * N));
          std::vector<double> ref, mag;
          int4_chip_ref(xv, w.q, w.s, M, N, K, group, ref, mag);
          int bad = 0;
          for (size_t i = 0; i < ref.size(); ++i) bad += std::fabs(got[i] - ref[i]) > 1e-5 * mag[i] + 1e-30;
          CHECK(bad == 0);
          if (M == 13 && N == 17) {  // bf16 activations: the same product, rounded to bf16
            ChipRunProbe probe_b;
            const Tensor yb = linear_int4(xd.to(DType::bf16), qd, sd);
            CHECK(yb.dtype() == DType::bf16);
            const std::vector<float> gb = yb.to(DType::f32).to_vector<float>();
            CHECK(probe_b.new_fallbacks() == 0);
            bad = 0;
            for (size_t i = 0; i < ref.size(); ++i)
              bad += std::fabs(gb[i] - ref[i]) > std::fabs(ref[i]) * 0x1p-8 + 1e-5 * mag[i] + 1e-30;
            CHECK(bad == 0);
          }
        }
}

// An IEEE half's value from its bits, by the definition (no conversion routine of the library).
double half_value(uint16_t h) {
  const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  const double v = e == 0 ? std::ldexp(double(m), -24) : e == 31 ? (m ? NAN : INFINITY)
                                                                   : std::ldexp(1.0 + m / 1024.0, e - 15);
  return (h & 0x8000) ? -v : v;
}

// The int4 matmul program with f16 group scales (MatmulSpec::b_int4_scale_f16) run on the tiny
// chip: the scales widened to f32 on the vector unit's integer ops. Scales include f16
// subnormals, the largest half, zeros of both signs and negative values; an inf or NaN scale
// makes its output column non-finite.
TEST_CASE("int4 matmul program with f16 group scales: widened exactly in VMEM", "[quant][sim]") {
  const sim::ChipConfig cfg = sim::preset_config("tiny");
  Generator g(53);
  for (const int64_t group : {32, 128})
    for (const bool nonfinite : {false, true})
    for (const int64_t M : {3, 70}) {
      const int64_t N = 17, K = 256;
      const RandomInt4 w(g, N, K, group);
      std::vector<uint16_t> sh(static_cast<size_t>(N * (K / group)));
      const uint16_t edge[] = {0x0001, 0x03FF, 0x0200, 0x7BFF, 0x8000, 0x0000, 0xAE66, 0x8401, 0x0400, 0x3C00};
      for (size_t i = 0; i < sh.size(); ++i)
        sh[i] = i < std::size(edge) ? edge[i] : static_cast<uint16_t>(0x2000 + (g.next_u64() % 0x1000));  // ~0.008..0.06
      if (nonfinite) sh[0] = 0x7C00, sh[static_cast<size_t>(K / group)] = 0x7E01;  // inf in row 0, NaN in row 1
      std::vector<float> sv(sh.size());
      for (size_t i = 0; i < sh.size(); ++i) sv[i] = static_cast<float>(half_value(sh[i]));
      const std::vector<float> xv = q4s_random(g, static_cast<size_t>(M * K), -2, 2);
      codegen::MatmulSpec s;
      s.name = "int4_f16_scales";
      s.m = M;
      s.n = N;
      s.k = K;
      s.b_transposed = true;
      s.b_int4_group = group;
      s.b_int4_scale_f16 = true;
      s.a_dtype = sim::DType::f32;
      s.b_dtype = sim::DType::i8;
      s.out_dtype = sim::DType::f32;
      s.mode = sim::MxuMode::bf16;
      s.epilogue.result = s.epilogue.input(0);
      sim::Chip chip(cfg);
      const int64_t A = 0, Bq = 131072, C = 196608, S = 262144;
      chip.write_hbm(uint64_t(A), xv.data(), xv.size() * 4);
      chip.write_hbm(uint64_t(Bq), w.q.data(), w.q.size());
      chip.write_hbm(uint64_t(S), sh.data(), sh.size() * 2);
      chip.run(codegen::make_matmul_program(cfg, s), {.registers = {A, Bq, C, 0, S}});
      std::vector<float> got(static_cast<size_t>(M * N));
      chip.read_hbm(uint64_t(C), got.data(), got.size() * 4);
      std::vector<double> ref, mag;
      int4_chip_ref(xv, w.q, sv, M, N, K, group, ref, mag);
      int bad = 0;
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          const size_t at = static_cast<size_t>(i * N + j);
          if (nonfinite && j < 2) bad += std::isfinite(got[at]);
          else bad += !(std::fabs(got[at] - ref[at]) <= 1e-5 * mag[at] + 1e-30);
        }
      INFO("group " << group << " M " << M << (nonfinite ? " with inf / NaN scales" : ""));
      CHECK(bad == 0);
    }
}

TEST_CASE("linear_int4 on the chip with the weight cut along K into panels of whole groups", "[quant][sim]") {
  Int4DefaultPrecision precision;
  TinySim sim;
  Generator g(47);
  // A bf16 panel of 16 rows of 8192 (256 KiB) exceeds tiny's VMEM: K is cut into chunks of whole groups.
  const int64_t M = 3, N = 16, K = 8192, group = 128;
  const RandomInt4 w(g, N, K, group);
  const std::vector<float> xv = q4s_random(g, static_cast<size_t>(M * K), -2, 2);
  ChipRunProbe probe;
  const std::vector<float> got =
      linear_int4(from_vector(xv, {M, K}).to(sim.dev()), w.tq.to(sim.dev()), w.ts.to(sim.dev())).to_vector<float>();
  CHECK(probe.new_fallbacks() == 0);
  std::vector<double> ref, mag;
  int4_chip_ref(xv, w.q, w.s, M, N, K, group, ref, mag);
  int bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) bad += std::fabs(got[i] - ref[i]) > 1e-5 * mag[i] + 1e-30;
  CHECK(bad == 0);
}

TEST_CASE("linear_int4 in a compiled function on the chip, and through quantize_int4 of a float weight", "[quant][sim]") {
  Int4DefaultPrecision precision;
  TinySim sim;
  Generator g(43);
  const int64_t M = 6, N = 9, K = 256, group = 128;
  const DType scale_dtype = GENERATE(DType::f32, DType::f16);  // f16: the scales stay f16 on the chip
  INFO("scales " << (scale_dtype == DType::f16 ? "f16" : "f32"));
  const Int4Weight qw =
      quantize_int4(from_vector(q4s_random(g, static_cast<size_t>(N * K), -1, 1), {N, K}), group, scale_dtype);
  CHECK(qw.scale.dtype() == scale_dtype);
  const std::vector<uint8_t> qh = qw.q.to_vector<uint8_t>();
  const std::vector<float> sh = qw.scale.to(DType::f32).to_vector<float>();
  const Tensor q = qw.q.to(sim.dev()), s = qw.scale.to(sim.dev());
  const std::vector<float> xv = q4s_random(g, static_cast<size_t>(M * K), -2, 2);
  auto f = tpu::compile([&](const Tensor& x) { return tpu::relu(linear_int4(x, q, s)); });
  const Tensor xd = from_vector(xv, {M, K}).to(sim.dev());
  (void)f(xd).to_vector<float>();  // traces and compiles
  ChipRunProbe probe;
  const std::vector<float> got = f(xd).to_vector<float>();
  CHECK(probe.new_fallbacks() == 0);
  CHECK(probe.new_runs() >= 1);
  std::vector<double> ref, mag;
  int4_chip_ref(xv, qh, sh, M, N, K, group, ref, mag);
  int bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) bad += std::fabs(got[i] - std::max(ref[i], 0.0)) > 1e-5 * mag[i] + 1e-30;
  CHECK(bad == 0);
}

TEST_CASE("a causal LM loaded with int4 weights on the chip: no host fallback, the cpu model's logits", "[quant][sim]") {
  Int4DefaultPrecision precision;
  TinySim sim;
  const auto dir = llm::temp_dir("quant_int4_sim");
  {
    const std::string cfg = R"({"model_type": "llama", "vocab_size": 64, "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
      "rms_norm_eps": 1e-6, "tie_word_embeddings": false})";
    Generator g(99);
    models::CausalLM m(models::ModelConfig::from_json(cfg), &g);
    models::save_causal_lm(m, dir.string());
  }
  models::LoadOptions o;
  o.quantize = nn::WeightQuant::int4;
  o.group = 32;
  auto host = models::load_causal_lm(dir.string(), o);
  o.device = sim.dev();
  auto chip = models::load_causal_lm(dir.string(), o);
  const Tensor ids = from_vector(std::vector<int64_t>{3, 9, 27, 1, 60}, Shape{1, 5});
  const std::vector<float> want = host->forward(ids).to_vector<float>();
  (void)chip->forward(ids.to(sim.dev())).to_vector<float>();  // builds the programs
  ChipRunProbe probe;
  const codegen::CodegenStats before = codegen::stats();
  const std::vector<float> got = chip->forward(ids.to(sim.dev())).to_vector<float>();
  CHECK(probe.new_fallbacks() == 0);
  // the seven projections of the layer, each one linear_int4 program
  CHECK(codegen::stats().runs_by_kernel["linear_int4"] - before.runs_by_kernel.at("linear_int4") == 7);
  REQUIRE(got.size() == want.size());
  // The chip rounds x and the dequantized weights to bf16 (the cpu keeps them in f32): measured
  // 0.27% of the largest logit.
  double err = 0, mag = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    err = std::max(err, static_cast<double>(std::fabs(got[i] - want[i])));
    mag = std::max(mag, static_cast<double>(std::fabs(want[i])));
  }
  INFO("max |logit difference| " << err << " of max |logit| " << mag);
  CHECK(err < 0.01 * mag);
}

}  // namespace
}  // namespace tpu::testing
