/// @file
/// Streams and events, as users know them from CUDA. Work on a device (copies, chip programs)
/// is queued on a stream and runs asynchronously, in order per stream; reading a value
/// (item(), to("cpu"), to_vector()) waits for the work it depends on. Events mark a point of a
/// stream: another stream (of any device) or the host can wait for it, and two events give the
/// elapsed time between them (simulated time on `sim` devices).
///
///   tpu::Stream s = tpu::Stream::create("sim:0");
///   {
///     tpu::StreamGuard g(s);               // work issued on sim:0 by this thread goes to s
///     y = x.to("sim:0");
///   }
///   tpu::Event e;
///   e.record(s);
///   e.wait(tpu::current_stream("sim:0"));  // the default stream waits for s's copy
///   tpu::synchronize("sim:0");
///
/// The cpu device runs everything synchronously: its streams and events are trivially
/// complete. TPU_SYNC=1 (or set_synchronous_mode(true)) makes every queued operation wait for
/// its completion and report its error at the call that issued it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "tpucore/core/device.h"

namespace tpu {

/// A queue of work on one device (a handle: copies name the same stream).
class Stream {
 public:
  Stream() = default;  ///< the cpu's default stream
  /// A new stream on `device` (a tpu::Error for a missing driver or a bad index).
  static Stream create(Device device);
  /// Every device has a default stream (id 0), where work goes unless another is current.
  static Stream default_stream(Device device);

  /// The stream's device.
  Device device() const { return device_; }
  /// The stream's number on its device (0: the default stream).
  uint64_t id() const { return id_; }
  /// True for the device's default stream.
  bool is_default() const { return id_ == 0; }
  /// Host waits for all work queued on this stream; reports errors of its earlier async work.
  void synchronize() const;
  /// True when all work queued on this stream has finished.
  bool query() const;
  std::string str() const;  ///< "sim:0/stream 3"

  /// Same device and id.
  friend bool operator==(const Stream& a, const Stream& b) { return a.device_ == b.device_ && a.id_ == b.id_; }
  /// Not operator==.
  friend bool operator!=(const Stream& a, const Stream& b) { return !(a == b); }

 private:
  friend Stream current_stream(Device device);
  Stream(Device d, uint64_t id) : device_(d), id_(id) {}
  Device device_;
  uint64_t id_ = 0;
};

/// The calling thread's current stream of `device` (its default stream until set).
Stream current_stream(Device device);
/// Makes `s` the calling thread's current stream of its device.
void set_current_stream(const Stream& s);

/// Makes `s` the current stream of its device for this thread, restoring the previous one.
class StreamGuard {
 public:
  /// Makes `s` current until the guard goes out of scope.
  explicit StreamGuard(const Stream& s);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream prev_;
};

/// A point in a stream's queued work, to wait for or time (a handle: copies share it).
class Event {
 public:
  Event();  ///< not recorded yet: waiting on it does nothing, query() is true
  /// Marks the current end of `s`'s queued work. Re-recording moves the mark.
  void record(const Stream& s);
  /// Records on the current stream of `device`.
  void record(Device device) { record(current_stream(device)); }
  /// Work queued on `s` after this call starts only once the event has been reached. Works
  /// across devices (a different driver: the host waits for the event first).
  void wait(const Stream& s) const;
  /// Host waits until the event has been reached.
  void synchronize() const;
  /// True when the event has been reached (or was never recorded).
  bool query() const;
  /// True once record() has been called.
  bool recorded() const;
  Device device() const;  ///< of the stream it was last recorded on (cpu if never)
  /// Time from this event to `end`, in milliseconds (simulated on sim; waits for both events);
  /// a tpu::Error when either was never recorded or they are on different kinds of device.
  double elapsed_ms(const Event& end) const;
  /// Time at which the event was reached, in seconds of its device's clock (waits for it).
  double time_seconds() const;

  struct State;

 private:
  std::shared_ptr<State> s_;
};

/// Host waits for all work queued on every stream of `device`.
void synchronize(Device device);

/// Synchronous debug mode (also TPU_SYNC=1 in the environment).
void set_synchronous_mode(bool on);
/// Whether synchronous debug mode is on.
bool synchronous_mode();

}  // namespace tpu
