// Work handles and the per-group queue that runs collectives in call order (internal).
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <future>
#include <mutex>
#include <string>
#include <thread>

#include "tpucore/dist.h"

namespace tpu::dist::detail {

struct WorkState {
  std::string what;                    // "all_reduce (gloo, rank 1 of 4)"
  std::shared_future<void> done;       // the part run by the queue (or already satisfied)
  // Run once by the first successful wait(): copy-back, p2p waits (bounded by the given timeout).
  std::function<void(std::chrono::milliseconds)> finish;
  std::chrono::milliseconds timeout{0};  // the group's
  std::mutex mu;
  bool finished = false;
  std::exception_ptr error;            // the error finish() raised, rethrown by later waits
};

// A thread that runs tasks one after the other. A task's exception fails its work only; a task
// that throws TransportError marks the queue broken, and every later task fails with that reason.
class TaskQueue {
 public:
  TaskQueue();
  ~TaskQueue();
  std::shared_future<void> push(std::function<void()> task);
  // Runs the task on the calling thread when the queue is idle (else pushes it): same order,
  // no thread hand-off.
  std::shared_future<void> run_or_push(std::function<void()> task);
  void mark_broken(const std::string& why);

 private:
  void run();
  void execute(std::function<void()>& task, std::promise<void>& done);
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::function<void()>, std::promise<void>>> tasks_;
  bool stop_ = false;
  bool busy_ = false;  // a task is running (on the queue's thread or inline)
  std::string broken_;
  std::thread thread_;
};

// An error from the transport (a peer died, a timeout): the group can no longer be trusted.
struct TransportError : Error {
  using Error::Error;
};

}  // namespace tpu::dist::detail

namespace tpu::dist {
struct ProcessGroup::Queue {
  detail::TaskQueue tasks;
  std::mutex mu;
  std::map<std::pair<int, int>, uint32_t> send_seq, recv_seq;  // (peer, tag) -> next message number
};
}  // namespace tpu::dist
