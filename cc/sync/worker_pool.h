// The threads that run collectives off XLA's threads (the CPU FFI handler is
// asynchronous: it hands its rank's work to this pool and returns a future).
//
// A rank of a collective waits for its peers, and its peers may be queued
// behind other collectives on other devices, in whatever order XLA runs
// independent custom calls. A bounded pool of blocking tasks can therefore
// deadlock, as XLA's own intra-op pool does under such tasks. This pool never queues a
// task behind a running one: a task goes to an idle thread, or to a new
// thread when none is idle, so every rank that was handed in runs, and the
// ranks of one collective always meet. Idle threads are kept for reuse
// (calls allocate no thread in the steady state) and exit after
// kIdleSeconds without work.
#ifndef JAX_BLINK_CC_SYNC_WORKER_POOL_H_
#define JAX_BLINK_CC_SYNC_WORKER_POOL_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>

namespace jax_blink {

struct WorkerPoolStats {
  int64_t threads = 0;  // alive
  int64_t idle = 0;     // waiting for work
  int64_t started = 0;  // ever created
};

class WorkerPool {
 public:
  // The process's pool (never destroyed: its threads may outlive static
  // destructors).
  static WorkerPool& Global();

  // Runs `task` on an idle thread, or on a new one. Returns an empty string,
  // or why no thread could be started (the task did not run).
  std::string Run(std::function<void()> task);

  WorkerPoolStats Stats();

  static constexpr int kIdleSeconds = 30;

 private:
  WorkerPool() = default;
  void Loop(std::function<void()> first);

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // never longer than idle_
  int64_t idle_ = 0;     // waiting threads not yet promised a task
  int64_t threads_ = 0;
  int64_t started_ = 0;
};

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_SYNC_WORKER_POOL_H_
