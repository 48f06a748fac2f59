// Executing one rank's steps of a schedule (shared step logic + CPU entry).
//
// The CPU executor (executor_cpu.cc) is a pull model over shared memory:
// a SEND only publishes "done" (the value stays where it is: the rank's input
// while the chunk is unwritten, else its accumulator); the matching RECV waits
// for that flag and reads the peer's memory directly. Value semantics are
// kept by waiting, before a chunk is overwritten, until the receivers of the
// earlier SENDs of that chunk have read it, and by waiting, before
// returning, until every receiver has read every SEND.
//
// StepTracker is the transport-independent part: local dependency counting
// and the set of steps whose local dependencies are done, so any such step
// may run (chunks of all trees pipeline); the CUDA executor reuses it.
#ifndef JAX_BLINK_CC_EXECUTOR_H_
#define JAX_BLINK_CC_EXECUTOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "schedule.h"

namespace jax_blink {

struct ExecArgs {
  const Schedule* schedule = nullptr;
  int64_t rank = -1;
  int64_t run_id = 0;
  int64_t op_id = 0;
  int64_t group = 0;
  const void* in = nullptr;
  void* out = nullptr;
  int64_t in_count = 0;   // elements in `in`
  int64_t out_count = 0;  // elements in `out`
  int32_t dtype = -1;  // dtype code of the buffers (-1: not a schedule dtype)
  int64_t timeout_ms = 60000;
  // An error found by the caller before joining (e.g. a buffer that does not
  // fit the schedule). The rank still joins so that its peers fail fast with
  // the same message instead of timing out.
  std::string local_error;
};

struct ExecResult {
  std::string error;        // "" on success
  int64_t generation = -1;  // rendezvous generation of this call
};

// Runs rank args.rank of args.schedule; blocks until done or failed.
ExecResult ExecuteCpu(const ExecArgs& args);

// Tunables read once from the environment (see docs/building.md).
struct ExecTunables {
  int spin = 0;          // busy-wait iterations before yielding
  int64_t yield_ns = 0;  // then sched_yield for this long before sleeping
  // Copies of at least this many bytes whose destination no peer reads
  // afterwards bypass the cache (non-temporal stores, x86-64 only); they
  // save the read-for-ownership traffic of large outputs.
  int64_t nt_bytes = 0;
  // A rank that completes a chunk writes it straight into the accumulators
  // of receivers whose RECV_COPY is ready (claimed with a CAS on its flag).
  bool push = true;
  // Output buffers at least this large get madvise(MADV_HUGEPAGE) (0: never).
  int64_t hugepage_bytes = 0;
};
const ExecTunables& GetExecTunables();
// For benchmarks and tests: replaces the tunables (not thread-safe against
// running collectives).
void SetExecTunables(const ExecTunables& t);

// Local dependency bookkeeping for one rank's steps. Reused across calls
// (thread-local in the CPU executor), so Reset() does not allocate in the
// steady state.
class StepTracker {
 public:
  void Reset(const RankSteps& rs) {
    rs_ = &rs;
    n_ = static_cast<int32_t>(rs.steps.size());
    remaining_.resize(n_);
    done_.assign(n_, 0);
    words_ = (n_ + 63) / 64;
    ready_.assign(words_, 0);
    ndone_ = 0;
    lo_word_ = 0;
    for (int32_t i = 0; i < n_; ++i) {
      const Step& st = rs.steps[i];
      remaining_[i] = st.deps_end - st.deps_begin;
      if (remaining_[i] == 0) SetReady(i);
    }
  }

  bool AllDone() const { return ndone_ == n_; }
  int32_t NumDone() const { return ndone_; }
  int32_t NumSteps() const { return n_; }
  bool Done(int32_t i) const { return done_[i] != 0; }

  // Marks step i done and makes its successors ready when their last local
  // dependency completes.
  void MarkDone(int32_t i) {
    done_[i] = 1;
    ++ndone_;
    ready_[i >> 6] &= ~(uint64_t{1} << (i & 63));
    const Step& st = rs_->steps[i];
    for (int32_t k = st.succ_begin; k < st.succ_end; ++k) {
      const int32_t j = rs_->succs[k];
      if (--remaining_[j] == 0 && !done_[j]) SetReady(j);
    }
  }

  // True when every local dependency of j is done or listed in group[0..n).
  bool DepsDoneExcept(int32_t j, const int32_t* group, int n) const {
    const Step& st = rs_->steps[j];
    for (int32_t k = st.deps_begin; k < st.deps_end; ++k) {
      const int32_t d = rs_->deps[k];
      if (done_[d]) continue;
      bool in_group = false;
      for (int g = 0; g < n; ++g) in_group |= (group[g] == d);
      if (!in_group) return false;
    }
    return true;
  }

  // Calls fn(i) for each ready step in ascending order; fn returns true when
  // it ran the step (it must call MarkDone). Returns whether any ran. Steps
  // made ready during the sweep are visited in the next sweep.
  template <typename Fn>
  bool Sweep(Fn&& fn) {
    bool progress = false;
    while (lo_word_ < words_ && ready_[lo_word_] == 0 &&
           AllDoneBelow((lo_word_ + 1) * 64)) {
      ++lo_word_;
    }
    for (int32_t w = lo_word_; w < words_; ++w) {
      uint64_t bits = ready_[w];
      while (bits != 0) {
        const int32_t i = w * 64 + __builtin_ctzll(bits);
        bits &= bits - 1;
        if (done_[i]) continue;
        progress |= fn(i);
      }
    }
    return progress;
  }

 private:
  void SetReady(int32_t i) { ready_[i >> 6] |= uint64_t{1} << (i & 63); }
  // Successors always have larger indices, so a fully done prefix stays done.
  bool AllDoneBelow(int32_t end) const {
    end = end < n_ ? end : n_;
    for (int32_t i = lo_word_ * 64; i < end; ++i) {
      if (!done_[i]) return false;
    }
    return true;
  }

  const RankSteps* rs_ = nullptr;
  int32_t n_ = 0;
  int32_t words_ = 0;
  int32_t lo_word_ = 0;
  int32_t ndone_ = 0;
  std::vector<int32_t> remaining_;
  std::vector<uint8_t> done_;
  std::vector<uint64_t> ready_;
};

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_EXECUTOR_H_
