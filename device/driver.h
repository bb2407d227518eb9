// The Driver interface: one per backend (cpu, sim, out-of-tree chips). Enumerates devices,
// allocates device memory, copies, and synchronizes. Program loading and streams are added
// by the backends that run programs (see device/README or DESIGN.md).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "tpucore/device.h"
#include "tpucore/storage.h"

namespace tpu::device {

struct DeviceProperties {
  std::string name;           // "cpu", "sim:0 (v5e)", ...
  size_t memory_bytes = 0;    // total device memory
  int compute_units = 0;      // host threads, or MXUs
  std::string description;
};

class Driver {
 public:
  virtual ~Driver() = default;
  virtual std::string_view name() const = 0;
  virtual DeviceType type() const = 0;
  virtual int device_count() const = 0;
  virtual DeviceProperties properties(int index) const = 0;

  // Device memory. A failed allocation (out of memory) is a tpu::Error naming the bytes.
  virtual StoragePtr allocate(int index, size_t nbytes) = 0;
  virtual size_t memory_free(int index) const = 0;

  // Copies in bytes; offsets are byte offsets into the storage.
  virtual void copy_to_host(const Storage& src, size_t src_offset, void* dst, size_t n) = 0;
  virtual void copy_from_host(Storage& dst, size_t dst_offset, const void* src, size_t n) = 0;
  virtual void copy_on_device(const Storage& src, size_t src_offset, Storage& dst, size_t dst_offset, size_t n) = 0;

  // Waits until all queued work on the device has finished.
  virtual void synchronize(int index) = 0;
};

// The driver for a device type; a tpu::Error saying how to provide one when none is present.
Driver& driver_for(DeviceType t);
// Checks the device exists (index in range) and returns its driver.
Driver& driver_for(const Device& d);
bool has_driver(DeviceType t);
// Installs a driver (replacing any previous one of that type).
void register_driver(std::unique_ptr<Driver> d);

}  // namespace tpu::device
