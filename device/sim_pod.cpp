// Sim devices as a pod and collectives between their HBM buffers (device/sim_pod.h).
//
// A collective queues one job per participant on that device's stream (Resource::ici). The
// jobs meet at a rendezvous: the last to arrive runs the collective on the chips (through a
// sim::Pod over the devices' chips; every participant's worker is then waiting at the
// rendezvous, so no other work touches those chips) and computes the common start, the latest
// of the jobs' start times. Each job then lasts until start + cost on its device's timeline.
// Collectives are queued under one lock, so every device sees them in the same order, which
// keeps the rendezvous free of deadlocks.
#include "device/sim_pod.h"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <set>

#include <fmt/format.h>

#include "device/profiling.h"
#include "device/sim_driver.h"
#include "sim/error.h"
#include "tpucore/core/error.h"

namespace tpu::device {
namespace {

struct PodState {
  std::mutex mu;
  bool initialized = false;
  std::string shape;  // "" = no pod
};

PodState& pod_state() {
  static PodState* s = new PodState();
  return *s;
}

std::mutex& submit_mutex() {
  static std::mutex* m = new std::mutex();
  return *m;
}

sim::IciConfig pod_ici() {
  const char* env = std::getenv("TPU_SIM_ICI");
  const std::string chip_name = sim_device(0).config().name;
  const std::string name = env && *env ? std::string(env) : chip_name;
  try {
    return sim::ici_preset(name);
  } catch (const sim::SimError& e) {
    fail("sim pod: no ICI for chip '{}' ({}); set TPU_SIM_ICI to one of: {}", name, e.what(),
         fmt::join(sim::ici_preset_names(), ", "));
  }
}

sim::Topology topology_for(const std::string& shape, const char* context) {
  sim::Topology t;
  try {
    t = sim::make_topology(pod_ici(), shape);
  } catch (const sim::SimError& e) {
    fail("{}: {}", context, e.what());
  }
  const int have = sim_device_count();
  TPU_CHECK(t.chips() <= have,
            "{}: the slice {} needs {} sim devices but only {} exist (set TPU_SIM_DEVICES, or leave it unset with "
            "TPU_SIM_POD)",
            context, shape, t.chips(), have);
  return t;
}

std::string current_shape() {
  PodState& s = pod_state();
  std::lock_guard<std::mutex> lk(s.mu);
  if (!s.initialized) {
    const char* env = std::getenv("TPU_SIM_POD");
    s.shape = env ? std::string(env) : std::string();
    s.initialized = true;
  }
  return s.shape;
}

// One collective's meeting point and result.
struct Rendezvous {
  std::mutex mu;
  std::condition_variable cv;
  size_t ranks = 0, arrived = 0, finished = 0;
  bool ran = false;
  std::vector<double> starts;
  std::string error, name;
  SimCollectiveResult result;
};

class Work final : public SimCollectiveWork {
 public:
  explicit Work(std::shared_ptr<Rendezvous> r) : r_(std::move(r)) {}
  bool done() const override {
    std::lock_guard<std::mutex> lk(r_->mu);
    return r_->finished == r_->ranks;
  }
  SimCollectiveResult wait(std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lk(r_->mu);
    TPU_CHECK(r_->cv.wait_for(lk, timeout, [&] { return r_->finished == r_->ranks; }),
              "sim collective {}: not finished after {} ms ({} of {} participants arrived; is a stream of one of "
              "them blocked?)",
              r_->name, timeout.count(), r_->arrived, r_->ranks);
    TPU_CHECK(r_->error.empty(), "sim collective {} failed: {}", r_->name, r_->error);
    return r_->result;
  }

 private:
  std::shared_ptr<Rendezvous> r_;
};

uint64_t out_elems(const SimCollectiveArgs& a, size_t G) {
  switch (a.kind) {
    case sim::CollectiveKind::all_gather: return a.count * G;
    case sim::CollectiveKind::reduce_scatter: return a.count / G;
    default: return a.count;
  }
}

// The profiler's view of one participant: a run from its job's start (waiting for the others
// included) to the collective's end, with the transfer on an "ICI" unit track.
void report_run(ProgramRunSink& sink, SimDevice& dev, const std::string& what, const std::string& tag,
                const SimCollectiveResult& res, double job_start) {
  const double hz = dev.config().clock_ghz * 1e9;
  ProgramRun run;
  run.device = dev.name();
  run.program = fmt::format("{} {} B {:.1f} GB/s ({})", what, res.bytes, res.achieved_gbps, res.algorithm);
  run.tag = tag;
  run.stats.chip = dev.config().name;
  run.stats.clock_ghz = dev.config().clock_ghz;
  run.stats.seconds = res.end - job_start;
  run.stats.cycles = run.stats.seconds * hz;
  auto tr = std::make_shared<sim::Trace>();
  tr->unit_names = {"ICI"};
  tr->clock_ghz = dev.config().clock_ghz;
  tr->events.push_back({0, 0, (res.start - job_start) * hz, (res.end - job_start) * hz});
  run.trace = std::move(tr);
  sink.on_program_run(std::move(run));
}

}  // namespace

int sim_pod_env_chips() {
  const char* env = std::getenv("TPU_SIM_POD");
  if (!env || !*env) return 0;
  int n = 1;
  std::string s(env);
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t x = std::min(s.find('x', pos), s.size());
    const int v = std::atoi(s.substr(pos, x - pos).c_str());
    if (v <= 0 || n > 65536) return 0;  // malformed: the pod's own parse names the problem
    n *= v;
    pos = x + 1;
  }
  return n <= 1024 ? n : 0;
}

void set_sim_pod(const std::string& shape) {
  if (!shape.empty()) topology_for(shape, "set_sim_pod");
  PodState& s = pod_state();
  std::lock_guard<std::mutex> lk(s.mu);
  s.shape = shape;
  s.initialized = true;
}

std::string sim_pod_shape() { return current_shape(); }

sim::Topology sim_pod_topology() {
  const std::string shape = current_shape();
  TPU_CHECK(!shape.empty(), "sim pod: no pod is configured (set TPU_SIM_POD, e.g. TPU_SIM_POD=2x2, or call set_sim_pod)");
  return topology_for(shape, "TPU_SIM_POD");
}

std::shared_ptr<SimCollectiveWork> sim_collective_async(const SimCollectiveArgs& a) {
  const std::string what = a.name.empty() ? sim::collective_name(a.kind) : a.name;
  const size_t G = a.src.size();
  TPU_CHECK(G >= 1, "sim collective {}: no participants", what);
  TPU_CHECK(a.dst.size() == G, "sim collective {}: {} sources but {} destinations; give one of each per rank", what, G,
            a.dst.size());
  // The pod: the configured one, or a lone chip for a one-rank collective.
  const bool lone = G == 1 && current_shape().empty();
  const sim::Topology topo = lone ? sim::make_topology(sim::ici_preset("tiny"), std::vector<int>{1}) : sim_pod_topology();
  std::vector<int> members;
  std::set<int> seen;
  for (size_t r = 0; r < G; ++r) {
    const SimBuffer& s = a.src[r];
    const SimBuffer& d = a.dst[r];
    TPU_CHECK(s.device == d.device, "sim collective {}: rank {} has its source on sim:{} but its destination on sim:{}",
              what, r, s.device, d.device);
    TPU_CHECK(s.device >= 0 && s.device < (lone ? sim_device_count() : topo.chips()),
              "sim collective {}: rank {} is on sim:{}, which is not in the pod {} (sim:0 .. sim:{})", what, r, s.device,
              topo.str(), topo.chips() - 1);
    TPU_CHECK(seen.insert(s.device).second, "sim collective {}: sim:{} appears twice (ranks must be distinct chips)",
              what, s.device);
    members.push_back(s.device);
  }
  // Shape checks through the pod's own validation (timing-only: no memory touched).
  sim::CollectiveSpec spec;
  spec.kind = a.kind;
  spec.op = a.op;
  spec.dtype = a.dtype;
  spec.count = a.count;
  spec.members = lone ? std::vector<int>{0} : members;
  spec.pairs = a.pairs;
  spec.root = a.root;
  spec.name = what;
  spec.elem = a.elem;
  for (size_t r = 0; r < G; ++r) {
    spec.src.push_back(a.src[r].addr);
    spec.dst.push_back(a.dst[r].addr);
  }
  sim::IciCost cost;
  try {
    sim::Pod dry(sim_device(members[0]).config(), topo.ici, topo.shape, sim::PodOptions{true, false});
    cost = dry.collective(spec).cost;
  } catch (const sim::SimError& e) {
    fail("sim collective {}: {}", what, e.what());
  }
  const uint64_t es = uint64_t(sim::elem_size(a.dtype, a.elem));
  std::vector<SimDevice*> devs;
  std::vector<StreamId> streams;
  for (size_t r = 0; r < G; ++r) {
    SimDevice& dev = sim_device(members[r]);
    TPU_CHECK(dev.config().name == sim_device(members[0]).config().name,
              "sim collective {}: rank {} (sim:{}) is a '{}' chip but rank 0 is '{}'; a pod has one chip type", what, r,
              members[r], dev.config().name, sim_device(members[0]).config().name);
    for (auto [addr, n, kind] : {std::tuple{a.src[r].addr, a.count * es, "source"},
                                 std::tuple{a.dst[r].addr, out_elems(a, G) * es, "destination"}})
      TPU_CHECK(addr <= dev.hbm_size() && n <= dev.hbm_size() - addr,
                "sim collective {}: rank {} (sim:{}): {} range [{}, {}) is outside the {} bytes of HBM", what, r,
                members[r], kind, addr, addr + n, dev.hbm_size());
    StreamId s = a.src[r].stream ? a.src[r].stream : current_stream(Device(DeviceType::sim, members[r]));
    dev.queue().check_stream(s);
    devs.push_back(&dev);
    streams.push_back(s);
  }

  auto rv = std::make_shared<Rendezvous>();
  rv->ranks = G;
  rv->starts.assign(G, 0.0);
  rv->result.algorithm = cost.algorithm;
  rv->name = what;
  // Runs the collective on the chips (the last job to arrive).
  auto run = [rv, spec, topo, timing_only = a.timing_only, cost, members, lone] {
    SimCollectiveResult& res = rv->result;
    res.start = *std::max_element(rv->starts.begin(), rv->starts.end());
    res.seconds = cost.seconds;
    res.cycles = cost.cycles;
    res.end = res.start + cost.seconds;
    res.algorithm = cost.algorithm;
    try {
      std::vector<sim::Chip*> chips;
      // Only the participants' chips: devices outside the collective are not created.
      if (lone) chips.push_back(&sim_device(members[0]).chip());
      else {
        chips.assign(size_t(topo.chips()), nullptr);
        for (int m : members) chips[size_t(m)] = &sim_device(m).chip();
      }
      sim::Pod pod(std::move(chips), topo.ici, topo.shape, sim::PodOptions{timing_only, false});
      const sim::CollectiveResult r = pod.collective(spec);
      res.bytes = r.bytes;
      res.achieved_gbps = r.achieved_gbps;
    } catch (const std::exception& e) {
      rv->error = e.what();
    }
  };
  // A recording profiler sees each participant's part as a run with one "ICI" unit.
  ProgramRunSink* const sink = program_run_sink();
  const std::string tag = sink ? std::string(work_tag() ? work_tag() : "") : std::string();
  if (sink)
    for (SimDevice* d : devs) sink->on_program_enqueued(*d);
  std::lock_guard<std::mutex> order(submit_mutex());
  for (size_t r = 0; r < G; ++r) {
    devs[r]->queue().submit(
        streams[r], Resource::ici,
        [rv, r, run, sink, tag, dev = devs[r], what]() -> double {
          std::unique_lock<std::mutex> lk(rv->mu);
          const double mine = DeviceQueue::current_job_start();
          rv->starts[r] = mine;
          if (++rv->arrived == rv->ranks) {
            run();
            rv->ran = true;
            rv->cv.notify_all();
          } else {
            rv->cv.wait(lk, [&] { return rv->ran; });
          }
          ++rv->finished;
          rv->cv.notify_all();
          if (!rv->error.empty()) throw Error(fmt::format("sim collective failed: {}", rv->error));
          const SimCollectiveResult res = rv->result;
          lk.unlock();
          if (sink && sink == program_run_sink()) report_run(*sink, *dev, what, tag, res, mine);
          return res.end - mine;
        },
        /*may_wait=*/false);
  }
  std::shared_ptr<SimCollectiveWork> work = std::make_shared<Work>(rv);
  if (sync_mode()) work->wait();  // synchronous mode: the collective's error surfaces here
  return work;
}

SimCollectiveResult sim_collective(const SimCollectiveArgs& a) { return sim_collective_async(a)->wait(); }

}  // namespace tpu::device
