#include "device/sim_device.h"

#include "device/profiling.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "sim/assembly.h"
#include "sim/error.h"
#include "sim/presets.h"
#include "sim/serialize.h"
#include "tpucore/core/error.h"

namespace tpu::device {

sim::ChipConfig load_chip_config(const std::string& chip, const std::string& context) {
  try {
    return sim::load_config(chip);
  } catch (const std::exception& e) {
    fail("{}: cannot use chip '{}': {} (known presets: {}; a JSON file path or JSON text also works)", context, chip,
         e.what(), fmt::join(sim::preset_names(), ", "));
  }
}

SimDevice::SimDevice(std::string name, const std::string& chip, SimDeviceOptions opt)
    : name_(std::move(name)),
      spec_(chip),
      opt_(opt),
      chip_(load_chip_config(chip, name_)),
      alloc_(opt.alignment, chip_.hbm_size() > opt.alignment ? chip_.hbm_size() - opt.alignment : 0, opt.alignment),
      queue_(name_) {
  static std::atomic<uint64_t> next_serial{1};
  serial_ = next_serial.fetch_add(1);
}

SimDevice::~SimDevice() = default;

std::string SimDevice::describe() const {
  const sim::ChipConfig& c = config();
  return fmt::format("{}: {} MXU(s) {}x{} at {} GHz, {:.4g} GiB HBM at {} GB/s, {:.4g} MiB VMEM", c.name, c.mxu.count,
                     c.mxu.rows, c.mxu.cols, c.clock_ghz, double(c.memory.hbm_bytes) / double(1ull << 30),
                     c.memory.hbm_bandwidth_gbps, double(c.memory.vmem_bytes) / double(1ull << 20));
}

uint64_t SimDevice::allocate(uint64_t bytes) {
  if (auto a = alloc_.allocate(bytes)) return *a;
  // Blocks freed by tensors whose last use is still queued come back once the queue drains.
  queue_.drain();
  if (auto a = alloc_.allocate(bytes)) return *a;
  HbmAllocatorStats s = alloc_.stats();
  fail("{}: out of device memory: cannot allocate {} bytes ({:.4g} MiB); {} bytes ({:.4g} MiB) free of {} bytes HBM, "
       "largest free block {} bytes. Free tensors on this device or use a chip with more HBM (TPU_SIM_CHIP)",
       name_, bytes, double(bytes) / 1048576.0, s.bytes_free, double(s.bytes_free) / 1048576.0, s.capacity,
       s.largest_free);
}

void SimDevice::free(uint64_t addr) {
  // Ordered after everything submitted so far (it may still be read or written by queued work).
  if (queue_.run_inline_if_idle(kDefaultStream, Resource::none, [&] { alloc_.free(addr); return 0.0; })) return;
  queue_.submit(
      kDefaultStream, Resource::none,
      [this, addr] {
        alloc_.free(addr);
        return 0.0;
      },
      /*may_wait=*/false);  // a free can come from the worker itself (a job releasing a tensor)
}

uint64_t SimDevice::memory_free() {
  queue_.drain();
  return alloc_.bytes_free();
}

HbmAllocatorStats SimDevice::memory_stats() {
  queue_.drain();
  return alloc_.stats();
}

void SimDevice::check_range(const char* what, uint64_t addr, uint64_t n) const {
  TPU_CHECK(addr <= hbm_size() && n <= hbm_size() - addr, "{}: {}: HBM range [{}, {}) is outside the {} bytes of HBM",
            name_, what, addr, addr + n, hbm_size());
  // Synchronous (debug) mode also checks that the range belongs to one live allocation, which
  // catches copies into freed or foreign memory at the op that issues them.
  if (sync_mode() && n > 0)
    TPU_CHECK(alloc_.in_live_block(addr, n),
              "{}: {}: HBM range [{}, {}) is not inside one live allocation (freed, or spans two blocks)", name_, what,
              addr, addr + n);
}

void SimDevice::copy_h2d(StreamId s, uint64_t dst, const void* src, uint64_t n) {
  check_range("copy from host", dst, n);
  if (n == 0) return;
  const double t = double(n) * seconds_per_byte_link();
  if (queue_.run_inline_if_idle(s, Resource::host_to_device, [&] {
        chip_.write_hbm(dst, src, n);
        return t;
      }))
    return;
  // The device is busy: stage the bytes so the caller may reuse its buffer at once.
  auto staged = std::make_shared<std::vector<uint8_t>>(static_cast<const uint8_t*>(src),
                                                       static_cast<const uint8_t*>(src) + n);
  queue_.submit(s, Resource::host_to_device, [this, dst, staged, t] {
    chip_.write_hbm(dst, staged->data(), staged->size());
    return t;
  });
}

void SimDevice::copy_d2h(StreamId s, void* dst, uint64_t src, uint64_t n) {
  check_range("copy to host", src, n);
  if (n == 0) return;
  const double t = double(n) * seconds_per_byte_link();
  queue_.submit_and_wait(s, Resource::device_to_host, [&] {
    chip_.read_hbm(src, dst, n);
    return t;
  });
}

double SimDevice::d2d_seconds(uint64_t n) const {
  const sim::ChipConfig& c = config();
  const double cycles = c.dma.latency_cycles + 2.0 * double(n) / c.hbm_bytes_per_cycle();
  return cycles / (c.clock_ghz * 1e9);
}

void SimDevice::copy_d2d(StreamId s, uint64_t dst, uint64_t src, uint64_t n) {
  check_range("copy on device (source)", src, n);
  check_range("copy on device (destination)", dst, n);
  if (n == 0 || dst == src) return;
  const double t = d2d_seconds(n);
  queue_.submit(s, Resource::compute, [this, dst, src, n, t] {
    constexpr uint64_t kChunk = uint64_t(4) << 20;
    std::vector<uint8_t> buf(std::min(n, kChunk));
    const bool backwards = dst > src && dst < src + n;  // overlapping: copy from the end
    for (uint64_t done = 0; done < n;) {
      const uint64_t len = std::min(kChunk, n - done);
      const uint64_t off = backwards ? n - done - len : done;
      chip_.read_hbm(src + off, buf.data(), len);
      chip_.write_hbm(dst + off, buf.data(), len);
      done += len;
    }
    return t;
  });
}

uint64_t SimDevice::load_program(sim::Program p) {
  try {
    p.finalize();
    p.check_against(config());
  } catch (const sim::SimError& e) {
    fail("{}: cannot load program '{}': {}", name_, p.name, e.what());
  }
  std::lock_guard<std::mutex> lk(prog_mu_);
  const uint64_t id = next_program_++;
  programs_[id] = std::make_shared<const sim::Program>(std::move(p));
  return id;
}

uint64_t SimDevice::load_program_text(std::string_view text) {
  auto first = std::find_if(text.begin(), text.end(), [](char c) { return c != ' ' && c != '\n' && c != '\t' && c != '\r'; });
  sim::Program p;
  try {
    if (first != text.end() && *first == '{') p = sim::program_from_json_text(std::string(text));
    else p = sim::parse_program(text);
  } catch (const std::exception& e) {
    fail("{}: cannot parse program: {}", name_, e.what());
  }
  return load_program(std::move(p));
}

void SimDevice::unload_program(uint64_t id) {
  std::lock_guard<std::mutex> lk(prog_mu_);
  programs_.erase(id);  // queued runs keep their own reference
}

void SimDevice::run_program(StreamId s, uint64_t id, const SimProgramOptions& o,
                            std::function<void(const sim::RunResult&)> done) {
  std::shared_ptr<const sim::Program> p;
  {
    std::lock_guard<std::mutex> lk(prog_mu_);
    auto it = programs_.find(id);
    TPU_CHECK(it != programs_.end(), "{}: run_program: unknown program handle {} (load it first)", name_, id);
    p = it->second;
  }
  sim::RunOptions ro;
  ro.timing_only = o.timing_only;
  ro.trace = o.trace;
  ro.registers = o.registers;
  if (sync_mode()) {
    ro.race_check = true;
    ro.fail_on_race = true;
  }
  // A profiler, when one is recording, gets every run it saw enqueued (traced if it asks) with
  // the host op that enqueued it; runs queued before it started are not its.
  std::string tag;
  ProgramRunSink* const enqueue_sink = program_run_sink();
  if (ProgramRunSink* sink = enqueue_sink) {
    tag = work_tag();
    if (sink->wants_trace()) ro.trace = true;
    sink->on_program_enqueued(*this);
  }
  queue_.submit(s, Resource::compute, [this, p, ro, enqueue_sink, tag = std::move(tag), done = std::move(done)] {
    sim::RunResult r;
    try {
      r = chip_.run(*p, ro);
    } catch (const std::exception& e) {
      fail("{}: program '{}' failed: {}", name_, p->name, e.what());
    }
    if (done) done(r);
    if (ProgramRunSink* sink = program_run_sink(); sink && sink == enqueue_sink) {
      ProgramRun run;
      run.device = name_;
      run.program = p->name;
      run.tag = tag;
      run.stats = r.stats;
      if (ro.trace) run.trace = std::make_shared<const sim::Trace>(std::move(r.trace));
      run.code = p;
      sink->on_program_run(std::move(run));
    }
    return r.stats.seconds;
  });
}

}  // namespace tpu::device
