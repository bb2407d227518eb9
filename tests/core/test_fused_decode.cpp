// The fused decoder ops (tpucore/fused_ops.h): OpInfo entries against naive double references
// (run on every device by test_opinfo.cpp), bit-for-bit equality with the op chains they stand
// for on the cpu (f32 / bf16 / f16, strided views), argument errors, and a decoder whose logits
// through the fused ops equal those through the chains.
#include <catch2/catch.hpp>

#include <cfloat>
#include <cmath>
#include <cstring>

#include "core/opinfo.h"
#include "core/testing.h"
#include "tpucore/autograd.h"
#include "tpucore/fused_ops.h"
#include "tpucore/models.h"
#include "tpucore/profiler.h"

namespace tpu::testing {
namespace {

using L = Layout;

double silu_d(double x) { return x / (1.0 + std::exp(-x)); }

std::vector<OpSample> silu_mul_samples(DType dt, Generator& g) {
  auto mk = [&](const Shape& s, L l) { return make_input(g, s, dt, l, -4.0, 4.0); };
  return {
      {"one row of 2048", {mk({1, 1, 2048}, L::contiguous), mk({1, 1, 2048}, L::contiguous)}},
      {"odd size, transposed gate", {mk({5, 37}, L::transposed), mk({5, 37}, L::contiguous)}},
      {"sliced up", {mk({3, 300}, L::contiguous), mk({3, 300}, L::sliced)}},
      {"empty", {mk({0, 4}, L::contiguous), mk({0, 4}, L::contiguous)}},
  };
}

OpInfoRegistrar reg_silu_mul({
    .op = "silu_mul",
    .dtypes = {DType::f32, DType::bf16, DType::f16},
    .samples = silu_mul_samples,
    .run = [](const std::vector<Tensor>& in) { return silu_mul(in[0], in[1]); },
    .reference = [](const std::vector<Ref>& r, DType) {
      return ref_map({r[0], r[1]}, [](const std::vector<double>& a) { return silu_d(a[0]) * a[1]; });
    },
});

// Inputs {x, residual, weight, params[eps_x1e6 (0: default)]}; the run returns [2, ...]: the
// sum stacked over the normed rows.
std::vector<OpSample> add_rms_norm_samples(DType dt, Generator& g) {
  auto mk = [&](const Shape& s, L l, double lo = -3.0, double hi = 3.0) { return make_input(g, s, dt, l, lo, hi); };
  return {
      {"decode row of 768", {mk({1, 1, 768}, L::contiguous), mk({1, 1, 768}, L::contiguous),
                             mk({768}, L::contiguous, 0.5, 2.0), params({0})}},
      {"16 rows, sliced residual, eps 1e-5", {mk({16, 1, 96}, L::contiguous), mk({16, 1, 96}, L::sliced),
                                              mk({96}, L::contiguous, 0.5, 2.0), params({10})}},
      {"odd width, transposed x, sliced weight", {mk({4, 33}, L::transposed), mk({4, 33}, L::contiguous),
                                                  mk({33}, L::sliced, 0.5, 2.0), params({0})}},
      {"no rows", {mk({0, 8}, L::contiguous), mk({0, 8}, L::contiguous), mk({8}, L::contiguous), params({0})}},
  };
}

OpInfoRegistrar reg_add_rms_norm({
    .op = "add_rms_norm",
    .dtypes = {DType::f32, DType::bf16, DType::f16},
    .samples = add_rms_norm_samples,
    .run =
        [](const std::vector<Tensor>& in) {
          const int64_t e = params_of(in[3])[0];
          std::optional<double> eps;
          if (e) eps = static_cast<double>(e) * 1e-6;
          auto [h, y] = add_rms_norm(in[0], in[1], in[2], eps);
          CHECK(h.dtype() == in[0].dtype());
          CHECK(y.dtype() == in[0].dtype());
          return cat({unsqueeze(h, 0), unsqueeze(y, 0)}, 0);
        },
    .reference =
        [](const std::vector<Ref>& r, DType) {
          const int64_t e = params_of(r[3])[0];
          const double eps = e ? static_cast<double>(e) * 1e-6 : static_cast<double>(FLT_EPSILON);
          const Ref &x = r[0], &res = r[1], &w = r[2];
          Shape os{2};
          for (int i = 0; i < x.shape.ndim(); ++i) os.push_back(x.shape[i]);
          Ref out(os);
          const int64_t n = x.shape[x.shape.ndim() - 1], total = x.numel();
          for (int64_t r0 = 0; n > 0 && r0 < total; r0 += n) {
            double ms = 0;
            for (int64_t i = 0; i < n; ++i) {
              const double h = x.v[size_t(r0 + i)] + res.v[size_t(r0 + i)];
              out.v[size_t(r0 + i)] = h;
              ms += h * h;
            }
            const double inv = 1.0 / std::sqrt(ms / static_cast<double>(n) + eps);
            for (int64_t i = 0; i < n; ++i) out.v[size_t(total + r0 + i)] = out.v[size_t(r0 + i)] * inv * w.v[size_t(i)];
          }
          return out;
        },
});

// x cos + rotate_half(x) sin with the tables broadcast to x, naive.
Ref rotary_ref(const Ref& x, const Ref& c, const Ref& s) {
  Ref out(x.shape);
  const int64_t D = x.shape[x.shape.ndim() - 1], h = D / 2;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const std::vector<int64_t> idx = unflatten(x.shape, i);
    std::vector<int64_t> other = idx;
    const int64_t j = idx.back();
    other.back() = j < h ? j + h : j - h;
    const double rot = j < h ? -x.at(other) : x.at(other);
    out.v[size_t(i)] = x.v[size_t(i)] * c.bcast(x.shape, idx) + rot * s.bcast(x.shape, idx);
  }
  return out;
}

// Inputs {q, k, cos, sin}; the run returns q's and k's results flattened one after the other.
OpInfoRegistrar reg_rotary_qk({
    .op = "rotary_embedding_qk",
    .dtypes = {DType::f32, DType::bf16, DType::f16},
    .samples =
        [](DType dt, Generator& g) {
          auto mk = [&](const Shape& s, L l, double lo = -2.0, double hi = 2.0) { return make_input(g, s, dt, l, lo, hi); };
          return std::vector<OpSample>{
              {"decode heads 12 / 4 of 64, tables per sequence",
               {mk({2, 12, 1, 64}, L::sliced), mk({2, 4, 1, 64}, L::transposed), mk({2, 1, 1, 64}, L::contiguous, -1, 1),
                mk({2, 1, 1, 64}, L::contiguous, -1, 1)}},
              {"prefill, tables per position", {mk({1, 4, 5, 8}, L::contiguous), mk({1, 2, 5, 8}, L::contiguous),
                                                mk({5, 8}, L::contiguous, -1, 1), mk({5, 8}, L::contiguous, -1, 1)}},
              {"no keys", {mk({1, 2, 0, 6}, L::contiguous), mk({1, 1, 0, 6}, L::contiguous), mk({6}, L::contiguous),
                           mk({6}, L::contiguous)}},
          };
        },
    .run =
        [](const std::vector<Tensor>& in) {
          auto [q, k] = rotary_embedding_qk(in[0], in[1], in[2], in[3]);
          return cat({reshape(q, Shape{q.numel()}), reshape(k, Shape{k.numel()})}, 0);
        },
    .reference =
        [](const std::vector<Ref>& r, DType) {
          const Ref q = rotary_ref(r[0], r[2], r[3]), k = rotary_ref(r[1], r[2], r[3]);
          Ref out(Shape{q.numel() + k.numel()});
          std::copy(q.v.begin(), q.v.end(), out.v.begin());
          std::copy(k.v.begin(), k.v.end(), out.v.begin() + q.numel());
          return out;
        },
});

bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor x = a.contiguous(), y = b.contiguous();
  return x.shape() == y.shape() && x.dtype() == y.dtype() &&
         std::memcmp(x.raw_data(), y.raw_data(), static_cast<size_t>(x.numel()) * x.element_size()) == 0;
}

}  // namespace

TEST_CASE("fused decode ops: bit for bit the op chains on the cpu", "[fused]") {
  Generator g(11);
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    INFO("dtype " << dtype_name(dt));
    for (L lay : {L::contiguous, L::transposed, L::sliced}) {
      INFO("layout " << layout_name(lay));
      const Tensor gate = make_input(g, {6, 130}, dt, lay, -6.0, 6.0), up = make_input(g, {6, 130}, dt, L::contiguous);
      CHECK(same_bits(silu_mul(gate, up), mul(silu(gate), up)));
      const Tensor q = make_input(g, {2, 6, 3, 16}, dt, lay), k = make_input(g, {2, 2, 3, 16}, dt, L::sliced);
      const Tensor c = make_input(g, {2, 1, 3, 16}, dt, L::contiguous), s = make_input(g, {3, 16}, dt, L::contiguous);
      auto [qr, kr] = rotary_embedding_qk(q, k, c, s);
      CHECK(same_bits(qr, rotary_embedding(q, c, s)));
      CHECK(same_bits(kr, rotary_embedding(k, c, s)));
      const Tensor x = make_input(g, {3, 2, 70}, dt, lay), r = make_input(g, {3, 2, 70}, dt, L::sliced);
      const Tensor w = make_input(g, {70}, dt, L::contiguous, 0.5, 2.0);
      for (std::optional<double> eps : {std::optional<double>{}, std::optional<double>{1e-5}}) {
        auto [h, y] = add_rms_norm(x, r, w, eps);
        const Tensor h_chain = add(x, r);
        CHECK(same_bits(h, h_chain));
        CHECK(same_bits(y, rms_norm(h_chain, Shape{70}, w, eps)));
      }
    }
  }
}

TEST_CASE("fused decode ops: bad arguments are tpu::Errors naming the op", "[fused]") {
  expect_error([] { silu_mul(ones({2, 3}), ones({3, 2})); }, {"silu_mul", "[2, 3]", "[3, 2]"});
  expect_error([] { silu_mul(ones({2}), ones({2}, TensorOptions(DType::bf16))); }, {"silu_mul", "dtype"});
  expect_error([] { silu_mul(ones({2}, TensorOptions(DType::i32)), ones({2}, TensorOptions(DType::i32))); },
               {"silu_mul", "floating"});
  expect_error([] { rotary_embedding_qk(ones({2, 8}), ones({2, 6}), ones({8}), ones({8})); },
               {"rotary_embedding_qk", "[8]", "[2, 6]"});
  expect_error([] { add_rms_norm(ones({2, 4}), ones({2, 4}), ones({3})); }, {"add_rms_norm", "weight", "[4]"});
  expect_error([] { add_rms_norm(ones({2, 4}), ones({4}), ones({4})); }, {"add_rms_norm", "[2, 4]", "[4]"});
}

TEST_CASE("fused decode ops: a decoder's logits through them equal the op chains'", "[fused][models]") {
  models::ModelConfig cfg;
  cfg.vocab_size = 61, cfg.hidden_size = 64, cfg.intermediate_size = 96, cfg.num_hidden_layers = 2;
  cfg.num_attention_heads = 4, cfg.num_key_value_heads = 2, cfg.tie_word_embeddings = false;
  cfg.max_position_embeddings = 64;
  for (DType dt : {DType::f32, DType::bf16}) {
    INFO("dtype " << dtype_name(dt));
    Generator gen(5);
    models::CausalLM m(cfg, &gen);
    m.eval();
    NoGradGuard ng;
    // Norm weights of their own (not all ones), so a norm applied with another's weight shows.
    Generator wg(9);
    for (auto& [name, p] : m.named_parameters())
      if (name.find("norm") != std::string::npos) p.copy_(make_input(wg, p.shape(), p.dtype(), L::contiguous, 0.5, 2.0));
    if (dt != DType::f32) m.to(dt);
    const Tensor ids = from_vector(std::vector<int64_t>{3, 17, 42, 8, 60, 1, 5, 9, 33, 12}, Shape{2, 5}, DType::i64);
    auto run = [&] {
      // A prefill of 4 and one decode step through the cache.
      nn::KVCache cache = m.make_cache(2, 8);
      Tensor a = m.forward(slice(ids, 1, 0, 4), &cache);
      Tensor b = m.forward(slice(ids, 1, 4, 5), &cache);
      return cat({a, b}, 1);
    };
    profiler::ProfileOptions po;
    po.chip_timeline = false;
    profiler::Profile prof(po);
    const Tensor fused = run();
    prof.stop();
    int calls = 0;
    for (const auto& s : prof.key_averages())
      if (s.name == "add_rms_norm" || s.name == "silu_mul" || s.name == "rotary_embedding_qk")
        calls += static_cast<int>(s.calls);
    // 2 forwards x 2 layers x (add_rms_norm after the attention and after the MLP, silu_mul,
    // rotary_embedding_qk).
    CHECK(calls == 2 * 2 * 4);
    // A forward hook on the second layer's norm: the first layer fused, the second through its
    // forward; then hooks on every layer's norm and activation: the op chains throughout.
    std::vector<nn::HookHandle> hooks;
    auto noop = [](nn::Module&, std::span<const Tensor>, Tensor&) {};
    hooks.push_back(m.model->layers[1]->post_attention_layernorm->register_forward_hook(noop));
    const Tensor mixed = run();
    CHECK(same_bits(fused, mixed));
    for (auto& l : m.model->layers) {
      hooks.push_back(l->post_attention_layernorm->register_forward_hook(noop));
      hooks.push_back(l->mlp->act->register_forward_hook(noop));
    }
    const Tensor chain = run();
    CHECK(same_bits(fused, chain));
    // With autograd recording (the parameters require grad), every op chain, rotary included.
    hooks.clear();
    GradModeGuard grad(true);
    const Tensor recorded = run();
    CHECK(same_bits(fused, recorded.detach()));
  }
}

}  // namespace tpu::testing

namespace tpu::testing {

TEST_CASE("fused decode ops: mixture-of-experts experts through silu_mul equal the op chain", "[fused][moe]") {
  nn::MoEConfig c;
  c.hidden = 24, c.intermediate = 40, c.num_experts = 3, c.top_k = 1, c.act = "silu";
  for (DType dt : {DType::f32, DType::bf16}) {
    INFO("dtype " << dtype_name(dt));
    Generator gen(4);
    nn::MoEExperts e(c, &gen);
    if (dt != DType::f32) e.to(dt);
    NoGradGuard ng;
    const Tensor xs = make_input(gen, {7, 24}, dt, Layout::contiguous);
    const Tensor groups = from_vector(std::vector<int64_t>{3, 0, 4}, Shape{3}, DType::i64);
    profiler::ProfileOptions po;
    po.chip_timeline = false;
    profiler::Profile prof(po);
    const Tensor fused = e.forward(xs, groups);
    prof.stop();
    uint64_t calls = 0;
    for (const auto& s : prof.key_averages())
      if (s.name == "silu_mul") calls += s.calls;
    CHECK(calls == 1);
    auto hook = e.act->register_forward_hook([](nn::Module&, std::span<const Tensor>, Tensor&) {});
    CHECK(same_bits(fused, e.forward(xs, groups)));
  }
}

}  // namespace tpu::testing
