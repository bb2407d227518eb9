// The serving step's paged attention op (serve/paged_op.h, used by the compiled step): its cpu
// kernel over a mixed batch (a decode after cached positions, a fresh prefill, a chunk after
// cached positions) against attention computed naively in double from the same cache and new
// rows; exactly the new tokens' slots written; bucket padding rows zero; bad step data a
// tpu::Error that leaves the cache untouched; on the tiny sim chip the op (the chip's program)
// equals the cpu op; through tpu::compile the op is one graph node that writes the captured
// cache in place on every call without a recompile.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "codegen/paged_attention.h"
#include "core/codegen_testing.h"
#include "core/testing.h"
#include "codegen/launch.h"
#include "tpucore/compile.h"
#include "tpucore/ops.h"
#include "tpucore/serve/paged_op.h"

using namespace tpu;
using tpu::testing::expect_error;

namespace {

constexpr int64_t kHeads = 4, kKvHeads = 2, kDim = 8, kBlock = 4, kBlocks = 12;
constexpr int64_t kRow = kKvHeads * kDim, kQRow = kHeads * kDim;

struct Batch {
  std::vector<int64_t> query_start{0}, context_len;
  std::vector<std::vector<int32_t>> tables;
  std::vector<const std::vector<int32_t>*> table_ptrs() const {
    std::vector<const std::vector<int32_t>*> p;
    for (const auto& t : tables) p.push_back(&t);
    return p;
  }
  void add(int64_t new_tokens, int64_t context, std::vector<int32_t> table) {
    query_start.push_back(query_start.back() + new_tokens);
    context_len.push_back(context);
    tables.push_back(std::move(table));
  }
  int64_t tokens() const { return query_start.back(); }
};

// Decode after 6 cached positions; a fresh 5-token prefill; a 3-token chunk after 4 cached.
Batch mixed_batch() {
  Batch b;
  b.add(1, 7, {9, 2});
  b.add(5, 5, {4, 11});
  b.add(3, 7, {0, 7});
  return b;
}

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

codegen::PagedAttentionSpec cpu_spec(int64_t max_units) {
  codegen::PagedAttentionSpec s;
  s.heads = kHeads;
  s.kv_heads = kKvHeads;
  s.head_dim = kDim;
  s.block_size = kBlock;
  s.max_units = max_units;
  s.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(kDim)));
  return s;
}

// Naive attention in double: token t of sequence s at position p reads positions 0..p, the
// new tokens' rows for positions of this step, the cache (through the table) for the others.
std::vector<double> naive(const Batch& b, const std::vector<float>& q, const std::vector<float>& kn,
                          const std::vector<float>& vn, const std::vector<float>& kc, const std::vector<float>& vc) {
  std::vector<double> out(static_cast<size_t>(b.tokens() * kQRow), 0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(kDim));
  for (size_t s = 0; s < b.context_len.size(); ++s) {
    const int64_t t0 = b.query_start[s], nq = b.query_start[s + 1] - t0, first = b.context_len[s] - nq;
    for (int64_t i = 0; i < nq; ++i) {
      const int64_t t = t0 + i, p = first + i;
      for (int64_t h = 0; h < kHeads; ++h) {
        const int64_t kh = h / (kHeads / kKvHeads);
        std::vector<double> sc(static_cast<size_t>(p + 1));
        double mx = -1e300;
        auto row_of = [&](int64_t j, const std::vector<float>& nw, const std::vector<float>& cache) {
          if (j >= first) return &nw[static_cast<size_t>((t0 + j - first) * kRow + kh * kDim)];
          const int64_t slot = b.tables[s][static_cast<size_t>(j / kBlock)] * kBlock + j % kBlock;
          return &cache[static_cast<size_t>(slot * kRow + kh * kDim)];
        };
        for (int64_t j = 0; j <= p; ++j) {
          const float* kr = row_of(j, kn, kc);
          double dot = 0;
          for (int64_t e = 0; e < kDim; ++e) dot += double(q[static_cast<size_t>(t * kQRow + h * kDim + e)]) * kr[e];
          sc[static_cast<size_t>(j)] = dot * scale;
          mx = std::max(mx, dot * scale);
        }
        double l = 0;
        for (double& x : sc) l += (x = std::exp(x - mx));
        for (int64_t j = 0; j <= p; ++j) {
          const float* vr = row_of(j, vn, vc);
          for (int64_t e = 0; e < kDim; ++e)
            out[static_cast<size_t>(t * kQRow + h * kDim + e)] += sc[static_cast<size_t>(j)] / l * vr[e];
        }
      }
    }
  }
  return out;
}

Tensor i32(const std::vector<int32_t>& v, Device d = Device()) {
  return from_vector(v, Shape{static_cast<int64_t>(v.size())}, TensorOptions(DType::i32, d));
}

}  // namespace

TEST_CASE("serve: paged attention op on the cpu equals naive attention and writes only the new slots", "[serve][paged]") {
  const Batch b = mixed_batch();
  const int64_t n = b.tokens(), rows = n + 3;  // 3 rows of bucket padding
  const codegen::PagedAttentionSpec spec = cpu_spec(rows);
  const codegen::PagedAttentionMeta meta =
      codegen::plan_paged_attention(spec, kBlocks, b.query_start, b.context_len, b.table_ptrs());
  const auto q = random_values(static_cast<size_t>(rows * kQRow), 1);
  const auto kn = random_values(static_cast<size_t>(rows * kRow), 2), vn = random_values(kn.size(), 3);
  const auto kc0 = random_values(static_cast<size_t>(kBlocks * kBlock * kRow), 4), vc0 = random_values(kc0.size(), 5);
  Tensor kc = from_vector(kc0, Shape{kBlocks * kBlock, kRow}), vc = from_vector(vc0, Shape{kBlocks * kBlock, kRow});
  std::vector<int32_t> slots = meta.slots;
  slots.resize(static_cast<size_t>(rows), 0);
  Tensor out = serve::paged_attention(spec, from_vector(q, Shape{rows, kQRow}), from_vector(kn, Shape{rows, kRow}),
                                      from_vector(vn, Shape{rows, kRow}), kc, vc, i32(meta.units), i32(meta.pages),
                                      i32(slots));
  REQUIRE(out.shape() == Shape{rows, kQRow});
  const std::vector<float> got = out.to_vector<float>();
  const std::vector<double> want = naive(b, q, kn, vn, kc0, vc0);
  double err = 0;
  for (size_t i = 0; i < want.size(); ++i) err = std::max(err, std::abs(got[i] - want[i]));
  CHECK(err < 2e-5);
  for (size_t i = want.size(); i < got.size(); ++i) CHECK(got[i] == 0.0f);  // padding rows
  // The cache: the new tokens' rows at their slots (block * 4 + offset through the tables), the rest unchanged.
  const std::vector<float> kc1 = kc.to_vector<float>(), vc1 = vc.to_vector<float>();
  std::vector<int64_t> writer(static_cast<size_t>(kBlocks * kBlock), -1);
  for (size_t s = 0; s < b.context_len.size(); ++s)
    for (int64_t t = b.query_start[s]; t < b.query_start[s + 1]; ++t) {
      const int64_t p = b.context_len[s] - (b.query_start[s + 1] - t);
      writer[static_cast<size_t>(b.tables[s][static_cast<size_t>(p / kBlock)] * kBlock + p % kBlock)] = t;
    }
  int64_t written = 0;
  for (int64_t slot = 0; slot < kBlocks * kBlock; ++slot)
    for (int64_t e = 0; e < kRow; ++e) {
      const auto i = static_cast<size_t>(slot * kRow + e);
      const int64_t w = writer[static_cast<size_t>(slot)];
      const float kw = w < 0 ? kc0[i] : kn[static_cast<size_t>(w * kRow + e)];
      const float vw = w < 0 ? vc0[i] : vn[static_cast<size_t>(w * kRow + e)];
      CHECK(kc1[i] == kw);
      CHECK(vc1[i] == vw);
      written += w >= 0 && e == 0;
    }
  CHECK(written == n);
}

TEST_CASE("serve: paged attention op rejects bad step data and leaves the cache untouched", "[serve][paged]") {
  const Batch b = mixed_batch();
  const int64_t n = b.tokens();
  const codegen::PagedAttentionSpec spec = cpu_spec(n);
  const codegen::PagedAttentionMeta meta =
      codegen::plan_paged_attention(spec, kBlocks, b.query_start, b.context_len, b.table_ptrs());
  const Tensor q = ones(Shape{n, kQRow}), kn = ones(Shape{n, kRow});
  Tensor kc = zeros(Shape{kBlocks * kBlock, kRow}), vc = zeros(Shape{kBlocks * kBlock, kRow});
  auto run = [&](std::vector<int32_t> units, std::vector<int32_t> pages, std::vector<int32_t> slots) {
    serve::paged_attention(spec, q, kn, kn, kc, vc, i32(units), i32(pages), i32(slots));
  };
  auto bad_slot = meta.slots;
  bad_slot[2] = kBlocks * kBlock;
  expect_error([&] { run(meta.units, meta.pages, bad_slot); }, {"token 2 names cache slot 48 of 48"});
  auto bad_page = meta.pages;
  bad_page[0] = -1;
  expect_error([&] { run(meta.units, bad_page, meta.slots); }, {"names block -1 of 12"});
  auto too_many = meta.units;
  too_many[0] = static_cast<int32_t>(n + 1);  // more tokens than the operands hold
  expect_error([&] { run(too_many, meta.pages, meta.slots); }, {"names 10 tokens"});
  auto short_pages = meta.pages;
  short_pages.resize(2);
  expect_error([&] { run(meta.units, short_pages, meta.slots); }, {"is outside the step"});
  expect_error([&] { run(std::vector<int32_t>(8, 0), meta.pages, meta.slots); }, {"unit table has 8 words"});
  expect_error([&] { serve::paged_attention(spec, q, ones(Shape{n, kRow + 1}), kn, kc, vc, i32(meta.units),
                                            i32(meta.pages), i32(meta.slots)); },
               {"new keys/values"});
  expect_error([&] { serve::paged_attention(spec, q, kn, kn, zeros(Shape{kBlocks * kBlock + 1, kRow}), vc,
                                            i32(meta.units), i32(meta.pages), i32(meta.slots)); },
               {"the caches"});
  CHECK(tpu::sum(tpu::abs(kc)).item<float>() == 0.0f);  // nothing was written by a rejected step
  CHECK(tpu::sum(tpu::abs(vc)).item<float>() == 0.0f);
  // Still usable: the good data runs.
  run(meta.units, meta.pages, meta.slots);
  CHECK(tpu::sum(tpu::abs(kc)).item<float>() == static_cast<float>(n * kRow));
}

TEST_CASE("serve: paged attention op traced by tpu::compile writes the captured cache in place", "[serve][paged][jit]") {
  // Two steps of one sequence through a compiled function: prefill 3 tokens, then decode one;
  // the decode reads the prefill's keys and values from the captured cache.
  Tensor kc = zeros(Shape{kBlocks * kBlock, kRow}), vc = zeros(Shape{kBlocks * kBlock, kRow});
  const codegen::PagedAttentionSpec spec = cpu_spec(4);
  auto step = tpu::compile(
      [&](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& units, const Tensor& pages,
          const Tensor& slots) { return serve::paged_attention(spec, q, k, v, kc, vc, units, pages, slots); },
      CompileOptions{.name = "serve_paged_op_test"});
  const auto q = random_values(4 * kQRow, 7), kn = random_values(4 * kRow, 8), vn = random_values(4 * kRow, 9);
  Batch all;  // the reference: the four tokens as one prefill
  all.add(4, 4, {5, 3});
  const std::vector<double> want = naive(all, q, kn, vn, kc.to_vector<float>(), vc.to_vector<float>());
  std::vector<float> got;
  for (int step_i = 0; step_i < 2; ++step_i) {
    Batch b;
    if (step_i == 0) b.add(3, 3, {5});
    else b.add(1, 4, {5, 3});
    const int64_t t0 = step_i == 0 ? 0 : 3, nt = b.tokens();
    codegen::PagedAttentionMeta meta =
        codegen::plan_paged_attention(spec, kBlocks, b.query_start, b.context_len, b.table_ptrs());
    meta.pages.resize(8, 0);  // one shape for both steps
    meta.slots.resize(4, 0);
    auto rows = [&](const std::vector<float>& v, int64_t w) {
      std::vector<float> r(static_cast<size_t>(4 * w), 0);
      std::copy(v.begin() + t0 * w, v.begin() + (t0 + nt) * w, r.begin());
      return from_vector(r, Shape{4, w});
    };
    const std::vector<float> o =
        step(rows(q, kQRow), rows(kn, kRow), rows(vn, kRow), i32(meta.units), i32(meta.pages), i32(meta.slots))
            .to_vector<float>();
    got.insert(got.end(), o.begin(), o.begin() + nt * kQRow);
  }
  double err = 0;
  for (size_t i = 0; i < want.size(); ++i) err = std::max(err, std::abs(got[i] - want[i]));
  CHECK(err < 2e-5);
  const jit::Stats st = jit::stats();
  REQUIRE(st.find("serve_paged_op_test") != nullptr);
  CHECK(st.find("serve_paged_op_test")->compiles == 1);
  CHECK(st.find("serve_paged_op_test")->hits == 1);
}

TEST_CASE("serve: paged attention op on the tiny sim chip equals the cpu op", "[serve][paged][sim]") {
  tpu::testing::TinySim sim;
  const Device dev = sim.dev();
  const Batch b = mixed_batch();
  const int64_t n = b.tokens();
  codegen::PagedAttentionSpec spec = cpu_spec(16);
  codegen::choose_paged_attention_tiling(codegen::chip_config(dev), spec);
  const int64_t rows = n + spec.tile_tokens - 1;
  const codegen::PagedAttentionMeta meta =
      codegen::plan_paged_attention(spec, kBlocks, b.query_start, b.context_len, b.table_ptrs());
  const auto q = random_values(static_cast<size_t>(rows * kQRow), 11);
  const auto kn = random_values(static_cast<size_t>(rows * kRow), 12), vn = random_values(kn.size(), 13);
  const auto kc0 = random_values(static_cast<size_t>(kBlocks * kBlock * kRow), 14), vc0 = random_values(kc0.size(), 15);
  std::vector<int32_t> slots = meta.slots;
  slots.resize(static_cast<size_t>(rows), 0);
  auto run_on = [&](Device d, Tensor& kc, Tensor& vc) {
    kc = from_vector(kc0, Shape{kBlocks * kBlock, kRow}, TensorOptions(DType::f32, d));
    vc = from_vector(vc0, Shape{kBlocks * kBlock, kRow}, TensorOptions(DType::f32, d));
    const TensorOptions o(DType::f32, d);
    Tensor out = serve::paged_attention(spec, from_vector(q, Shape{rows, kQRow}, o), from_vector(kn, Shape{rows, kRow}, o),
                                        from_vector(vn, Shape{rows, kRow}, o), kc, vc, i32(meta.units, d),
                                        i32(meta.pages, d), i32(slots, d));
    return narrow(out.to(Device()), 0, 0, n).contiguous().to_vector<float>();
  };
  tpu::testing::ChipRunProbe probe;
  Tensor kc_chip, vc_chip, kc_cpu, vc_cpu;
  const std::vector<float> chip = run_on(dev, kc_chip, vc_chip);
  CHECK(probe.new_runs() >= 1);
  CHECK(probe.new_fallbacks() == 0);
  const std::vector<float> cpu = run_on(Device(), kc_cpu, vc_cpu);
  double err = 0;
  for (size_t i = 0; i < cpu.size(); ++i) err = std::max(err, static_cast<double>(std::abs(chip[i] - cpu[i])));
  CHECK(err < 2e-5);
  CHECK(kc_chip.to(Device()).to_vector<float>() == kc_cpu.to_vector<float>());
  CHECK(vc_chip.to(Device()).to_vector<float>() == vc_cpu.to_vector<float>());
}
