// all_to_all with uneven splits on tpu::dist's sim backend (one group per chip of the 2x2 pod of
// tiny chips), checked against a naive exchange of the ranks' host inputs; the errors (split
// sizes, dtypes across ranks, a rank that never calls); and the simulated ICI time of an
// all-to-all against the torus closed form derived from the bisection below.
#include <catch2/catch.hpp>

#include <chrono>

#include "pod/pod_testing.h"
#include "tpucore/compile.h"
#include "tpucore/dist.h"
#include "tpucore/ops.h"
#include "tpucore/streams.h"

using namespace tpu;
using Catch::Matchers::Contains;

namespace {

using pod_testing::chip;
using pod_testing::g_env;
using pod_testing::on_ranks;

std::vector<float> host(const Tensor& t) { return t.to(Device()).to(DType::f32).contiguous().to_vector<float>(); }

// Rank r's row i (of `w` columns): small integers every dtype holds.
float val(int r, int64_t i, int64_t c) { return float((r * 13 + i * 5 + c) % 17 - 8); }

// rows[r][j]: the rows rank r sends to rank j (0 allowed).
void check_uneven(int n, const std::vector<std::vector<int64_t>>& rows, DType t) {
  const int64_t w = 3;
  auto g = dist::sim_pod_groups({n});
  std::vector<std::vector<float>> got(static_cast<size_t>(n));
  on_ranks(n, [&](int r) {
    std::vector<int64_t> in_s = rows[size_t(r)], out_s;
    for (int j = 0; j < n; ++j) out_s.push_back(rows[size_t(j)][size_t(r)]);
    int64_t ni = 0, no = 0;
    for (int j = 0; j < n; ++j) ni += in_s[size_t(j)], no += out_s[size_t(j)];
    std::vector<float> v;
    for (int64_t i = 0; i < ni; ++i)
      for (int64_t c = 0; c < w; ++c) v.push_back(val(r, i, c));
    Tensor in = from_vector(v, Shape{ni, w}).to(t).to(chip(r));
    Tensor out = full(Shape{no, w}, 99.0, TensorOptions(t, chip(r)));
    g[size_t(r)]->all_to_all_single(out, in, out_s, in_s);
    got[size_t(r)] = host(out);
  });
  // Naive exchange: rank r's output is, for each source j in order, the rows j sent to r.
  for (int r = 0; r < n; ++r) {
    std::vector<float> want;
    for (int j = 0; j < n; ++j) {
      int64_t first = 0;
      for (int k = 0; k < r; ++k) first += rows[size_t(j)][size_t(k)];
      for (int64_t i = first; i < first + rows[size_t(j)][size_t(r)]; ++i)
        for (int64_t c = 0; c < w; ++c) want.push_back(val(j, i, c));
    }
    INFO("rank " << r << " of " << n);
    CHECK(got[size_t(r)] == want);
  }
}

}  // namespace

TEST_CASE("sim all_to_all_single with uneven and empty splits equals a naive exchange on 2-4 chips") {
  check_uneven(2, {{1, 3}, {2, 0}}, DType::f32);
  check_uneven(3, {{0, 2, 1}, {4, 0, 0}, {1, 1, 3}}, DType::bf16);
  check_uneven(4, {{1, 0, 2, 3}, {0, 0, 0, 0}, {2, 2, 2, 1}, {5, 0, 1, 0}}, DType::i32);
  check_uneven(4, {{0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}}, DType::f32);  // nothing moves
}

TEST_CASE("sim all_to_all_single inside tpu::compile: equal and uneven splits equal a naive exchange") {
  const int n = 2;
  auto g = dist::sim_pod_groups({n});
  // Rank r holds rows 10 r + i (i = 0..3, one column); it sends rows[r][j] of them to rank j.
  const std::vector<std::vector<int64_t>> rows = {{1, 3}, {2, 2}};
  std::vector<std::vector<float>> eq(static_cast<size_t>(n)), un(static_cast<size_t>(n));
  on_ranks(n, [&](int r) {
    auto& pg = *g[size_t(r)];
    std::vector<int64_t> in_s = rows[size_t(r)], out_s = {rows[0][size_t(r)], rows[1][size_t(r)]};
    auto equal = compile([&](const Tensor& t) {
      Tensor o = empty_like(t);
      pg.all_to_all_single(o, t * 2.0);
      return o;
    });
    auto uneven = compile([&](const Tensor& t) {
      Tensor o = empty(Shape{out_s[0] + out_s[1], 1}, TensorOptions(DType::f32, t.device()));
      pg.all_to_all_single(o, t + 1.0, out_s, in_s);
      return o;
    });
    Tensor x = from_vector(std::vector<float>{10.f * r, 10.f * r + 1, 10.f * r + 2, 10.f * r + 3}, Shape{4, 1}).to(chip(r));
    eq[size_t(r)] = host(equal(x));
    un[size_t(r)] = host(uneven(x));
  });
  // Equal: block r (2 rows) of each rank j, doubled.
  CHECK(eq[0] == std::vector<float>{0, 2, 20, 22});
  CHECK(eq[1] == std::vector<float>{4, 6, 24, 26});
  // Uneven, plus one: rank 0 gets row 0 of rank 0 and rows 0-1 of rank 1; rank 1 the rest.
  CHECK(un[0] == std::vector<float>{1, 11, 12});
  CHECK(un[1] == std::vector<float>{2, 3, 4, 13, 14});
}

TEST_CASE("sim list all_to_all with tensors of different sizes equals a naive exchange") {
  const int n = 3;
  auto g = dist::sim_pod_groups({n});
  // Rank r sends r + j + 1 elements (or none when r == j + 1) to rank j, as [len] tensors.
  auto len = [](int r, int j) -> int64_t { return r == j + 1 ? 0 : r + j + 1; };
  std::vector<std::vector<std::vector<float>>> got(static_cast<size_t>(n));
  on_ranks(n, [&](int r) {
    std::vector<Tensor> ins, outs;
    for (int j = 0; j < n; ++j) {
      std::vector<float> v;
      for (int64_t i = 0; i < len(r, j); ++i) v.push_back(float(100 * r + 10 * j + i));
      ins.push_back(from_vector(v, Shape{len(r, j)}).to(chip(r)));
      outs.push_back(empty(Shape{len(j, r)}, TensorOptions(DType::f32, chip(r))));
    }
    g[size_t(r)]->all_to_all(outs, ins);
    for (auto& o : outs) got[size_t(r)].push_back(host(o));
  });
  for (int r = 0; r < n; ++r)
    for (int j = 0; j < n; ++j) {
      std::vector<float> want;
      for (int64_t i = 0; i < len(j, r); ++i) want.push_back(float(100 * j + 10 * r + i));
      CHECK(got[size_t(r)][size_t(j)] == want);
    }
}

TEST_CASE("sim all_to_all errors: split sizes, dtypes across ranks, a rank that never calls") {
  const int n = 2;
  auto g = dist::sim_pod_groups({n});
  Tensor x = zeros(Shape{4, 2}, TensorOptions(DType::f32, chip(0)));
  // Local checks: the sizes must sum to dim 0 and name it. (Without the header check, so that
  // rank 0 alone can make them: with it, the rank would still join the header exchange.)
  auto loc = dist::sim_pod_groups({n, std::chrono::milliseconds(0), false});
  CHECK_THROWS_WITH(loc[0]->all_to_all_single(x, x, {2, 2}, {1, 2}), Contains("input_split_sizes sum to 3 but the input's dim 0 is 4"));
  CHECK_THROWS_WITH(loc[0]->all_to_all_single(x, x, {2, 2, 0}, {2, 2}), Contains("output_split_sizes has 3 entries"));
  CHECK_THROWS_WITH(loc[0]->all_to_all_single(x, x, {5, -1}, {2, 2}), Contains("negative"));
  // Sizes that sum right on each rank but disagree across ranks: every rank fails alike, naming them.
  std::vector<std::string> err(static_cast<size_t>(n));
  auto mismatch = [&](const std::vector<dist::ProcessGroupPtr>& gs, bool dtype) {
    on_ranks(n, [&](int r) {
      Tensor in = zeros(Shape{4, 2}, TensorOptions(dtype && r == 1 ? DType::bf16 : DType::f32, chip(r)));
      Tensor out = zeros(Shape{4, 2}, TensorOptions(dtype && r == 1 ? DType::bf16 : DType::f32, chip(r)));
      try {
        if (dtype) gs[size_t(r)]->all_to_all_single(out, in, {2, 2}, {2, 2});
        else gs[size_t(r)]->all_to_all_single(out, in, {2, 2}, r == 0 ? std::vector<int64_t>{1, 3} : std::vector<int64_t>{2, 2});
      } catch (const Error& e) {
        err[size_t(r)] = e.what();
      }
    });
  };
  mismatch(g, false);
  for (const auto& m : err) CHECK_THAT(m, Contains("rank 0 sends 6 element(s) to rank 1, which expects 4"));
  // The group stays usable.
  check_uneven(2, {{1, 1}, {0, 2}}, DType::f32);
  mismatch(g, true);  // with the header check: the headers disagree
  for (const auto& m : err) CHECK_THAT(m, Contains("disagree") && Contains("bf16"));
  auto unchecked = dist::sim_pod_groups({n, std::chrono::milliseconds(0), false});
  mismatch(unchecked, true);  // without it: the exchange of the counts names the dtypes
  for (const auto& m : err) CHECK_THAT(m, Contains("dtypes differ (rank 0: f32, rank 1: bf16)"));
  // A rank that never calls: the others fail within the timeout, naming it.
  auto s = dist::sim_pod_groups({4, std::chrono::milliseconds(300)});
  std::vector<dist::Work> ws;
  std::vector<Tensor> keep;
  for (int r = 0; r < 3; ++r) {
    keep.push_back(zeros(Shape{4}, TensorOptions(DType::f32, chip(r))));
    ws.push_back(s[size_t(r)]->all_to_all_single_async(keep.back(), keep.back(), {1, 1, 1, 1}, {2, 0, 1, 1}));
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& w : ws) CHECK_THROWS_WITH(w.wait(std::chrono::seconds(20)), Contains("rank(s) 3 (chip(s) sim:3) did not call"));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
}

// The closed form. An all-to-all over G chips moves V bytes in all (V / G per chip, V / G^2 to
// each peer). Cut the slice in two halves across its longest axis (length a, N chips in all):
// each half sends the other V / 4. With wraparound the cut crosses 2 N / a links per
// direction (a ring: 2), without it N / a (a line of 2: 1); at W bytes/s per link direction
// T = (V / 4) / (links x W). Hop latency is left out (the volumes below make it < 1%).
TEST_CASE("sim all_to_all's simulated ICI time against the torus closed form") {
  const double W = 1e9;  // tiny ICI: 1 GB/s per link direction
  auto timed = [&](const std::function<void()>& fn) {
    for (int r = 0; r < 4; ++r) synchronize(chip(r));
    Event a, b;
    a.record(chip(0));
    fn();
    b.record(chip(0));
    return a.elapsed_ms(b) / 1e3;
  };
  SECTION("the 2x2 pod (no wraparound), equal and uneven splits") {
    auto g = dist::sim_pod_groups({4});
    const int64_t per = 16 * 1024;  // f32 elements each chip sends each peer: 64 KB
    std::vector<Tensor> in, out;
    for (int r = 0; r < 4; ++r) {
      in.push_back(zeros(Shape{4 * per}, TensorOptions(DType::f32, chip(r))));
      out.push_back(zeros(Shape{4 * per}, TensorOptions(DType::f32, chip(r))));
    }
    const double V = 4.0 * per * 4 * 4;  // G^2 blocks
    const double closed = (V / 4) / (4.0 / 2 * W);
    const double eq = timed([&] { on_ranks(4, [&](int r) { g[size_t(r)]->all_to_all_single(out[size_t(r)], in[size_t(r)]); }); });
    INFO("simulated " << eq << " s, closed form " << closed << " s");
    CHECK(eq == Approx(closed).epsilon(0.10));
    // Uneven: every block at most `per` elements, the largest exactly `per`. The sim backend
    // pads every block to the largest and runs the equal exchange, so its ICI time is the closed
    // form above; the padding and unpadding copies on the chips come on top (an unpadded
    // exchange of these blocks, half of `per` on average, would take about half the time).
    const double un = timed([&] {
      on_ranks(4, [&](int r) {
        const std::vector<int64_t> s = {per, per / 2, per / 4, per / 4};  // every rank sends these
        const int64_t back = s[size_t(r)];                                 // and receives s[r] from each
        g[size_t(r)]->all_to_all_single(out[size_t(r)].narrow(0, 0, 4 * back), in[size_t(r)].narrow(0, 0, 2 * per),
                                        {back, back, back, back}, s);
      });
    });
    INFO("uneven: simulated " << un << " s");
    CHECK(un >= 0.95 * closed);
    CHECK(un <= 2.0 * closed);
  }
  SECTION("a ring of 8 and a 4x4 torus (wraparound), by symmetry") {
    for (const char* slice : {"8", "4x4"}) {
      auto pg = dist::sim_symmetric_group({.slice = slice});
      const int G = pg->size();
      const int64_t chunk = 128 * 1024 / G;  // f32 elements to each peer (512 KB per chip in all)
      Tensor x = zeros(Shape{chunk * G}, TensorOptions(DType::f32, chip(0)));
      Tensor y = zeros(Shape{chunk * G}, TensorOptions(DType::f32, chip(0)));
      synchronize(chip(0));
      Event a, b;
      a.record(chip(0));
      pg->all_to_all_single(y, x);
      b.record(chip(0));
      const double t = a.elapsed_ms(b) / 1e3;
      const double V = double(chunk) * 4 * G * G;
      const double longest = G == 8 ? 8 : 4;
      const double closed = (V / 4) / (2.0 * G / longest * W);
      INFO(slice << ": simulated " << t << " s, closed form " << closed << " s");
      CHECK(t == Approx(closed).epsilon(0.10));
    }
  }
}
