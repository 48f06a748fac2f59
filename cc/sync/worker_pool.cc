#include "sync/worker_pool.h"

#include <chrono>
#include <system_error>
#include <thread>
#include <utility>

namespace jax_blink {

WorkerPool& WorkerPool::Global() {
  static WorkerPool* pool = new WorkerPool();  // leaked on purpose (see the header)
  return *pool;
}

std::string WorkerPool::Run(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (idle_ > 0) {  // promise the task to a waiting thread
      --idle_;
      queue_.push_back(std::move(task));
      cv_.notify_one();
      return "";
    }
    ++threads_;
    ++started_;
  }
  try {
    std::thread([this, t = std::move(task)]() mutable { Loop(std::move(t)); }).detach();
  } catch (const std::system_error& e) {
    std::lock_guard<std::mutex> lk(mu_);
    --threads_;
    return std::string("could not start a worker thread: ") + e.what();
  }
  return "";
}

void WorkerPool::Loop(std::function<void()> task) {
  for (;;) {
    task();
    task = nullptr;  // release what it captured before waiting
    std::unique_lock<std::mutex> lk(mu_);
    ++idle_;
    const bool got = cv_.wait_for(lk, std::chrono::seconds(kIdleSeconds),
                                  [this] { return !queue_.empty(); });
    if (!got) {  // idle too long, and nothing was promised to us
      --idle_;
      --threads_;
      return;
    }
    task = std::move(queue_.front());  // Run() already took us off idle_
    queue_.pop_front();
  }
}

WorkerPoolStats WorkerPool::Stats() {
  std::lock_guard<std::mutex> lk(mu_);
  WorkerPoolStats s;
  s.threads = threads_;
  s.idle = idle_;
  s.started = started_;
  return s;
}

}  // namespace jax_blink
