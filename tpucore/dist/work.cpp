#include "tpucore/dist/work.h"

namespace tpu::dist {

namespace detail {

TaskQueue::TaskQueue() : thread_([this] { run(); }) {}

TaskQueue::~TaskQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::shared_future<void> TaskQueue::push(std::function<void()> task) {
  std::promise<void> p;
  std::shared_future<void> f = p.get_future().share();
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.emplace_back(std::move(task), std::move(p));
  }
  cv_.notify_one();
  return f;
}

void TaskQueue::mark_broken(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_.empty()) broken_ = why;
}

void TaskQueue::execute(std::function<void()>& task, std::promise<void>& done) {
  std::string broken;
  {
    std::lock_guard<std::mutex> lock(mu_);
    broken = broken_;
  }
  if (!broken.empty()) {
    done.set_exception(std::make_exception_ptr(
        Error(fmt::format("tpu::dist: the group is broken by an earlier failure, so this call did not run: {}", broken))));
    return;
  }
  try {
    task();
    done.set_value();
  } catch (const TransportError& e) {
    mark_broken(e.what());
    done.set_exception(std::current_exception());
  } catch (...) {
    done.set_exception(std::current_exception());
  }
}

std::shared_future<void> TaskQueue::run_or_push(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!tasks_.empty() || busy_) {
      std::promise<void> p;
      std::shared_future<void> f = p.get_future().share();
      tasks_.emplace_back(std::move(task), std::move(p));
      cv_.notify_one();
      return f;
    }
    busy_ = true;
  }
  std::promise<void> p;
  std::shared_future<void> f = p.get_future().share();
  execute(task, p);
  {
    std::lock_guard<std::mutex> lock(mu_);
    busy_ = false;
  }
  cv_.notify_one();  // tasks queued meanwhile
  return f;
}

void TaskQueue::run() {
  for (;;) {
    std::pair<std::function<void()>, std::promise<void>> item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return (stop_ && !busy_) || (!tasks_.empty() && !busy_); });
      if (tasks_.empty()) return;  // stop_ and nothing left
      item = std::move(tasks_.front());
      tasks_.pop_front();
      busy_ = true;
    }
    execute(item.first, item.second);
    {
      std::lock_guard<std::mutex> lock(mu_);
      busy_ = false;
    }
    cv_.notify_all();
  }
}

}  // namespace detail

bool Work::is_completed() const {
  if (!state_) return true;
  return state_->done.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

void Work::wait(std::chrono::milliseconds timeout) const {
  if (!state_) return;
  auto& s = *state_;
  if (timeout.count() > 0 && s.done.wait_for(timeout) != std::future_status::ready)
    fail("tpu::dist: {} did not complete within {} ms", s.what, timeout.count());
  s.done.get();  // rethrows the queue's error
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.error) std::rethrow_exception(s.error);
  if (s.finished) return;
  try {
    if (s.finish) s.finish(timeout.count() > 0 ? timeout : s.timeout);
    s.finished = true;
  } catch (...) {
    s.error = std::current_exception();
    throw;
  }
}

}  // namespace tpu::dist
