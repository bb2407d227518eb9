#include "device/plugin_loader.h"

#include <dlfcn.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "device/plugin_abi.h"
#include "tpucore/core/error.h"

namespace tpu::device {
namespace {

// The directory libtpucore was loaded from, for bare plugin names.
std::string library_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&library_dir), &info) == 0 || !info.dli_fname) return {};
  std::string p = info.dli_fname;
  auto slash = p.rfind('/');
  return slash == std::string::npos ? std::string() : p.substr(0, slash);
}

struct Library {
  void* handle = nullptr;
  const TpuPluginApi* api = nullptr;
  std::string path;
};

Library open_plugin(const std::string& path, DeviceType type) {
  const std::string how = fmt::format(
      "(a driver plugin is a shared library built against device/plugin_abi.h that exports '{}'; give its path in "
      "TPU_DRIVER_PATH or to tpu::load_driver_plugin)",
      TPU_PLUGIN_ENTRY_POINT);
  TPU_CHECK(!path.empty(), "load_driver_plugin: empty path for device type '{}' {}", device_type_name(type), how);
  Library lib;
  lib.path = path;
  lib.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  std::string err;
  if (!lib.handle) {
    const char* e = dlerror();  // (each call clears the message)
    err = e ? e : "unknown dlopen error";
  }
  if (!lib.handle && path.find('/') == std::string::npos) {
    const std::string dir = library_dir();
    if (!dir.empty()) {
      const std::string p2 = dir + "/" + path;
      lib.handle = dlopen(p2.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (lib.handle) lib.path = p2;
      else if (const char* e2 = dlerror()) err += std::string("; ") + e2;
    }
  }
  if (!lib.handle) fail("load_driver_plugin: cannot load '{}' for device type '{}': {} {}", path, device_type_name(type), err, how);
  dlerror();
  void* sym = dlsym(lib.handle, TPU_PLUGIN_ENTRY_POINT);
  if (!sym) {
    dlclose(lib.handle);
    fail("load_driver_plugin: '{}' is not a tpucore driver plugin: it does not export '{}' {}", lib.path,
         TPU_PLUGIN_ENTRY_POINT, how);
  }
  auto get_api = reinterpret_cast<TpuPluginGetApiFn>(sym);
  lib.api = get_api();
  if (!lib.api) {
    dlclose(lib.handle);
    fail("load_driver_plugin: '{}': {}() returned no function table", lib.path, TPU_PLUGIN_ENTRY_POINT);
  }
  if (lib.api->abi_version != TPU_PLUGIN_ABI_VERSION) {
    const unsigned v = lib.api->abi_version;
    const std::string name = lib.api->plugin_name ? lib.api->plugin_name : "?";
    dlclose(lib.handle);
    const char* why = v < TPU_PLUGIN_ABI_VERSION
                          ? " (an older ABI: before version 2, programs could not receive arguments, so tpucore's "
                            "generated programs cannot run on it)"
                          : "";
    fail("load_driver_plugin: '{}' (plugin '{}') was built for driver ABI version {}, but this tpucore implements "
         "version {}{}; rebuild the plugin against this tpucore's device/plugin_abi.h",
         lib.path, name, v, TPU_PLUGIN_ABI_VERSION, why);
  }
  if (lib.api->struct_size < TPU_STRUCT_SIZE(TpuPluginApi, synchronize)) {
    dlclose(lib.handle);
    fail("load_driver_plugin: '{}': its function table has {} bytes, fewer than ABI version {} requires ({})", lib.path,
         lib.api->struct_size, TPU_PLUGIN_ABI_VERSION, TPU_STRUCT_SIZE(TpuPluginApi, synchronize));
  }
  const void* const fns[] = {
      reinterpret_cast<const void*>(lib.api->last_error),        reinterpret_cast<const void*>(lib.api->device_count),
      reinterpret_cast<const void*>(lib.api->device_properties), reinterpret_cast<const void*>(lib.api->memory_alloc),
      reinterpret_cast<const void*>(lib.api->memory_free),       reinterpret_cast<const void*>(lib.api->copy),
      reinterpret_cast<const void*>(lib.api->synchronize)};
  for (const void* f : fns) {
    if (!f) {
      dlclose(lib.handle);
      fail("load_driver_plugin: '{}': a required function of the driver ABI is missing from its table", lib.path);
    }
  }
  return lib;
}

// Per-device context for the storage deleter (which only gets a context pointer). Never
// freed: storages may outlive the Driver object (a driver can be replaced or unloaded while
// tensors of it live; the library itself stays loaded).
struct DeviceCtx {
  const TpuPluginApi* api = nullptr;
  int index = 0;
};

void plugin_storage_free(void* ctx, void* data, size_t);

class PluginDriver final : public Driver {
 public:
  // Loads now (eager) or on first use (lazy, for TPU_DRIVER_PATH at start-up).
  PluginDriver(std::string path, DeviceType type, bool lazy) : path_(std::move(path)), type_(type) {
    if (!lazy) ensure();
  }
  ~PluginDriver() override {
    // Runs still queued in the plugin write into these; keep them alive.
    std::lock_guard<std::mutex> lk(pend_mu_);
    for (auto& h : pending_) new std::shared_ptr<Holder>(std::move(h));
  }

  std::string_view name() const override { return name_.empty() ? device_type_name(type_) : std::string_view(name_); }
  DeviceType type() const override { return type_; }
  int device_count() const override {
    ensure();
    return static_cast<int>(ctx_.size());
  }
  DeviceProperties properties(int index) const override {
    TpuDevicePropertiesArgs a{};
    a.struct_size = sizeof a;
    a.device = index;
    call(api()->device_properties(&a), index, "device_properties");
    DeviceProperties p;
    p.name = fmt::format("{}:{} ({}, plugin {})", device_type_name(type_), index, a.name, name_);
    p.memory_bytes = a.memory_bytes;
    p.compute_units = a.compute_units;
    p.description = a.description;
    p.clock_ghz = a.clock_ghz;
    p.peak_flops = a.peak_flops;
    return p;
  }

  StoragePtr allocate(int index, size_t nbytes) override {
    TpuMemoryArgs a{};
    a.struct_size = sizeof a;
    a.device = index;
    a.bytes = nbytes;
    call(api()->memory_alloc(&a), index, "memory_alloc");
    return std::make_shared<Storage>(reinterpret_cast<void*>(static_cast<uintptr_t>(a.address)), nbytes,
                                     Device(type_, index), &plugin_storage_free, ctx_[static_cast<size_t>(index)]);
  }
  size_t memory_free(int index) const override {
    TpuMemoryArgs a{};
    a.struct_size = sizeof a;
    a.device = index;
    TPU_CHECK(api()->memory_info, "{}:{}: driver plugin '{}' does not report free memory", device_type_name(type_), index, name_);
    call(api()->memory_info(&a), index, "memory_info");
    return a.free_bytes;
  }

  void copy_to_host(const Storage& src, size_t off, void* dst, size_t n) override {
    check(src, off, n, "copy_to_host");
    TpuCopyArgs a = copy_args(src.device, TPU_COPY_DEVICE_TO_HOST, n);
    a.src_address = addr(src) + off;
    a.host_dst = dst;
    do_copy(a);
    sweep();
  }
  void copy_from_host(Storage& dst, size_t off, const void* src, size_t n) override {
    check(dst, off, n, "copy_from_host");
    TpuCopyArgs a = copy_args(dst.device, TPU_COPY_HOST_TO_DEVICE, n);
    a.dst_address = addr(dst) + off;
    a.host_src = src;
    do_copy(a);
  }
  void copy_on_device(const Storage& src, size_t soff, Storage& dst, size_t doff, size_t n) override {
    check(src, soff, n, "copy_on_device (source)");
    check(dst, doff, n, "copy_on_device (destination)");
    if (src.device.index != dst.device.index) {
      std::vector<uint8_t> tmp(n);
      copy_to_host(src, soff, tmp.data(), n);
      copy_from_host(dst, doff, tmp.data(), n);
      return;
    }
    TpuCopyArgs a = copy_args(dst.device, TPU_COPY_DEVICE_TO_DEVICE, n);
    a.src_address = addr(src) + soff;
    a.dst_address = addr(dst) + doff;
    do_copy(a);
  }
  void synchronize(int index) override {
    TpuSynchronizeArgs a{};
    a.struct_size = sizeof a;
    a.device = index;
    call(api()->synchronize(&a), index, "synchronize");
    sweep();
  }

  StreamId create_stream(int index) override { return stream_call(&TpuPluginApi::stream_create, index, 0, "stream_create").stream; }
  void synchronize_stream(int index, StreamId s) override {
    stream_call(&TpuPluginApi::stream_synchronize, index, s, "stream_synchronize");
    sweep();
  }
  bool query_stream(int index, StreamId s) override {
    const bool done = stream_call(&TpuPluginApi::stream_query, index, s, "stream_query").done != 0;
    sweep();
    return done;
  }

  EventHandle create_event(int index) override { return event_call(&TpuPluginApi::event_create, index, 0, 0, "event_create").event; }
  void destroy_event(int index, EventHandle e) override {
    if (api()->event_destroy) {
      TpuEventArgs a = event_args(index, 0, e);
      api()->event_destroy(&a);  // called from destructors: never throws
    }
  }
  void record_event(int index, StreamId s, EventHandle e) override { event_call(&TpuPluginApi::event_record, index, s, e, "event_record"); }
  void wait_event(int index, StreamId s, int, EventHandle e) override { event_call(&TpuPluginApi::event_wait, index, s, e, "event_wait"); }
  void synchronize_event(int index, EventHandle e) override {
    event_call(&TpuPluginApi::event_synchronize, index, 0, e, "event_synchronize");
    sweep();
  }
  bool query_event(int index, EventHandle e) override {
    const bool done = event_call(&TpuPluginApi::event_query, index, 0, e, "event_query").done != 0;
    sweep();
    return done;
  }
  double event_time(int index, EventHandle e) override { return event_call(&TpuPluginApi::event_time, index, 0, e, "event_time").time_seconds; }

  bool runs_programs() const override { return api()->program_load && api()->program_run; }
  ProgramHandle load_program(int index, std::string_view program) override {
    TPU_CHECK(api()->program_load, "{}:{}: driver plugin '{}' does not load programs", device_type_name(type_), index, name_);
    TpuProgramLoadArgs a{};
    a.struct_size = sizeof a;
    a.device = index;
    a.format = TPU_PROGRAM_AUTO;
    a.program = program.data();
    a.program_size = program.size();
    call(api()->program_load(&a), index, "program_load");
    return a.program_handle;
  }
  void unload_program(int index, ProgramHandle p) override {
    if (!api()->program_unload) return;
    TpuProgramLoadArgs a{};
    a.struct_size = sizeof a;
    a.device = index;
    a.program_handle = p;
    call(api()->program_unload(&a), index, "program_unload");
  }
  void enqueue_program(int index, StreamId s, ProgramHandle p, const ProgramOptions& opt,
                       std::shared_ptr<ProgramStats> stats) override;
  std::string program_target(int index) const override;

 private:
  void ensure() const {
    std::call_once(once_, [&] {
      Library lib = open_plugin(path_, type_);
      api_ = lib.api;
      name_ = lib.api->plugin_name ? lib.api->plugin_name : "unnamed";
      TpuDeviceCountArgs a{};
      a.struct_size = sizeof a;
      call(api_->device_count(&a), -1, "device_count");
      for (int i = 0; i < a.count; ++i) ctx_.push_back(new DeviceCtx{api_, i});
    });
  }
  const TpuPluginApi* api() const {
    ensure();
    return api_;
  }
  void call(TpuStatus st, int index, const char* fn) const {
    if (st == TPU_STATUS_OK) return;
    const char* msg = api_->last_error ? api_->last_error() : nullptr;
    const std::string dev = index < 0 ? std::string(device_type_name(type_)) : Device(type_, index).str();
    fail("{}: driver plugin '{}' failed in {}: {}", dev, name_, fn, msg && *msg ? msg : "(no message)");
  }
  static uint64_t addr(const Storage& s) { return reinterpret_cast<uintptr_t>(s.data); }
  void check(const Storage& s, size_t off, size_t n, const char* what) const {
    TPU_CHECK(s.device.type == type_ && off <= s.nbytes && n <= s.nbytes - off,
              "{} driver: {}: byte range [{}, {}) is outside the {}-byte storage on {}", name_, what, off, off + n,
              s.nbytes, s.device.str());
  }
  TpuCopyArgs copy_args(const Device& d, TpuCopyKind kind, size_t n) const {
    TpuCopyArgs a{};
    a.struct_size = sizeof a;
    a.device = d.index;
    a.kind = kind;
    a.stream = current_stream(d);
    a.bytes = n;
    return a;
  }
  void do_copy(TpuCopyArgs& a) {
    if (a.bytes == 0) return;
    call(api()->copy(&a), a.device, "copy");
    if (sync_mode()) synchronize_stream(a.device, a.stream);
  }
  TpuStreamArgs stream_call(TpuStatus (*TpuPluginApi::*fn)(TpuStreamArgs*), int index, StreamId s, const char* what) {
    TPU_CHECK(api()->*fn, "{}:{}: driver plugin '{}' has no {}", device_type_name(type_), index, name_, what);
    TpuStreamArgs a{};
    a.struct_size = sizeof a;
    a.device = index;
    a.stream = s;
    call((api()->*fn)(&a), index, what);
    return a;
  }
  static TpuEventArgs event_args(int index, StreamId s, EventHandle e) {
    TpuEventArgs a{};
    a.struct_size = sizeof a;
    a.device = index;
    a.stream = s;
    a.event = e;
    a.time_seconds = NAN;
    return a;
  }
  TpuEventArgs event_call(TpuStatus (*TpuPluginApi::*fn)(TpuEventArgs*), int index, StreamId s, EventHandle e,
                          const char* what) {
    TPU_CHECK(api()->*fn, "{}:{}: driver plugin '{}' has no {}", device_type_name(type_), index, name_, what);
    TpuEventArgs a = event_args(index, s, e);
    call((api()->*fn)(&a), index, what);
    return a;
  }

  struct Holder {
    TpuProgramStats c{};
    std::shared_ptr<ProgramStats> out;
  };
  void sweep();

  std::mutex pend_mu_;
  std::vector<std::shared_ptr<Holder>> pending_;
  std::string path_;
  DeviceType type_;
  mutable std::once_flag once_;
  mutable const TpuPluginApi* api_ = nullptr;
  mutable std::string name_;
  mutable std::vector<DeviceCtx*> ctx_;  // leaked on purpose (see DeviceCtx)
};

void PluginDriver::enqueue_program(int index, StreamId s, ProgramHandle p, const ProgramOptions& opt,
                                   std::shared_ptr<ProgramStats> stats) {
  TPU_CHECK(api()->program_run, "{}:{}: driver plugin '{}' does not run programs", device_type_name(type_), index, name_);
  // The plugin fills a C struct when the run completes; it is copied into `stats` at the next
  // synchronization or query through this driver (see sweep()).
  TpuProgramRunArgs a{};
  a.struct_size = sizeof a;
  a.device = index;
  a.stream = s;
  a.program_handle = p;
  a.timing_only = opt.timing_only ? 1 : 0;
  a.args = opt.args.empty() ? nullptr : opt.args.data();
  a.num_args = opt.args.size();
  std::shared_ptr<Holder> h;
  if (stats) {
    h = std::make_shared<Holder>();
    h->c.struct_size = sizeof h->c;
    h->out = stats;
    a.stats = &h->c;
  }
  call(api()->program_run(&a), index, "program_run");
  if (h) {
    std::lock_guard<std::mutex> lk(pend_mu_);
    pending_.push_back(std::move(h));
  }
  if (sync_mode()) synchronize_stream(index, s);
}

std::string PluginDriver::program_target(int index) const {
  if (!(api()->struct_size >= TPU_STRUCT_SIZE(TpuPluginApi, device_target) && api()->device_target)) return {};
  TpuDeviceTargetArgs a{};
  a.struct_size = sizeof a;
  a.device = index;
  call(api()->device_target(&a), index, "device_target");
  std::string text(a.size + 1, '\0');
  a.buffer = text.data();
  a.capacity = text.size();
  call(api()->device_target(&a), index, "device_target");
  TPU_CHECK(a.size + 1 <= text.size(), "{}: driver plugin '{}': device_target's size changed between two calls",
            Device(type_, index).str(), name_);
  text.resize(a.size);
  return text;
}

void PluginDriver::sweep() {
  std::lock_guard<std::mutex> lk(pend_mu_);
  for (size_t i = 0; i < pending_.size();) {
    Holder& h = *pending_[i];
    if (__atomic_load_n(&h.c.done, __ATOMIC_ACQUIRE) == 0) {
      ++i;
      continue;
    }
    ProgramStats& o = *h.out;
    o.cycles = h.c.cycles;
    o.seconds = h.c.seconds;
    o.instructions = h.c.instructions;
    o.mxu_flops = h.c.mxu_flops;
    o.mfu = h.c.mfu;
    o.hbm_bytes_read = h.c.hbm_bytes_read;
    o.hbm_bytes_written = h.c.hbm_bytes_written;
    o.vector_elements = h.c.vector_elements;
    o.dma_bytes = h.c.dma_bytes;
    o.done = true;
    pending_[i] = std::move(pending_.back());
    pending_.pop_back();
  }
}

void plugin_storage_free(void* ctx, void* data, size_t) {
  auto* c = static_cast<DeviceCtx*>(ctx);
  TpuMemoryArgs a{};
  a.struct_size = sizeof a;
  a.device = c->index;
  a.address = reinterpret_cast<uintptr_t>(data);
  c->api->memory_free(&a);  // a deleter cannot throw; a failed free leaks the block
}

// Stands in for a driver after unload_driver_plugin: every use is the missing-driver error.
class MissingDriver final : public Driver {
 public:
  explicit MissingDriver(DeviceType t) : type_(t) {}
  std::string_view name() const override { return device_type_name(type_); }
  DeviceType type() const override { return type_; }
  int device_count() const override { missing(); }
  DeviceProperties properties(int) const override { missing(); }
  StoragePtr allocate(int, size_t) override { missing(); }
  size_t memory_free(int) const override { missing(); }
  void copy_to_host(const Storage&, size_t, void*, size_t) override { missing(); }
  void copy_from_host(Storage&, size_t, const void*, size_t) override { missing(); }
  void copy_on_device(const Storage&, size_t, Storage&, size_t, size_t) override { missing(); }
  void synchronize(int) override { missing(); }

 private:
  [[noreturn]] void missing() const {
    fail("device '{}': no driver is loaded (the driver plugin was unloaded). Provide one: point TPU_DRIVER_PATH at "
         "a driver plugin (a shared library implementing device/plugin_abi.h) or call tpu::load_driver_plugin(path)",
         device_type_name(type_));
  }
  DeviceType type_;
};

std::string env_driver_path() {
  const char* p = std::getenv("TPU_DRIVER_PATH");
  return p && *p ? std::string(p) : std::string();
}

std::mutex g_explicit_mu;
bool g_explicit[kNumDeviceTypes] = {};

const bool g_env_plugin = [] {
  const std::string p = env_driver_path();
  if (!p.empty()) register_driver(std::make_unique<PluginDriver>(p, DeviceType::tpu, /*lazy=*/true));
  return true;
}();

}  // namespace

std::unique_ptr<Driver> load_plugin_driver(const std::string& path, DeviceType type) {
  TPU_CHECK(type != DeviceType::cpu, "load_driver_plugin: the cpu device type has a built-in driver; load '{}' as "
            "'tpu' (or 'sim')", path);
  return std::make_unique<PluginDriver>(path, type, /*lazy=*/false);
}

std::string load_driver_plugin(const std::string& path, DeviceType type) {
  std::unique_ptr<Driver> d = load_plugin_driver(path, type);
  std::string name(d->name());
  std::lock_guard<std::mutex> lk(g_explicit_mu);
  register_driver(std::move(d));
  g_explicit[static_cast<int>(type)] = true;
  return name;
}

bool driver_present(DeviceType type) {
  return has_driver(type) && dynamic_cast<MissingDriver*>(&driver_for(type)) == nullptr;
}

bool unload_driver_plugin(DeviceType type) {
  std::lock_guard<std::mutex> lk(g_explicit_mu);
  if (!g_explicit[static_cast<int>(type)]) return false;
  g_explicit[static_cast<int>(type)] = false;
  const std::string env = env_driver_path();
  if (type == DeviceType::tpu && !env.empty()) register_driver(std::make_unique<PluginDriver>(env, type, /*lazy=*/true));
  else register_driver(std::make_unique<MissingDriver>(type));
  return true;
}

}  // namespace tpu::device
