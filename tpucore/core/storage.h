/// @file
/// Storage: a refcounted block of memory on one device. Tensors are views over it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "tpucore/core/device.h"

namespace tpu {

/// A block of device memory that tensors view. Not copyable; shared through StoragePtr and
/// freed by its deleter when the last tensor viewing it goes away.
struct Storage {
  /// Frees `data` (of `nbytes`) with the driver context `ctx`.
  using Deleter = void (*)(void* ctx, void* data, size_t nbytes);

  void* data = nullptr;  ///< host pointer on cpu; a driver-defined handle elsewhere
  /// Size in bytes.
  size_t nbytes = 0;
  /// The device holding the memory.
  Device device;
  /// Called on destruction when set.
  Deleter deleter = nullptr;
  void* ctx = nullptr;  ///< driver context for the deleter
  /// Bumped by every in-place write to any view of this storage; autograd compares it with the
  /// value it saw when it saved a tensor for backward.
  uint64_t version = 0;

  Storage() = default;
  /// Takes ownership of `d` (`n` bytes on `dev`), freed by `del(c, d, n)`.
  Storage(void* d, size_t n, Device dev, Deleter del, void* c) : data(d), nbytes(n), device(dev), deleter(del), ctx(c) {}
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage() {
    if (deleter) deleter(ctx, data, nbytes);
  }
};

/// Shared ownership of a Storage.
using StoragePtr = std::shared_ptr<Storage>;

/// A new storage of `nbytes` on `device`, from that device's driver. Declared here, with the
/// storage type, and defined by the driver registry (device/), so core code allocates without
/// including the layer above it.
StoragePtr allocate_storage(Device device, size_t nbytes);

}  // namespace tpu
