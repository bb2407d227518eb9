// Collectives between sim devices of a pod (device/sim_pod.h). Run with TPU_SIM_POD=2x2 and
// TPU_SIM_CHIP=tiny (set below unless given), so sim:0..3 are the chips of a 2x2 slice. Values are
// checked against naive loops over the host copies; times against the devices' stream times.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "device/sim_driver.h"
#include "device/sim_pod.h"
#include "tpucore/profiler.h"

using namespace tpu::device;
namespace sim = tpu::sim;
using Catch::Matchers::Contains;
using tpu::sim::CollectiveKind;
using tpu::sim::DType;
using tpu::sim::ReduceOp;

namespace {

// Before any sim device exists: tiny chips (ctest also sets TPU_SIM_POD; running the binary
// by hand gets the same pod). Environment values already set win.
const bool g_env = [] {
  setenv("TPU_SIM_CHIP", "tiny", 0);
  setenv("TPU_SIM_POD", "2x2", 0);
  return true;
}();

struct Bufs {
  std::vector<int> devs;
  std::vector<uint64_t> src, dst;
  explicit Bufs(std::vector<int> d, uint64_t bytes) : devs(std::move(d)) {
    for (int i : devs) {
      src.push_back(sim_device(i).allocate(std::max<uint64_t>(bytes, 1)));
      dst.push_back(sim_device(i).allocate(std::max<uint64_t>(bytes * devs.size(), 1)));
    }
  }
  ~Bufs() {
    for (size_t r = 0; r < devs.size(); ++r) {
      sim_device(devs[r]).free(src[r]);
      sim_device(devs[r]).free(dst[r]);
    }
  }
  SimCollectiveArgs args(CollectiveKind k, DType t, uint64_t count, ReduceOp op = ReduceOp::sum) const {
    SimCollectiveArgs a;
    a.kind = k;
    a.dtype = t;
    a.count = count;
    a.op = op;
    for (size_t r = 0; r < devs.size(); ++r) {
      a.src.push_back({devs[r], src[r], 0});
      a.dst.push_back({devs[r], dst[r], 0});
    }
    return a;
  }
  std::vector<uint8_t> out(size_t r, uint64_t bytes) const {
    std::vector<uint8_t> v(bytes);
    sim_device(devs[r]).copy_d2h(kDefaultStream, v.data(), dst[r], bytes);
    return v;
  }
};

double elem(DType t, const uint8_t* p, size_t i) {
  switch (t) {
    case DType::f32: { float f; std::memcpy(&f, p + i * 4, 4); return f; }
    case DType::bf16: { uint16_t u; std::memcpy(&u, p + i * 2, 2); return sim::bf16_bits_to_f32(u); }
    case DType::i32: { int32_t v; std::memcpy(&v, p + i * 4, 4); return v; }
    case DType::i8: return static_cast<int8_t>(p[i]);
    case DType::f8e4m3: return sim::e4m3_bits_to_f32(p[i]);
  }
  return 0;
}

// Naive sum / max / min over ranks as the dtype stores it (float accumulation for f32 and bf16).
double naive(DType t, ReduceOp op, const std::vector<std::vector<uint8_t>>& in, size_t i) {
  double acc = elem(t, in[0].data(), i);
  float facc = float(acc);
  for (size_t r = 1; r < in.size(); ++r) {
    const double v = elem(t, in[r].data(), i);
    if (op == ReduceOp::sum) { acc += v; facc += float(v); }
    if (op == ReduceOp::max) acc = std::max(acc, v);
    if (op == ReduceOp::min) acc = std::min(acc, v);
  }
  if (op != ReduceOp::sum) return acc;
  if (t == DType::f32) return facc;
  if (t == DType::bf16) return sim::round_to_bf16(facc);
  if (t == DType::i32) return double(int32_t(uint32_t(int64_t(acc))));
  return double(int8_t(uint8_t(int64_t(acc))));
}

}  // namespace

TEST_CASE("sim pod: TPU_SIM_POD makes sim:0..3 a 2x2 slice") {
  CHECK(sim_pod_shape() == "2x2");
  CHECK(sim_device_count() == 4);  // TPU_SIM_DEVICES defaults to the slice
  const sim::Topology t = sim_pod_topology();
  CHECK(t.chips() == 4);
  CHECK(t.ici.name == "tiny");
}

TEST_CASE("sim pod: collectives on 2 and 4 devices, every dtype, odd and zero sizes, against naive loops") {
  std::mt19937 rng(3);
  for (std::vector<int> devs : {std::vector<int>{0, 1, 2, 3}, std::vector<int>{2, 3}, std::vector<int>{3, 0}}) {
    const size_t G = devs.size();
    for (DType t : {DType::f32, DType::bf16, DType::i32, DType::i8}) {
      for (uint64_t count : {0, 5, 12}) {
        const uint64_t es = uint64_t(sim::dtype_size(t)), bytes = count * es;
        Bufs b(devs, bytes);
        std::vector<std::vector<uint8_t>> in(G, std::vector<uint8_t>(bytes));
        for (size_t r = 0; r < G; ++r) {
          for (size_t i = 0; i < count; ++i) {
            const float f = std::uniform_real_distribution<float>(-8, 8)(rng);
            if (t == DType::f32) std::memcpy(&in[r][i * 4], &f, 4);
            if (t == DType::bf16) { const uint16_t u = sim::f32_to_bf16_bits(f); std::memcpy(&in[r][i * 2], &u, 2); }
            if (t == DType::i32) { const int32_t v = int32_t(f * 1000); std::memcpy(&in[r][i * 4], &v, 4); }
            if (t == DType::i8) in[r][i] = uint8_t(int8_t(f * 16));
          }
          sim_device(devs[r]).copy_h2d(kDefaultStream, b.src[r], in[r].data(), bytes);
        }
        INFO("devices " << G << " dtype " << sim::dtype_name(t) << " count " << count);
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
          SimCollectiveResult res = sim_collective(b.args(CollectiveKind::all_reduce, t, count, op));
          CHECK(res.end >= res.start);
          for (size_t r = 0; r < G; ++r) {
            auto o = b.out(r, bytes);
            for (size_t i = 0; i < count; ++i) CHECK(elem(t, o.data(), i) == naive(t, op, in, i));
          }
        }
        sim_collective(b.args(CollectiveKind::all_gather, t, count));
        for (size_t r = 0; r < G; ++r) {
          auto o = b.out(r, bytes * G);
          for (size_t q = 0; q < G; ++q)
            for (size_t i = 0; i < count; ++i) CHECK(elem(t, o.data(), q * count + i) == elem(t, in[q].data(), i));
        }
        const uint64_t cn = count - count % G, blk = cn / G;
        sim_collective(b.args(CollectiveKind::reduce_scatter, t, cn));
        for (size_t r = 0; r < G; ++r) {
          auto o = b.out(r, blk * es);
          for (size_t i = 0; i < blk; ++i) CHECK(elem(t, o.data(), i) == naive(t, ReduceOp::sum, in, r * blk + i));
        }
        sim_collective(b.args(CollectiveKind::all_to_all, t, cn));
        for (size_t j = 0; j < G; ++j) {
          auto o = b.out(j, cn * es);
          for (size_t r = 0; r < G; ++r)
            for (size_t i = 0; i < blk; ++i) CHECK(elem(t, o.data(), r * blk + i) == elem(t, in[r].data(), j * blk + i));
        }
        SimCollectiveArgs bc = b.args(CollectiveKind::broadcast, t, count);
        bc.root = int(G) - 1;
        sim_collective(bc);
        for (size_t r = 0; r < G; ++r) {
          auto o = b.out(r, bytes);
          for (size_t i = 0; i < count; ++i) CHECK(elem(t, o.data(), i) == elem(t, in[G - 1].data(), i));
        }
        SimCollectiveArgs pm = b.args(CollectiveKind::permute, t, count);
        for (size_t r = 0; r < G; ++r) pm.pairs.push_back({int(r), int((r + 1) % G)});  // a ring shift
        sim_collective(pm);
        for (size_t r = 0; r < G; ++r) {
          auto o = b.out(r, bytes);
          for (size_t i = 0; i < count; ++i) CHECK(elem(t, o.data(), i) == elem(t, in[(r + G - 1) % G].data(), i));
        }
      }
    }
  }
}

TEST_CASE("sim pod: a collective starts at the latest participant and overlaps compute on other streams") {
  const uint64_t n = 64 * 1024;  // f32 elements: 256 KiB
  Bufs b({0, 1, 2, 3}, n * 4);
  // Delay sim:2's default stream by an on-chip copy (compute) first.
  const double t2 = sim_device(2).queue().stream_time(kDefaultStream);
  sim_device(2).copy_d2d(kDefaultStream, b.dst[2], b.src[2], n * 4);
  sim_device(2).queue().synchronize();
  const double ready = sim_device(2).queue().stream_time(kDefaultStream);
  REQUIRE(ready > t2);
  double latest = 0;
  for (int d = 0; d < 4; ++d) latest = std::max(latest, sim_device(d).queue().stream_time(kDefaultStream));
  // A copy on another stream of sim:0 (compute) runs while the collective uses the ICI.
  const StreamId other = sim_device(0).queue().create_stream();
  auto work = sim_collective_async(b.args(CollectiveKind::all_reduce, DType::f32, n));
  sim_device(0).copy_d2d(other, b.dst[0] + n * 4, b.src[0], n * 4);
  const SimCollectiveResult r = work->wait();
  CHECK(work->done());
  CHECK(r.start == Approx(latest));
  CHECK(r.seconds > 0);
  CHECK(r.bytes == n * 4);
  CHECK(r.achieved_gbps == Approx(double(r.bytes) / r.seconds / 1e9));
  for (int d = 0; d < 4; ++d) {
    sim_device(d).queue().synchronize();
    CHECK(sim_device(d).queue().stream_time(kDefaultStream) == Approx(r.end));
  }
  CHECK(sim_device(0).queue().stream_time(other) < r.end);  // not serialized behind the ICI
  // Timing-only: costs the same, moves nothing.
  SimCollectiveArgs a = b.args(CollectiveKind::all_reduce, DType::f32, n);
  a.timing_only = true;
  CHECK(sim_collective(a).seconds == Approx(r.seconds));
}

TEST_CASE("sim pod: bad input is a tpu::Error naming the rank, the devices stay usable") {
  Bufs b({0, 1}, 64);
  SimCollectiveArgs a = b.args(CollectiveKind::all_reduce, DType::f32, 16);
  SimCollectiveArgs x = a;
  x.dst.pop_back();
  CHECK_THROWS_WITH(sim_collective(x), Contains("2 sources but 1 destinations"));
  x = a;
  x.src[1].device = 0;
  x.dst[1].device = 0;
  CHECK_THROWS_WITH(sim_collective(x), Contains("sim:0 appears twice"));
  x = a;
  x.dst[1].device = 2;
  CHECK_THROWS_WITH(sim_collective(x), Contains("rank 1 has its source on sim:1 but its destination on sim:2"));
  x = a;
  x.src[1].device = x.dst[1].device = 7;
  CHECK_THROWS_WITH(sim_collective(x), Contains("rank 1 is on sim:7") && Contains("not in the pod"));
  x = a;
  x.dst[0].addr = sim_device(0).hbm_size() - 8;
  CHECK_THROWS_WITH(sim_collective(x), Contains("rank 0 (sim:0): destination range") && Contains("outside"));
  x = b.args(CollectiveKind::reduce_scatter, DType::f32, 15);
  CHECK_THROWS_WITH(sim_collective(x), Contains("count 15 is not a multiple of the group size 2"));
  x = a;
  x.src[0].stream = 999;
  CHECK_THROWS_WITH(sim_collective(x), Contains("999"));
  CHECK_THROWS_WITH(set_sim_pod("3x3"), Contains("axis 0 has length 3") || Contains("3x3"));
  CHECK_THROWS_WITH(set_sim_pod("4x4"), Contains("needs 16 sim devices but only 4 exist"));
  CHECK_THROWS_WITH(set_sim_pod("2xq"), Contains("'q' is not an axis length"));
  CHECK(sim_pod_shape() == "2x2");  // unchanged by the failed calls
  set_sim_pod("");
  CHECK_THROWS_WITH(sim_collective(a), Contains("no pod is configured"));
  set_sim_pod("4");  // a 1-D slice of the same four devices
  const std::vector<float> ones(16, 1.0f);
  for (int r = 0; r < 2; ++r) sim_device(r).copy_h2d(kDefaultStream, b.src[r], ones.data(), 64);
  sim_collective(a);
  std::vector<float> got(16);
  sim_device(1).copy_d2h(kDefaultStream, got.data(), b.dst[1], 64);
  CHECK(got == std::vector<float>(16, 2.0f));
  set_sim_pod("2x2");
}

TEST_CASE("sim pod: a recording profiler shows each participant's collective on an ICI track") {
  Bufs b({0, 1}, 4096);
  std::string json;
  {
    tpu::profiler::Profile prof;
    sim_collective(b.args(CollectiveKind::all_gather, DType::f32, 1024));
    prof.stop();
    json = prof.chrome_trace_json();
  }
  CHECK_THAT(json, Contains("all_gather 8192 B"));
  CHECK_THAT(json, Contains("\"ICI\""));
  CHECK_THAT(json, Contains("sim:1"));
}

TEST_CASE("sim pod: wait() with a timeout fails cleanly while a participant is held, then completes") {
  Bufs b({0, 1}, 64);
  const std::vector<float> v(16, 3.0f);
  for (int r = 0; r < 2; ++r) sim_device(r).copy_h2d(kDefaultStream, b.src[r], v.data(), 64);
  sim_device(1).queue().hold();  // sim:1 starts no job: the collective cannot finish
  auto work = sim_collective_async(b.args(CollectiveKind::all_reduce, DType::f32, 16));
  CHECK_THROWS_WITH(work->wait(std::chrono::milliseconds(50)), Contains("all_reduce: not finished after 50 ms") && Contains("1 of 2 participants arrived"));
  CHECK_FALSE(work->done());
  sim_device(1).queue().release();
  work->wait(std::chrono::seconds(30));
  CHECK(work->done());
  std::vector<float> got(16);
  sim_device(0).copy_d2h(kDefaultStream, got.data(), b.dst[0], 64);
  CHECK(got == std::vector<float>(16, 6.0f));
}

TEST_CASE("sim pod: f16 elements and synchronous mode") {
  Bufs b({1, 2, 3}, 8);
  const uint16_t h[3][2] = {{0x3C00, 0x3800}, {0x3C00, 0x3800}, {0x4000, 0xBC00}};  // 1, .5 | 1, .5 | 2, -1
  for (int r = 0; r < 3; ++r) sim_device(b.devs[size_t(r)]).copy_h2d(kDefaultStream, b.src[size_t(r)], h[r], 4);
  SimCollectiveArgs a = b.args(CollectiveKind::all_reduce, DType::f32, 2);
  a.elem = sim::ElemType::f16;
  set_sync_mode(true);  // waits inside the call; errors surface there
  const SimCollectiveResult r = sim_collective_async(a)->wait(std::chrono::seconds(0));
  set_sync_mode(false);
  CHECK(r.bytes == 4);
  auto o = b.out(2, 4);
  uint16_t got[2];
  std::memcpy(got, o.data(), 4);
  CHECK(got[0] == 0x4400);  // 1 + 1 + 2 = 4
  CHECK(got[1] == 0x0000);  // .5 + .5 - 1 = 0
}
