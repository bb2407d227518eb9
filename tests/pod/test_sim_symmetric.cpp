// tpu::dist::sim_symmetric_group: one tiny chip playing a rank of a 4x4x4 slice. Values are
// checked against naive loops over G copies of this rank's data; the simulated time of an
// all-gather against the closed form of the "How to Scale Your Model" book (V / W on each of
// the three wraparound axes at once: V / (3 W), W = one link's bidirectional bandwidth); and a
// compiled FSDP-style step hides the gather of the next weight behind the current matmul.
#include <catch2/catch.hpp>

#include <cstdlib>

#include "tpucore/compile.h"
#include "tpucore/dist.h"
#include "tpucore/ops.h"
#include "tpucore/streams.h"

using namespace tpu;
using Catch::Matchers::Contains;

namespace {
const bool g_env = [] {
  setenv("TPU_SIM_CHIP", "tiny", 0);
  setenv("TPU_SIM_POD", "2x2", 0);
  return true;
}();
const Device kChip("sim:0");

std::vector<float> host(const Tensor& t) { return t.to(Device()).contiguous().to_vector<float>(); }
std::vector<float> seq(int64_t n, float base) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = base + float(i % 5);
  return v;
}
}  // namespace

TEST_CASE("sim symmetric group: values as if every rank held this rank's data") {
  auto pg = dist::sim_symmetric_group({.slice = "4x4x4", .rank = 3});
  REQUIRE(pg->size() == 64);
  CHECK(pg->rank() == 3);
  Tensor x = from_vector(seq(8, 1), Shape{8}).to(kChip);
  Tensor s = x.clone();
  pg->all_reduce(s);
  std::vector<float> want;
  for (float v : seq(8, 1)) want.push_back(64 * v);
  CHECK(host(s) == want);
  Tensor g = empty(Shape{8 * 64}, TensorOptions(DType::f32, kChip));
  pg->all_gather_into_tensor(g, x);
  want.clear();
  for (int i = 0; i < 64; ++i)
    for (float v : seq(8, 1)) want.push_back(v);
  CHECK(host(g) == want);
  Tensor big = from_vector(seq(64 * 2, 0), Shape{128}).to(kChip), part = empty(Shape{2}, TensorOptions(DType::f32, kChip));
  pg->reduce_scatter_tensor(part, big);
  CHECK(host(part) == std::vector<float>{64 * seq(128, 0)[6], 64 * seq(128, 0)[7]});  // block 3 of 64
  // One axis of the slice: a group of 4.
  auto row = dist::sim_symmetric_group({.slice = "4x4x4", .axes = {2}});
  CHECK(row->size() == 4);
  Tensor y = x.clone();
  row->all_reduce(y, dist::ReduceOp::max);
  CHECK(host(y) == seq(8, 1));
  CHECK_THROWS_WITH(dist::sim_symmetric_group({.slice = "4x4x4", .axes = {3}}), Contains("axis 3"));
  CHECK_THROWS_WITH(dist::sim_symmetric_group({.slice = "4x4x4", .rank = 64}), Contains("rank 64"));
}

TEST_CASE("sim symmetric group: an all-gather's simulated time against the closed form") {
  auto pg = dist::sim_symmetric_group({.slice = "4x4x4"});
  const int64_t shard = 8 * 1024;  // f32 elements: 32 KB per chip, V = 2 MB
  Tensor x = zeros(Shape{shard}, TensorOptions(DType::f32, kChip));
  Tensor g = empty(Shape{shard * 64}, TensorOptions(DType::f32, kChip));
  synchronize(kChip);
  Event a, b;
  a.record(kChip);
  pg->all_gather_into_tensor(g, x);
  b.record(kChip);
  const double seconds = a.elapsed_ms(b) / 1e3;
  const double V = double(shard) * 4 * 64, W = 2 * 1e9;  // tiny ICI: 1 GB/s per direction
  const double closed = V / (3 * W);
  INFO("simulated " << seconds << " s, closed form " << closed << " s");
  CHECK(seconds == Approx(closed).epsilon(0.10));
}

TEST_CASE("sim symmetric group: a compiled FSDP-style step gathers the next weight behind the current matmul") {
  auto pg = dist::sim_symmetric_group({.slice = "2x2", .ici = "tiny"});
  const int64_t n = 128;
  std::vector<Tensor> shards;
  for (int l = 0; l < 3; ++l) shards.push_back(full(Shape{n * n / 4}, 0.25 * (l + 1), TensorOptions(DType::bf16, kChip)));
  auto step = [&](const Tensor& x) {
    Tensor h = x;
    for (const Tensor& s : shards) {
      Tensor w = empty(Shape{n * n}, TensorOptions(DType::bf16, kChip));
      pg->all_gather_into_tensor(w, s);
      h = matmul(h, reshape(w, {n, n}));
    }
    return h;
  };
  auto f = compile(step);
  Tensor x = ones(Shape{n, n}, TensorOptions(DType::bf16, kChip));
  Tensor y = f(x);
  // Every weight is all (l + 1) / 4 (4 equal shards): y = 128^3 * (1/4 * 2/4 * 3/4) per element.
  CHECK(host(y.to(DType::f32)) == std::vector<float>(size_t(n * n), float(n * n * n) * 0.09375f));
  auto timed = [&](const std::function<void()>& fn) {
    synchronize(kChip);
    Event a, b;
    a.record(kChip);
    fn();
    b.record(kChip);
    return a.elapsed_ms(b);
  };
  const double compiled = timed([&] { (void)f(x); }), eager = timed([&] { (void)step(x); });
  Tensor w = empty(Shape{n * n}, TensorOptions(DType::bf16, kChip));
  const double gather = timed([&] { pg->all_gather_into_tensor(w, shards[0]); });
  const double mm = timed([&] { (void)matmul(x, x); });
  INFO("compiled " << compiled << " ms, eager " << eager << " ms, one gather " << gather << " ms, one matmul " << mm);
  // Serial reference: 3 gathers + 3 matmuls (eager); overlapped: only the first gather shows.
  CHECK(eager == Approx(3 * gather + 3 * mm).epsilon(0.03));
  CHECK(compiled == Approx(gather + 3 * mm).epsilon(0.03));
}
