// The mixture-of-experts ops (grouped_matmul and its weight gradient, topk, moe_sort,
// moe_permute, moe_unpermute): OpInfo entries with naive double-loop references (run on every
// device by test_opinfo.cpp, gradients checked against finite differences by
// test_autograd_gradcheck.cpp), and cases of their own: empty, one-token and uneven groups,
// products large enough to run threaded, bf16, closed-form gradients and bad inputs.
#include "moe_test_util.h"
#include "ops/fallback.h"
#include "tpucore/autograd.h"
#include "codegen_testing.h"
#include "tpucore/nn/moe.h"

namespace tpu::testing {
namespace {

using L = Layout;
using namespace moe;

// ---- OpInfo entries; the last input carries the integer arguments ----
OpInfoRegistrar reg_grouped_matmul({
    .op = "grouped_matmul",
    .dtypes = {DType::f32, DType::bf16},
    .samples =
        [](DType dt, Generator& g) {
          auto mk = [&](const Shape& s, L l) { return make_input(g, s, dt, l, -1.0, 1.0); };
          return std::vector<OpSample>{
              {"uneven groups", {mk({7, 5}, L::contiguous), mk({3, 5, 4}, L::contiguous), counts_tensor({2, 4, 1}),
                                 params({0})}},
              {"empty and one-token groups, transposed w",
               {mk({4, 6}, L::contiguous), mk({5, 3, 6}, L::contiguous), counts_tensor({0, 1, 0, 3, 0}, DType::i32),
                params({1})}},
              {"strided x and w", {mk({6, 4}, L::transposed), mk({2, 4, 5}, L::sliced), counts_tensor({5, 1}),
                                   params({0})}},
              {"every row in one group", {mk({3, 2}, L::sliced), mk({4, 3, 2}, L::contiguous),
                                          counts_tensor({0, 0, 3, 0}), params({1})}},
              {"no rows", {mk({0, 3}, L::contiguous), mk({2, 3, 4}, L::contiguous), counts_tensor({0, 0}), params({0})}},
          };
        },
    .run = [](const std::vector<Tensor>& in) { return grouped_matmul(in[0], in[1], in[2], params_of(in[3])[0] != 0); },
    .reference = [](const std::vector<Ref>& r, DType) {
      return grouped_matmul_ref(r[0], r[1], ints(r[2]), params_of(r[3])[0] != 0);
    },
});

OpInfoRegistrar reg_weight_grad({
    .op = "grouped_matmul_weight_grad",
    .dtypes = {DType::f32, DType::bf16},
    .samples =
        [](DType dt, Generator& g) {
          auto mk = [&](const Shape& s, L l) { return make_input(g, s, dt, l, -1.0, 1.0); };
          return std::vector<OpSample>{
              {"uneven groups", {mk({7, 3}, L::contiguous), mk({7, 4}, L::contiguous), counts_tensor({3, 0, 4}),
                                 params({0})}},
              {"one-token groups, transposed", {mk({3, 5}, L::transposed), mk({3, 2}, L::sliced),
                                                counts_tensor({1, 1, 0, 1}, DType::i32), params({1})}},
              {"no rows", {mk({0, 2}, L::contiguous), mk({0, 3}, L::contiguous), counts_tensor({0, 0}), params({1})}},
          };
        },
    .run = [](const std::vector<Tensor>& in) {
      return grouped_matmul_weight_grad(in[0], in[1], in[2], params_of(in[3])[0] != 0);
    },
    .reference = [](const std::vector<Ref>& r, DType) {
      return weight_grad_ref(r[0], r[1], ints(r[2]), params_of(r[3])[0] != 0);
    },
});

OpInfoRegistrar reg_topk({
    .op = "topk",
    .dtypes = {DType::f32, DType::bf16, DType::i32},
    .samples =
        [](DType dt, Generator& g) {
          auto mk = [&](const Shape& s, L l) { return make_input(g, s, dt, l, -8.0, 8.0); };
          return std::vector<OpSample>{
              {"top 2 of 8", {mk({5, 8}, L::contiguous), params({2})}},
              {"transposed, top 3 of 4", {mk({3, 4}, L::transposed), params({3})}},
              {"all of a sliced row", {mk({2, 5}, L::sliced), params({5})}},
              {"k 0", {mk({2, 3}, L::contiguous), params({0})}},
          };
        },
    .run = [](const std::vector<Tensor>& in) { return std::get<0>(topk(in[0], params_of(in[1])[0])); },
    .reference = [](const std::vector<Ref>& r, DType) { return topk_ref(r[0], params_of(r[1])[0], false); },
    .tol = exact_tol,
});

OpInfoRegistrar reg_moe_sort({
    .op = "moe_sort",
    .dtypes = {DType::i64, DType::i32},
    .samples =
        [](DType dt, Generator& g) {
          return std::vector<OpSample>{
              {"8 tokens x top 2 of 4", {make_input(g, {8, 2}, dt, L::contiguous, 0.0, 4.0), params({4})}},
              {"transposed ids, unused experts", {make_input(g, {2, 5}, dt, L::transposed, 0.0, 3.0), params({6})}},
              {"no tokens", {make_input(g, {0, 2}, dt, L::contiguous, 0.0, 2.0), params({3})}},
          };
        },
    .run = [](const std::vector<Tensor>& in) {
      auto [order, counts] = moe_sort(in[0], params_of(in[1])[0]);
      return cat({order, counts}, 0);
    },
    .reference = [](const std::vector<Ref>& r, DType) { return moe_sort_ref(r[0], params_of(r[1])[0]); },
    .tol = exact_tol,
});

OpInfoRegistrar reg_moe_permute({
    .op = "moe_permute",
    .dtypes = {DType::f32, DType::bf16},
    .samples =
        [](DType dt, Generator& g) {
          return std::vector<OpSample>{
              {"5 tokens x top 2", {make_input(g, {5, 3}, dt, L::contiguous), random_order(g, 10), params({2})}},
              {"transposed x, i32 order, top 3", {make_input(g, {2, 4}, dt, L::transposed),
                                                  random_order(g, 6, DType::i32), params({3})}},
              {"top 1", {make_input(g, {4, 2}, dt, L::sliced), random_order(g, 4), params({1})}},
          };
        },
    .run = [](const std::vector<Tensor>& in) { return moe_permute(in[0], in[1], params_of(in[2])[0]); },
    .reference = [](const std::vector<Ref>& r, DType) { return permute_ref(r[0], ints(r[1]), params_of(r[2])[0]); },
    .tol = exact_tol,
});

OpInfoRegistrar reg_moe_unpermute({
    .op = "moe_unpermute",
    .dtypes = {DType::f32, DType::bf16},
    .samples =
        [](DType dt, Generator& g) {
          return std::vector<OpSample>{
              {"5 tokens x top 2", {make_input(g, {10, 3}, dt, L::contiguous), random_order(g, 10),
                                    make_input(g, {5, 2}, dt, L::contiguous, 0.0, 1.0), params({2, 1})}},
              {"strided y and weights, top 3", {make_input(g, {6, 4}, dt, L::transposed), random_order(g, 6, DType::i32),
                                                make_input(g, {2, 3}, dt, L::sliced, 0.0, 1.0), params({3, 1})}},
              {"no weights", {make_input(g, {4, 2}, dt, L::contiguous), random_order(g, 4),
                              make_input(g, {2, 2}, dt, L::contiguous), params({2, 0})}},
          };
        },
    // The second argument: whether the weights are passed (else weights of one).
    .run = [](const std::vector<Tensor>& in) {
      const auto p = params_of(in[3]);
      return moe_unpermute(in[0], in[1], p[1] ? in[2] : Tensor(), p[0]);
    },
    .reference = [](const std::vector<Ref>& r, DType) {
      const auto p = params_of(r[3]);
      return unpermute_ref(r[0], ints(r[1]), p[1] ? &r[2] : nullptr, p[0]);
    },
});

OpInfoRegistrar reg_cumsum({
    .op = "cumsum",
    .dtypes = {DType::f32, DType::bf16, DType::i32, DType::i64},
    .samples =
        [](DType dt, Generator& g) {
          auto mk = [&](const Shape& s, L l) { return make_input(g, s, dt, l, -4.0, 4.0); };
          return std::vector<OpSample>{
              {"rows", {mk({4, 7}, L::contiguous), params({1})}},
              {"transposed, dim 0", {mk({5, 3}, L::transposed), params({0})}},
              {"middle dim of a sliced 3-D", {mk({2, 6, 3}, L::sliced), params({-2})}},
              {"one element along dim", {mk({3, 1}, L::contiguous), params({-1})}},
              {"0-d", {mk({}, L::contiguous), params({0})}},
              {"no elements", {mk({0, 4}, L::contiguous), params({0})}},
          };
        },
    .run = [](const std::vector<Tensor>& in) { return cumsum(in[0], params_of(in[1])[0]); },
    .reference = [](const std::vector<Ref>& r, DType) { return cumsum_ref(r[0], params_of(r[1])[0]); },
});

TEST_CASE("cumsum: long lines, wrapping i32, bool counts as i64, gradient is the reverse prefix sum", "[moe]") {
  Generator g(41);
  // 3 x 5000 f32 (threads over lines, a long f32 accumulation) against the naive loop in double.
  const Tensor x = make_input(g, {3, 5000}, DType::f32, Layout::contiguous, -1.0, 1.0);
  check_close(cumsum(x, 1), cumsum_ref(ref_of(x), 1), {2e-3, 1e-4}, "long f32 lines");
  // i32 wraps modulo 2^32 as the dtype does.
  const Tensor big = from_vector(std::vector<int32_t>{2147483647, 1, 5}, Shape{3});
  CHECK(cumsum(big, 0).to_vector<int32_t>() == std::vector<int32_t>{2147483647, -2147483647 - 1, -2147483643});
  const Tensor b = from_vector(std::vector<int64_t>{1, 0, 1, 1, 0, 0}, Shape{2, 3}).to(DType::boolean);
  const Tensor cb = cumsum(b, 1);
  CHECK(cb.dtype() == DType::i64);
  CHECK(cb.to_vector<int64_t>() == std::vector<int64_t>{1, 1, 2, 1, 1, 1});
  // d/dx_j sum_i c_i out_i = sum_{i >= j} c_i.
  const Tensor xr = make_input(g, {2, 4}, DType::f32, Layout::contiguous).requires_grad_();
  const std::vector<float> c{1, 2, 3, 4, -1, 0.5f, 2, 0};
  sum(mul(cumsum(xr, 1), from_vector(c, Shape{2, 4}))).backward();
  const std::vector<float> want{10, 9, 7, 4, 1.5f, 2.5f, 2, 0};
  const std::vector<float> got = xr.grad().to_vector<float>();
  for (size_t i = 0; i < want.size(); ++i) CHECK(got[i] == Approx(want[i]).margin(1e-6));
  expect_error([&] { cumsum(x, 2); }, {"cumsum"});
}

TEST_CASE("cumsum on the chip: f32 lines as shifted adds equal the naive loop, no host fallback", "[moe][codegen]") {
  TinySim tiny;
  Generator g(43);
  struct Case {
    const char* name;
    Shape shape;
    Layout layout;
    int64_t dim;
  };
  const std::vector<Case> cases{
      {"rows in chunks and single lines", {6, 2000}, Layout::contiguous, 1},  // 4 lines a chunk on tiny
      {"middle dim, inner 5", {2, 9, 5}, Layout::contiguous, -2},
      {"transposed, dim 0", {5, 3}, Layout::transposed, 0},
      {"1-D of 7", {7}, Layout::contiguous, 0},
      {"one element along dim", {3, 1}, Layout::contiguous, 1},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    const Tensor x = make_input(g, c.shape, DType::f32, c.layout, -1.0, 1.0);
    const Tensor xd = x.to(tiny.dev());
    const ChipRunProbe probe;
    const Tensor y = cumsum(xd, c.dim);
    CHECK(probe.new_fallbacks() == 0);
    CHECK(probe.new_runs() >= 1);
    REQUIRE(y.device() == tiny.dev());
    check_close(y.to(Device()), cumsum_ref(ref_of(x), c.dim), {1e-4, 1e-5}, c.name);
  }
}

TEST_CASE("to_dtype: i64 to f32 on the chip equals the host's conversion (tiles, rows, single elements)",
          "[moe][codegen]") {
  TinySim tiny;
  Generator g(47);
  // i64 tensors on a sim device come from chip ops (top-k's ids): 600 x 8 ids are 2 full tiles of
  // 16 x 128, 5 rows of 128 and 64 single elements, every loop of the program.
  const auto ids_of = [&](int64_t rows, int64_t k) {
    const Tensor x = make_input(g, {rows, 8}, DType::f32, Layout::contiguous, -1.0, 1.0).to(tiny.dev());
    const Tensor ids = std::get<1>(topk(x, k));
    REQUIRE(ids.dtype() == DType::i64);
    REQUIRE(ids.device() == tiny.dev());
    ChipRunProbe::sync_all();
    return ids;
  };
  const auto check_cast = [](const Tensor& ids, const Tensor& y) {
    const std::vector<int64_t> want = ids.to(Device()).to_vector<int64_t>();
    const std::vector<float> got = y.to(Device()).to_vector<float>();
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      INFO("element " << i);
      CHECK(got[i] == static_cast<float>(want[i]));
    }
  };
  const Tensor ids = ids_of(600, 8);
  const ChipRunProbe probe;
  const Tensor y = ids.to(DType::f32);
  CHECK(probe.new_fallbacks() == 0);
  CHECK(probe.new_runs() == 1);
  check_cast(ids, y);
  // Another length reuses the program (the counts are arguments).
  const Tensor ids2 = ids_of(3, 2);
  const ChipRunProbe again;
  const size_t programs = codegen::cached_programs(tiny.dev());
  const Tensor y2 = ids2.to(DType::f32);
  CHECK(again.new_fallbacks() == 0);
  CHECK(codegen::cached_programs(tiny.dev()) == programs);
  check_cast(ids2, y2);
}

TEST_CASE("to_dtype: f32 to i32 on the chip truncates toward zero as a naive loop does", "[moe][codegen]") {
  TinySim tiny;
  // Halves either side of zero (the chip's vcast rounds them to even), values just off an
  // integer, exact integers, -0, values where f32 holds only integers, up to near 2^31; then
  // random values to 4803 elements: 2 full tiles of 16 x 128, 5 rows of 128, 3 single elements.
  std::vector<float> v{0.5f,   -0.5f,  1.5f,       -1.5f,       2.5f,        -2.5f,      3.5f,        -3.5f,
                       0.999f, -0.999f, 1.0001f,   -1.0001f,    7.0f,        -7.0f,      0.0f,        -0.0f,
                       1e-3f,  -1e-3f,  8388607.5f, -8388607.5f, 16777216.0f, -16777218.0f, 1e9f,     -1e9f,
                       2147483520.0f, -2147483648.0f, 123456.75f, -123456.75f, 0.49999997f, -0.49999997f};
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1000.0f, 1000.0f);
  while (v.size() < 4803) v.push_back(v.size() % 3 == 0 ? std::round(u(rng)) + 0.5f : u(rng));
  const Tensor x = from_vector(v, Shape{static_cast<int64_t>(v.size())});
  const Tensor xd = x.to(tiny.dev());
  const ChipRunProbe probe;
  const Tensor y = xd.to(DType::i32);
  CHECK(probe.new_fallbacks() == 0);
  CHECK(probe.new_runs() == 1);
  REQUIRE(y.dtype() == DType::i32);
  const std::vector<int32_t> got = y.to(Device()).to_vector<int32_t>();
  REQUIRE(got.size() == v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    INFO("element " << i << ": " << v[i]);
    CHECK(got[i] == static_cast<int32_t>(std::trunc(static_cast<double>(v[i]))));
  }
  // A view (not contiguous) is gathered first: [[-2.5, -0.7], [1.5, 9.5], [0.7, -9.5]] truncated.
  const Tensor m = from_vector(std::vector<float>{-2.5f, 1.5f, 0.7f, -0.7f, 9.5f, -9.5f}, Shape{2, 3});
  const Tensor mt = transpose(m.to(tiny.dev()), 0, 1);
  const ChipRunProbe view_probe;
  const Tensor yt = mt.to(DType::i32);
  CHECK(view_probe.new_fallbacks() == 0);
  CHECK(yt.to(Device()).contiguous().to_vector<int32_t>() == std::vector<int32_t>{-2, 0, 1, 9, 0, -9});
}

TEST_CASE("to_dtype: i64 to i32 on the chip keeps the low words as the host's conversion does", "[moe][codegen]") {
  TinySim tiny;
  // Small ids, negatives, and values beyond i32 (wrapped): 2 tiles of 16 x 128, 5 rows, 2 elements.
  std::vector<int64_t> v{0, 1, -1, 7, -7, INT32_MAX, INT32_MIN, (int64_t{1} << 33) + 5, -(int64_t{1} << 40) - 3,
                         int64_t{1} << 31, INT64_MAX, INT64_MIN};
  for (int64_t i = 0; static_cast<int64_t>(v.size()) < 4738; ++i) v.push_back((i * 2654435761LL) % 1000003 - 500000);
  const Tensor x = from_vector(v, Shape{static_cast<int64_t>(v.size())}, DType::i64).to(tiny.dev());
  const ChipRunProbe probe;
  const Tensor y = x.to(DType::i32);
  CHECK(probe.new_fallbacks() == 0);
  CHECK(probe.new_runs() == 1);
  const std::vector<int32_t> got = y.to(Device()).to_vector<int32_t>();
  REQUIRE(got.size() == v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    INFO("element " << i << ": " << v[i]);
    CHECK(got[i] == static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(v[i]) & 0xffffffffu)));
  }
}

TEST_CASE("topk backward on the chip (a short last dim) equals a naive loop, no host fallback", "[moe][codegen]") {
  TinySim tiny;
  Generator g(31);
  const int64_t N = 5, E = 8, k = 3;
  const Tensor x0 = make_input(g, {N, E}, DType::f32, Layout::contiguous, -1.0, 1.0);
  const Tensor w = make_input(g, {N, k}, DType::f32, Layout::contiguous, -2.0, 2.0);
  Tensor x = x0.to(tiny.dev());
  x.requires_grad_(true);
  auto [vals, ids] = topk(x, k);
  const Tensor loss = sum(mul(vals, w.to(tiny.dev())));
  const ChipRunProbe probe;
  loss.backward();
  const Tensor gx = x.grad().to(Device());
  CHECK(probe.new_fallbacks() == 0);
  CHECK(probe.host_fallbacks == codegen::stats().host_fallbacks);
  // Naive: the weight of each chosen element at its place, zero elsewhere.
  const std::vector<int64_t> iv = ids.to(Device()).to(DType::i64).to_vector<int64_t>();
  const std::vector<float> wv = w.to_vector<float>();
  std::vector<float> want(static_cast<size_t>(N * E), 0.0f);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < k; ++j) want[static_cast<size_t>(n * E + iv[static_cast<size_t>(n * k + j)])] += wv[static_cast<size_t>(n * k + j)];
  CHECK(gx.to_vector<float>() == want);
  // An infinite gradient stays at its element (no 0 * inf elsewhere).
  Tensor y = x0.to(tiny.dev());
  y.requires_grad_(true);
  auto [v2, i2] = topk(y, 1);
  sum(mul(v2, std::numeric_limits<double>::infinity())).backward();
  const std::vector<float> gy = y.grad().to(Device()).to_vector<float>();
  const std::vector<int64_t> top = i2.to(Device()).to(DType::i64).to_vector<int64_t>();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t e = 0; e < E; ++e)
      CHECK(gy[static_cast<size_t>(n * E + e)] == (e == top[static_cast<size_t>(n)] ? INFINITY : 0.0f));
}

TEST_CASE("sigmoid routing: group-limited top-k weights and their gradient equal naive loops (cpu, tiny sim)",
          "[moe][codegen]") {
  TinySim tiny;
  const int64_t N = 5, E = 8, G = 4, k = 3;
  nn::MoEConfig c;
  c.hidden = 4;
  c.intermediate = 4;
  c.num_experts = E;
  c.top_k = k;
  c.sigmoid_routing = true;
  c.n_group = G;
  c.topk_group = 2;
  c.norm_topk_prob = false;
  Generator g(53);
  nn::SparseMoE moe(c, &g);
  auto* router = dynamic_cast<nn::MoERouter*>(moe.gate.get());
  REQUIRE(router != nullptr);
  router->e_score_correction_bias.copy_(make_input(g, {E}, DType::f32, Layout::contiguous, -0.5, 0.5));
  const Tensor logits = make_input(g, {N, E}, DType::f32, Layout::contiguous, -3.0, 3.0);
  const Tensor cw = make_input(g, {N, k}, DType::f32, Layout::contiguous);  // d loss / d w
  // Naive: keep the 2 groups of best top-2 sums (ties: lower group), then the top 3 experts of
  // the kept ones (others score 0); weights are the sigmoid scores at the chosen experts.
  const std::vector<float> lv = logits.to_vector<float>(), bv = router->e_score_correction_bias.to_vector<float>();
  const std::vector<float> cv = cw.to_vector<float>();
  std::vector<double> want_w, want_grad(static_cast<size_t>(N * E), 0.0);
  std::vector<int64_t> want_ids;
  for (int64_t n = 0; n < N; ++n) {
    std::vector<double> sc(E), ch(E), gs(G, 0.0);
    for (int64_t e = 0; e < E; ++e) {
      sc[e] = 1.0 / (1.0 + std::exp(-static_cast<double>(lv[n * E + e])));
      ch[e] = static_cast<float>(static_cast<float>(sc[e]) + bv[e]);
    }
    for (int64_t q = 0; q < G; ++q) gs[q] = ch[2 * q] + ch[2 * q + 1];  // 2 experts per group: both are its top 2
    std::vector<int64_t> go(G);
    std::iota(go.begin(), go.end(), 0);
    std::stable_sort(go.begin(), go.end(), [&](int64_t a, int64_t b) { return gs[a] > gs[b]; });
    std::vector<double> masked(E, 0.0);
    for (int64_t q : {go[0], go[1]})
      for (int64_t e = 2 * q; e < 2 * q + 2; ++e) masked[e] = ch[e];
    std::vector<int64_t> eo(E);
    std::iota(eo.begin(), eo.end(), 0);
    std::stable_sort(eo.begin(), eo.end(), [&](int64_t a, int64_t b) { return masked[a] > masked[b]; });
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = eo[j];
      want_ids.push_back(e);
      want_w.push_back(sc[e]);
      want_grad[n * E + e] += cv[n * k + j] * sc[e] * (1.0 - sc[e]);
    }
  }
  // Host fallbacks on sim devices (none: the i64 top-k ids are cast to f32 on the chip too).
  auto routing_fallbacks = [] {
    uint64_t n = 0;
    for (const auto& f : ops::fallback_counts())
      if (f.device.type == DeviceType::sim) n += f.calls;
    return n;
  };
  for (Device d : {Device("cpu"), tiny.dev()}) {
    INFO(d.str());
    if (d != Device("cpu")) moe.to(d);
    const uint64_t before = routing_fallbacks();
    const Tensor l = logits.detach().to(d).requires_grad_();  // a leaf on each device
    auto [w, ids] = moe.sigmoid_topk(l);
    REQUIRE(w.requires_grad());
    CHECK(ids.to(Device()).to_vector<int64_t>() == want_ids);
    const std::vector<float> got = w.to(Device()).to_vector<float>();
    REQUIRE(got.size() == want_w.size());
    for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(want_w[i]).margin(1e-6));
    sum(mul(w, cw.to(d))).backward();
    REQUIRE(l.grad().defined());
    const std::vector<float> gl = l.grad().to(Device()).to_vector<float>();
    for (size_t i = 0; i < gl.size(); ++i) CHECK(gl[i] == Approx(want_grad[i]).margin(1e-6));
    CHECK(routing_fallbacks() == before);  // no gather, one_hot, integer sum or cast on the host
  }
}

// The fused layer node (graph pass fuse_moe) run eagerly through the registry.
Tensor run_moe_ffn(const Tensor& x, const Tensor& ids, const Tensor& w, const Tensor& w1, const Tensor& w2) {
  return ops::call(*ops::find_op("moe_ffn"), {x, ids, w, w1, w2}, {{"num_experts", w1.size(0)}, {"top_k", ids.size(1)}});
}

TEST_CASE("moe_ffn: the fused layer equals the per-token loop (empty, one-token, uneven experts, row tiles)",
          "[moe][codegen]") {
  TinySim tiny;
  Generator g(31);
  struct Case {
    const char* name;
    int64_t T, H, F, E, k;
    std::vector<int64_t> ids;  // empty: random (every token's k experts distinct)
  };
  // 150 tokens x top 2 over 3 experts: expert 1 gets >= 64 rows, so it runs in several row tiles.
  std::vector<int64_t> many;
  for (int64_t t = 0; t < 150; ++t) {
    many.push_back(t % 7 == 0 ? 2 : 1);
    many.push_back(t % 7 == 0 ? 1 : (t % 3 == 0 ? 2 : 3));
  }
  const std::vector<Case> cases{
      {"uneven, random", 6, 5, 3, 4, 2, {}},
      {"empty and one-token experts", 3, 4, 2, 5, 2, {3, 0, 3, 1, 0, 3}},  // experts 2 and 4 empty, 1 one token
      {"top 1, one expert takes all", 4, 3, 4, 3, 1, {2, 2, 2, 2}},
      {"no tokens", 0, 3, 2, 2, 2, {}},
      {"row tiles", 150, 16, 24, 4, 2, many},  // expert 0 empty
  };
  for (DType dt : {DType::f32, DType::bf16})
    for (const Case& c : cases) {
      std::vector<int64_t> ids = c.ids;
      if (ids.empty())
        for (int64_t t = 0; t < c.T; ++t) {
          const auto a = static_cast<int64_t>(g.next_double() * static_cast<double>(c.E)) % c.E;
          ids.push_back(a);
          if (c.k == 2) ids.push_back((a + 1 + static_cast<int64_t>(g.next_double() * (c.E - 1.0)) % (c.E - 1)) % c.E);
        }
      const Tensor x = make_input(g, {c.T, c.H}, dt, Layout::contiguous, -1.0, 1.0);
      const Tensor w = make_input(g, {c.T, c.k}, dt, Layout::contiguous, 0.0, 1.0);
      const Tensor w1 = make_input(g, {c.E, 2 * c.F, c.H}, dt, Layout::contiguous, -1.0, 1.0);
      const Tensor w2 = make_input(g, {c.E, c.H, c.F}, dt, Layout::contiguous, -1.0, 1.0);
      const Tensor idt = from_vector(ids, Shape{c.T, c.k});
      const Ref ref = moe_ffn_ref(ref_of(x), ids, ref_of(w), ref_of(w1), ref_of(w2));
      const Tol tol = dt == DType::f32 ? Tol{1e-5, 1e-5} : Tol{0.1, 3e-2};
      for (Device d : {Device("cpu"), tiny.dev()}) {
        if (c.T > 64 && d != Device("cpu")) continue;  // row tiles are the cpu kernel's; the chip's time is long
        INFO(c.name << " " << dtype_name(dt) << " " << d.str());
        const Tensor out = run_moe_ffn(x.to(d), idt.to(d), w.to(d), w1.to(d), w2.to(d));
        REQUIRE(out.device() == d);
        CHECK(out.dtype() == dt);
        check_close(out.to(Device()), ref, tol, c.name);
      }
    }
  // Strided operands (a transposed x, sliced weights) and i32 ids on the cpu.
  const Tensor x = make_input(g, {5, 4}, DType::f32, Layout::transposed, -1.0, 1.0);
  const Tensor w = make_input(g, {5, 2}, DType::f32, Layout::sliced, 0.0, 1.0);
  const Tensor w1 = make_input(g, {3, 6, 4}, DType::f32, Layout::sliced, -1.0, 1.0);
  const Tensor w2 = make_input(g, {3, 4, 3}, DType::f32, Layout::transposed, -1.0, 1.0);
  const std::vector<int64_t> ids{0, 2, 1, 0, 2, 1, 0, 1, 2, 0};  // stored [2, 5], passed as its transpose [5, 2]
  std::vector<int64_t> slot_ids;
  for (int64_t t = 0; t < 5; ++t)
    for (int64_t j = 0; j < 2; ++j) slot_ids.push_back(ids[static_cast<size_t>(j * 5 + t)]);
  const Tensor ids_t = transpose(from_vector(ids, Shape{2, 5}).to(DType::i32), 0, 1);
  REQUIRE(!ids_t.is_contiguous());
  check_close(run_moe_ffn(x, ids_t, w, w1, w2),
              moe_ffn_ref(ref_of(x), slot_ids, ref_of(w), ref_of(w1), ref_of(w2)), {1e-5, 1e-5}, "strided");
  expect_error([&] { run_moe_ffn(x, from_vector(std::vector<int64_t>{0, 3, 1, 0, 2, 1, 0, 1, 2, 0}, Shape{5, 2}), w, w1, w2); },
               {"moe_ffn", "out of range"});
}

}  // namespace
}  // namespace tpu::testing
