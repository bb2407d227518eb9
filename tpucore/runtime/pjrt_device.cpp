// The `pjrt` device type: a Driver over a PJRT client (tpucore/runtime/pjrt_client.h) and the
// eager kernel that runs each op as a cached single-op StableHLO executable.
//
// Memory. A pjrt storage is a PJRT buffer once a computation produced it or read it; PJRT
// buffers are typed and shaped while the Driver interface writes untyped bytes, so bytes
// written from the host are kept on the host side of the storage until the first op reads
// them, which uploads them as a buffer of that op's dtype and shape (kept for later ops when
// the tensor covers the whole storage). Reading from the host downloads the buffer once (kept
// until the next write). Outputs of executables are adopted as they are: no copy.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "device/driver.h"
#include "ops/fallback.h"
#include "ops/index_common.h"
#include "ops/registry.h"
#include "tpucore/core/error.h"
#include "tpucore/core/log.h"
#include "graph/stablehlo.h"
#include "tpucore/export.h"
#include "tpucore/jit/internal.h"
#include "tpucore/runtime/pjrt_client.h"

namespace tpu::pjrt {
namespace {

struct Counters {
  std::atomic<uint64_t> compiles{0}, cache_hits{0}, executions{0}, uploads{0}, downloads{0}, host_fallbacks{0},
      unmapped{0}, graph_compiles{0}, graph_runs{0};
};
Counters& counters() {
  static Counters* c = new Counters();
  return *c;
}

std::atomic<int> g_host_fallback{-1};  // -1: not read from the environment yet

bool host_fallback_on() {
  int v = g_host_fallback.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* e = std::getenv("TPU_PJRT_HOST_FALLBACK");
    v = (e && std::string_view(e) == "0") ? 0 : 1;
    g_host_fallback.store(v);
  }
  return v != 0;
}

// What Storage::data points at on a pjrt device.
struct PjrtStorage {
  std::mutex mu;
  int device = 0;
  size_t nbytes = 0;
  std::vector<uint8_t> host;  // valid when host_valid
  bool host_valid = false;
  BufferPtr buf;  // a valid device copy when set (same bytes as host when both are valid)
};

void delete_storage(void* ctx, void*, size_t) { delete static_cast<PjrtStorage*>(ctx); }

PjrtStorage& storage_of(const Storage& s) { return *static_cast<PjrtStorage*>(s.ctx); }

// Makes the host side valid (downloads the buffer, or zeros for a never-written storage).
void ensure_host(PjrtStorage& s) {
  if (s.host_valid) return;
  s.host.assign(s.nbytes, 0);
  if (s.buf) {
    TPU_CHECK(s.buf->nbytes() <= s.nbytes, "internal: pjrt: a buffer of {} bytes in a storage of {}", s.buf->nbytes(),
              s.nbytes);
    s.buf->to_host(s.host.data(), s.buf->nbytes());
    counters().downloads.fetch_add(1, std::memory_order_relaxed);
  }
  s.host_valid = true;
}

struct CacheEntry {
  std::mutex mu;                    // guards exe and why after the entry is published
  std::shared_ptr<Executable> exe;  // null: the op does not map
  std::string why;                  // why it does not map
  std::shared_ptr<Executable> get() {
    std::lock_guard<std::mutex> lk(mu);
    return exe;
  }
  std::string reason() {
    std::lock_guard<std::mutex> lk(mu);
    return why;
  }
};

class PjrtDriver final : public device::Driver {
 public:
  explicit PjrtDriver(std::shared_ptr<Client> c) : client_(std::move(c)) {}
  std::string_view name() const override { return "pjrt"; }
  DeviceType type() const override { return DeviceType::pjrt; }
  int device_count() const override { return client_->device_count(); }
  device::DeviceProperties properties(int index) const override {
    device::DeviceProperties p;
    p.name = fmt::format("pjrt:{} ({})", index, client_->platform_name());
    p.memory_bytes = 0;  // not asked of the plugin (PJRT_Device_MemoryStats is optional)
    p.description = fmt::format("PJRT plugin {} (C API {}.{})", client_->path(), client_->api_major(),
                                client_->api_minor());
    return p;
  }
  StoragePtr allocate(int index, size_t nbytes) override {
    auto* s = new PjrtStorage();
    s->device = index;
    s->nbytes = nbytes;
    return std::make_shared<Storage>(s, nbytes, Device(DeviceType::pjrt, index), &delete_storage, s);
  }
  size_t memory_free(int) const override { return SIZE_MAX; }
  void copy_to_host(const Storage& src, size_t off, void* dst, size_t n) override {
    PjrtStorage& s = storage_of(src);
    std::lock_guard<std::mutex> lk(s.mu);
    TPU_CHECK(off + n <= s.nbytes, "internal: pjrt: read of bytes [{}, {}) of a storage of {}", off, off + n, s.nbytes);
    ensure_host(s);
    if (n) std::memcpy(dst, s.host.data() + off, n);
  }
  void copy_from_host(Storage& dst, size_t off, const void* src, size_t n) override {
    PjrtStorage& s = storage_of(dst);
    std::lock_guard<std::mutex> lk(s.mu);
    TPU_CHECK(off + n <= s.nbytes, "internal: pjrt: write of bytes [{}, {}) of a storage of {}", off, off + n, s.nbytes);
    if (off == 0 && n == s.nbytes) {
      s.host.assign(static_cast<const uint8_t*>(src), static_cast<const uint8_t*>(src) + n);
      s.host_valid = true;
    } else {
      ensure_host(s);
      if (n) std::memcpy(s.host.data() + off, src, n);
    }
    s.buf.reset();  // the device copy is stale now
  }
  void copy_on_device(const Storage& src, size_t soff, Storage& dst, size_t doff, size_t n) override {
    std::vector<uint8_t> tmp(n);
    copy_to_host(src, soff, tmp.data(), n);
    copy_from_host(dst, doff, tmp.data(), n);
  }
  void synchronize(int) override {}  // every PJRT call here waits for its events

  Client& client() { return *client_; }

  // The cached executable of a call (compiled on a miss), or an entry saying it does not map.
  std::shared_ptr<CacheEntry> executable_for(const ops::KernelArgs& a);

  // A buffer on device `index` holding tensor t (any device) in its shape and dtype.
  BufferPtr input_buffer(const Tensor& t, int index);

 private:
  std::shared_ptr<Client> client_;
  std::mutex cache_mu_, compile_mu_;
  std::map<std::string, std::shared_ptr<CacheEntry>> cache_;
};

std::string cache_key(const ops::KernelArgs& a) {
  std::string k = a.op.name + "(" + a.attrs.str() + ")";
  for (const Tensor& t : a.inputs) k += fmt::format(";{}[{}]", dtype_name(t.dtype()), fmt::join(t.shape().vec(), ","));
  return k;
}

std::shared_ptr<CacheEntry> PjrtDriver::executable_for(const ops::KernelArgs& a) {
  const std::string key = cache_key(a);
  {
    std::lock_guard<std::mutex> lk(cache_mu_);
    auto it = cache_.find(key);
    if (it != cache_.end()) {
      if (it->second->get()) counters().cache_hits.fetch_add(1, std::memory_order_relaxed);
      return it->second;
    }
  }
  std::lock_guard<std::mutex> compile_lk(compile_mu_);  // one compile at a time (and once per key)
  {
    std::lock_guard<std::mutex> lk(cache_mu_);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
  }
  auto e = std::make_shared<CacheEntry>();
  const ops::OpDef& op = a.op;
  const ops::Attrs& attrs = a.attrs;
  const size_t nout = a.outputs.size();
  std::string text;
  try {
    std::vector<Tensor> examples(a.inputs.begin(), a.inputs.end());
    text = tpu::detail::export_traced(
        [&](const std::vector<Tensor>& p) {
          std::vector<Tensor> outs(ops::kMaxOutputs);
          ops::call(op, p, attrs, outs);
          outs.resize(nout);
          return outs;
        },
        examples, {});
  } catch (const Error& err) {
    e->why = std::string("no StableHLO export: ") + err.what();
  }
  if (e->why.empty()) {
    try {
      e->exe = client_->compile(text);
      counters().compiles.fetch_add(1, std::memory_order_relaxed);
      if (e->exe->num_outputs() != nout)
        fail("the executable has {} output(s), the op {}", e->exe->num_outputs(), nout);
    } catch (const Error& err) {
      e->exe.reset();
      e->why = std::string("the plugin did not compile it: ") + err.what();
    }
  }
  if (!e->exe) counters().unmapped.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lk(cache_mu_);
  cache_.emplace(key, e);
  return e;
}

BufferPtr PjrtDriver::input_buffer(const Tensor& t, int index) {
  const bool whole = t.device() == Device(DeviceType::pjrt, index) && t.is_contiguous() && t.offset() == 0 &&
                     t.nbytes() == storage_of(*t.storage()).nbytes;
  if (whole) {
    PjrtStorage& s = storage_of(*t.storage());
    std::lock_guard<std::mutex> lk(s.mu);
    if (s.buf && s.buf->dtype() == t.dtype() && s.buf->dims() == t.shape().vec()) return s.buf;
  }
  // Through the host: a host tensor, another device's tensor, a view, or bytes written from the host.
  const Tensor h = t.device().is_cpu() ? t.contiguous() : ops::copy_to_device(t, Device());
  BufferPtr b = client_->upload(h.raw_data(), h.dtype(), h.shape().vec(), index);
  counters().uploads.fetch_add(1, std::memory_order_relaxed);
  if (whole) {
    PjrtStorage& s = storage_of(*t.storage());
    std::lock_guard<std::mutex> lk(s.mu);
    if (s.host_valid) s.buf = b;  // same bytes as the host side, kept for the next op
  }
  return b;
}

// Puts an executable's output buffer into a pjrt tensor's storage (no copy).
void adopt(const Tensor& o, BufferPtr b) {
  PjrtStorage& s = storage_of(*o.storage());
  std::lock_guard<std::mutex> lk(s.mu);
  s.buf = std::move(b);
  s.host_valid = false;
}

PjrtDriver* current_driver() {
  if (!device::has_driver(DeviceType::pjrt)) return nullptr;
  return dynamic_cast<PjrtDriver*>(&device::driver_for(DeviceType::pjrt));
}

// Runs a cached executable; false (and the entry marked as not mapping) when its outputs do not
// match the op's (an export bug: the op then takes the fallback rule).
bool run_executable(PjrtDriver& d, CacheEntry& e, const std::shared_ptr<Executable>& exe, const ops::KernelArgs& a,
                    Device dev) {
  std::vector<BufferPtr> ins;
  ins.reserve(a.inputs.size());
  for (const Tensor& t : a.inputs) ins.push_back(d.input_buffer(t, dev.index));
  std::vector<BufferPtr> outs = exe->execute_buffers(ins, dev.index);
  counters().executions.fetch_add(1, std::memory_order_relaxed);
  std::string bad;
  if (outs.size() != a.outputs.size()) bad = fmt::format("{} output(s), expected {}", outs.size(), a.outputs.size());
  for (size_t i = 0; bad.empty() && i < outs.size(); ++i) {
    const Tensor& o = a.outputs[i];
    if (outs[i]->dtype() != o.dtype() || outs[i]->dims() != o.shape().vec())
      bad = fmt::format("output {} came back as {}[{}], expected {}[{}]", i, dtype_name(outs[i]->dtype()),
                        fmt::join(outs[i]->dims(), ","), dtype_name(o.dtype()), fmt::join(o.shape().vec(), ","));
  }
  if (!bad.empty()) {
    log().warn("pjrt: op '{}' ({}): the executable's {}; the op takes the fallback rule from now on", a.op.name,
               a.attrs.str(), bad);
    std::lock_guard<std::mutex> lk(e.mu);
    e.why = "its executable's " + bad;
    e.exe.reset();
    counters().unmapped.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  for (size_t i = 0; i < outs.size(); ++i) adopt(a.outputs[i], outs[i]);
  return true;
}

// The indexing ops' ids are checked on the host first, so pjrt raises the cpu kernels' error
// for an out-of-range id; the exported module alone would clamp it (StableHLO gather semantics).
void check_indices(const ops::KernelArgs& a) {
  const std::string& n = a.op.name;
  const bool emb = n == "embedding";
  if (!emb && n != "index_select" && n != "gather" && n != "scatter_add") return;
  const Tensor& x = a.inputs[0];
  int64_t d = emb || x.dim() == 0 ? 0 : a.attrs.get_int("dim");
  if (d < 0) d += x.dim();
  const Tensor ids = ops::copy_to_device(a.inputs[1], Device());
  counters().downloads.fetch_add(1, std::memory_order_relaxed);
  ops::indexing::check_index_range(n.c_str(), ids.dtype() == DType::i32 ? ids : ids.to(DType::i32),
                              x.dim() ? x.shape()[int(d)] : 1, d,
                              (emb ? "weight of shape " : "x of shape ") + x.shape().str());
}

void pjrt_kernel(const ops::KernelArgs& a) {
  TPU_CHECK(!a.outputs.empty(), "internal: pjrt: op '{}' without outputs", a.op.name);
  const Device dev = a.outputs[0].device();
  PjrtDriver* d = current_driver();
  TPU_CHECK(d, "internal: pjrt: op '{}' on '{}' without a pjrt driver", a.op.name, dev.str());
  bool empty = true;  // every output has no elements: nothing to compute
  for (const Tensor& o : a.outputs) empty &= o.numel() == 0;
  if (empty) return;
  check_indices(a);
  std::shared_ptr<CacheEntry> e = d->executable_for(a);
  if (std::shared_ptr<Executable> exe = e->get()) {
    if (run_executable(*d, *e, exe, a, dev)) return;
  }
  TPU_CHECK(host_fallback_on(), "pjrt: op '{}' ({}) does not run on '{}': {}. Host fallback is off "
            "(set_pjrt_host_fallback / TPU_PJRT_HOST_FALLBACK)", a.op.name, a.attrs.str(), dev.str(), e->reason());
  counters().host_fallbacks.fetch_add(1, std::memory_order_relaxed);
  ops::run_on_host(a.op, a.inputs, a.attrs, a.outputs);
}

// A tpu::compile'd graph as one executable (jit/internal.h GraphProgram).
class GraphExecutable final : public jit::detail::GraphProgram {
 public:
  GraphExecutable(std::shared_ptr<Executable> exe, int device, std::vector<graph::ValueMeta> outs)
      : exe_(std::move(exe)), device_(device), outs_(std::move(outs)) {}
  void run(std::span<const Tensor> inputs, std::vector<Tensor>& outputs) const override {
    PjrtDriver* d = current_driver();
    TPU_CHECK(d, "pjrt: a compiled function's executable ran without a pjrt driver");
    std::vector<BufferPtr> ins;
    for (const Tensor& t : inputs) ins.push_back(d->input_buffer(t, device_));
    std::vector<BufferPtr> res = exe_->execute_buffers(ins, device_);
    counters().graph_runs.fetch_add(1, std::memory_order_relaxed);
    TPU_CHECK(res.size() == outs_.size(), "pjrt: a compiled function's executable returned {} output(s), expected {}",
              res.size(), outs_.size());
    outputs.clear();
    for (size_t i = 0; i < res.size(); ++i) {
      TPU_CHECK(res[i]->dtype() == outs_[i].dtype && res[i]->dims() == outs_[i].shape.vec(),
                "pjrt: a compiled function's output {} came back as {}[{}], expected {}", i, dtype_name(res[i]->dtype()),
                fmt::join(res[i]->dims(), ","), graph::meta_str(outs_[i]));
      Tensor o = empty_tensor(outs_[i].shape, outs_[i].dtype, Device(DeviceType::pjrt, device_));
      adopt(o, res[i]);
      outputs.push_back(o);
    }
  }

 private:
  std::shared_ptr<Executable> exe_;
  int device_;
  std::vector<graph::ValueMeta> outs_;
};

std::shared_ptr<jit::detail::GraphProgram> compile_graph(const graph::Graph& g) {
  PjrtDriver* d = current_driver();
  if (!d) return nullptr;
  int device = -1;
  for (graph::ValueId v : g.inputs) {
    const Device dv = g.meta(v).device;
    if (dv.type == DeviceType::pjrt && device < 0) device = dv.index;
    TPU_CHECK(dv.is_cpu() || dv == Device(DeviceType::pjrt, device), "inputs on {} and pjrt:{}", dv.str(), device);
  }
  if (device < 0) return nullptr;
  std::vector<graph::ValueMeta> outs;
  for (graph::ValueId v : g.outputs) {
    outs.push_back(g.meta(v));
    if (outs.back().device != Device(DeviceType::pjrt, device)) return nullptr;  // an output on another device
  }
  // Every graph input is an argument (captured tensors too: the entry passes them).
  const std::string text = graph::to_stablehlo(g, std::vector<Tensor>(g.inputs.size()));
  std::shared_ptr<Executable> exe = d->client().compile(text);
  counters().graph_compiles.fetch_add(1, std::memory_order_relaxed);
  TPU_CHECK(exe->num_outputs() == outs.size(), "pjrt: the graph's executable has {} outputs, the graph {}",
            exe->num_outputs(), outs.size());
  return std::make_shared<GraphExecutable>(std::move(exe), device, std::move(outs));
}

void register_kernels_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    jit::detail::set_graph_compiler(DeviceType::pjrt, &compile_graph);
    ops::register_generic_kernel(DeviceType::pjrt, &pjrt_kernel);  // ops defined later too (user kernels)
  });
}

// TPU_PJRT_PLUGIN: a driver that loads the plugin on its first use.
class LazyDriver final : public device::Driver {
 public:
  explicit LazyDriver(std::string path) : path_(std::move(path)) {}
  std::string_view name() const override { return "pjrt"; }
  DeviceType type() const override { return DeviceType::pjrt; }
  int device_count() const override { return real().device_count(); }
  device::DeviceProperties properties(int i) const override { return real().properties(i); }
  StoragePtr allocate(int i, size_t n) override { return real().allocate(i, n); }
  size_t memory_free(int i) const override { return real().memory_free(i); }
  void copy_to_host(const Storage&, size_t, void*, size_t) override { fail("internal: pjrt: lazy driver holds no memory"); }
  void copy_from_host(Storage&, size_t, const void*, size_t) override { fail("internal: pjrt: lazy driver holds no memory"); }
  void copy_on_device(const Storage&, size_t, Storage&, size_t, size_t) override { fail("internal: pjrt: lazy driver"); }
  void synchronize(int i) override { real().synchronize(i); }

 private:
  // Loads the plugin and installs its driver in place of this one (a failure is a tpu::Error
  // on every use, naming TPU_PJRT_PLUGIN).
  device::Driver& real() const {
    std::lock_guard<std::mutex> lk(mu_);
    if (!loaded_) {
      try {
        load_pjrt_plugin(path_);
      } catch (const Error& e) {
        fail("TPU_PJRT_PLUGIN={}: {}", path_, e.what());
      }
      loaded_ = true;
    }
    return device::driver_for(DeviceType::pjrt);
  }
  std::string path_;
  mutable std::mutex mu_;
  mutable bool loaded_ = false;
};

const bool g_env_plugin = [] {
  const char* p = std::getenv("TPU_PJRT_PLUGIN");
  if (p && *p) device::register_driver(std::make_unique<LazyDriver>(p));
  return true;
}();

}  // namespace
}  // namespace tpu::pjrt

namespace tpu {

std::string load_pjrt_plugin(const std::string& path) {
  TPU_CHECK(!path.empty(), "load_pjrt_plugin: empty path (give a PJRT plugin: libtpu.so on a TPU VM, or "
            "libpjrt_tpucore_sim.so)");
  std::shared_ptr<pjrt::Client> c = pjrt::Client::load(path);  // throws; the old driver stays
  TPU_CHECK(c->device_count() > 0, "load_pjrt_plugin: '{}' ({}) has no addressable devices", path, c->platform_name());
  pjrt::register_kernels_once();
  std::string name = c->platform_name();
  device::register_driver(std::make_unique<pjrt::PjrtDriver>(std::move(c)));
  return name;
}

PjrtStats pjrt_stats() {
  pjrt::Counters& c = pjrt::counters();
  PjrtStats s;
  s.compiles = c.compiles.load();
  s.cache_hits = c.cache_hits.load();
  s.executions = c.executions.load();
  s.uploads = c.uploads.load();
  s.downloads = c.downloads.load();
  s.host_fallbacks = c.host_fallbacks.load();
  s.unmapped = c.unmapped.load();
  s.graph_compiles = c.graph_compiles.load();
  s.graph_runs = c.graph_runs.load();
  return s;
}

void reset_pjrt_stats() {
  pjrt::Counters& c = pjrt::counters();
  for (auto* a : {&c.compiles, &c.cache_hits, &c.executions, &c.uploads, &c.downloads, &c.host_fallbacks, &c.unmapped,
                  &c.graph_compiles, &c.graph_runs})
    a->store(0);
}

void set_pjrt_host_fallback(bool on) { pjrt::g_host_fallback.store(on ? 1 : 0); }
bool pjrt_host_fallback() { return pjrt::host_fallback_on(); }

}  // namespace tpu
