// rotary_embedding: the OpInfo entry (naive reference; run on every device by test_opinfo.cpp
// and gradchecked), argument errors, and agreement with the rotate_half formula written in ops.
#include "codegen_testing.h"
#include "opinfo.h"
#include "tpucore/ops.h"

namespace tpu::testing {
namespace {

using L = Layout;

struct RotCase {
  Shape x, cos, sin;
  L layout = L::contiguous;
};

std::vector<OpSample> rotary_samples(DType dt, Generator& g) {
  const std::vector<RotCase> cases = {
      {{4, 8}, {4, 8}, {4, 8}},
      {{2, 3, 5, 8}, {5, 8}, {5, 8}, L::transposed},   // heads x positions, tables per position
      {{2, 5, 6}, {1, 5, 6}, {5, 6}, L::sliced},
      {{3, 4}, {1, 4}, {3, 1}},                        // sin broadcast along the last dim
      {{1, 4, 37, 16}, {37, 16}, {37, 16}},            // ragged rows
      {{0, 4}, {4}, {4}},
      {{2, 4, 1, 64}, {2, 1, 1, 64}, {2, 1, 1, 64}, L::sliced},  // decode: tables per sequence, over heads
  };
  std::vector<OpSample> out;
  for (const RotCase& c : cases)
    out.push_back({fmt::format("{} x {} cos {} sin {}", layout_name(c.layout), c.x.str(), c.cos.str(), c.sin.str()),
                   {make_input(g, c.x, dt, c.layout), make_input(g, c.cos, dt, L::contiguous, -1.0, 1.0),
                    make_input(g, c.sin, dt, L::contiguous, -1.0, 1.0)}});
  return out;
}

Ref rotary_reference(const std::vector<Ref>& r, DType) {
  const Ref &x = r[0], &c = r[1], &s = r[2];
  Ref out(x.shape);
  const int64_t D = x.shape[x.shape.ndim() - 1], h = D / 2;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const std::vector<int64_t> idx = unflatten(x.shape, i);
    const int64_t j = idx.back();
    std::vector<int64_t> other = idx;
    other.back() = j < h ? j + h : j - h;
    const double rot = j < h ? -x.at(other) : x.at(other);
    out.v[size_t(i)] = x.v[size_t(i)] * c.bcast(x.shape, idx) + rot * s.bcast(x.shape, idx);
  }
  return out;
}

OpInfoRegistrar reg_rotary({
    .op = "rotary_embedding",
    .dtypes = {DType::f32, DType::bf16, DType::f16},
    .samples = rotary_samples,
    .run = [](const std::vector<Tensor>& in) { return rotary_embedding(in[0], in[1], in[2]); },
    .reference = rotary_reference,
});

TEST_CASE("rotary_embedding: bad arguments are tpu::Errors naming the op and shapes", "[rotary]") {
  const Tensor x = randn({2, 5, 8}), c = randn({5, 8});
  expect_error([&] { (void)rotary_embedding(randn({2, 5, 7}), randn({5, 7}), randn({5, 7})); },
               {"rotary_embedding", "even", "[2, 5, 7]"});
  expect_error([&] { (void)rotary_embedding(x, randn({6, 8}), c); }, {"rotary_embedding", "[6, 8]", "[2, 5, 8]"});
  expect_error([&] { (void)rotary_embedding(x, randn({3, 2, 5, 8}), c); }, {"broadcast"});
  expect_error([&] { (void)rotary_embedding(x, c.to(DType::bf16), c); }, {"one floating dtype"});
  CHECK(rotary_embedding(x, c, c).shape() == x.shape());
}

TEST_CASE("rotary_embedding: equals x cos + cat(-x2, x1) sin", "[rotary]") {
  Generator g(4);
  const Tensor x = randn({2, 3, 7, 10}, {}, &g), c = randn({7, 10}, {}, &g), s = randn({7, 10}, {}, &g);
  const Tensor want = add(mul(x, c), mul(cat({neg(narrow(x, -1, 5, 5)), narrow(x, -1, 0, 5)}, -1), s));
  check_near(rotary_embedding(x, c, s), dvals(want), 1e-6);
}

TEST_CASE("rotary_embedding: one chip program on sim, heads read in place", "[rotary][codegen]") {
  TinySim tiny;
  Generator g(8);
  for (DType dt : {DType::f32, DType::bf16}) {
    INFO(dtype_name(dt));
    // [T, H * D] projection output -> [1, H, T, D] heads (rows strided by H * D); tables [T, D].
    const Tensor y = randn({37, 3 * 16}, {}, &g).to(dt), c = randn({37, 16}, {}, &g).to(dt),
                 s = randn({37, 16}, {}, &g).to(dt);
    auto heads = [](const Tensor& t) { return transpose(reshape(t, Shape{1, 37, 3, 16}), 1, 2); };
    ChipRunProbe probe;
    const Tensor got = rotary_embedding(heads(y.to(tiny.dev())), c.to(tiny.dev()), s.to(tiny.dev()));
    CHECK(probe.new_fallbacks() == 0);
    CHECK(probe.new_runs() == 1);
    const Tensor want = rotary_embedding(heads(y).to(DType::f32), c.to(DType::f32), s.to(DType::f32));
    check_near(got.to(Device("cpu")).to(DType::f32), dvals(want), dt == DType::f32 ? 1e-6 : 1e-2);
  }
}

TEST_CASE("rotary_embedding on sim: many row blocks, shared and per-head tables", "[rotary][codegen]") {
  // 800 rows do not fit one tile in the tiny chip's VMEM: several row blocks, each with its own
  // table block (shared by the heads, or one per head: a new table block every tile), so the
  // kernel's three x and table buffers and its swap buffers all rotate.
  TinySim tiny;
  Generator g(9);
  const int64_t t = 800, h = 3, d = 16;
  for (DType dt : {DType::f32, DType::bf16})
    for (bool per_head : {false, true}) {
      INFO(dtype_name(dt) << (per_head ? ", per-head tables" : ", shared tables"));
      const Tensor y = randn({t, h * d}, {}, &g).to(dt);
      const Shape ts = per_head ? Shape{1, h, t, d} : Shape{t, d};
      const Tensor c = randn(ts, {}, &g).to(dt), s = randn(ts, {}, &g).to(dt);
      auto heads = [&](const Tensor& x) { return transpose(reshape(x, Shape{1, t, h, d}), 1, 2); };
      ChipRunProbe probe;
      const Tensor got = rotary_embedding(heads(y.to(tiny.dev())), c.to(tiny.dev()), s.to(tiny.dev()));
      CHECK(probe.new_fallbacks() == 0);
      const Tensor want = rotary_embedding(heads(y).to(DType::f32), c.to(DType::f32), s.to(DType::f32));
      check_near(got.to(Device("cpu")).to(DType::f32), dvals(want), dt == DType::f32 ? 1e-6 : 1e-2);
    }
}

}  // namespace
}  // namespace tpu::testing
