// libpjrt_tpucore_sim.so: a PJRT plugin (device/pjrt/pjrt_c_api.h, PJRT C API 0.33) whose
// devices are tpucore's simulated chips sim:0 .. sim:N-1. Compile takes format "mlir": the
// StableHLO text tpu::export_stablehlo writes (shlo_program.h); Execute runs it with tpucore's
// ops on the device (generated chip programs where an op lowers, the host fallback otherwise).
// Everything is synchronous: the events it returns are already complete. No exception crosses
// the C boundary; errors are PJRT_Errors with a code and the message.
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "device/pjrt/pjrt_c_api.h"
#include "device/pjrt/pjrt_dtype.h"
#include "device/plugins/pjrt_sim/shlo_program.h"
#include "tpucore/devices.h"
#include "tpucore/core/error.h"
#include "tpucore/ops.h"
#include "tpucore/streams.h"

struct PJRT_Error {
  PJRT_Error_Code code;
  std::string message;
};
struct PJRT_Event {};
struct PJRT_Device {
  int index = 0;
};
struct PJRT_Client {
  std::string platform = "tpucore_sim";
  std::vector<PJRT_Device*> devices;
  ~PJRT_Client() {
    for (PJRT_Device* d : devices) delete d;
  }
};
struct PJRT_Executable {
  std::shared_ptr<const tpu::pjrt_sim::Program> program;
};
struct PJRT_LoadedExecutable {
  std::shared_ptr<const tpu::pjrt_sim::Program> program;
  PJRT_Client* client = nullptr;
};
struct PJRT_Buffer {
  tpu::Tensor t;  // on the device
  std::vector<int64_t> dims;
};

namespace {

using tpu::DType;

PJRT_Error* error(PJRT_Error_Code c, std::string m) { return new PJRT_Error{c, std::move(m)}; }

template <class F>
PJRT_Error* guarded(F&& f) {
  try {
    f();
    return nullptr;
  } catch (const std::exception& e) {
    return error(PJRT_Error_Code_INVALID_ARGUMENT, e.what());
  } catch (...) {
    return error(PJRT_Error_Code_INTERNAL, "pjrt_tpucore_sim: unknown error");
  }
}

template <class A>
void check(const A* a, const char* fn) {
  if (!a) throw tpu::Error(std::string("pjrt_tpucore_sim: ") + fn + ": null arguments");
  if (a->struct_size < sizeof(size_t) + sizeof(void*))
    throw tpu::Error(std::string("pjrt_tpucore_sim: ") + fn + ": struct_size " + std::to_string(a->struct_size) + " is too small");
}

DType to_dtype(PJRT_Buffer_Type t) {
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
    default: throw tpu::Error("pjrt_tpucore_sim: element type " + std::to_string(int(t)) + " is not supported");
  }
}
tpu::Device sim(int i) { return tpu::Device(tpu::DeviceType::sim, i); }

void error_destroy(PJRT_Error_Destroy_Args* a) {
  if (a) delete a->error;
}
void error_message(PJRT_Error_Message_Args* a) {
  a->message = a->error->message.c_str();
  a->message_size = a->error->message.size();
}
PJRT_Error* error_code(PJRT_Error_GetCode_Args* a) {
  a->code = a->error->code;
  return nullptr;
}
PJRT_Error* plugin_initialize(PJRT_Plugin_Initialize_Args*) { return nullptr; }
PJRT_Error* event_destroy(PJRT_Event_Destroy_Args* a) {
  return guarded([&] {
    check(a, "PJRT_Event_Destroy");
    delete a->event;
  });
}
PJRT_Error* event_await(PJRT_Event_Await_Args* a) {
  return guarded([&] { check(a, "PJRT_Event_Await"); });
}

PJRT_Error* client_create(PJRT_Client_Create_Args* a) {
  return guarded([&] {
    check(a, "PJRT_Client_Create");
    auto c = std::make_unique<PJRT_Client>();
    const int n = tpu::device_count(tpu::DeviceType::sim);
    for (int i = 0; i < n; ++i) c->devices.push_back(new PJRT_Device{i});
    a->client = c.release();
  });
}
PJRT_Error* client_destroy(PJRT_Client_Destroy_Args* a) {
  return guarded([&] {
    check(a, "PJRT_Client_Destroy");
    delete a->client;
  });
}
PJRT_Error* client_platform_name(PJRT_Client_PlatformName_Args* a) {
  return guarded([&] {
    check(a, "PJRT_Client_PlatformName");
    a->platform_name = a->client->platform.c_str();
    a->platform_name_size = a->client->platform.size();
  });
}
PJRT_Error* client_devices(PJRT_Client_AddressableDevices_Args* a) {
  return guarded([&] {
    check(a, "PJRT_Client_AddressableDevices");
    a->addressable_devices = a->client->devices.data();
    a->num_addressable_devices = a->client->devices.size();
  });
}
PJRT_Error* client_compile(PJRT_Client_Compile_Args* a) {
  return guarded([&] {
    check(a, "PJRT_Client_Compile");
    if (!a->program || !a->program->code) throw tpu::Error("pjrt_tpucore_sim: PJRT_Client_Compile: no program");
    const std::string fmt(a->program->format ? a->program->format : "", a->program->format_size);
    if (fmt != "mlir")
      throw tpu::Error("pjrt_tpucore_sim: program format '" + fmt + "' is not supported (only 'mlir': StableHLO text)");
    auto p = std::make_shared<const tpu::pjrt_sim::Program>(
        tpu::pjrt_sim::parse_program(std::string(a->program->code, a->program->code_size)));
    a->executable = new PJRT_LoadedExecutable{std::move(p), a->client};
  });
}
PJRT_Error* buffer_from_host(PJRT_Client_BufferFromHostBuffer_Args* a) {
  return guarded([&] {
    check(a, "PJRT_Client_BufferFromHostBuffer");
    if (a->byte_strides && a->num_byte_strides) throw tpu::Error("pjrt_tpucore_sim: strided host buffers are not supported");
    if (!a->device) throw tpu::Error("pjrt_tpucore_sim: PJRT_Client_BufferFromHostBuffer: no device");
    const DType dt = to_dtype(a->type);
    std::vector<int64_t> dims(a->dims, a->dims + a->num_dims);
    tpu::Tensor host = tpu::empty(tpu::Shape(dims), tpu::TensorOptions(dt));
    std::memcpy(host.raw_data(), a->data, size_t(host.numel()) * tpu::dtype_size(dt));
    a->buffer = new PJRT_Buffer{host.to(sim(a->device->index)), dims};
    a->done_with_host_buffer = new PJRT_Event{};
  });
}
PJRT_Error* executable_destroy(PJRT_Executable_Destroy_Args* a) {
  return guarded([&] {
    check(a, "PJRT_Executable_Destroy");
    delete a->executable;
  });
}
PJRT_Error* executable_num_outputs(PJRT_Executable_NumOutputs_Args* a) {
  return guarded([&] {
    check(a, "PJRT_Executable_NumOutputs");
    a->num_outputs = a->executable->program->results.size();
  });
}
PJRT_Error* loaded_destroy(PJRT_LoadedExecutable_Destroy_Args* a) {
  return guarded([&] {
    check(a, "PJRT_LoadedExecutable_Destroy");
    delete a->executable;
  });
}
PJRT_Error* loaded_get_executable(PJRT_LoadedExecutable_GetExecutable_Args* a) {
  return guarded([&] {
    check(a, "PJRT_LoadedExecutable_GetExecutable");
    a->executable = new PJRT_Executable{a->loaded_executable->program};
  });
}
PJRT_Error* loaded_execute(PJRT_LoadedExecutable_Execute_Args* a) {
  return guarded([&] {
    check(a, "PJRT_LoadedExecutable_Execute");
    const auto& prog = *a->executable->program;
    for (size_t d = 0; d < a->num_devices; ++d) {
      std::vector<tpu::Tensor> in;
      for (size_t i = 0; i < a->num_args; ++i) in.push_back(a->argument_lists[d][i]->t);
      const int dev = a->execute_device ? a->execute_device->index : int(d);
      std::vector<tpu::Tensor> out = tpu::pjrt_sim::run_program(prog, in, sim(dev));
      for (size_t o = 0; o < out.size(); ++o) {
        const tpu::Tensor t = out[o].contiguous();
        a->output_lists[d][o] = new PJRT_Buffer{t, t.shape().vec()};
      }
      if (a->device_complete_events) a->device_complete_events[d] = new PJRT_Event{};
    }
  });
}
PJRT_Error* buffer_destroy(PJRT_Buffer_Destroy_Args* a) {
  return guarded([&] {
    check(a, "PJRT_Buffer_Destroy");
    delete a->buffer;
  });
}
PJRT_Error* buffer_element_type(PJRT_Buffer_ElementType_Args* a) {
  return guarded([&] {
    check(a, "PJRT_Buffer_ElementType");
    a->type = tpu::pjrt::buffer_type_of(a->buffer->t.dtype());
  });
}
PJRT_Error* buffer_dimensions(PJRT_Buffer_Dimensions_Args* a) {
  return guarded([&] {
    check(a, "PJRT_Buffer_Dimensions");
    a->dims = a->buffer->dims.data();
    a->num_dims = a->buffer->dims.size();
  });
}
PJRT_Error* buffer_to_host(PJRT_Buffer_ToHostBuffer_Args* a) {
  return guarded([&] {
    check(a, "PJRT_Buffer_ToHostBuffer");
    if (a->host_layout) throw tpu::Error("pjrt_tpucore_sim: host layouts are not supported");
    const tpu::Tensor& t = a->src->t;
    const size_t need = size_t(t.numel()) * t.element_size();
    if (!a->dst) {
      a->dst_size = need;
      return;
    }
    if (a->dst_size < need)
      throw tpu::Error("pjrt_tpucore_sim: PJRT_Buffer_ToHostBuffer: dst_size " + std::to_string(a->dst_size) +
                       " is smaller than the buffer's " + std::to_string(need) + " bytes");
    const tpu::Tensor h = t.to("cpu").contiguous();
    std::memcpy(a->dst, h.raw_data(), need);
    a->event = new PJRT_Event{};
  });
}

PJRT_Api make_api() {
  PJRT_Api api{};
  api.struct_size = sizeof(PJRT_Api);
  api.pjrt_api_version = {sizeof(PJRT_Api_Version), nullptr, TPU_PJRT_API_MAJOR, TPU_PJRT_API_MINOR};
  api.PJRT_Error_Destroy = &error_destroy;
  api.PJRT_Error_Message = &error_message;
  api.PJRT_Error_GetCode = &error_code;
  api.PJRT_Plugin_Initialize = &plugin_initialize;
  api.PJRT_Event_Destroy = &event_destroy;
  api.PJRT_Event_Await = &event_await;
  api.PJRT_Client_Create = &client_create;
  api.PJRT_Client_Destroy = &client_destroy;
  api.PJRT_Client_PlatformName = &client_platform_name;
  api.PJRT_Client_AddressableDevices = &client_devices;
  api.PJRT_Client_Compile = &client_compile;
  api.PJRT_Client_BufferFromHostBuffer = &buffer_from_host;
  api.PJRT_Executable_Destroy = &executable_destroy;
  api.PJRT_Executable_NumOutputs = &executable_num_outputs;
  api.PJRT_LoadedExecutable_Destroy = &loaded_destroy;
  api.PJRT_LoadedExecutable_GetExecutable = &loaded_get_executable;
  api.PJRT_LoadedExecutable_Execute = &loaded_execute;
  api.PJRT_Buffer_Destroy = &buffer_destroy;
  api.PJRT_Buffer_ElementType = &buffer_element_type;
  api.PJRT_Buffer_Dimensions = &buffer_dimensions;
  api.PJRT_Buffer_ToHostBuffer = &buffer_to_host;
  return api;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) const PJRT_Api* GetPjrtApi(void) {
  static const PJRT_Api api = make_api();
  return &api;
}
