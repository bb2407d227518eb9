/// @file
/// The Driver interface: one per backend (cpu, sim, out-of-tree chips). Enumerates devices,
/// allocates device memory, copies, streams and events, loads and runs programs, synchronizes.
/// Copies without an explicit stream go to the calling thread's current stream of the device
/// (device/stream.h); a driver that runs everything synchronously (cpu) keeps the default
/// stream/event methods, which are trivially correct for it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "device/stream.h"
#include "tpucore/core/device.h"
#include "tpucore/core/storage.h"

namespace tpu::device {

/// What a device is: its name, memory, compute units and peak rate.
struct DeviceProperties {
  std::string name;           ///< "cpu", "sim:0 (v5e)", ...
  size_t memory_bytes = 0;    ///< total device memory
  int compute_units = 0;      ///< host threads, or MXUs
  /// One line for humans (chip preset, cores, ...).
  std::string description;
  double clock_ghz = 0;       ///< 0 when not meaningful
  double peak_flops = 0;      ///< bf16 peak of one device, 0 when unknown
};

using EventHandle = uint64_t;    ///< driver-defined, never 0
using ProgramHandle = uint64_t;  ///< driver-defined, never 0

/// How a program run is done (Driver::enqueue_program).
struct ProgramOptions {
  bool timing_only = false;  ///< skip the arithmetic; same cycle counts
  /// Record a per-unit timeline of the run.
  bool trace = false;
  /// The program's arguments: scalar register i starts as args[i] (buffer addresses, runtime
  /// scalars); the others at 0. tpucore's generated programs read their operands from these.
  std::vector<int64_t> args{};
};

/// Filled by the driver when an enqueued program has finished (read it after synchronizing).
struct ProgramStats {
  /// True once the run finished.
  bool done = false;
  /// Run time in cycles and seconds.
  ///@{
  double cycles = 0, seconds = 0;  ///< simulated
  ///@}
  /// Instructions executed.
  uint64_t instructions = 0;
  /// MXU FLOPs, and their share of the chip's peak over the run.
  ///@{
  double mxu_flops = 0, mfu = 0;
  ///@}
  /// HBM bytes read and written.
  ///@{
  uint64_t hbm_bytes_read = 0, hbm_bytes_written = 0;
  ///@}
  double vector_elements = 0;  ///< produced by vector/EUP/XLU instructions
  /// Bytes moved by DMA.
  uint64_t dma_bytes = 0;
};

/// A backend: implement it (or the C plugin ABI of device/plugin_abi.h) to run tpucore on a new
/// kind of device, and install it with register_driver. Device indices are 0..device_count()-1.
class Driver {
 public:
  virtual ~Driver() = default;
  /// The driver's name ("cpu", "sim", a plugin's name).
  virtual std::string_view name() const = 0;
  /// The device type it serves.
  virtual DeviceType type() const = 0;
  /// Number of devices.
  virtual int device_count() const = 0;
  /// Properties of device `index`.
  virtual DeviceProperties properties(int index) const = 0;

  /// Device memory. A failed allocation (out of memory) is a tpu::Error naming the bytes.
  virtual StoragePtr allocate(int index, size_t nbytes) = 0;
  /// Free memory of device `index`, in bytes.
  virtual size_t memory_free(int index) const = 0;

  /// Copies in bytes; offsets are byte offsets into the storage.
  ///@{
  virtual void copy_to_host(const Storage& src, size_t src_offset, void* dst, size_t n) = 0;
  virtual void copy_from_host(Storage& dst, size_t dst_offset, const void* src, size_t n) = 0;
  virtual void copy_on_device(const Storage& src, size_t src_offset, Storage& dst, size_t dst_offset, size_t n) = 0;
  ///@}

  /// Waits until all queued work on the device has finished.
  virtual void synchronize(int index) = 0;

  /// Streams (kDefaultStream exists on every device). Defaults: distinct ids, all synchronous.
  /// create_stream makes a stream; synchronize_stream waits for its queued work; query_stream
  /// is true when that work is done.
  ///@{
  virtual StreamId create_stream(int index);
  virtual void synchronize_stream(int index, StreamId s) { synchronize(index); }
  virtual bool query_stream(int index, StreamId s) { return true; }
  ///@}

  /// Events. record: reached when the work queued on `s` so far is done. wait: stream `s` of
  /// device `index` waits for an event of this driver recorded on device `event_index`.
  /// event_time: seconds (simulated time on simulators, host steady clock otherwise) at which the
  /// event was reached; NaN when not recorded or not reached yet. Defaults: host-time events.
  /// create_event / destroy_event make and free one; synchronize_event waits for it on the host;
  /// query_event is true once it is reached.
  ///@{
  virtual EventHandle create_event(int index);
  virtual void destroy_event(int index, EventHandle e);
  virtual void record_event(int index, StreamId s, EventHandle e);
  virtual void wait_event(int index, StreamId s, int event_index, EventHandle e) {}
  virtual void synchronize_event(int index, EventHandle e) {}
  virtual bool query_event(int index, EventHandle e) { return true; }
  virtual double event_time(int index, EventHandle e);
  ///@}

  /// Programs for the chip, in the simulator's text (assembly) or JSON form. Default: a
  /// tpu::Error saying the device does not run programs. runs_programs tells whether the
  /// device runs them; load_program parses and loads one (a tpu::Error for a
  /// malformed one); unload_program frees it.
  ///@{
  virtual bool runs_programs() const { return false; }
  virtual ProgramHandle load_program(int index, std::string_view program);
  virtual void unload_program(int index, ProgramHandle p) {}
  ///@}
  /// Asynchronous on stream `s`; `stats` (optional) is filled when the program finished.
  virtual void enqueue_program(int index, StreamId s, ProgramHandle p, const ProgramOptions& opt,
                               std::shared_ptr<ProgramStats> stats = nullptr);

  /// The chip that programs for device `index` are generated for, as the simulator's chip-config
  /// JSON (sim/config.h); empty when the device does not run tpucore's generated programs (its
  /// ops then run on the host). tpucore's code generator targets a driver that returns one.
  virtual std::string program_target(int index) const { return {}; }
  /// Unique per Driver object created in the process (caches of loaded programs key on it).
  uint64_t instance_id() const { return instance_id_; }

 private:
  uint64_t instance_id_ = next_instance_id();
  static uint64_t next_instance_id();
};

/// The driver for a device type; a tpu::Error saying how to provide one when none is present.
Driver& driver_for(DeviceType t);
/// Checks the device exists (index in range) and returns its driver.
Driver& driver_for(const Device& d);
/// True when a driver for `t` is installed (always for cpu).
bool has_driver(DeviceType t);
/// Installs a driver (replacing any previous one of that type).
void register_driver(std::unique_ptr<Driver> d);

}  // namespace tpu::device
