// The sim device's memory: the HBM allocator (best fit, coalescing, alignment, threads), OOM
// and recovery on the tiny chip, copies host<->HBM<->HBM, properties, bad presets and indices.
#include <catch2/catch.hpp>

#include <thread>
#include <vector>

#include "device/hbm_allocator.h"
#include "device/sim_driver.h"
#include "tpucore/devices.h"
#include "tpucore/ops.h"
#include "tpucore/streams.h"

using namespace tpu;
using Catch::Matchers::Contains;

namespace {

// Builds sim:1 on the tiny chip (4 MiB HBM) for the duration of a test; back to the default
// chip afterwards so other tests see the usual device.
struct TinySim1 {
  std::string prev;
  TinySim1() : prev(device::sim_chip(1)) { set_sim_chip("tiny", 1); }
  ~TinySim1() {
    try {
      set_sim_chip(prev, 1);
    } catch (...) {
    }
  }
};

}  // namespace

TEST_CASE("device: HBM allocator is best fit, aligned and coalesces", "[device]") {
  device::HbmAllocator a(512, 64 * 1024, 512);
  const uint64_t cap = a.stats().capacity;
  CHECK(cap == 64 * 1024);
  auto x = a.allocate(1), y = a.allocate(1000), z = a.allocate(4096), w = a.allocate(0);
  REQUIRE(x);
  REQUIRE(y);
  REQUIRE(z);
  REQUIRE(w);
  for (uint64_t p : {*x, *y, *z, *w}) CHECK(p % 512 == 0);
  CHECK(*x >= 512);  // address 0 is never handed out
  CHECK(a.block_size(*y) == 1024);
  CHECK(a.in_live_block(*y, 1024));
  CHECK(a.in_live_block(*y + 100, 924));
  CHECK_FALSE(a.in_live_block(*y + 100, 925));
  CHECK_FALSE(a.in_live_block(*w + 4096, 1));
  CHECK(a.stats().bytes_in_use == 512 + 1024 + 4096 + 512);
  // Best fit: after freeing y (1024) and a 4096 hole, a 600-byte request takes y's hole.
  REQUIRE(a.free(*y));
  auto big_hole = a.allocate(8192);
  REQUIRE(big_hole);
  auto small = a.allocate(600);
  REQUIRE(small);
  CHECK(*small == *y);
  CHECK_FALSE(a.free(*y + 512));  // not the start of a block
  CHECK_FALSE(a.free(123456789));
  // Free everything: the blocks coalesce back into one, so the whole capacity fits again.
  for (uint64_t p : {*x, *z, *w, *big_hole, *small}) REQUIRE(a.free(p));
  CHECK(a.stats().bytes_in_use == 0);
  CHECK(a.stats().largest_free == cap);
  auto all = a.allocate(cap);
  REQUIRE(all);
  CHECK_FALSE(a.allocate(1));
  CHECK(a.stats().failures == 1);
}

TEST_CASE("device: HBM allocator is thread-safe", "[device]") {
  device::HbmAllocator a(512, 8 << 20, 512);
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      std::vector<uint64_t> mine;
      for (int i = 0; i < 500; ++i) {
        if (auto p = a.allocate(static_cast<uint64_t>(512 * (1 + (i + t) % 7)))) mine.push_back(*p);
        if (i % 3 == 2 && !mine.empty()) {
          a.free(mine.back());
          mine.pop_back();
        }
      }
      for (uint64_t p : mine) a.free(p);
    });
  for (auto& t : ts) t.join();
  auto s = a.stats();
  CHECK(s.bytes_in_use == 0);
  CHECK(s.live_blocks == 0);
  CHECK(s.largest_free == s.capacity);
}

TEST_CASE("device: sim tensors live in HBM and round-trip through copies", "[device]") {
  Tensor z = zeros({2, 3}, Device("sim:0"));
  CHECK(z.device() == Device("sim:0"));
  CHECK_THROWS_WITH(z.raw_data(), Contains("sim:0"));  // the host never dereferences HBM
  CHECK(z.to_vector<float>() == std::vector<float>(6, 0.0f));

  std::vector<float> v(1000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) * 0.5f - 7.0f;
  Tensor h = from_vector(v, {10, 100});
  Tensor s0 = h.to("sim:0");
  Tensor s1 = s0.to("sim:1");        // between two chips
  Tensor s0b = clone(s0);            // HBM -> HBM on one chip
  CHECK(s0.to_vector<float>() == v);
  CHECK(s1.to_vector<float>() == v);
  CHECK(s0b.to_vector<float>() == v);
  // Non-contiguous views are made contiguous on the way.
  CHECK(s0.transpose(0, 1).to("cpu").to_vector<float>() == h.transpose(0, 1).contiguous().to_vector<float>());
  // Every dtype survives the trip bit for bit.
  for (DType dt : {DType::bf16, DType::f16, DType::i32, DType::i8, DType::u8, DType::boolean}) {
    Tensor c = to(h, dt);
    CHECK(equal(to(c, "sim:0").to("cpu"), c));
  }
  // Scalars.
  CHECK(s0.sum().item().to_double() == Approx(h.sum().item().to_double()));
}

TEST_CASE("device: overlapping HBM->HBM copies behave like memmove", "[device]") {
  std::vector<int32_t> v(64);
  for (int i = 0; i < 64; ++i) v[static_cast<size_t>(i)] = i;
  Tensor t = from_vector(v, {64}).to("sim:0");
  device::Driver& drv = device::driver_for(Device("sim:0"));
  drv.copy_on_device(*t.storage(), 0, *t.storage(), 16 * 4, 32 * 4);  // forward overlap
  std::vector<int32_t> e = v;
  std::copy_backward(v.begin(), v.begin() + 32, e.begin() + 48);
  CHECK(t.to_vector<int32_t>() == e);
  CHECK_THROWS_WITH(drv.copy_on_device(*t.storage(), 0, *t.storage(), 250, 8), Contains("outside"));
}

TEST_CASE("device: out of memory on the tiny chip is a clear error and the device recovers", "[device]") {
  TinySim1 tiny;
  const Device d("sim:1");
  const DeviceProperties p = device_properties(d);
  CHECK(p.memory_bytes == 4u << 20);
  CHECK_THAT(p.name, Contains("tiny"));
  CHECK(p.compute_units == 2);
  const size_t free0 = memory_free(d);
  CHECK(free0 <= p.memory_bytes);
  CHECK(free0 > p.memory_bytes - 4096);

  std::vector<Tensor> held;
  std::string msg;
  try {
    for (int i = 0; i < 100; ++i) held.push_back(zeros({256, 1024}, TensorOptions(DType::f32, d)));  // 1 MiB each
  } catch (const Error& e) {
    msg = e.what();
  }
  REQUIRE(!msg.empty());
  CHECK(held.size() == 3);  // 4 MiB minus the reserved first block
  CHECK_THAT(msg, Contains("sim:1") && Contains("out of device memory") && Contains("1048576 bytes") && Contains("free"));
  CHECK_THAT(msg, Contains(std::to_string(memory_free(d)) + " bytes"));
  // A large request names what was asked for.
  CHECK_THROWS_WITH(empty({1 << 30}, TensorOptions(DType::f32, d)), Contains("4294967296 bytes"));
  // The device keeps working: what is held is intact, and freeing makes room again.
  CHECK(held[0].sum().item().to_double() == 0.0);
  held.clear();
  CHECK(memory_free(d) == free0);
  Tensor again = ones({256, 1024}, TensorOptions(DType::f32, d));
  Tensor again2 = ones({256, 1024}, TensorOptions(DType::f32, d));
  CHECK(again.sum().item().to_double() == 256.0 * 1024.0);
  CHECK(memory_free(d) == free0 - 2 * (1u << 20));
}

TEST_CASE("device: sim chip selection and bad presets", "[device]") {
  CHECK_THROWS_WITH(set_sim_chip("v99"), Contains("v99") && Contains("tiny") && Contains("v5e") && Contains("presets"));
  {
    TinySim1 tiny;
    Tensor keep = zeros({4}, Device("sim:1"));
    CHECK_THROWS_WITH(set_sim_chip("v5e", 1), Contains("sim:1") && Contains("live"));
  }
  CHECK_THAT(device_properties(Device("sim:0")).description, Contains("MXU"));
  CHECK(device_count(DeviceType::sim) == device::sim_device_count());
  CHECK(device_count(DeviceType::sim) >= 2);
}

TEST_CASE("device: a bad sim device index names the device and the count", "[device]") {
  const int n = device_count(DeviceType::sim);
  const std::string bad = "sim:" + std::to_string(n + 3);
  CHECK_THROWS_WITH(zeros({2}, Device(bad)), Contains(bad) && Contains(std::to_string(n)));
  CHECK_THROWS_WITH(ones({2}).to(Device(bad)), Contains(bad));
  CHECK_THROWS_WITH(Stream::create(Device(bad)), Contains(bad));
}

TEST_CASE("device: one op on tensors of two devices names both", "[device]") {
  Tensor a = ones({3}, Device("sim:0"));
  Tensor b = ones({3});
  CHECK_THROWS_WITH(add(a, b), Contains("add") && Contains("sim:0") && Contains("cpu"));
  Tensor c = ones({3}, Device("sim:1"));
  CHECK_THROWS_WITH(mul(a, c), Contains("sim:0") && Contains("sim:1"));
  // A Python-style scalar (wrapped number) may meet a tensor of any device.
  CHECK(add(a, 2.0).to_vector<float>() == std::vector<float>(3, 3.0f));
}
