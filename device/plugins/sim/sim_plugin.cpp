// The simulator as an out-of-tree driver plugin (libtpusim_plugin.so): the C ABI of
// device/plugin_abi.h over SimDevice, so tests run tensors on the simulator through the same
// path a real chip's driver takes. Devices: TPU_SIM_DEVICES (default 2) chips of TPU_SIM_CHIP
// (default v5e), created on first use. No exception crosses the ABI: every entry point turns
// them into a status and a last_error message.
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "device/plugin_abi.h"
#include "device/sim_device.h"
#include "sim/config.h"

#include <nlohmann/json.hpp>
#include "tpucore/core/error.h"

namespace tpu::device {
namespace {

thread_local std::string t_last_error;

class OutOfMemory : public Error {
 public:
  using Error::Error;
};
class BadArgument : public Error {
 public:
  using Error::Error;
};

template <class F>
TpuStatus guarded(F&& f) {
  try {
    f();
    return TPU_STATUS_OK;
  } catch (const OutOfMemory& e) {
    t_last_error = e.what();
    return TPU_STATUS_OUT_OF_MEMORY;
  } catch (const BadArgument& e) {
    t_last_error = e.what();
    return TPU_STATUS_INVALID_ARGUMENT;
  } catch (const std::exception& e) {
    t_last_error = e.what();
    return TPU_STATUS_ERROR;
  } catch (...) {
    t_last_error = "unknown error";
    return TPU_STATUS_ERROR;
  }
}

template <class A>
void check_args(const A* a, size_t need, const char* fn) {
  if (!a) throw BadArgument(std::string("tpusim plugin: ") + fn + ": null arguments");
  if (a->struct_size < need)
    throw BadArgument(std::string("tpusim plugin: ") + fn + ": struct_size " + std::to_string(a->struct_size) +
                      " is smaller than this ABI's " + std::to_string(need));
}

class Plugin {
 public:
  int count() {
    std::lock_guard<std::mutex> lk(mu_);
    init_locked();
    return static_cast<int>(devs_.size());
  }
  SimDevice& dev(int i) {
    std::lock_guard<std::mutex> lk(mu_);
    init_locked();
    if (i < 0 || i >= static_cast<int>(devs_.size()))
      throw BadArgument("tpusim plugin: device " + std::to_string(i) + " does not exist (" +
                        std::to_string(devs_.size()) + " device(s); set TPU_SIM_DEVICES for more)");
    auto& d = devs_[static_cast<size_t>(i)];
    if (!d) d = std::make_unique<SimDevice>("tpusim device " + std::to_string(i), chip_);
    return *d;
  }
  uint64_t new_event() {
    std::lock_guard<std::mutex> lk(mu_);
    uint64_t e = next_event_++;
    events_[e] = nullptr;
    return e;
  }
  void drop_event(uint64_t e) {
    std::lock_guard<std::mutex> lk(mu_);
    events_.erase(e);
  }
  void set_marker(uint64_t e, MarkerPtr m) {
    std::lock_guard<std::mutex> lk(mu_);
    slot(e) = std::move(m);
  }
  MarkerPtr marker(uint64_t e) {
    std::lock_guard<std::mutex> lk(mu_);
    return slot(e);
  }

 private:
  MarkerPtr& slot(uint64_t e) {
    auto it = events_.find(e);
    if (it == events_.end()) throw BadArgument("tpusim plugin: unknown event handle " + std::to_string(e));
    return it->second;
  }
  void init_locked() {
    if (init_) return;
    int n = 2;
    if (const char* v = std::getenv("TPU_SIM_DEVICES"); v && *v) {
      std::string_view s(v);
      auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
      if (ec != std::errc() || p != s.data() + s.size() || n < 1 || n > 1024)
        throw BadArgument("tpusim plugin: TPU_SIM_DEVICES='" + std::string(s) + "': expected a number from 1 to 1024");
    }
    const char* c = std::getenv("TPU_SIM_CHIP");
    chip_ = c && *c ? c : "v5e";
    load_chip_config(chip_, "tpusim plugin");  // a bad preset fails here, listing the presets
    devs_.resize(static_cast<size_t>(n));
    init_ = true;
  }

  std::mutex mu_;
  bool init_ = false;
  std::string chip_;
  std::vector<std::unique_ptr<SimDevice>> devs_;
  std::unordered_map<uint64_t, MarkerPtr> events_;
  uint64_t next_event_ = 1;
};

Plugin& plugin() {
  static Plugin* p = new Plugin();  // leaked: the host may free memory during its exit
  return *p;
}

void copy_str(char* dst, size_t cap, const std::string& s) {
  const size_t n = std::min(cap - 1, s.size());
  std::memcpy(dst, s.data(), n);
  dst[n] = '\0';
}

const char* last_error() { return t_last_error.c_str(); }

TpuStatus device_count(TpuDeviceCountArgs* a) {
  return guarded([&] {
    check_args(a, TPU_STRUCT_SIZE(TpuDeviceCountArgs, count), "device_count");
    a->count = plugin().count();
  });
}

TpuStatus device_properties(TpuDevicePropertiesArgs* a) {
  return guarded([&] {
    check_args(a, TPU_STRUCT_SIZE(TpuDevicePropertiesArgs, peak_flops), "device_properties");
    SimDevice& d = plugin().dev(a->device);
    copy_str(a->name, sizeof a->name, d.config().name);
    copy_str(a->description, sizeof a->description, d.describe());
    a->memory_bytes = d.hbm_size();
    a->compute_units = d.config().mxu.count;
    a->clock_ghz = d.config().clock_ghz;
    a->peak_flops = d.config().peak_flops();
  });
}

TpuStatus memory_alloc(TpuMemoryArgs* a) {
  return guarded([&] {
    check_args(a, TPU_STRUCT_SIZE(TpuMemoryArgs, address), "memory_alloc");
    SimDevice& d = plugin().dev(a->device);
    try {
      a->address = d.allocate(a->bytes);
    } catch (const Error& e) {
      throw OutOfMemory(e.what());
    }
  });
}

TpuStatus memory_free(TpuMemoryArgs* a) {
  return guarded([&] {
    check_args(a, TPU_STRUCT_SIZE(TpuMemoryArgs, address), "memory_free");
    plugin().dev(a->device).free(a->address);
  });
}

TpuStatus memory_info(TpuMemoryArgs* a) {
  return guarded([&] {
    check_args(a, TPU_STRUCT_SIZE(TpuMemoryArgs, total_bytes), "memory_info");
    SimDevice& d = plugin().dev(a->device);
    a->free_bytes = d.memory_free();
    a->total_bytes = d.hbm_size();
  });
}

TpuStatus copy(TpuCopyArgs* a) {
  return guarded([&] {
    check_args(a, TPU_STRUCT_SIZE(TpuCopyArgs, bytes), "copy");
    SimDevice& d = plugin().dev(a->device);
    switch (a->kind) {
      case TPU_COPY_HOST_TO_DEVICE: d.copy_h2d(a->stream, a->dst_address, a->host_src, a->bytes); break;
      case TPU_COPY_DEVICE_TO_HOST: d.copy_d2h(a->stream, a->host_dst, a->src_address, a->bytes); break;
      case TPU_COPY_DEVICE_TO_DEVICE: d.copy_d2d(a->stream, a->dst_address, a->src_address, a->bytes); break;
      default: throw BadArgument("tpusim plugin: copy: unknown copy kind " + std::to_string(a->kind));
    }
  });
}

TpuStatus stream_create(TpuStreamArgs* a) {
  return guarded([&] {
    check_args(a, TPU_STRUCT_SIZE(TpuStreamArgs, stream), "stream_create");
    a->stream = plugin().dev(a->device).queue().create_stream();
  });
}
TpuStatus stream_synchronize(TpuStreamArgs* a) {
  return guarded([&] {
    check_args(a, TPU_STRUCT_SIZE(TpuStreamArgs, stream), "stream_synchronize");
    plugin().dev(a->device).queue().synchronize_stream(a->stream);
  });
}
TpuStatus stream_query(TpuStreamArgs* a) {
  return guarded([&] {
    check_args(a, TPU_STRUCT_SIZE(TpuStreamArgs, done), "stream_query");
    a->done = plugin().dev(a->device).queue().query_stream(a->stream) ? 1 : 0;
  });
}

TpuStatus event_create(TpuEventArgs* a) {
  return guarded([&] {
    check_args(a, TPU_STRUCT_SIZE(TpuEventArgs, event), "event_create");
    a->event = plugin().new_event();
  });
}
TpuStatus event_destroy(TpuEventArgs* a) {
  return guarded([&] {
    check_args(a, TPU_STRUCT_SIZE(TpuEventArgs, event), "event_destroy");
    plugin().drop_event(a->event);
  });
}
TpuStatus event_record(TpuEventArgs* a) {
  return guarded([&] {
    check_args(a, TPU_STRUCT_SIZE(TpuEventArgs, event), "event_record");
    plugin().marker(a->event);  // validates the handle
    plugin().set_marker(a->event, plugin().dev(a->device).queue().record(a->stream));
  });
}
TpuStatus event_wait(TpuEventArgs* a) {
  return guarded([&] {
    check_args(a, TPU_STRUCT_SIZE(TpuEventArgs, event), "event_wait");
    if (MarkerPtr m = plugin().marker(a->event)) plugin().dev(a->device).queue().wait_marker(a->stream, std::move(m));
  });
}
TpuStatus event_synchronize(TpuEventArgs* a) {
  return guarded([&] {
    check_args(a, TPU_STRUCT_SIZE(TpuEventArgs, event), "event_synchronize");
    if (MarkerPtr m = plugin().marker(a->event)) m->wait();
  });
}
TpuStatus event_query(TpuEventArgs* a) {
  return guarded([&] {
    check_args(a, TPU_STRUCT_SIZE(TpuEventArgs, done), "event_query");
    MarkerPtr m = plugin().marker(a->event);
    a->done = !m || m->done() ? 1 : 0;
  });
}
TpuStatus event_time(TpuEventArgs* a) {
  return guarded([&] {
    check_args(a, TPU_STRUCT_SIZE(TpuEventArgs, time_seconds), "event_time");
    MarkerPtr m = plugin().marker(a->event);
    a->time_seconds = m && m->done() ? m->time() : NAN;
  });
}

TpuStatus program_load(TpuProgramLoadArgs* a) {
  return guarded([&] {
    check_args(a, TPU_STRUCT_SIZE(TpuProgramLoadArgs, program_handle), "program_load");
    if (!a->program) throw BadArgument("tpusim plugin: program_load: null program text");
    SimDevice& d = plugin().dev(a->device);
    try {
      a->program_handle = d.load_program_text(std::string_view(a->program, a->program_size));
    } catch (const Error& e) {
      throw BadArgument(e.what());
    }
  });
}
TpuStatus program_unload(TpuProgramLoadArgs* a) {
  return guarded([&] {
    check_args(a, TPU_STRUCT_SIZE(TpuProgramLoadArgs, program_handle), "program_unload");
    plugin().dev(a->device).unload_program(a->program_handle);
  });
}
TpuStatus program_run(TpuProgramRunArgs* a) {
  return guarded([&] {
    check_args(a, TPU_STRUCT_SIZE(TpuProgramRunArgs, stats), "program_run");
    TpuProgramStats* st = a->stats;
    if (st && st->struct_size < TPU_STRUCT_SIZE(TpuProgramStats, done))
      throw BadArgument("tpusim plugin: program_run: stats.struct_size is too small");
    std::function<void(const sim::RunResult&)> done;
    if (st)
      done = [st](const sim::RunResult& r) {
        // Fill only what the caller's struct has room for.
        auto has = [st](size_t need) { return st->struct_size >= need; };
        if (has(TPU_STRUCT_SIZE(TpuProgramStats, cycles))) st->cycles = r.stats.cycles;
        if (has(TPU_STRUCT_SIZE(TpuProgramStats, seconds))) st->seconds = r.stats.seconds;
        if (has(TPU_STRUCT_SIZE(TpuProgramStats, instructions))) st->instructions = r.stats.instructions;
        if (has(TPU_STRUCT_SIZE(TpuProgramStats, mxu_flops))) st->mxu_flops = r.stats.mxu_flops;
        if (has(TPU_STRUCT_SIZE(TpuProgramStats, mfu))) st->mfu = r.stats.mfu;
        if (has(TPU_STRUCT_SIZE(TpuProgramStats, hbm_bytes_read))) st->hbm_bytes_read = r.stats.hbm_bytes_read;
        if (has(TPU_STRUCT_SIZE(TpuProgramStats, hbm_bytes_written))) st->hbm_bytes_written = r.stats.hbm_bytes_written;
        if (has(TPU_STRUCT_SIZE(TpuProgramStats, vector_elements))) st->vector_elements = r.stats.vector_elements;
        if (has(TPU_STRUCT_SIZE(TpuProgramStats, dma_bytes))) st->dma_bytes = r.stats.dma_bytes;
        __atomic_store_n(&st->done, 1, __ATOMIC_RELEASE);  // last: the host reads it with acquire
      };
    SimDevice& d = plugin().dev(a->device);
    SimProgramOptions o{.timing_only = a->timing_only != 0};
    // Arguments (version 2): a caller built for version 1 has a smaller struct and none.
    if (a->struct_size >= TPU_STRUCT_SIZE(TpuProgramRunArgs, num_args) && a->num_args > 0) {
      if (!a->args) throw BadArgument("tpusim plugin: program_run: num_args is " + std::to_string(a->num_args) +
                                      " but args is null");
      const auto regs = static_cast<size_t>(d.config().scalar.registers);
      if (a->num_args > regs)
        throw BadArgument("tpusim plugin: program_run: " + std::to_string(a->num_args) + " arguments, but the chip '" +
                          d.config().name + "' has " + std::to_string(regs) + " scalar registers");
      o.registers.assign(a->args, a->args + a->num_args);
    }
    d.run_program(a->stream, a->program_handle, o, std::move(done));
  });
}

TpuStatus device_target(TpuDeviceTargetArgs* a) {
  return guarded([&] {
    check_args(a, TPU_STRUCT_SIZE(TpuDeviceTargetArgs, size), "device_target");
    const std::string text = sim::config_to_json(plugin().dev(a->device).config()).dump();
    a->size = text.size();
    if (!a->buffer || a->capacity == 0) return;
    const size_t n = std::min(a->capacity - 1, text.size());
    std::memcpy(a->buffer, text.data(), n);
    a->buffer[n] = '\0';
  });
}

TpuStatus synchronize(TpuSynchronizeArgs* a) {
  return guarded([&] {
    check_args(a, TPU_STRUCT_SIZE(TpuSynchronizeArgs, device), "synchronize");
    plugin().dev(a->device).queue().synchronize();
  });
}

const TpuPluginApi kApi = {
    .struct_size = sizeof(TpuPluginApi),
    .abi_version = TPU_PLUGIN_ABI_VERSION,
    .plugin_name = "tpusim",
    .last_error = &last_error,
    .device_count = &device_count,
    .device_properties = &device_properties,
    .memory_alloc = &memory_alloc,
    .memory_free = &memory_free,
    .memory_info = &memory_info,
    .copy = &copy,
    .stream_create = &stream_create,
    .stream_synchronize = &stream_synchronize,
    .stream_query = &stream_query,
    .event_create = &event_create,
    .event_destroy = &event_destroy,
    .event_record = &event_record,
    .event_wait = &event_wait,
    .event_synchronize = &event_synchronize,
    .event_query = &event_query,
    .event_time = &event_time,
    .program_load = &program_load,
    .program_unload = &program_unload,
    .program_run = &program_run,
    .synchronize = &synchronize,
    .device_target = &device_target,
};

}  // namespace
}  // namespace tpu::device

extern "C" TPU_PLUGIN_EXPORT const TpuPluginApi* tpu_plugin_get_api(void) { return &tpu::device::kApi; }
