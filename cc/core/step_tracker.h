// Local dependency bookkeeping of one rank's steps, shared by the CPU
// executor (cpu/executor_cpu.cc) and the stream engine's plan
// (stream/stream_exec.cc): dependency counting and the set of steps whose
// local dependencies are done, so any such step may run (chunks of all
// trees pipeline).
#ifndef JAX_BLINK_CC_CORE_STEP_TRACKER_H_
#define JAX_BLINK_CC_CORE_STEP_TRACKER_H_

#include <cstdint>
#include <vector>

#include "core/schedule.h"

namespace jax_blink {

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

#endif  // JAX_BLINK_CC_CORE_STEP_TRACKER_H_
