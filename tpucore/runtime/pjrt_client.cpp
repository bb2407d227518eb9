#include "tpucore/runtime/pjrt_client.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>

#include "device/pjrt/pjrt_c_api.h"
#include "device/pjrt/pjrt_dtype.h"
#include "tpucore/core/error.h"
#include "tpucore/ops.h"

namespace tpu::pjrt {
namespace {

template <class A>
A args() {
  A a;
  std::memset(static_cast<void*>(&a), 0, sizeof a);
  a.struct_size = sizeof a;
  return a;
}

DType tensor_type(PJRT_Buffer_Type t) {
  switch (t) {
    case PJRT_Buffer_Type_PRED: return DType::boolean;
    case PJRT_Buffer_Type_S8: return DType::i8;
    case PJRT_Buffer_Type_S32: return DType::i32;
    case PJRT_Buffer_Type_S64: return DType::i64;
    case PJRT_Buffer_Type_U8: return DType::u8;
    case PJRT_Buffer_Type_F16: return DType::f16;
    case PJRT_Buffer_Type_F32: return DType::f32;
    case PJRT_Buffer_Type_BF16: return DType::bf16;
    case PJRT_Buffer_Type_F8E4M3FN: return DType::f8e4m3;
    case PJRT_Buffer_Type_F8E5M2: return DType::f8e5m2;
    default: fail("pjrt: the plugin returned a buffer of element type {}, which tpucore has no dtype for", int(t));
  }
}

std::string library_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&library_dir), &info) == 0 || !info.dli_fname) return {};
  std::string p = info.dli_fname;
  const auto slash = p.rfind('/');
  return slash == std::string::npos ? std::string() : p.substr(0, slash);
}

}  // namespace

void Client::check(void* err, const char* what) const {
  auto* e = static_cast<PJRT_Error*>(err);
  if (!e) return;
  auto m = args<PJRT_Error_Message_Args>();
  m.error = e;
  api_->PJRT_Error_Message(&m);
  std::string msg(m.message ? m.message : "", m.message_size);
  auto d = args<PJRT_Error_Destroy_Args>();
  d.error = e;
  api_->PJRT_Error_Destroy(&d);
  fail("pjrt ({}, {}): {} failed: {}", platform_.empty() ? path_ : platform_, path_, what, msg);
}

int Client::api_major() const { return api_->pjrt_api_version.major_version; }
int Client::api_minor() const { return api_->pjrt_api_version.minor_version; }

std::shared_ptr<Client> Client::load(const std::string& path_in) {
  std::string path = path_in;
  if (path.empty()) {
    const char* env = std::getenv("TPU_PJRT_PLUGIN");
    TPU_CHECK(env && *env, "pjrt: no plugin given: pass a path to tpu::pjrt::Client::load or set TPU_PJRT_PLUGIN "
              "(e.g. libtpu.so on a TPU VM, or libpjrt_tpucore_sim.so)");
    path = env;
  }
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  std::string err;
  if (!h) {
    const char* e = dlerror();  // (each call clears the message)
    err = e ? e : "unknown dlopen error";
  }
  if (!h && path.find('/') == std::string::npos && !library_dir().empty()) {
    const std::string p2 = library_dir() + "/" + path;
    h = dlopen(p2.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h) path = p2;
  }
  TPU_CHECK(h, "pjrt: cannot load the PJRT plugin '{}': {}", path, err);
  auto get = reinterpret_cast<PJRT_GetApiFn>(dlsym(h, TPU_PJRT_ENTRY_POINT));
  TPU_CHECK(get, "pjrt: '{}' is not a PJRT plugin: it does not export {}", path, TPU_PJRT_ENTRY_POINT);
  const PJRT_Api* api = get();
  TPU_CHECK(api, "pjrt: '{}': {}() returned no API table", path, TPU_PJRT_ENTRY_POINT);
  const int major = api->pjrt_api_version.major_version, minor = api->pjrt_api_version.minor_version;
  TPU_CHECK(major == TPU_PJRT_API_MAJOR && minor >= TPU_PJRT_API_MINOR,
            "pjrt: '{}' implements PJRT C API {}.{}, but tpucore's client needs {}.{} or a later minor version",
            path, major, minor, TPU_PJRT_API_MAJOR, TPU_PJRT_API_MINOR);
  TPU_CHECK(api->struct_size >= offsetof(PJRT_Api, PJRT_Buffer_ToHostBuffer) + sizeof(void*),
            "pjrt: '{}': its API table has {} bytes, too few for version {}.{}", path, api->struct_size, major, minor);
  std::shared_ptr<Client> c(new Client());
  c->api_ = api;
  c->path_ = path;
  auto init = args<PJRT_Plugin_Initialize_Args>();
  c->check(api->PJRT_Plugin_Initialize(&init), "PJRT_Plugin_Initialize");
  auto cr = args<PJRT_Client_Create_Args>();
  c->check(api->PJRT_Client_Create(&cr), "PJRT_Client_Create");
  c->client_ = cr.client;
  auto pn = args<PJRT_Client_PlatformName_Args>();
  pn.client = c->client_;
  c->check(api->PJRT_Client_PlatformName(&pn), "PJRT_Client_PlatformName");
  c->platform_.assign(pn.platform_name, pn.platform_name_size);
  auto dv = args<PJRT_Client_AddressableDevices_Args>();
  dv.client = c->client_;
  c->check(api->PJRT_Client_AddressableDevices(&dv), "PJRT_Client_AddressableDevices");
  for (size_t i = 0; i < dv.num_addressable_devices; ++i) c->devices_.push_back(dv.addressable_devices[i]);
  return c;
}

Client::~Client() {
  if (client_) {
    auto a = args<PJRT_Client_Destroy_Args>();
    a.client = client_;
    if (PJRT_Error* e = api_->PJRT_Client_Destroy(&a)) {
      auto d = args<PJRT_Error_Destroy_Args>();
      d.error = e;
      api_->PJRT_Error_Destroy(&d);
    }
  }
}

std::shared_ptr<Executable> Client::compile(const std::string& mlir_text) {
  auto prog = args<PJRT_Program>();
  std::string code = mlir_text;
  prog.code = code.data();
  prog.code_size = code.size();
  prog.format = "mlir";
  prog.format_size = 4;
  auto a = args<PJRT_Client_Compile_Args>();
  a.client = client_;
  a.program = &prog;
  check(api_->PJRT_Client_Compile(&a), "PJRT_Client_Compile");
  std::shared_ptr<Executable> e(new Executable());
  e->exe_ = a.executable;
  e->client_ = shared_from_this();  // the client outlives its executables
  auto g = args<PJRT_LoadedExecutable_GetExecutable_Args>();
  g.loaded_executable = e->exe_;
  check(api_->PJRT_LoadedExecutable_GetExecutable(&g), "PJRT_LoadedExecutable_GetExecutable");
  auto n = args<PJRT_Executable_NumOutputs_Args>();
  n.executable = g.executable;
  PJRT_Error* ne = api_->PJRT_Executable_NumOutputs(&n);
  auto d = args<PJRT_Executable_Destroy_Args>();
  d.executable = g.executable;
  check(api_->PJRT_Executable_Destroy(&d), "PJRT_Executable_Destroy");
  check(ne, "PJRT_Executable_NumOutputs");
  e->num_outputs_ = n.num_outputs;
  return e;
}

Executable::~Executable() {
  if (exe_ && client_) {
    auto a = args<PJRT_LoadedExecutable_Destroy_Args>();
    a.executable = exe_;
    try {
      client_->check(client_->api_->PJRT_LoadedExecutable_Destroy(&a), "PJRT_LoadedExecutable_Destroy");
    } catch (...) {
    }
  }
}

void Client::await_and_destroy(void* ev, const char* what) const {
  auto* e = static_cast<PJRT_Event*>(ev);
  if (!e) return;
  auto w = args<PJRT_Event_Await_Args>();
  w.event = e;
  PJRT_Error* we = api_->PJRT_Event_Await(&w);
  auto d = args<PJRT_Event_Destroy_Args>();
  d.event = e;
  PJRT_Error* de = api_->PJRT_Event_Destroy(&d);
  check(we, what);
  check(de, "PJRT_Event_Destroy");
}

BufferPtr Client::upload(const void* data, DType dtype, const std::vector<int64_t>& dims, int device) {
  TPU_CHECK(device >= 0 && device < device_count(), "pjrt ({}): device {} does not exist ({} device(s))", platform_,
            device, device_count());
  auto a = args<PJRT_Client_BufferFromHostBuffer_Args>();
  a.client = client_;
  a.data = data;
  a.type = buffer_type_of(dtype);
  a.dims = dims.data();
  a.num_dims = dims.size();
  a.host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes;
  a.device = static_cast<PJRT_Device*>(devices_[size_t(device)]);
  check(api_->PJRT_Client_BufferFromHostBuffer(&a), "PJRT_Client_BufferFromHostBuffer");
  BufferPtr b(new Buffer());
  b->client_ = shared_from_this();
  b->buf_ = a.buffer;
  b->dtype_ = dtype;
  b->dims_ = dims;
  b->device_ = device;
  await_and_destroy(a.done_with_host_buffer, "PJRT_Event_Await (host buffer)");
  return b;
}

Buffer::~Buffer() {
  if (!buf_ || !client_) return;
  auto a = args<PJRT_Buffer_Destroy_Args>();
  a.buffer = buf_;
  try {
    client_->check(client_->api_->PJRT_Buffer_Destroy(&a), "PJRT_Buffer_Destroy");
  } catch (...) {
  }
}

size_t Buffer::nbytes() const {
  size_t n = dtype_size(dtype_);
  for (int64_t d : dims_) n *= size_t(d);
  return n;
}

void Buffer::to_host(void* dst, size_t n) const {
  TPU_CHECK(n == nbytes(), "internal: pjrt: to_host of {} bytes from a buffer of {}", n, nbytes());
  if (n == 0) return;
  auto th = args<PJRT_Buffer_ToHostBuffer_Args>();
  th.src = buf_;
  th.dst = dst;
  th.dst_size = n;
  client_->check(client_->api_->PJRT_Buffer_ToHostBuffer(&th), "PJRT_Buffer_ToHostBuffer");
  client_->await_and_destroy(th.event, "PJRT_Event_Await (to host)");
}

std::vector<BufferPtr> Executable::execute_buffers(const std::vector<BufferPtr>& inputs, int device) {
  Client& c = *client_;
  const PJRT_Api* api = c.api_;
  TPU_CHECK(device >= 0 && device < c.device_count(), "pjrt ({}): device {} does not exist ({} device(s))",
            c.platform_, device, c.device_count());
  std::vector<PJRT_Buffer*> in;
  for (size_t i = 0; i < inputs.size(); ++i) {
    TPU_CHECK(inputs[i] && inputs[i]->client_.get() == &c, "pjrt: execute: input {} is not a buffer of this client", i);
    in.push_back(inputs[i]->buf_);
  }
  std::vector<PJRT_Buffer*> out_list(num_outputs_, nullptr);
  PJRT_Buffer* const* arg_list = in.data();
  PJRT_Buffer** out_ptr = out_list.data();
  PJRT_Event* done = nullptr;
  auto opts = args<PJRT_ExecuteOptions>();
  auto a = args<PJRT_LoadedExecutable_Execute_Args>();
  a.executable = exe_;
  a.options = &opts;
  a.argument_lists = &arg_list;
  a.num_devices = 1;
  a.num_args = in.size();
  a.output_lists = &out_ptr;
  a.device_complete_events = &done;
  a.execute_device = static_cast<PJRT_Device*>(c.devices_[size_t(device)]);
  c.check(api->PJRT_LoadedExecutable_Execute(&a), "PJRT_LoadedExecutable_Execute");
  // Own the outputs first, so an error below frees them.
  std::vector<BufferPtr> outs;
  for (PJRT_Buffer* b : out_list) {
    BufferPtr p(new Buffer());
    p->client_ = client_;
    p->buf_ = b;
    p->device_ = device;
    outs.push_back(p);
  }
  c.await_and_destroy(done, "PJRT_Event_Await (execution)");
  for (BufferPtr& p : outs) {
    TPU_CHECK(p->buf_, "pjrt ({}): the plugin returned no buffer for an output", c.platform_);
    auto et = args<PJRT_Buffer_ElementType_Args>();
    et.buffer = p->buf_;
    c.check(api->PJRT_Buffer_ElementType(&et), "PJRT_Buffer_ElementType");
    p->dtype_ = tensor_type(et.type);
    auto dm = args<PJRT_Buffer_Dimensions_Args>();
    dm.buffer = p->buf_;
    c.check(api->PJRT_Buffer_Dimensions(&dm), "PJRT_Buffer_Dimensions");
    p->dims_.assign(dm.dims, dm.dims + dm.num_dims);
  }
  return outs;
}

std::vector<Tensor> Executable::execute(const std::vector<Tensor>& inputs, int device) {
  std::vector<BufferPtr> ins;
  for (size_t i = 0; i < inputs.size(); ++i) {
    TPU_CHECK(inputs[i].defined(), "pjrt: execute: input {} is an undefined tensor", i);
    const Tensor h = inputs[i].to("cpu").contiguous();
    ins.push_back(client_->upload(h.raw_data(), h.dtype(), h.shape().vec(), device));
  }
  std::vector<Tensor> results;
  for (const BufferPtr& b : execute_buffers(ins, device)) {
    Tensor r = empty(Shape(b->dims()), TensorOptions(b->dtype()));
    b->to_host(r.raw_data(), size_t(r.numel()) * r.element_size());
    results.push_back(r);
  }
  return results;
}

}  // namespace tpu::pjrt
