// Internal: what a Profile records (shared by profiler.cpp and profiler_trace.cpp).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "device/profiling.h"
#include "tpucore/profiler.h"

namespace tpu::profiler {

struct HostEvent {
  const char* name = "";  // the op's name (owned by the registry) or a RecordScope's (interned)
  int tid = 0;
  int depth = 0;  // nesting level on its thread
  int64_t start_ns = 0, dur_ns = 0, self_ns = 0;
  std::string args;  // input shapes/dtypes
  double flops = 0;
  uint64_t bytes = 0;
  bool on_host = true;  // the op ran on the cpu (its FLOPs and bytes are host figures)
};

struct ChipRun {
  std::string device, program, tag;
  sim::Stats stats;
  double start_s = 0;  // on the device's timeline: programs laid end to end in completion order
  std::shared_ptr<const sim::Trace> trace;
  std::shared_ptr<const sim::Program> code;
};

struct Profile::State {
  class Observer;
  class Sink;

  explicit State(ProfileOptions o);
  ~State();

  int thread_index();
  void note_sim_device(device::SimDevice* dev);
  void add_host(HostEvent&& e);
  void add_run(device::ProgramRun&& run);
  // A stable copy of a RecordScope's name (host events and work tags keep raw pointers).
  const char* intern(const std::string& name);

  ProfileOptions opt;
  int64_t t0_ns = 0, t1_ns = 0;
  bool active = false;
  std::unique_ptr<Observer> observer;
  std::unique_ptr<Sink> sink;

  mutable std::mutex mu;
  std::map<std::thread::id, int> threads;
  std::set<device::SimDevice*> sim_devices;  // devices that ran programs for this profile
  std::vector<HostEvent> host;
  std::vector<ChipRun> runs;
  std::map<std::string, double> device_time_s;
  size_t chip_events = 0, dropped_chip_events = 0;
  std::set<std::string> scope_names;  // RecordScope names (node-based: pointers stay valid)
};

}  // namespace tpu::profiler
