// SimDevice: one simulated chip as a device, at the level of HBM addresses (no tensors): the
// chip, its HBM allocator and its queue of stream-ordered work. The in-tree `sim` driver and
// the simulator plugin (device/plugins/sim) are both thin wrappers around it.
//
// Costs in simulated time: programs take the cycles the simulator reports; host<->HBM copies
// move at `host_link_gbps` over a link per direction; HBM->HBM copies take the DMA latency plus
// a read and a write of every byte at the HBM bandwidth, on the chip's compute timeline.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "device/hbm_allocator.h"
#include "device/stream_queue.h"
#include "sim/chip.h"

namespace tpu::device {

struct SimDeviceOptions {
  double host_link_gbps = 32.0;  // host <-> device copies, GB/s per direction
  uint64_t alignment = 512;      // of every HBM allocation
};

struct SimProgramOptions {
  bool timing_only = false;
  bool trace = false;
  std::vector<int64_t> registers{};  // initial scalar registers: the program's arguments
};

class SimDevice {
 public:
  // `chip` is a preset name, a JSON file path or JSON text; a bad one is a tpu::Error that
  // lists the presets.
  SimDevice(std::string name, const std::string& chip, SimDeviceOptions opt = {});
  ~SimDevice();

  const std::string& name() const { return name_; }
  const std::string& chip_spec() const { return spec_; }
  // Unique per SimDevice ever created in the process (caches of loaded programs key on it).
  uint64_t serial() const { return serial_; }
  const sim::ChipConfig& config() const { return chip_.config(); }
  uint64_t hbm_size() const { return chip_.hbm_size(); }
  std::string describe() const;  // "v5e: 4 MXUs 128x128 at 1.5 GHz, 16 GiB HBM at 819 GB/s"

  // HBM. allocate: an out-of-memory tpu::Error names the bytes asked for and the bytes free.
  // free is stream ordered: the block is reused only after all work submitted before it ran.
  uint64_t allocate(uint64_t bytes);
  void free(uint64_t addr);
  uint64_t memory_free();  // after pending frees
  HbmAllocatorStats memory_stats();

  // Copies, in order on stream s. copy_h2d returns once `src` may be reused; copy_d2h returns
  // once `dst` holds the data; copy_d2d is asynchronous (memmove semantics).
  void copy_h2d(StreamId s, uint64_t dst, const void* src, uint64_t n);
  void copy_d2h(StreamId s, void* dst, uint64_t src, uint64_t n);
  void copy_d2d(StreamId s, uint64_t dst, uint64_t src, uint64_t n);

  // Programs: checked against the chip when loaded; text is JSON (starting with '{') or the
  // assembly form. run_program is asynchronous; `done` (optional) runs on the worker with the
  // result once the program finished.
  uint64_t load_program(sim::Program p);
  uint64_t load_program_text(std::string_view text);
  void unload_program(uint64_t id);
  void run_program(StreamId s, uint64_t id, const SimProgramOptions& o,
                   std::function<void(const sim::RunResult&)> done = {});

  DeviceQueue& queue() { return queue_; }
  // The chip itself, for pod collectives (device/sim_pod.h), which touch it only from a job of
  // this device's queue.
  sim::Chip& chip() { return chip_; }
  double seconds_per_byte_link() const { return 1.0 / (opt_.host_link_gbps * 1e9); }

 private:
  void check_range(const char* what, uint64_t addr, uint64_t n) const;
  double d2d_seconds(uint64_t n) const;

  std::string name_, spec_;
  uint64_t serial_ = 0;
  SimDeviceOptions opt_;
  sim::Chip chip_;
  HbmAllocator alloc_;
  std::mutex prog_mu_;
  std::map<uint64_t, std::shared_ptr<const sim::Program>> programs_;
  uint64_t next_program_ = 1;
  DeviceQueue queue_;  // last: its worker stops first
};

// The chip config for a preset name / path / JSON text, as a tpu::Error listing the presets
// when the name is unknown.
sim::ChipConfig load_chip_config(const std::string& chip, const std::string& context);

}  // namespace tpu::device
