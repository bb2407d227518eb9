#include "device/stream_queue.h"

#include <algorithm>
#include <exception>

#include "tpucore/core/error.h"

namespace tpu::device {

void Marker::complete(double time) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    done_ = true;
    time_ = time;
  }
  cv_.notify_all();
}
bool Marker::done() const {
  std::lock_guard<std::mutex> lk(mu_);
  return done_;
}
void Marker::wait() const {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return done_; });
}
double Marker::time() const {
  std::lock_guard<std::mutex> lk(mu_);
  return time_;
}

DeviceQueue::DeviceQueue(std::string device_name) : name_(std::move(device_name)) {
  streams_[kDefaultStream];
  worker_ = std::thread([this] { worker_loop(); });
}

DeviceQueue::~DeviceQueue() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    held_ = 0;
  }
  cv_work_.notify_all();
  if (worker_.joinable()) worker_.join();
}

StreamId DeviceQueue::create_stream() {
  std::lock_guard<std::mutex> lk(mu_);
  StreamId s = next_stream_++;
  StreamState& st = streams_[s];
  // A new stream starts at the device's current simulated time, not at zero.
  for (double t : resource_free_) st.time = std::max(st.time, t);
  return s;
}

bool DeviceQueue::has_stream(StreamId s) const {
  std::lock_guard<std::mutex> lk(mu_);
  return streams_.count(s) != 0;
}

void DeviceQueue::check_stream(StreamId s) const {
  if (!has_stream(s)) fail("{}: unknown stream {} (streams are created per device with tpu::Stream::create)", name_, s);
}

DeviceQueue::StreamState& DeviceQueue::stream_locked(StreamId s) {
  auto it = streams_.find(s);
  if (it == streams_.end())
    fail("{}: unknown stream {} (streams are created per device with tpu::Stream::create)", name_, s);
  return it->second;
}

uint64_t DeviceQueue::push_locked(Job j) {
  j.seq = next_seq_++;
  stream_locked(j.stream).last_seq = j.seq;
  const uint64_t seq = j.seq;
  jobs_.push_back(std::move(j));
  cv_work_.notify_all();
  return seq;
}

namespace {
thread_local double t_job_start = 0;  // the running job's start, for current_job_start()
}  // namespace

double DeviceQueue::current_job_start() { return t_job_start; }

std::string DeviceQueue::execute(std::unique_lock<std::mutex>& lk, Job& j) {
  StreamState& st = streams_[j.stream];  // node-based map: the reference survives inserts
  std::string err;
  switch (j.kind) {
    case Kind::work: {
      const int r = static_cast<int>(j.res);
      const double start = j.res == Resource::none ? st.time : std::max(st.time, resource_free_[r]);
      lk.unlock();
      t_job_start = start;
      double dur = 0;
      try {
        dur = j.fn();
      } catch (const std::exception& e) {
        err = e.what();
        if (err.empty()) err = "unknown error";
      } catch (...) {
        err = "unknown error";
      }
      lk.lock();
      if (j.res != Resource::none) {
        const double end = start + std::max(dur, 0.0);
        st.time = end;
        resource_free_[r] = end;
      }
      break;
    }
    case Kind::record:
      j.marker->complete(st.time);
      break;
    case Kind::wait:
      lk.unlock();
      j.marker->wait();
      lk.lock();
      st.time = std::max(st.time, j.marker->time());
      break;
  }
  completed_ = std::max(completed_, j.seq);
  return err;
}

void DeviceQueue::worker_loop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_work_.wait(lk, [&] { return (stop_ && jobs_.empty()) || (!jobs_.empty() && !busy_ && (held_ == 0 || stop_)); });
    if (jobs_.empty()) return;  // stopping
    Job j = std::move(jobs_.front());
    jobs_.pop_front();
    busy_ = true;
    std::string err = execute(lk, j);
    busy_ = false;
    if (j.waiter) {
      j.waiter->done = true;
      j.waiter->error = std::move(err);
    } else if (!err.empty()) {
      StreamState& st = streams_[j.stream];
      if (st.error.empty()) st.error = std::move(err);
    }
    cv_done_.notify_all();
    // Release the job's captures without the lock: they may own tensors whose release
    // queues a free on this device.
    JobFn dead = std::move(j.fn);
    MarkerPtr m = std::move(j.marker);
    lk.unlock();
    dead = nullptr;
    m.reset();
    lk.lock();
  }
}

void DeviceQueue::throw_error(StreamId s, const std::string& msg, bool earlier) const {
  if (!earlier) throw Error(msg);
  fail("{} stream {}: an earlier asynchronous operation failed: {} (run with TPU_SYNC=1 to report errors at the "
       "operation that caused them)",
       name_, s, msg);
}

bool DeviceQueue::run_inline_if_idle(StreamId s, Resource r, const JobFn& fn) {
  std::unique_lock<std::mutex> lk(mu_);
  stream_locked(s);
  if (busy_ || held_ || !jobs_.empty()) return false;
  Job j = make_job(s, Kind::work, r, fn);
  j.seq = next_seq_++;
  streams_[s].last_seq = j.seq;
  busy_ = true;
  std::string err = execute(lk, j);
  busy_ = false;
  cv_done_.notify_all();
  cv_work_.notify_all();
  lk.unlock();
  if (!err.empty()) throw_error(s, err, false);
  return true;
}

void DeviceQueue::submit(StreamId s, Resource r, JobFn fn, bool may_wait) {
  if (may_wait && sync_mode()) return submit_and_wait(s, r, fn);
  std::lock_guard<std::mutex> lk(mu_);
  push_locked(make_job(s, Kind::work, r, std::move(fn)));
}

void DeviceQueue::submit_and_wait(StreamId s, Resource r, const JobFn& fn) {
  std::unique_lock<std::mutex> lk(mu_);
  stream_locked(s);
  std::string err;
  if (!busy_ && !held_ && jobs_.empty()) {
    Job j = make_job(s, Kind::work, r, fn);
    j.seq = next_seq_++;
    streams_[s].last_seq = j.seq;
    busy_ = true;
    err = execute(lk, j);
    busy_ = false;
    cv_done_.notify_all();
    cv_work_.notify_all();
  } else {
    auto w = std::make_shared<Waiter>();
    push_locked(make_job(s, Kind::work, r, fn, nullptr, w));
    cv_done_.wait(lk, [&] { return w->done; });
    err = std::move(w->error);
  }
  if (!err.empty()) {
    lk.unlock();
    throw_error(s, err, false);
  }
  StreamState& st = streams_[s];
  if (!st.error.empty()) {
    std::string e = std::move(st.error);
    st.error.clear();
    lk.unlock();
    throw_error(s, e, true);
  }
}

MarkerPtr DeviceQueue::record(StreamId s) {
  auto m = std::make_shared<Marker>();
  std::lock_guard<std::mutex> lk(mu_);
  StreamState& st = stream_locked(s);
  if (!busy_ && !held_ && jobs_.empty()) {
    m->complete(st.time);
  } else {
    push_locked(make_job(s, Kind::record, Resource::none, nullptr, m));
  }
  return m;
}

void DeviceQueue::wait_marker(StreamId s, MarkerPtr m) {
  if (!m) return;
  std::lock_guard<std::mutex> lk(mu_);
  StreamState& st = stream_locked(s);
  if (m->done() && !busy_ && !held_ && jobs_.empty()) {
    st.time = std::max(st.time, m->time());
  } else {
    push_locked(make_job(s, Kind::wait, Resource::none, nullptr, std::move(m)));
  }
}

void DeviceQueue::wait_seq(std::unique_lock<std::mutex>& lk, uint64_t seq) {
  cv_done_.wait(lk, [&] { return completed_ >= seq; });
}

void DeviceQueue::synchronize_stream(StreamId s) {
  std::unique_lock<std::mutex> lk(mu_);
  wait_seq(lk, stream_locked(s).last_seq);
  StreamState& st = streams_[s];
  if (!st.error.empty()) {
    std::string e = std::move(st.error);
    st.error.clear();
    lk.unlock();
    throw_error(s, e, true);
  }
}

void DeviceQueue::synchronize() {
  std::unique_lock<std::mutex> lk(mu_);
  wait_seq(lk, next_seq_ - 1);
  for (auto& [id, st] : streams_) {
    if (st.error.empty()) continue;
    std::string e = std::move(st.error);
    StreamId sid = id;
    for (auto& [id2, st2] : streams_) st2.error.clear();
    lk.unlock();
    throw_error(sid, e, true);
  }
}

void DeviceQueue::drain() {
  std::unique_lock<std::mutex> lk(mu_);
  wait_seq(lk, next_seq_ - 1);
}

bool DeviceQueue::query_stream(StreamId s) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = streams_.find(s);
  if (it == streams_.end())
    fail("{}: unknown stream {} (streams are created per device with tpu::Stream::create)", name_, s);
  return completed_ >= it->second.last_seq;
}

bool DeviceQueue::idle() const {
  std::lock_guard<std::mutex> lk(mu_);
  return !busy_ && jobs_.empty();
}

double DeviceQueue::stream_time(StreamId s) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = streams_.find(s);
  return it == streams_.end() ? 0.0 : it->second.time;
}

uint64_t DeviceQueue::jobs_completed() const {
  std::lock_guard<std::mutex> lk(mu_);
  return completed_;
}

void DeviceQueue::hold() {
  std::lock_guard<std::mutex> lk(mu_);
  ++held_;
}

void DeviceQueue::release() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (held_ > 0) --held_;
  }
  cv_work_.notify_all();
}

}  // namespace tpu::device
