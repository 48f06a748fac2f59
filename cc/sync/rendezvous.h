// In-process rendezvous of the ranks of one collective call.
//
// Every participating device thread calls Rendezvous::Join() with the key
// (RunId, static op_id, group) and its rank. A per-(key, rank) generation
// counter separates repeated executions of one call site inside a single run
// (scan, fori_loop). Ranks publish their buffer pointers, element count,
// dtype and schedule fingerprint in a Slot, execute, and Leave(). Either
// every rank waits for all the others before executing (a barrier, with a
// deadline), or each starts at once (early start: the CPU executor waits
// for a peer only in the steps that touch it, Slot::Arrived). Slots are pooled and their per-step
// completion flags carry an epoch, so nothing is cleared or allocated per
// call in the steady state; map entries are deleted once quiescent.
#ifndef JAX_BLINK_CC_SYNC_RENDEZVOUS_H_
#define JAX_BLINK_CC_SYNC_RENDEZVOUS_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"

namespace jax_blink {

// ---- Waiting primitives ----------------------------------------------------

// Blocks while *word == expected, at most timeout_ns (spurious wake-ups are
// allowed). Linux: futex; elsewhere: a short sleep. `shared`: the word lives
// in memory shared between processes (sync/host_rendezvous.h), which needs
// the futex's shared form; in-process words use the cheaper private one.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected,
               int64_t timeout_ns, bool shared = false);
void FutexWakeAll(std::atomic<uint32_t>* word, bool shared = false);

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

using Clock = std::chrono::steady_clock;

// A doorbell per rank: peers ring it when they complete a step the rank may
// be waiting for; the rank sleeps on it when it has nothing to do.
struct alignas(64) Bell {
  std::atomic<uint32_t> seq{0};
  std::atomic<uint32_t> sleepers{0};
  // Wake-up filters (reset with the slot), so that completions the rank
  // need not react to do not wake it:
  // set while the rank waits for its SENDs to be read before returning;
  std::atomic<uint32_t> final_wait{0};
  // RECV_COPYs without successors completed for the rank by their senders,
  // and the count at which the rank wants to be woken (it sleeps until all
  // its remaining steps are such pushed copies).
  std::atomic<uint32_t> pushed_sinks{0};
  std::atomic<uint32_t> sink_target{UINT32_MAX};
  // The peer whose arrival the rank sleeps on (early start; UINT32_MAX:
  // none): another rank's arrival does not wake it.
  std::atomic<uint32_t> awaited{UINT32_MAX};
  // The bell lives in memory shared between processes (set when its slot is
  // prepared; see FutexWait).
  uint32_t shared = 0;
  // The slot epoch in which the rank published its RankInfo (early start:
  // its peers may then read it and touch its buffers; never reset, the
  // epoch tells uses apart).
  std::atomic<uint32_t> arrived{0};

  void ResetFilters() {
    final_wait.store(0, std::memory_order_relaxed);
    pushed_sinks.store(0, std::memory_order_relaxed);
    sink_target.store(UINT32_MAX, std::memory_order_relaxed);
    awaited.store(UINT32_MAX, std::memory_order_relaxed);
  }

  void Ring() {
    seq.fetch_add(1, std::memory_order_seq_cst);
    if (sleepers.load(std::memory_order_seq_cst) != 0) FutexWakeAll(&seq, shared != 0);
  }
  // Returns when seq != seen or after at most timeout_ns: spins `spin`
  // iterations, then yields the CPU for up to yield_ns (cheap on
  // oversubscribed cores: no wake-up latency), then sleeps on a futex.
  void Wait(uint32_t seen, int64_t timeout_ns, int spin, int64_t yield_ns);
};

// ---- Rendezvous
// --------------------------------------------------------------

struct RendezvousKey {
  int64_t run_id;
  int64_t op_id;
  int64_t group;
  bool operator==(const RendezvousKey& o) const {
    return run_id == o.run_id && op_id == o.op_id && group == o.group;
  }
};

// What a rank publishes.
struct RankInfo {
  const void* in = nullptr;  // input buffer (IN_r)
  void* acc = nullptr;       // accumulator (ACC_r): out, or a scratch buffer
  // CPU executor: when not null, the accumulator's elements of the rank's
  // output range (a reduce_scatter's shard) live here (the output buffer)
  // instead of in `acc`, so they need no copy at the end.
  void* acc_out = nullptr;
  void* out = nullptr;       // output buffer
  // CPU executor, a segmented call (cpu/executor_cpu.h, ExecArgs::nsegs): the
  // input is these nsegs buffers, segment i from element seg_offset[i].
  int32_t nsegs = 0;
  const int64_t* seg_offset = nullptr;
  const void* const* in_segs = nullptr;
  // ... and its output these nsegs buffers; with acc_segs, they are its
  // accumulator too (`acc`, like `out`, is then the first of them).
  void* const* out_segs = nullptr;
  bool acc_segs = false;
  int64_t count = 0;         // elements in its buffers
  int32_t dtype = -1;        // dtype code of its buffers
  int64_t nranks = 0;        // from its schedule
  int64_t total_steps = 0;   // from its schedule
  uint64_t fingerprint = 0;  // of its schedule
  Status error;              // a local error found before joining, or ok
  int process = -1;          // host slots: the rank's process on this host
  int device = -1;           // stream executors: the rank's device
  void* stream = nullptr;    // stream executors: the caller's stream (opaque)
  // Stream executors: the rank's StreamPeerView and its progress at the
  // start of this call (stream/stream_exec.h).
  const void* stream_view = nullptr;
  uint64_t stream_base = 0;
};

// The words every rank of a slot updates (in the slot itself, or in memory
// shared between processes for a host slot).
struct SlotWords {
  // 0: waiting for ranks, 1: all arrived, 2: aborted (timed out: the ranks
  // that never arrived count as finished).
  std::atomic<uint32_t> state{0};
  // Set once when any rank fails during execution; wakes everyone.
  std::atomic<uint32_t> failed{0};
  // Ranks whose execution of this call is over, successful or not (futex
  // word).
  std::atomic<uint32_t> finished{0};
};

// The first failure of a host slot, in memory shared between processes
// (Slot::Fail's record for ranks of other processes to read).
struct SharedFailure {
  std::atomic<uint32_t> ready{0};  // the record below is complete
  int32_t code = 0;                // ErrorKind of the failure
  char message[1024] = {};
};

class Slot {
 public:
  int64_t nranks = 0;
  // Per-step flags: 2*epoch+1 = done in this use of the slot, 2*epoch =
  // claimed (a RECV_COPY being executed, possibly by its sender).
  uint32_t epoch = 0;
  std::vector<RankInfo> info;
  // Host slots: "" while every process of the slot's ranks lives, else what
  // says which exited (its ranks will never progress: waiting is useless).
  std::string (*peers_gone)(const Slot& slot) = nullptr;

  std::atomic<uint32_t>* flags() { return ext_flags_ != nullptr ? ext_flags_ : flags_.get(); }
  Bell& bell(int64_t r) { return ext_bells_ != nullptr ? ext_bells_[r] : bells_[r]; }
  void RingAll() {
    for (int64_t r = 0; r < nranks; ++r) bell(r).Ring();
  }
  // Waits until every rank has arrived (true) or until `until` (false, or
  // true if the call was aborted meanwhile): spins `spin` iterations, yields
  // for up to yield_ns, then sleeps on the state word.
  bool AwaitArrivals(Clock::time_point until, int spin = 0, int64_t yield_ns = 0);
  // Rank r has published its RankInfo in this use of the slot (info[r] is
  // complete; in a host slot's view, once the view has mapped it).
  bool Arrived(int64_t r) { return bell(r).arrived.load(std::memory_order_seq_cst) == epoch; }
  // Marks `rank`'s RankInfo published: before the state word says that all
  // arrived, so that a rank that sees it finds every peer published.
  void MarkArrived(int64_t rank) { bell(rank).arrived.store(epoch, std::memory_order_seq_cst); }
  // Then wakes the ranks that sleep on its arrival (Bell::awaited). Waking
  // every rank at every arrival costs a punctual call more than it gains: a
  // woken rank mostly finds its next step still waiting for another rank.
  void WakeAwaiting(int64_t rank) {
    for (int64_t r = 0; r < nranks; ++r) {
      if (bell(r).awaited.load(std::memory_order_seq_cst) == static_cast<uint32_t>(rank)) bell(r).Ring();
    }
  }

  std::atomic<uint32_t>& state() { return words_->state; }
  std::atomic<uint32_t>& failed() { return words_->failed; }
  std::atomic<uint32_t>& finished() { return words_->finished; }

  // Makes this slot a view of a slot that ranks of several processes share
  // (sync/host_rendezvous.h): its flags, bells, words and failure record
  // live there; `info` stays this process's (with the peers' buffers as
  // mapped here) and is filled by the caller.
  void AttachShared(int64_t n, uint32_t shared_epoch, std::atomic<uint32_t>* flags, Bell* bells,
                    SlotWords* words, SharedFailure* failure);

  // Records the first failure ("rank <rank> failed: <message>", with the
  // error's kind) and wakes every rank.
  void Fail(int64_t rank, const Status& error);
  // The same for a verdict on the whole call, recorded as it is.
  void FailAll(const Status& error);
  Status FailStatus();

  // All or nothing: marks this rank's execution over and waits until every
  // rank's is (after that no rank touches another's buffers), then returns
  // the first failure of any rank, or ok: the same verdict on every rank. A
  // rank still executing at `limit` is an error (the executors bound their
  // own waits, so this only happens when something else hangs). Waits like
  // Bell::Wait: `spin` iterations, then yields for up to `yield_ns`, then
  // sleeps.
  Status Finish(Clock::time_point limit, int spin = 0, int64_t yield_ns = 0);

 private:
  friend class Rendezvous;
  // Prepares the slot for a new use (called under the rendezvous lock).
  void Reset(int64_t nranks, int64_t total_steps);

  SlotWords own_words_;
  SlotWords* words_ = &own_words_;
  // AttachShared: the shared slot's storage (null: this slot's own).
  std::atomic<uint32_t>* ext_flags_ = nullptr;
  Bell* ext_bells_ = nullptr;
  SharedFailure* ext_failure_ = nullptr;
  std::unique_ptr<std::atomic<uint32_t>[]> flags_;
  size_t flag_cap_ = 0;
  std::unique_ptr<Bell[]> bells_;
  size_t bell_cap_ = 0;
  // Guarded by the rendezvous mutex.
  int64_t arrived_ = 0;
  int64_t left_ = 0;
  std::vector<uint8_t> present_;
  std::vector<Clock::time_point> arrival_;  // when each rank joined
  std::string abort_message_;
  // Guarded by fail_mu_.
  std::mutex fail_mu_;
  Status fail_status_;
};

// A rank's membership in one slot, from Join() to Leave().
struct Ticket {
  RendezvousKey key{};
  int64_t rank = -1;
  int64_t generation = -1;
  Slot* slot = nullptr;
  uint32_t epoch = 0;
};

struct RendezvousStats {
  int64_t entries = 0;       // live (key) entries
  int64_t active_slots = 0;  // slots in use
  int64_t pooled_slots = 0;  // slots kept for reuse
  int64_t tombstones = 0;    // aborted generations remembered for late ranks
};

class Rendezvous {
 public:
  static Rendezvous& Global();

  // Publishes `info` for `rank` and waits until all `nranks` ranks of the
  // same key and generation arrived, or until `deadline`. On success fills
  // `ticket` and returns ok; on failure returns the error (the caller must
  // still call Leave() when ticket->slot is set): InvalidArgument when the
  // ranks expect different numbers of ranks, DeadlineExceeded when some rank
  // did not arrive in time.
  // While waiting it spins `spin` iterations, then yields the CPU for up to
  // yield_ns, then sleeps on a futex.
  // `generation` >= 0: the generation Reserve() gave this call (else the
  // next one is taken here).
  // `early`: returns once `info` is published (Slot::Arrived), without
  // waiting; the caller then waits for each peer it needs, and calls
  // AbortMissing() at its deadline.
  Status Join(const RendezvousKey& key, int64_t rank, int64_t nranks,
              RankInfo info, Clock::time_point deadline, int64_t timeout_ms,
              Ticket* ticket, int spin = 64, int64_t yield_ns = 0,
              int64_t generation = -1, bool early = false);

  // Waits until every rank of the ticket's slot has arrived (ok) or until
  // `deadline` (then AbortMissing()'s error).
  Status AwaitAll(const Ticket& ticket, Clock::time_point deadline, int64_t timeout_ms,
                  int spin = 64, int64_t yield_ns = 0);

  // At a rank's deadline: when some rank of the ticket's slot has not
  // arrived, aborts the call: DeadlineExceeded naming the missing ranks for
  // every rank (the slot fails with it), the ranks that never arrived
  // counted as finished (Slot::Finish), and a tombstone for those arriving
  // later. Ok when every rank has arrived.
  Status AbortMissing(const Ticket& ticket, int64_t timeout_ms);

  // Takes `rank`'s next generation of `key` now, for a Join() made later on
  // another thread: calls a rank hands to other threads keep the order in
  // which it made them. InvalidArgument as Join(); the entry is kept until
  // the reserved generation has joined.
  Status Reserve(const RendezvousKey& key, int64_t rank, int64_t nranks,
                 int64_t* generation);

  // Leaves the slot; the last rank out recycles it.
  void Leave(Ticket* ticket);

  RendezvousStats Stats();

 private:
  struct Entry;
  struct KeyHash {
    size_t operator()(const RendezvousKey& k) const;
  };
  // The key's entry, created for `nranks` ranks; InvalidArgument when the
  // ranks disagree on their number or `rank` is not one of them.
  Status EntryLocked(const RendezvousKey& key, int64_t rank, int64_t nranks, Entry** entry);
  std::unique_ptr<Slot> AcquireSlotLocked(int64_t nranks, int64_t total_steps);
  void ReleaseSlotLocked(std::unique_ptr<Slot> slot);
  void MaybeEraseLocked(const RendezvousKey& key);
  void EvictTombstonesLocked();

  std::mutex mu_;
  struct Impl;
  Impl* impl_;
  Rendezvous();
};

std::string DescribeRanks(const std::vector<int64_t>& ranks);

// ---- Arrival lateness (jax_blink.stats()) -----------------------------------
// How long after the first rank of a call each rank joined, over the last
// kLatenessWindow calls of each rank count in this process's in-process
// rendezvous (the last rank to arrive records the call). A rank that is often
// late is a candidate for a leaf of the trees (plan(slow_ranks=...)).
constexpr int64_t kLatenessWindow = 256;

struct LatenessSummary {
  int64_t nranks = 0;
  int64_t calls = 0;            // recorded in the window
  std::vector<double> mean_ns;  // per rank
  std::vector<double> max_ns;   // per rank
};

// Records one call's arrival times (rank r joined at arrivals[r]).
void RecordArrivals(const std::vector<Clock::time_point>& arrivals);
// The summaries, one per rank count seen, smallest first; `reset` forgets them.
std::vector<LatenessSummary> ArrivalLateness(bool reset);

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_SYNC_RENDEZVOUS_H_
