// Streams and events on sim devices: asynchronous work, ordering across streams and devices,
// host queries before and after, simulated elapsed time, TPU_SYNC mode and async errors.
// Determinism: while a device's queue is held (a testing aid of DeviceQueue) no job starts, so
// "not yet done" is checked without racing the worker.
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include "device/driver.h"
#include "device/sim_driver.h"
#include "tpucore/devices.h"
#include "tpucore/ops.h"
#include "tpucore/streams.h"

using namespace tpu;
using Catch::Matchers::Contains;

namespace {

uint64_t hbm_addr(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.storage()->data) + t.offset() * t.element_size(); }

// HBM -> HBM copy of `bytes` as a chip program (one DMA and its wait).
std::string copy_program(uint64_t dst, uint64_t src, uint64_t bytes) {
  return fmt::format("dma dst=hbm[{}] src=hbm[{}] shape=[1,1,{}] q=0 sem=0\nwait sem=0 n=1\n", dst, src, bytes);
}
// A 1 GiB HBM -> HBM DMA far from any tensor: long in simulated time, free in timing-only mode.
std::string long_program() {
  const uint64_t base = uint64_t(8) << 30;
  return fmt::format("dma dst=hbm[{}] src=hbm[{}] shape=[64,1024,16384] q=0 sem=0\nwait sem=0 n=1\n", base + (uint64_t(2) << 30), base);
}

// These tests observe asynchrony, so they run in asynchronous mode even under TPU_SYNC=1.
struct AsyncMode {
  bool prev = synchronous_mode();
  AsyncMode() { set_synchronous_mode(false); }
  ~AsyncMode() { set_synchronous_mode(prev); }
};

struct Held {
  AsyncMode async;
  device::DeviceQueue& q;
  explicit Held(int index) : q(device::sim_device(index).queue()) { q.hold(); }
  ~Held() { q.release(); }
};

}  // namespace

TEST_CASE("streams: default and current streams, guards", "[device]") {
  const Device d("sim:0");
  Stream def = current_stream(d);
  CHECK(def.is_default());
  CHECK(def == Stream::default_stream(d));
  Stream s = Stream::create(d), s2 = Stream::create(d);
  CHECK(s != s2);
  CHECK_FALSE(s.is_default());
  {
    StreamGuard g(s);
    CHECK(current_stream(d) == s);
    CHECK(current_stream(Device("sim:1")).is_default());  // per device
    {
      StreamGuard g2(s2);
      CHECK(current_stream(d) == s2);
    }
    CHECK(current_stream(d) == s);
    Tensor x = ones({4}, d);  // work issued under the guard goes to s
    CHECK(x.to_vector<float>() == std::vector<float>(4, 1.0f));
  }
  CHECK(current_stream(d) == def);
  // cpu streams and events exist and are trivially complete.
  Stream c = Stream::create(Device("cpu"));
  Event e1, e2;
  CHECK(e1.query());
  e1.record(c);
  e2.record(c);
  CHECK(e2.query());
  CHECK(e1.elapsed_ms(e2) >= 0.0);
  c.synchronize();
  synchronize(Device("cpu"));
}

TEST_CASE("streams: an event orders work across streams, host queries before and after", "[device]") {
  const Device d("sim:0");
  device::Driver& drv = device::driver_for(d);
  Stream A = Stream::create(d), B = Stream::create(d);
  std::vector<float> v(256);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) + 0.25f;
  Tensor a = from_vector(v).to(d), b = zeros({256}, d), c = zeros({256}, d);
  const auto lp = drv.load_program(0, long_program());
  const auto cp = drv.load_program(0, copy_program(hbm_addr(b), hbm_addr(a), 1024));
  auto long_stats = std::make_shared<device::ProgramStats>();
  Event e0, eA, eB;
  {
    Held hold(0);
    e0.record(A);
    drv.enqueue_program(0, A.id(), lp, {.timing_only = true}, long_stats);
    drv.enqueue_program(0, A.id(), cp, {});  // b = a, after the long program
    eA.record(A);
    eA.wait(B);  // B's copy below must see b written
    {
      StreamGuard g(B);
      c.copy_(b);
    }
    eB.record(B);
    CHECK_FALSE(eA.query());
    CHECK_FALSE(eB.query());
    CHECK_FALSE(A.query());
    CHECK_FALSE(B.query());
    CHECK_FALSE(long_stats->done);
  }
  eB.synchronize();
  CHECK(eB.query());
  CHECK(eA.query());
  CHECK(A.query());
  REQUIRE(long_stats->done);
  CHECK(long_stats->cycles > 1e6);
  // Simulated time: A's span covers the long program, B's copy starts after A's event.
  CHECK(e0.elapsed_ms(eA) >= long_stats->seconds * 1e3 * 0.999);
  CHECK(eA.elapsed_ms(eB) > 0.0);
  CHECK(c.to_vector<float>() == v);
  CHECK(b.to_vector<float>() == v);
  drv.unload_program(0, lp);
  drv.unload_program(0, cp);
}

TEST_CASE("streams: independent streams overlap in simulated time, a wait serializes them", "[device]") {
  const Device d("sim:0");
  device::Driver& drv = device::driver_for(d);
  const auto lp = drv.load_program(0, long_program());
  Stream A = Stream::create(d), B = Stream::create(d), C = Stream::create(d);
  Tensor host = ones({1 << 16});
  Event start, eA, eB, eC;
  Tensor onB, onC;
  {
    Held hold(0);
    start.record(A);
    drv.enqueue_program(0, A.id(), lp, {.timing_only = true});
    eA.record(A);
    {
      StreamGuard g(B);  // a host->device copy on its own link: overlaps A's program
      onB = host.to(d);
      eB.record(B);
    }
    eA.wait(C);
    {
      StreamGuard g(C);  // the same copy after waiting for A
      onC = host.to(d);
      eC.record(C);
    }
    CHECK_FALSE(eC.query());
  }
  synchronize(d);
  CHECK(eB.time_seconds() < eA.time_seconds());
  CHECK(eC.time_seconds() > eA.time_seconds());
  CHECK(start.elapsed_ms(eB) < start.elapsed_ms(eA));
  CHECK(onB.sum().item().to_double() == 65536.0);
  CHECK(onC.sum().item().to_double() == 65536.0);
  drv.unload_program(0, lp);
}

TEST_CASE("streams: a stream of one device waits on an event of another", "[device]") {
  const Device d0("sim:0"), d1("sim:1");
  device::Driver& drv = device::driver_for(d0);
  const auto lp = drv.load_program(0, long_program());
  Stream A = Stream::create(d0), S = Stream::create(d1);
  Event eA, eS;
  Tensor x;
  {
    Held hold(0);
    drv.enqueue_program(0, A.id(), lp, {.timing_only = true});
    eA.record(A);
    eA.wait(S);
    {
      StreamGuard g(S);
      x = full({8}, 3.0f).to(d1);
    }
    eS.record(S);
    CHECK_FALSE(eS.query());  // sim:1 is blocked on sim:0's event
    CHECK_FALSE(S.query());
  }
  eS.synchronize();
  CHECK(eS.time_seconds() >= eA.time_seconds());
  CHECK(x.to_vector<float>() == std::vector<float>(8, 3.0f));
  // An event of another kind of device: the host waits for it instead.
  Event ec;
  ec.record(Stream::create(Device("cpu")));
  ec.wait(S);
  CHECK_THROWS_WITH(ec.elapsed_ms(eS), Contains("clock"));
  drv.unload_program(0, lp);
}

TEST_CASE("streams: reading a value waits for the work it depends on", "[device]") {
  AsyncMode async;
  const Device d("sim:0");
  device::Driver& drv = device::driver_for(d);
  std::vector<int32_t> v(128);
  for (int i = 0; i < 128; ++i) v[static_cast<size_t>(i)] = 3 * i - 50;
  Tensor a = from_vector(v).to(d), b = zeros({128}, TensorOptions(DType::i32, d));
  const auto lp = drv.load_program(0, long_program());
  const auto cp = drv.load_program(0, copy_program(hbm_addr(b), hbm_addr(a), 512));
  Stream A = Stream::create(d);
  drv.enqueue_program(0, A.id(), lp, {.timing_only = true});
  drv.enqueue_program(0, A.id(), cp, {});
  // No explicit synchronization: the read is ordered after the queued program.
  CHECK(b.to_vector<int32_t>() == v);
  drv.unload_program(0, lp);
  drv.unload_program(0, cp);
}

TEST_CASE("streams: asynchronous errors surface at synchronization, TPU_SYNC reports them at the op", "[device]") {
  AsyncMode async;
  const Device d("sim:0");
  device::Driver& drv = device::driver_for(d);
  const uint64_t beyond = uint64_t(1) << 50;  // outside every preset's HBM
  const auto bad = drv.load_program(0, copy_program(beyond, 4096, 512));
  const auto lp = drv.load_program(0, long_program());
  Stream A = Stream::create(d);

  // Asynchronous: the enqueue succeeds; the next synchronization reports the failure, once.
  drv.enqueue_program(0, A.id(), bad, {});
  CHECK_THROWS_WITH(A.synchronize(), Contains("sim:0") && Contains("earlier asynchronous operation failed") &&
                                         Contains("TPU_SYNC=1"));
  A.synchronize();
  drv.enqueue_program(0, device::kDefaultStream, bad, {});
  CHECK_THROWS_WITH(synchronize(d), Contains("asynchronous"));
  synchronize(d);

  // Synchronous mode: the failing op throws itself, and every op is complete on return.
  set_synchronous_mode(true);
  CHECK(synchronous_mode());
  CHECK_THROWS_WITH(drv.enqueue_program(0, A.id(), bad, {}), Contains("failed") && !Contains("earlier"));
  auto st = std::make_shared<device::ProgramStats>();
  drv.enqueue_program(0, A.id(), lp, {.timing_only = true}, st);
  CHECK(st->done);
  CHECK(A.query());
  Tensor y = add(ones({5}, d), 1.0);
  CHECK(y.to_vector<float>() == std::vector<float>(5, 2.0f));
  // ... and checks that copies stay inside live allocations.
  uint64_t stale = 0;
  {
    Tensor gone = zeros({64}, d);
    stale = hbm_addr(gone);
  }
  synchronize(d);
  const float buf[4] = {1, 2, 3, 4};
  CHECK_THROWS_WITH(device::sim_device(0).copy_h2d(0, stale, buf, sizeof buf), Contains("not inside one live allocation"));
  set_synchronous_mode(false);

  // The device keeps working after errors.
  CHECK(ones({3}, d).sum().item().to_double() == 3.0);
  drv.unload_program(0, bad);
  drv.unload_program(0, lp);
}

TEST_CASE("streams: bad programs and handles are clear errors", "[device]") {
  device::Driver& drv = device::driver_for(Device("sim:0"));
  CHECK_THROWS_WITH(drv.load_program(0, "vfrobnicate dst=vmem[0]"), Contains("sim:0") && Contains("parse"));
  CHECK_THROWS_WITH(drv.enqueue_program(0, 0, 987654, {}), Contains("unknown program"));
  CHECK_THROWS_WITH(drv.synchronize_stream(0, 424242), Contains("unknown stream"));
  CHECK_THROWS_WITH(device::driver_for(Device("cpu")).load_program(0, "nop"), Contains("does not run chip programs"));
}
