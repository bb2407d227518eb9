/// @file
/// Streams at the device layer: stream ids, the calling thread's current stream per device,
/// and the synchronous debug mode (TPU_SYNC=1). The public API is tpucore/streams.h.
#pragma once

#include <cstdint>

#include "tpucore/core/device.h"

namespace tpu::device {

/// A stream of one device, named by an id its driver hands out. 0 is the default stream.
using StreamId = uint64_t;
/// The default stream of every device.
inline constexpr StreamId kDefaultStream = 0;

/// The calling thread's current stream for a device (kDefaultStream until set). Driver
/// operations issued without an explicit stream (the copies of the ops front half) go to it.
StreamId current_stream(const Device& d);
/// Sets the calling thread's current stream for `d`.
void set_current_stream(const Device& d, StreamId s);

/// Synchronous mode: every queued operation waits for its completion and reports its error at
/// the call that issued it; programs run with the race checker failing at the first race.
/// Starts from the environment (TPU_SYNC=1); can be switched at run time.
bool sync_mode();
/// Switches synchronous mode on or off.
void set_sync_mode(bool on);

}  // namespace tpu::device
