// The cpu driver: device memory is host memory from the caching host allocator.
#include <cstring>
#include <thread>

#include "device/driver.h"
#include "tpucore/core/allocator.h"
#include "tpucore/core/error.h"
#include "tpucore/core/parallel.h"

namespace tpu::device {
namespace {

void cpu_deleter(void*, void* data, size_t nbytes) { host_free(data, nbytes); }

class CpuDriver final : public Driver {
 public:
  std::string_view name() const override { return "cpu"; }
  DeviceType type() const override { return DeviceType::cpu; }
  int device_count() const override { return 1; }
  DeviceProperties properties(int) const override {
    DeviceProperties p;
    p.name = "cpu";
    p.compute_units = num_threads();
    p.description = "host CPU";
    return p;
  }
  StoragePtr allocate(int, size_t nbytes) override {
    void* p = host_allocate(nbytes == 0 ? 1 : nbytes);
    return std::make_shared<Storage>(p, nbytes == 0 ? 1 : nbytes, Device(DeviceType::cpu, 0), &cpu_deleter, nullptr);
  }
  size_t memory_free(int) const override { return SIZE_MAX; }
  void copy_to_host(const Storage& src, size_t off, void* dst, size_t n) override {
    if (n) std::memcpy(dst, static_cast<const char*>(src.data) + off, n);
  }
  void copy_from_host(Storage& dst, size_t off, const void* src, size_t n) override {
    if (n) std::memcpy(static_cast<char*>(dst.data) + off, src, n);
  }
  void copy_on_device(const Storage& src, size_t soff, Storage& dst, size_t doff, size_t n) override {
    if (n) std::memmove(static_cast<char*>(dst.data) + doff, static_cast<const char*>(src.data) + soff, n);
  }
  void synchronize(int) override {}
};

}  // namespace

std::unique_ptr<Driver> make_cpu_driver() { return std::make_unique<CpuDriver>(); }

}  // namespace tpu::device
