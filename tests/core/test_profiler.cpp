// The profiler: per-op counts and FLOPs against what the test itself called (closed form),
// nesting (self <= total), the Chrome trace's structure, chip program attribution, and the
// one-profile-at-a-time error.
#include <atomic>
#include <map>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "device/sim_driver.h"
#include "tpucore/ops.h"
#include "tpucore/profiler.h"

using namespace tpu;
using Catch::Matchers::Contains;

namespace {
const profiler::OpSummary* row(const std::vector<profiler::OpSummary>& rows, const std::string& name) {
  for (const auto& r : rows)
    if (r.name == name) return &r;
  return nullptr;
}
}  // namespace

TEST_CASE("profiler: host ops counted with their FLOPs, nesting and a Chrome trace", "[profiler]") {
  Tensor a = randn({32, 48}), b = randn({48, 16});
  Tensor i = arange(0, 16, 1, DType::i32);
  profiler::Profile prof;
  REQUIRE(prof.recording());
  for (int k = 0; k < 3; ++k) (void)add(a, a);
  (void)matmul(a, b);
  (void)matmul(a, b);
  Tensor m = matmul(a, b);
  (void)add(m, i);  // f32 + i32: the front half casts i32 -> f32 inside add (a nested call)
  prof.stop();
  CHECK_FALSE(prof.recording());
  (void)add(a, a);  // after stop: not recorded

  const auto rows = prof.key_averages();
  const auto* r_add = row(rows, "add");
  const auto* r_mm = row(rows, "matmul");
  const auto* r_cast = row(rows, "to_dtype");
  REQUIRE(r_add);
  REQUIRE(r_mm);
  REQUIRE(r_cast);
  CHECK(r_add->calls == 4);
  CHECK(r_mm->calls == 3);
  CHECK(r_cast->calls >= 1);
  CHECK(r_mm->flops == Approx(3 * 2.0 * 32 * 48 * 16));
  // Bytes of an add: two 32x48 f32 inputs and one output, three calls; then the mixed one
  // (its inputs as passed: 32x16 f32 and 16 i32, and a 32x16 f32 output).
  CHECK(r_add->bytes == 3 * 3 * (32 * 48 * 4) + (32 * 16 * 4) + 16 * 4 + (32 * 16 * 4));
  CHECK(r_add->host_self_us <= r_add->host_total_us);
  CHECK(r_add->host_total_us > 0);
  CHECK(r_mm->programs == 0);

  const std::string tab = prof.table();
  CHECK_THAT(tab, Contains("matmul") && Contains("Calls") && Contains("Host self") && Contains("Chip cycles"));

  const auto j = nlohmann::json::parse(prof.chrome_trace_json());
  int mm_events = 0;
  bool host_named = false;
  for (const auto& e : j.at("traceEvents")) {
    if (e.at("ph") == "M" && e.at("name") == "process_name" && e.at("args").at("name") == "host") host_named = true;
    if (e.at("ph") == "X" && e.at("name") == "matmul") {
      ++mm_events;
      CHECK(e.at("dur").get<double>() >= 0);
      CHECK(e.at("args").at("inputs").get<std::string>() == "f32[32, 48], f32[48, 16]");
    }
  }
  CHECK(host_named);
  CHECK(mm_events == 3);
}

TEST_CASE("profiler: one profile at a time, a clear error otherwise, usable afterwards", "[profiler]") {
  {
    profiler::Profile p1;
    CHECK_THROWS_WITH(profiler::Profile(), Contains("profiler") && Contains("already recording"));
  }
  profiler::Profile p2;  // the first one stopped when it went out of scope
  Tensor x = ones({4});
  (void)mul(x, x);
  p2.stop();
  CHECK(row(p2.key_averages(), "mul") != nullptr);
  CHECK_THROWS_WITH(p2.export_chrome_trace("/nonexistent-dir/trace.json"), Contains("cannot open"));
}

TEST_CASE("profiler: chip programs with their cycles and unit timeline", "[profiler]") {
  device::SimDevice& dev = device::sim_device(0);
  const uint64_t prog = dev.load_program_text(
      "dma dst=vmem[4096] src=vmem[0] shape=[1,4,512] q=0 sem=0\n"
      "wait sem=0 n=1\n");
  auto stream = dev.queue().create_stream();
  std::atomic<double> cycles{0};
  profiler::Profile prof;
  dev.run_program(stream, prog, {}, [&](const sim::RunResult& r) { cycles = r.stats.cycles; });
  dev.run_program(stream, prog, {}, {});
  prof.stop();  // drains the device
  dev.unload_program(prog);
  REQUIRE(cycles.load() > 0);

  const auto rows = prof.key_averages();
  REQUIRE(!rows.empty());
  const auto& r = rows.front();  // sorted by chip time: the only row with chip work
  CHECK_THAT(r.name, Contains("program"));
  CHECK(r.programs == 2);
  CHECK(r.chip_cycles == Approx(2 * cycles.load()));
  CHECK(r.bytes == 0);  // VMEM to VMEM: no HBM traffic

  const auto j = nlohmann::json::parse(prof.chrome_trace_json());
  int programs = 0, dmas = 0;
  std::map<int, std::string> tracks;
  for (const auto& e : j.at("traceEvents")) {
    if (e.at("ph") == "M" && e.at("name") == "thread_name" && e.at("pid") != 1)
      tracks[e.at("tid").get<int>()] = e.at("args").at("name").get<std::string>();
    if (e.at("ph") == "X" && e.value("cat", "") == "program") ++programs;
    if (e.at("ph") == "X" && e.at("name") == "dma") ++dmas;
  }
  CHECK(programs == 2);
  CHECK(dmas == 2);
  CHECK(tracks[0] == "programs");
  bool dma_track = false;
  for (const auto& [tid, name] : tracks) dma_track |= name.rfind("dma", 0) == 0;
  CHECK(dma_track);
}
