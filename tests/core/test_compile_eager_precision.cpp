// CompileOptions::emulate_precision_casts: compiled bf16 graphs (norms, attention, MLPs) give
// eager's results bit for bit on the cpu and on sim (the tiny chip), with their fused kernels
// still running; the option is part of the compile cache key.
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "codegen/cache_update.h"
#include "codegen/cached_attention.h"
#include "codegen_testing.h"
#include "graph/printer.h"
#include "jit_testing.h"

namespace tpu::testing {
namespace {

using Fn = std::function<Tensor(const Tensor&)>;

// Bitwise equality of two tensors of one dtype (bf16 values compared as their 16-bit patterns),
// naming the first element that differs.
void expect_bits_equal(const Tensor& got, const Tensor& want, const std::string& what) {
  INFO(what);
  REQUIRE(got.shape() == want.shape());
  REQUIRE(got.dtype() == want.dtype());
  const Tensor a = got.to("cpu").contiguous(), b = want.to("cpu").contiguous();
  const size_t n = static_cast<size_t>(a.numel()), es = a.nbytes() / std::max<size_t>(n, 1);
  const auto* pa = static_cast<const unsigned char*>(a.raw_data());
  const auto* pb = static_cast<const unsigned char*>(b.raw_data());
  size_t bad = 0, first = n;
  for (size_t i = 0; i < n; ++i)
    if (std::memcmp(pa + i * es, pb + i * es, es) != 0) {
      if (first == n) first = i;
      ++bad;
    }
  if (bad) {
    const std::vector<float> fa = a.to(DType::f32).to_vector<float>(), fb = b.to(DType::f32).to_vector<float>();
    FAIL_CHECK(bad << " of " << n << " elements differ; first " << first << ": compiled " << fa[first] << ", eager "
                   << fb[first]);
  } else {
    SUCCEED();
  }
}

Tensor rnd_bf16(const Shape& s, uint64_t seed, const Device& d, double scale = 1.0) {
  return (jit_testing::rnd(s, seed) * scale).to(DType::bf16).to(d);
}

// Runs fn eagerly and compiled with the option (twice: the trace and a cached run) and
// compares bit for bit; compiled without the option it only has to be close.
void check_eager_equal(const std::string& name, const Fn& fn, const Tensor& x) {
  const Tensor eager = fn(x);
  auto on = tpu::compile(fn, {.name = name + ":emulate", .emulate_precision_casts = 1});
  (void)on(x);
  expect_bits_equal(on(x), eager, name + " compiled with emulate_precision_casts vs eager on " + x.device().str());
  auto off = tpu::compile(fn, {.name = name + ":fast", .emulate_precision_casts = 0});
  (void)off(x);
  jit_testing::expect_close(off(x).to("cpu").to(DType::f32), eager.to("cpu").to(DType::f32), 5e-2, 5e-2,
                            name + " compiled without the option stays close to eager");
}

// The graphs, built on device d.
struct Graphs {
  Device d;
  int64_t H = 32;
  Tensor w, b, w1, b1, w2, b2, w3;
  explicit Graphs(Device dev) : d(dev) {
    w = rnd_bf16({H}, 21, d);
    b = rnd_bf16({H}, 22, d);
    w1 = rnd_bf16({64, H}, 23, d, 0.2);
    b1 = rnd_bf16({64}, 24, d);
    w2 = rnd_bf16({H, 64}, 25, d, 0.2);
    b2 = rnd_bf16({H}, 26, d);
    w3 = rnd_bf16({64, H}, 27, d, 0.2);
  }
  // rms_norm as the op, with a residual and a weight product after it.
  Fn rms_op() const {
    return [this](const Tensor& x) { return x + tpu::rms_norm(x * 1.5, Shape{H}, w, 1e-6) * x; };
  }
  // rms_norm written out as Llama does: f32 statistics, then back to bf16 and the weight.
  Fn rms_hand() const {
    return [this](const Tensor& x) {
      const Tensor xf = x.to(DType::f32);
      const Tensor r = tpu::rsqrt(tpu::mean(xf * xf, {-1}, true) + 1e-6);
      return (xf * r).to(DType::bf16) * w;
    };
  }
  Fn layer_norm_gelu() const {
    return [this](const Tensor& x) { return tpu::gelu(tpu::layer_norm(x + b, Shape{H}, w, b)) * 0.5; };
  }
  // Softmax attention written out (scores, scale, mask, softmax, values) and as the fused op.
  Fn attention_hand() const {
    return [this](const Tensor& q) {
      const Tensor k = q * 0.75 + b, v = q - b;
      const Tensor s = tpu::matmul(q, k.transpose(-2, -1)) * 0.125;
      const Tensor keep = tpu::tril(tpu::ones({q.size(-2), q.size(-2)}, TensorOptions(DType::boolean, d)));
      const Tensor p = tpu::softmax(tpu::where(keep, s, -1e4), -1);
      return tpu::matmul(p, v) + q;
    };
  }
  Fn attention_op() const {
    return [this](const Tensor& q) {
      const Tensor k = q * 0.75 + b, v = q - b;
      return tpu::scaled_dot_product_attention(q, k, v, {}, true) * 2.0 + q;
    };
  }
  // Llama's SwiGLU MLP and a GPT-style gelu MLP with biases and a residual.
  Fn mlp_silu() const {
    return [this](const Tensor& x) {
      return x + tpu::linear(tpu::silu(tpu::linear(x, w1)) * tpu::linear(x, w3), w2);
    };
  }
  Fn mlp_gelu() const {
    return [this](const Tensor& x) { return x + tpu::linear(tpu::gelu(tpu::linear(x, w1, b1), true), w2, b2); };
  }
};

void run_all(const Device& d) {
  const Graphs gr(d);
  const Tensor x = rnd_bf16({2, 5, gr.H}, 31, d);
  SECTION("rms_norm op") { check_eager_equal("prec_rms_op", gr.rms_op(), x); }
  SECTION("rms_norm by hand") { check_eager_equal("prec_rms_hand", gr.rms_hand(), x); }
  SECTION("layer_norm and gelu") { check_eager_equal("prec_ln_gelu", gr.layer_norm_gelu(), x); }
  SECTION("softmax attention by hand") {
    check_eager_equal("prec_attn_hand", gr.attention_hand(), rnd_bf16({2, 3, 6, gr.H}, 32, d));
  }
  SECTION("scaled_dot_product_attention") {
    check_eager_equal("prec_attn_op", gr.attention_op(), rnd_bf16({2, 3, 6, gr.H}, 33, d));
  }
  SECTION("SwiGLU MLP") { check_eager_equal("prec_mlp_silu", gr.mlp_silu(), x); }
  SECTION("gelu MLP") { check_eager_equal("prec_mlp_gelu", gr.mlp_gelu(), x); }
}

}  // namespace

TEST_CASE("compile: emulate_precision_casts gives eager's bf16 results bit for bit on the cpu", "[jit][precision]") {
  run_all(Device("cpu"));
}

TEST_CASE("compile: emulate_precision_casts gives eager's bf16 results bit for bit on sim", "[jit][precision][codegen]") {
  TinySim tiny;
  run_all(tiny.dev());
}

TEST_CASE("compile: under emulate_precision_casts the fused chip kernels still run", "[jit][precision][codegen]") {
  TinySim tiny;
  const Graphs gr(tiny.dev());
  const Tensor x = rnd_bf16({2, 5, gr.H}, 41, tiny.dev());
  auto rows = tpu::compile(gr.rms_op(), {.name = "prec_rows_kernel", .emulate_precision_casts = 1});
  auto mlp = tpu::compile(gr.mlp_gelu(), {.name = "prec_mlp_kernel", .emulate_precision_casts = 1});
  (void)rows(x);
  (void)mlp(x);
  auto count = [](const char* k) { return codegen::stats().runs_by_kernel[k]; };
  const uint64_t rw = count("region:rowwise"), mm = count("region:matmul") + count("region:mlp");
  ChipRunProbe probe;
  (void)rows(x);
  CHECK(count("region:rowwise") == rw + 1);  // the norm with its prologue and epilogue: one program
  CHECK(probe.new_runs() == 1);
  (void)mlp(x);
  CHECK(count("region:matmul") + count("region:mlp") > mm);
  CHECK(probe.new_fallbacks() == 0);
}

// The one-program kv_cache_attention kernel steps through the keys in blocks chosen from the
// cache's capacity, eager's attention kernel in blocks chosen from the live length: their f32
// sums differ in the last bits (visible with f32 caches; bf16 outputs round most of it away).
TEST_CASE("compile: under emulate_precision_casts kv_cache_attention is eager's attention over the live keys",
          "[jit][precision][codegen]") {
  TinySim tiny;
  const Device d = tiny.dev();
  for (DType dt : {DType::bf16, DType::f32}) {
    const Tensor q = rnd_bf16({2, 4, 1, 16}, 61, d).to(dt), kc = rnd_bf16({2, 2, 256, 16}, 62, d, 3.0).to(dt),
                 vc = rnd_bf16({2, 2, 256, 16}, 63, d).to(dt);
    auto f = tpu::compile(
        [&](const Tensor& qq, const Tensor& p) { return codegen::kv_cache_attention(qq, kc, vc, p, {}, 0.25); },
        {.name = "prec_kv_attention", .emulate_precision_casts = 1});
    for (int64_t pos : {0, 31, 100, 255}) {
      const Tensor eager = tpu::scaled_dot_product_attention(q, kc.narrow(2, 0, pos + 1), vc.narrow(2, 0, pos + 1), {},
                                                             false, 0.25);
      const Tensor p = codegen::position_tensor(pos, d);
      expect_bits_equal(f(q, p), eager,
                        fmt::format("kv_cache_attention, {} caches, position {}", dtype_name(dt), pos));
    }
  }
}

TEST_CASE("compile: emulate_precision_casts is part of the cache key", "[jit][precision]") {
  const bool before = jit::emulate_precision_casts();
  struct Restore {
    bool v;
    ~Restore() { jit::set_emulate_precision_casts(v); }
  } restore{before};
  const Tensor x = rnd_bf16({4, 8}, 51, Device("cpu"));
  auto f = tpu::compile([](const Tensor& t) { return tpu::gelu(t * 3.0) + t; }, {.name = "prec_key"});
  jit::set_emulate_precision_casts(false);
  (void)f(x);
  jit::set_emulate_precision_casts(true);
  (void)f(x);
  (void)f(x);
  jit::set_emulate_precision_casts(false);
  (void)f(x);
  const jit::FunctionStats& s = jit_testing::stats_of("prec_key");
  CHECK(s.compiles == 2);
  CHECK(s.hits == 2);
  REQUIRE(s.reasons.size() == 2);
  CHECK(s.reasons[1] == "emulate_precision_casts off -> on");
  CHECK_THROWS_WITH(tpu::compile([](const Tensor& t) { return t; }, {.emulate_precision_casts = 2})(x),
                    Catch::Contains("emulate_precision_casts must be 1 (on), 0 (off) or -1"));
}

TEST_CASE("compile: the emulate_precision_casts flag of a graph is in its hash and its JSON", "[jit][precision]") {
  graph::Graph g;
  const graph::ValueId in = g.add_input({Shape{3}, DType::bf16, Device("cpu")});
  g.outputs.push_back(in);
  const uint64_t plain = graph::structural_hash(g);
  CHECK_FALSE(graph::from_json(graph::to_json(g)).emulate_precision_casts);
  g.emulate_precision_casts = true;
  CHECK(graph::structural_hash(g) != plain);
  const graph::Graph back = graph::from_json(graph::to_json(g));
  CHECK(back.emulate_precision_casts);
  CHECK(graph::structural_hash(back) == graph::structural_hash(g));
}

}  // namespace tpu::testing
