#include "device/sim_driver.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "device/sim_pod.h"
#include "tpucore/core/error.h"

namespace tpu::device {
namespace {

int env_device_count() {
  const char* v = std::getenv("TPU_SIM_DEVICES");
  if ((!v || !*v) && sim_pod_env_chips() > 0) return sim_pod_env_chips();  // TPU_SIM_POD's slice
  if (!v || !*v) return kDefaultSimDevices;
  std::string_view s(v);
  int n = -1;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
  TPU_CHECK(ec == std::errc() && p == s.data() + s.size() && n >= 1 && n <= 1024,
            "TPU_SIM_DEVICES='{}': expected the number of simulated devices, from 1 to 1024", s);
  return n;
}

std::string env_chip() {
  const char* v = std::getenv("TPU_SIM_CHIP");
  return v && *v ? std::string(v) : std::string(kDefaultSimChip);
}

void sim_storage_free(void* ctx, void* data, size_t) {
  static_cast<SimDevice*>(ctx)->free(reinterpret_cast<uintptr_t>(data));
}

uint64_t addr_of(const Storage& s) { return reinterpret_cast<uintptr_t>(s.data); }

// Device state shared by the driver and the free functions above.
class SimDevices {
 public:
  int count() {
    std::lock_guard<std::mutex> lk(mu_);
    init_locked();
    return static_cast<int>(specs_.size());
  }
  SimDevice& get(int index) {
    std::lock_guard<std::mutex> lk(mu_);
    init_locked();
    TPU_CHECK(index >= 0 && index < static_cast<int>(specs_.size()),
              "device 'sim:{}': index out of range ({} sim device(s) available; set TPU_SIM_DEVICES for more)", index,
              specs_.size());
    auto& d = devs_[static_cast<size_t>(index)];
    if (!d) d = std::make_unique<SimDevice>("sim:" + std::to_string(index), specs_[static_cast<size_t>(index)]);
    return *d;
  }
  std::string spec(int index) {
    std::lock_guard<std::mutex> lk(mu_);
    init_locked();
    TPU_CHECK(index >= 0 && index < static_cast<int>(specs_.size()), "sim_chip: no device sim:{} ({} available)",
              index, specs_.size());
    return specs_[static_cast<size_t>(index)];
  }
  void set_chip(const std::string& chip, int index) {
    load_chip_config(chip, index < 0 ? std::string("set_sim_chip") : "set_sim_chip(sim:" + std::to_string(index) + ")");
    std::lock_guard<std::mutex> lk(mu_);
    init_locked();
    const int n = static_cast<int>(specs_.size());
    TPU_CHECK(index < n, "set_sim_chip: no device sim:{} ({} sim device(s) available)", index, n);
    for (int i = index < 0 ? 0 : index; i < (index < 0 ? n : index + 1); ++i) {
      auto& d = devs_[static_cast<size_t>(i)];
      if (d) {
        HbmAllocatorStats st = d->memory_stats();  // drains the queue first
        TPU_CHECK(st.live_blocks == 0,
                  "set_sim_chip: cannot change the chip of sim:{} to '{}' while {} allocation(s) ({} bytes) live on it; "
                  "free its tensors first",
                  i, chip, st.live_blocks, st.bytes_in_use);
        d.reset();
      }
      specs_[static_cast<size_t>(i)] = chip;
    }
  }

 private:
  void init_locked() {
    if (initialized_) return;
    const int n = env_device_count();
    const std::string chip = env_chip();
    if (std::getenv("TPU_SIM_CHIP")) load_chip_config(chip, "TPU_SIM_CHIP");  // a bad value fails here, named
    specs_.assign(static_cast<size_t>(n), chip);
    devs_.resize(static_cast<size_t>(n));
    initialized_ = true;
  }
  std::mutex mu_;
  bool initialized_ = false;
  std::vector<std::string> specs_;
  std::vector<std::unique_ptr<SimDevice>> devs_;
};

SimDevices& devices() {
  static SimDevices* d = new SimDevices();  // leaked: storages may be freed during static destruction
  return *d;
}

class SimDriver final : public Driver {
 public:
  std::string_view name() const override { return "sim"; }
  DeviceType type() const override { return DeviceType::sim; }
  int device_count() const override { return devices().count(); }
  DeviceProperties properties(int index) const override {
    SimDevice& d = dev(index);
    const sim::ChipConfig& c = d.config();
    DeviceProperties p;
    p.name = d.name() + " (" + c.name + ")";
    p.memory_bytes = d.hbm_size();
    p.compute_units = c.mxu.count;
    p.description = d.describe();
    p.clock_ghz = c.clock_ghz;
    p.peak_flops = c.peak_flops();
    return p;
  }

  StoragePtr allocate(int index, size_t nbytes) override {
    SimDevice& d = dev(index);
    const uint64_t a = d.allocate(nbytes);
    return std::make_shared<Storage>(reinterpret_cast<void*>(static_cast<uintptr_t>(a)), nbytes,
                                     Device(DeviceType::sim, index), &sim_storage_free, &d);
  }
  size_t memory_free(int index) const override { return dev(index).memory_free(); }

  void copy_to_host(const Storage& src, size_t off, void* dst, size_t n) override {
    check(src, off, n, "copy_to_host");
    dev(src.device.index).copy_d2h(current_stream(src.device), dst, addr_of(src) + off, n);
  }
  void copy_from_host(Storage& dst, size_t off, const void* src, size_t n) override {
    check(dst, off, n, "copy_from_host");
    dev(dst.device.index).copy_h2d(current_stream(dst.device), addr_of(dst) + off, src, n);
  }
  void copy_on_device(const Storage& src, size_t soff, Storage& dst, size_t doff, size_t n) override {
    check(src, soff, n, "copy_on_device (source)");
    check(dst, doff, n, "copy_on_device (destination)");
    if (src.device.index == dst.device.index) {
      dev(dst.device.index).copy_d2d(current_stream(dst.device), addr_of(dst) + doff, addr_of(src) + soff, n);
      return;
    }
    // Between two chips: through the host, ordered on both devices' current streams.
    std::vector<uint8_t> tmp(n);
    copy_to_host(src, soff, tmp.data(), n);
    copy_from_host(dst, doff, tmp.data(), n);
  }
  void synchronize(int index) override { dev(index).queue().synchronize(); }

  StreamId create_stream(int index) override { return dev(index).queue().create_stream(); }
  void synchronize_stream(int index, StreamId s) override { dev(index).queue().synchronize_stream(s); }
  bool query_stream(int index, StreamId s) override { return dev(index).queue().query_stream(s); }

  EventHandle create_event(int index) override {
    dev(index);
    std::lock_guard<std::mutex> lk(ev_mu_);
    const EventHandle e = next_event_++;
    events_[e] = nullptr;
    return e;
  }
  void destroy_event(int, EventHandle e) override {
    std::lock_guard<std::mutex> lk(ev_mu_);
    events_.erase(e);
  }
  void record_event(int index, StreamId s, EventHandle e) override {
    MarkerPtr m = dev(index).queue().record(s);
    std::lock_guard<std::mutex> lk(ev_mu_);
    marker_slot(e) = std::move(m);
  }
  void wait_event(int index, StreamId s, int, EventHandle e) override {
    MarkerPtr m = marker(e);
    if (m) dev(index).queue().wait_marker(s, std::move(m));
  }
  void synchronize_event(int, EventHandle e) override {
    if (MarkerPtr m = marker(e)) m->wait();
  }
  bool query_event(int, EventHandle e) override {
    MarkerPtr m = marker(e);
    return !m || m->done();
  }
  double event_time(int, EventHandle e) override {
    MarkerPtr m = marker(e);
    return m && m->done() ? m->time() : NAN;
  }

  bool runs_programs() const override { return true; }
  ProgramHandle load_program(int index, std::string_view program) override {
    return dev(index).load_program_text(program);
  }
  void unload_program(int index, ProgramHandle p) override { dev(index).unload_program(p); }
  void enqueue_program(int index, StreamId s, ProgramHandle p, const ProgramOptions& opt,
                       std::shared_ptr<ProgramStats> stats) override {
    std::function<void(const sim::RunResult&)> done;
    if (stats)
      done = [stats](const sim::RunResult& r) {
        stats->cycles = r.stats.cycles;
        stats->seconds = r.stats.seconds;
        stats->instructions = r.stats.instructions;
        stats->mxu_flops = r.stats.mxu_flops;
        stats->mfu = r.stats.mfu;
        stats->hbm_bytes_read = r.stats.hbm_bytes_read;
        stats->hbm_bytes_written = r.stats.hbm_bytes_written;
        stats->done = true;
      };
    dev(index).run_program(s, p, SimProgramOptions{.timing_only = opt.timing_only, .trace = opt.trace},
                           std::move(done));
  }

 private:
  static SimDevice& dev(int index) { return devices().get(index); }
  static void check(const Storage& s, size_t off, size_t n, const char* what) {
    TPU_CHECK(s.device.type == DeviceType::sim && off <= s.nbytes && n <= s.nbytes - off,
              "sim driver: {}: byte range [{}, {}) is outside the {}-byte storage on {}", what, off, off + n, s.nbytes,
              s.device.str());
  }
  MarkerPtr& marker_slot(EventHandle e) {
    auto it = events_.find(e);
    TPU_CHECK(it != events_.end(), "sim driver: unknown event handle {}", e);
    return it->second;
  }
  MarkerPtr marker(EventHandle e) {
    std::lock_guard<std::mutex> lk(ev_mu_);
    return marker_slot(e);
  }

  std::mutex ev_mu_;
  std::unordered_map<EventHandle, MarkerPtr> events_;
  EventHandle next_event_ = 1;
};

[[maybe_unused]] const bool g_registered = [] {
  register_driver(make_sim_driver());
  return true;
}();

}  // namespace

void set_sim_chip(const std::string& chip, int index) { devices().set_chip(chip, index); }
std::string sim_chip(int index) { return devices().spec(index); }
int sim_device_count() { return devices().count(); }
SimDevice& sim_device(int index) { return devices().get(index); }
std::unique_ptr<Driver> make_sim_driver() { return std::make_unique<SimDriver>(); }

}  // namespace tpu::device
