// DeviceQueue: the asynchronous execution engine of one device. Every driver operation is a
// job on a stream; one worker thread per device runs the jobs in submission order (which is a
// valid order for any set of streams, since a wait always refers to an earlier record), and
// blocking calls (reads to the host) wait for their job. When nothing is queued, blocking jobs
// run inline on the calling thread, so small eager work does not pay a thread hand-off.
//
// Simulated time: each job reports its duration in simulated seconds and occupies one resource
// of the device (chip compute, host->device link, device->host link). A job starts at the later
// of its stream's time and its resource's free time, so work on different streams overlaps
// when it uses different resources, and a stream that waits on an event starts no earlier than
// the event's time. Events (Markers) carry the simulated time at which they were reached.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "device/stream.h"

namespace tpu::device {

// A point in a stream's work (an event record): done once everything submitted to that
// stream before it has run. `time` is the simulated time (seconds) of that point.
class Marker {
 public:
  void complete(double time);
  bool done() const;
  void wait() const;
  double time() const;  // valid once done

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool done_ = false;
  double time_ = 0;
};
using MarkerPtr = std::shared_ptr<Marker>;

// ici: the chip's inter-chip links (collectives of a sim pod, device/sim_pod.h).
enum class Resource : uint8_t { none, compute, host_to_device, device_to_host, ici };
inline constexpr int kNumResources = 5;

// The work of a job: runs on the worker (or inline) and returns its simulated duration in
// seconds. Exceptions become the job's error.
using JobFn = std::function<double()>;

class DeviceQueue {
 public:
  explicit DeviceQueue(std::string device_name);
  ~DeviceQueue();  // drains the queue and joins the worker
  DeviceQueue(const DeviceQueue&) = delete;
  DeviceQueue& operator=(const DeviceQueue&) = delete;

  const std::string& name() const { return name_; }
  StreamId create_stream();
  bool has_stream(StreamId s) const;
  // A tpu::Error naming the device when `s` is not one of its streams.
  void check_stream(StreamId s) const;

  // Queues `fn` (asynchronous; in sync mode it waits and throws the job's error here, unless
  // may_wait is false).
  void submit(StreamId s, Resource r, JobFn fn, bool may_wait = true);
  // Runs `fn` in order on stream s and waits for it; throws its error, or an earlier
  // asynchronous error of the stream.
  void submit_and_wait(StreamId s, Resource r, const JobFn& fn);
  // Runs `fn` on the calling thread if the device is idle (nothing queued or running);
  // returns false, without running it, otherwise.
  bool run_inline_if_idle(StreamId s, Resource r, const JobFn& fn);

  // Events: a marker reached when the stream's work so far is done; a stream waiting on one.
  MarkerPtr record(StreamId s);
  void wait_marker(StreamId s, MarkerPtr m);

  // Host waits. synchronize_* throw (and clear) errors of earlier asynchronous work.
  void synchronize_stream(StreamId s);
  void synchronize();
  void drain();  // waits for everything, reports nothing
  bool query_stream(StreamId s) const;
  bool idle() const;

  double stream_time(StreamId s) const;  // simulated seconds at the end of the stream's work
  uint64_t jobs_completed() const;

  // Inside a job's function: the simulated time (seconds) at which that job started.
  static double current_job_start();

  // Testing aid: while held, no job starts (neither on the worker nor inline).
  void hold();
  void release();

 private:
  enum class Kind : uint8_t { work, record, wait };
  struct Waiter {
    bool done = false;
    std::string error;
  };
  struct Job {
    StreamId stream = 0;
    Kind kind = Kind::work;
    Resource res = Resource::none;
    JobFn fn;
    MarkerPtr marker;
    uint64_t seq = 0;
    std::shared_ptr<Waiter> waiter;
  };
  struct StreamState {
    double time = 0;
    uint64_t last_seq = 0;
    std::string error;  // first error of asynchronous work not yet reported
  };

  static Job make_job(StreamId s, Kind k, Resource r, JobFn fn, MarkerPtr m = nullptr,
                      std::shared_ptr<Waiter> w = nullptr) {
    Job j;
    j.stream = s;
    j.kind = k;
    j.res = r;
    j.fn = std::move(fn);
    j.marker = std::move(m);
    j.waiter = std::move(w);
    return j;
  }
  StreamState& stream_locked(StreamId s);
  uint64_t push_locked(Job j);
  // Runs one job with mu_ released; returns its error. Updates times and counters.
  std::string execute(std::unique_lock<std::mutex>& lk, Job& j);
  void worker_loop();
  void wait_seq(std::unique_lock<std::mutex>& lk, uint64_t seq);
  [[noreturn]] void throw_error(StreamId s, const std::string& msg, bool earlier) const;

  std::string name_;
  mutable std::mutex mu_;
  std::condition_variable cv_work_, cv_done_;
  std::deque<Job> jobs_;
  std::unordered_map<StreamId, StreamState> streams_;
  StreamId next_stream_ = 1;
  double resource_free_[kNumResources] = {};
  uint64_t next_seq_ = 1, completed_ = 0;
  bool busy_ = false, stop_ = false;
  int held_ = 0;
  std::thread worker_;
};

}  // namespace tpu::device
