// Recording side of the profiler: the op observer (host events), the program-run sink (chip
// events) and the per-op summary. The trace export is in profiler_trace.cpp.
#include "tpucore/profiler.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "device/profiling.h"
#include "device/sim_device.h"
#include "ops/registry.h"
#include "tpucore/core/error.h"
#include "tpucore/profiler/state.h"

namespace tpu::profiler {
namespace {

std::atomic<Profile::State*> g_active{nullptr};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Nominal FLOPs of a host op (matmul-like ops only; elementwise work is reported as bytes).
double host_flops(const ops::OpDef& op, std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
  if (outputs.empty() || inputs.empty() || !outputs[0].defined()) return 0;
  if (op.name == "matmul" || op.name == "linear" || op.name == "bmm") {
    const Shape& a = inputs[0].shape();
    const int64_t k = a.ndim() ? a[a.ndim() - 1] : 1;
    return 2.0 * static_cast<double>(outputs[0].numel()) * static_cast<double>(k);
  }
  if (op.name == "scaled_dot_product_attention" && inputs.size() >= 2 && inputs[0].dim() >= 2) {
    // Q K^T and P V over every (query, key) pair (causal masking not discounted).
    const Shape &q = inputs[0].shape(), &o = outputs[0].shape();
    const double lk = static_cast<double>(inputs[1].shape()[inputs[1].dim() - 2]);
    const double pairs = static_cast<double>(outputs[0].numel() / std::max<int64_t>(1, o[o.ndim() - 1])) * lk;
    return 2.0 * pairs * static_cast<double>(q[q.ndim() - 1] + o[o.ndim() - 1]);
  }
  return 0;
}

std::string shapes_of(std::span<const Tensor> ts) {
  std::string s;
  for (const Tensor& t : ts) {
    if (!s.empty()) s += ", ";
    if (!t.defined()) {
      s += "undefined";
      continue;
    }
    s += fmt::format("{}{}", dtype_name(t.dtype()), t.shape().str());
  }
  return s;
}

}  // namespace

// ---- the observer: one stack of open calls per thread ----

struct OpenCall {
  const char* name = "";
  int64_t start_ns = 0;
  int64_t child_ns = 0;
  std::string args;
  std::vector<Tensor> inputs;  // only for the FLOP/byte estimate at end()
};
thread_local std::vector<OpenCall> t_stack;

// Closes the innermost open call of this thread (moved into `c`): its host event with times and
// nesting depth; the enclosing call gets its time as a child's and its name back as work tag.
HostEvent close_innermost_call(Profile::State& s, OpenCall& c) {
  c = std::move(t_stack.back());
  t_stack.pop_back();
  const int64_t dur = now_ns() - c.start_ns;
  if (!t_stack.empty()) t_stack.back().child_ns += dur;
  device::set_work_tag(t_stack.empty() ? nullptr : t_stack.back().name);
  HostEvent e;
  e.name = c.name;
  e.tid = s.thread_index();
  e.start_ns = c.start_ns;
  e.dur_ns = dur;
  e.self_ns = dur - c.child_ns;
  e.depth = static_cast<int>(t_stack.size());
  return e;
}

class Profile::State::Observer final : public ops::OpObserver {
 public:
  explicit Observer(State& s) : s_(s) {}
  void begin(const ops::OpDef& op, std::span<const Tensor> inputs) override {
    OpenCall c{op.name.c_str(), now_ns(), 0, {}, {}};
    if (s_.opt.record_shapes) c.args = shapes_of(inputs);
    c.inputs.assign(inputs.begin(), inputs.end());
    t_stack.push_back(std::move(c));
    device::set_work_tag(op.name.c_str());
  }
  void end(const ops::OpDef& op, std::span<const Tensor> outputs) override {
    if (t_stack.empty()) return;  // began before the profile started
    OpenCall c;
    HostEvent e = close_innermost_call(s_, c);
    e.args = std::move(c.args);
    e.flops = host_flops(op, c.inputs, outputs);
    bool on_host = true;
    for (const Tensor& t : outputs)
      if (t.defined()) {
        e.bytes += t.nbytes();
        on_host &= t.device().is_cpu();
      }
    for (const Tensor& t : c.inputs)
      if (t.defined()) e.bytes += t.nbytes();
    e.on_host = on_host;
    s_.add_host(std::move(e));
  }

 private:
  State& s_;
};

class Profile::State::Sink final : public device::ProgramRunSink {
 public:
  explicit Sink(State& s) : s_(s) {}
  void on_program_run(device::ProgramRun&& run) override { s_.add_run(std::move(run)); }
  bool wants_trace() const override { return s_.opt.chip_timeline; }
  void on_program_enqueued(device::SimDevice& dev) override { s_.note_sim_device(&dev); }

 private:
  State& s_;
};

Profile::State::State(ProfileOptions o) : opt(o), t0_ns(now_ns()) {
  observer = std::make_unique<Observer>(*this);
  sink = std::make_unique<Sink>(*this);
}
Profile::State::~State() = default;

int Profile::State::thread_index() {
  const auto id = std::this_thread::get_id();
  std::lock_guard<std::mutex> lk(mu);
  auto [it, inserted] = threads.emplace(id, static_cast<int>(threads.size()));
  return it->second;
}

void Profile::State::note_sim_device(device::SimDevice* dev) {
  std::lock_guard<std::mutex> lk(mu);
  sim_devices.insert(dev);
}

const char* Profile::State::intern(const std::string& name) {
  std::lock_guard<std::mutex> lk(mu);
  return scope_names.insert(name).first->c_str();
}

void Profile::State::add_host(HostEvent&& e) {
  std::lock_guard<std::mutex> lk(mu);
  host.push_back(std::move(e));
}

void Profile::State::add_run(device::ProgramRun&& run) {
  std::lock_guard<std::mutex> lk(mu);
  ChipRun c;
  c.device = run.device;
  c.program = run.program;
  c.tag = run.tag;
  c.stats = run.stats;
  double& cursor = device_time_s[c.device];
  c.start_s = cursor;
  cursor += run.stats.seconds;
  if (run.trace) {
    const size_t room = opt.max_chip_events > chip_events ? opt.max_chip_events - chip_events : 0;
    if (run.trace->events.size() <= room) {
      c.trace = run.trace;
      c.code = run.code;
      chip_events += run.trace->events.size();
    } else {
      dropped_chip_events += run.trace->events.size();
    }
  }
  runs.push_back(std::move(c));
}

Profile::Profile(ProfileOptions opt) : state_(std::make_unique<State>(opt)) {
  State* expected = nullptr;
  TPU_CHECK(g_active.compare_exchange_strong(expected, state_.get()),
            "profiler: another Profile is already recording (stop it first)");
  state_->active = true;
  t_stack.clear();
  device::set_program_run_sink(state_->sink.get());
  ops::set_op_observer(state_->observer.get());
}

Profile::~Profile() {
  try {
    stop();
  } catch (...) {
    // Destructors do not throw; stop() only fails on a device error already reported elsewhere.
  }
}

void Profile::stop() {
  if (!state_->active) return;
  ops::set_op_observer(nullptr);
  // Programs still queued on the simulated devices belong to this profile.
  std::set<device::SimDevice*> devs;
  {
    std::lock_guard<std::mutex> lk(state_->mu);
    devs = state_->sim_devices;
  }
  for (device::SimDevice* d : devs) d->queue().drain();
  device::set_program_run_sink(nullptr);
  device::set_work_tag(nullptr);
  t_stack.clear();
  state_->active = false;
  state_->t1_ns = now_ns();
  g_active.store(nullptr);
}

bool Profile::recording() const { return state_->active; }

RecordScope::RecordScope(std::string_view name) {
  Profile::State* st = g_active.load(std::memory_order_acquire);
  if (!st) return;
  state_ = st;
  const char* n = st->intern(std::string(name));
  t_stack.push_back(OpenCall{n, now_ns(), 0, {}, {}});
  device::set_work_tag(n);
}

RecordScope::~RecordScope() {
  if (!state_ || g_active.load(std::memory_order_acquire) != state_ || t_stack.empty()) return;
  // The profile that saw this scope open is still recording (stop() clears the stack).
  OpenCall c;
  state_->add_host(close_innermost_call(*state_, c));
}

std::vector<OpSummary> Profile::key_averages() const {
  std::lock_guard<std::mutex> lk(state_->mu);
  std::map<std::string, OpSummary> rows;
  for (const HostEvent& e : state_->host) {
    OpSummary& r = rows[e.name];
    r.name = e.name;
    r.calls += 1;
    r.host_total_us += static_cast<double>(e.dur_ns) * 1e-3;
    r.host_self_us += static_cast<double>(e.self_ns) * 1e-3;
    if (e.on_host) {
      r.flops += e.flops;
      r.bytes += e.bytes;
    }
  }
  for (const ChipRun& c : state_->runs) {
    const std::string name = c.tag.empty() ? "(program " + c.program + ")" : c.tag;
    OpSummary& r = rows[name];
    r.name = name;
    r.programs += 1;
    r.chip_cycles += c.stats.cycles;
    r.chip_us += c.stats.seconds * 1e6;
    r.flops += c.stats.mxu_flops;
    r.bytes += c.stats.hbm_bytes_read + c.stats.hbm_bytes_written;
  }
  std::vector<OpSummary> out;
  bool any_chip = false;
  for (auto& [k, v] : rows) {
    any_chip |= v.programs > 0;
    if (v.calls == 0) v.calls = v.programs;  // a kernel run outside any host op: each run is a call
    out.push_back(v);
  }
  std::stable_sort(out.begin(), out.end(), [any_chip](const OpSummary& a, const OpSummary& b) {
    return any_chip ? a.chip_us > b.chip_us : a.host_total_us > b.host_total_us;
  });
  return out;
}

namespace {
std::string human(double v, const char* unit) {
  if (v == 0) return "-";
  const char* pre[] = {"", "K", "M", "G", "T", "P"};
  int i = 0;
  while (v >= 1000 && i < 5) {
    v /= 1000;
    ++i;
  }
  return fmt::format("{:.3g} {}{}", v, pre[i], unit);
}
std::string us(double v) {
  if (v == 0) return "-";
  if (v >= 1e6) return fmt::format("{:.3f} s", v * 1e-6);
  if (v >= 1e3) return fmt::format("{:.3f} ms", v * 1e-3);
  return fmt::format("{:.3f} us", v);
}
}  // namespace

std::string Profile::table(size_t row_limit) const {
  const std::vector<OpSummary> rows = key_averages();
  double host_self = 0, chip = 0;
  for (const OpSummary& r : rows) {
    host_self += r.host_self_us;
    chip += r.chip_us;
  }
  size_t w = 4;
  for (const OpSummary& r : rows) w = std::max(w, r.name.size());
  w = std::min<size_t>(w, 40);
  std::string out;
  const std::string head = fmt::format("{:<{}}  {:>7}  {:>12}  {:>12}  {:>12}  {:>7}  {:>8}  {:>12}  {:>12}  {:>7}  {:>10}  {:>10}\n",
                                       "Name", w, "Calls", "Host total", "Host self", "Host avg", "Self %", "Programs",
                                       "Chip cycles", "Chip time", "Chip %", "FLOPs", "Bytes");
  const std::string rule(head.size() - 1, '-');
  out += rule + "\n" + head + rule + "\n";
  size_t n = 0;
  for (const OpSummary& r : rows) {
    if (row_limit && n++ >= row_limit) break;
    out += fmt::format("{:<{}}  {:>7}  {:>12}  {:>12}  {:>12}  {:>6.1f}%  {:>8}  {:>12}  {:>12}  {:>6.1f}%  {:>10}  {:>10}\n",
                       r.name.substr(0, w), w, r.calls, us(r.host_total_us), us(r.host_self_us),
                       us(r.calls ? r.host_total_us / static_cast<double>(r.calls) : 0),
                       host_self > 0 ? 100.0 * r.host_self_us / host_self : 0.0, r.programs,
                       r.chip_cycles > 0 ? fmt::format("{:.0f}", r.chip_cycles) : "-", us(r.chip_us),
                       chip > 0 ? 100.0 * r.chip_us / chip : 0.0, human(r.flops, "FLOP"),
                       human(static_cast<double>(r.bytes), "B"));
  }
  out += rule + "\n";
  std::lock_guard<std::mutex> lk(state_->mu);
  out += fmt::format("Host self time total: {}; chip time total: {} over {} program(s)", us(host_self), us(chip),
                     state_->runs.size());
  if (state_->dropped_chip_events)
    out += fmt::format("; {} chip trace event(s) dropped (max_chip_events)", state_->dropped_chip_events);
  out += "\n";
  return out;
}

}  // namespace tpu::profiler
