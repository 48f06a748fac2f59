// In-process rendezvous; see rendezvous.h.
#include "sync/rendezvous.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <utility>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#endif

namespace jax_blink {

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t),
              "futex words must be plain 32-bit integers");
static_assert(std::atomic<uint32_t>::is_always_lock_free);

// ---- Waiting primitives ----------------------------------------------------

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected,
               int64_t timeout_ns, bool shared) {
  if (timeout_ns <= 0) return;
#if defined(__linux__)
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout_ns / 1000000000);
  ts.tv_nsec = static_cast<long>(timeout_ns % 1000000000);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), shared ? FUTEX_WAIT : FUTEX_WAIT_PRIVATE,
          expected, &ts, nullptr, 0);
#else
  (void)shared;
  (void)word;
  (void)expected;
  std::this_thread::sleep_for(
      std::chrono::nanoseconds(std::min<int64_t>(timeout_ns, 50000)));
#endif
}

void FutexWakeAll(std::atomic<uint32_t>* word, bool shared) {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), shared ? FUTEX_WAKE : FUTEX_WAKE_PRIVATE,
          INT_MAX, nullptr, nullptr, 0);
#else
  (void)shared;
  (void)word;
#endif
}

void Bell::Wait(uint32_t seen, int64_t timeout_ns, int spin, int64_t yield_ns) {
  for (int i = 0; i < spin; ++i) {
    if (seq.load(std::memory_order_relaxed) != seen) return;
    CpuRelax();
  }
  if (yield_ns > 0) {
    const auto until =
        Clock::now() + std::chrono::nanoseconds(std::min(yield_ns, timeout_ns));
    do {
      std::this_thread::yield();
      if (seq.load(std::memory_order_relaxed) != seen) return;
    } while (Clock::now() < until);
  }
  sleepers.fetch_add(1, std::memory_order_seq_cst);
  if (seq.load(std::memory_order_seq_cst) == seen) {
    FutexWait(&seq, seen, timeout_ns, shared != 0);
  }
  sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

std::string DescribeRanks(const std::vector<int64_t>& ranks) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i == 32) {
      os << ", ... (" << ranks.size() << " in all)";
      break;
    }
    os << (i ? ", " : "") << ranks[i];
  }
  os << "]";
  return os.str();
}

// ---- Slot
// --------------------------------------------------------------------

void Slot::Reset(int64_t n, int64_t total_steps) {
  nranks = n;
  if (static_cast<size_t>(total_steps) > flag_cap_) {
    size_t cap = std::max<size_t>(total_steps, 2 * flag_cap_);
    flags_.reset(new std::atomic<uint32_t>[cap]);
    for (size_t i = 0; i < cap; ++i)
      flags_[i].store(0, std::memory_order_relaxed);
    flag_cap_ = cap;
  }
  // Flags hold 2*epoch (claimed) or 2*epoch+1 (done): keep epoch < 2^31.
  if (++epoch >= (uint32_t{1} << 31)) {  // wrapped: old flags could alias
    for (size_t i = 0; i < flag_cap_; ++i) {
      flags_[i].store(0, std::memory_order_relaxed);
    }
    for (size_t r = 0; r < bell_cap_; ++r) bells_[r].arrived.store(0, std::memory_order_relaxed);
    epoch = 1;
  }
  if (static_cast<size_t>(n) > bell_cap_) {
    bells_.reset(new Bell[n]);
    bell_cap_ = n;
  }
  for (int64_t r = 0; r < n; ++r) bells_[r].ResetFilters();
  if (info.size() < static_cast<size_t>(n)) info.resize(n);
  for (int64_t r = 0; r < n; ++r) {
    RankInfo& ri = info[r];
    ri.in = nullptr;
    ri.acc = nullptr;
    ri.acc_out = nullptr;
    ri.out = nullptr;
    ri.count = 0;
    ri.dtype = -1;
    ri.nranks = 0;
    ri.total_steps = 0;
    ri.fingerprint = 0;
    ri.error = Status();
    ri.device = -1;
    ri.stream = nullptr;
    ri.process = -1;
  }
  present_.assign(n, 0);
  arrival_.assign(n, Clock::time_point());
  arrived_ = 0;
  left_ = 0;
  abort_message_.clear();
  state().store(0, std::memory_order_relaxed);
  failed().store(0, std::memory_order_relaxed);
  finished().store(0, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lk(fail_mu_);
  fail_status_ = Status();
}

void Slot::AttachShared(int64_t n, uint32_t shared_epoch, std::atomic<uint32_t>* flags,
                        Bell* bells, SlotWords* words, SharedFailure* failure) {
  nranks = n;
  epoch = shared_epoch;
  ext_flags_ = flags;
  ext_bells_ = bells;
  words_ = words;
  ext_failure_ = failure;
  if (info.size() < static_cast<size_t>(n)) info.resize(n);
}

void Slot::Fail(int64_t rank, const Status& error) {
  FailAll(error.Prefixed("rank " + std::to_string(rank) + " failed: "));
}

void Slot::FailAll(const Status& st) {
  if (ext_failure_ != nullptr) {
    // Shared between processes: the rank that sets `failed` writes the
    // record, then marks it ready for the others (FailStatus).
    uint32_t expected = 0;
    if (failed().compare_exchange_strong(expected, 1, std::memory_order_seq_cst)) {
      ext_failure_->code = static_cast<int32_t>(st.kind);
      std::snprintf(ext_failure_->message, sizeof(ext_failure_->message), "%s",
                    st.message.c_str());
      ext_failure_->ready.store(1, std::memory_order_seq_cst);
    }
  } else {
    std::lock_guard<std::mutex> lk(fail_mu_);
    if (failed().load(std::memory_order_relaxed) != 0) return;
    fail_status_ = st;
    failed().store(1, std::memory_order_seq_cst);
  }
  RingAll();
}

Status Slot::FailStatus() {
  if (ext_failure_ != nullptr) {
    // The failing rank writes its record right after setting `failed`; a
    // process that died in between leaves no record.
    const auto until = Clock::now() + std::chrono::seconds(1);
    while (ext_failure_->ready.load(std::memory_order_seq_cst) == 0) {
      if (Clock::now() >= until) {
        return Status::Internal("a rank of another process failed without saying why");
      }
      std::this_thread::yield();
    }
    return Status{static_cast<ErrorKind>(ext_failure_->code), ext_failure_->message};
  }
  std::lock_guard<std::mutex> lk(fail_mu_);
  return fail_status_;
}

Status Slot::Finish(Clock::time_point limit, int spin, int64_t yield_ns) {
  const uint32_t n = static_cast<uint32_t>(nranks);
  if (finished().fetch_add(1, std::memory_order_seq_cst) + 1 == n) {
    FutexWakeAll(&finished(), ext_failure_ != nullptr);
  }
  // Ranks usually finish close together: spin, then yield, then sleep.
  for (int i = 0; i < spin && finished().load(std::memory_order_relaxed) < n; ++i) CpuRelax();
  if (yield_ns > 0) {
    const auto until = Clock::now() + std::chrono::nanoseconds(yield_ns);
    while (finished().load(std::memory_order_relaxed) < n && Clock::now() < until) {
      std::this_thread::yield();
    }
  }
  uint32_t cur;
  auto checked = Clock::now();
  while ((cur = finished().load(std::memory_order_seq_cst)) < n) {
    const auto now = Clock::now();
    if (peers_gone != nullptr && now - checked >= std::chrono::milliseconds(100)) {
      checked = now;
      const std::string gone = peers_gone(*this);
      if (!gone.empty()) {
        if (failed().load(std::memory_order_seq_cst) != 0) return FailStatus();
        return Status::DeadlineExceeded("jax_blink: " + std::to_string(n - cur) + " of " +
                                        std::to_string(n) + " ranks never finished: " + gone);
      }
    }
    if (now >= limit) {
      std::ostringstream os;
      os << "jax_blink: " << (n - cur) << " of " << n
         << " ranks were still executing the collective long after its timeout; "
            "their buffers may still be in use";
      return Status::DeadlineExceeded(os.str());
    }
    FutexWait(&finished(), cur,
              std::min<int64_t>(
                  10000000, std::chrono::duration_cast<std::chrono::nanoseconds>(limit - now)
                                .count()),
              ext_failure_ != nullptr);
  }
  if (failed().load(std::memory_order_seq_cst) != 0) return FailStatus();
  return Status();
}

// ---- Rendezvous
// --------------------------------------------------------------

struct Rendezvous::Entry {
  int64_t nranks = 0;
  std::vector<int64_t> gen;  // next generation of each rank
  std::vector<std::pair<int64_t, std::unique_ptr<Slot>>> active;
  std::vector<std::pair<int64_t, std::string>> tombstones;
  int64_t reserved = 0;  // generations Reserve()d and not yet joined
};

struct Rendezvous::Impl {
  std::unordered_map<RendezvousKey, Entry, KeyHash> entries;
  std::vector<std::unique_ptr<Slot>> pool;
  int64_t tombstone_entries = 0;  // entries holding at least one tombstone
};

namespace {
constexpr size_t kMaxPooledSlots = 64;
constexpr int64_t kMaxTombstoneEntries = 1024;
}  // namespace

size_t Rendezvous::KeyHash::operator()(const RendezvousKey& k) const {
  uint64_t h = static_cast<uint64_t>(k.run_id) * 0x9E3779B97F4A7C15ull;
  h ^= static_cast<uint64_t>(k.op_id) + 0x632BE59BD9B4E019ull + (h << 6) +
       (h >> 2);
  h ^= static_cast<uint64_t>(k.group) + 0x85EBCA77C2B2AE63ull + (h << 6) +
       (h >> 2);
  return static_cast<size_t>(h);
}

Rendezvous::Rendezvous() : impl_(new Impl) {}

Rendezvous& Rendezvous::Global() {
  // Leaked on purpose: device threads may still be leaving at exit.
  static Rendezvous* r = new Rendezvous();
  return *r;
}

std::unique_ptr<Slot> Rendezvous::AcquireSlotLocked(int64_t nranks,
                                                    int64_t total_steps) {
  std::unique_ptr<Slot> slot;
  if (!impl_->pool.empty()) {
    slot = std::move(impl_->pool.back());
    impl_->pool.pop_back();
  } else {
    slot = std::make_unique<Slot>();
  }
  slot->Reset(nranks, total_steps);
  return slot;
}

void Rendezvous::ReleaseSlotLocked(std::unique_ptr<Slot> slot) {
  if (impl_->pool.size() < kMaxPooledSlots) {
    impl_->pool.push_back(std::move(slot));
  }
}

void Rendezvous::MaybeEraseLocked(const RendezvousKey& key) {
  auto it = impl_->entries.find(key);
  if (it == impl_->entries.end()) return;
  Entry& e = it->second;
  const int64_t lo = *std::min_element(e.gen.begin(), e.gen.end());
  const int64_t hi = *std::max_element(e.gen.begin(), e.gen.end());
  if (!e.tombstones.empty()) {
    // Every rank went past these generations: nobody can arrive late.
    e.tombstones.erase(
        std::remove_if(e.tombstones.begin(), e.tombstones.end(),
                       [lo](const auto& t) { return t.first < lo; }),
        e.tombstones.end());
    if (e.tombstones.empty()) --impl_->tombstone_entries;
  }
  if (e.active.empty() && e.tombstones.empty() && e.reserved == 0 && lo == hi) {
    impl_->entries.erase(it);
  }
}

void Rendezvous::EvictTombstonesLocked() {
  // Ranks that never arrive leave their entries behind; bound their number.
  for (auto it = impl_->entries.begin(); it != impl_->entries.end();) {
    if (it->second.active.empty() && it->second.reserved == 0 && !it->second.tombstones.empty()) {
      --impl_->tombstone_entries;
      it = impl_->entries.erase(it);
    } else {
      ++it;
    }
  }
}

Status Rendezvous::EntryLocked(const RendezvousKey& key, int64_t rank, int64_t nranks,
                               Entry** entry) {
  auto [it, inserted] = impl_->entries.try_emplace(key);
  Entry& e = it->second;
  if (inserted) {
    e.nranks = nranks;
    e.gen.assign(nranks, 0);
  }
  if (e.nranks != nranks || rank < 0 || rank >= nranks) {
    std::ostringstream os;
    os << "jax_blink: op_id=" << key.op_id << " group=" << key.group
       << ": rank " << rank << " expects " << nranks
       << " ranks but other ranks of this op expect " << e.nranks
       << " (the ranks run different schedules)";
    MaybeEraseLocked(key);
    return Status::InvalidArgument(os.str());
  }
  *entry = &e;
  return Status();
}

Status Rendezvous::Reserve(const RendezvousKey& key, int64_t rank, int64_t nranks,
                           int64_t* generation) {
  std::lock_guard<std::mutex> lk(mu_);
  Entry* e = nullptr;
  Status st = EntryLocked(key, rank, nranks, &e);
  if (!st.ok()) return st;
  *generation = e->gen[rank]++;
  ++e->reserved;
  return Status();
}

Status Rendezvous::Join(const RendezvousKey& key, int64_t rank, int64_t nranks,
                        RankInfo info, Clock::time_point deadline,
                        int64_t timeout_ms, Ticket* ticket, int spin,
                        int64_t yield_ns, int64_t generation, bool early) {
  *ticket = Ticket();
  ticket->key = key;
  ticket->rank = rank;
  std::unique_lock<std::mutex> lk(mu_);
  Entry* entry = nullptr;
  Status checked = EntryLocked(key, rank, nranks, &entry);
  if (!checked.ok()) return checked;
  Entry& e = *entry;
  int64_t gen = generation;
  if (gen < 0) {
    gen = e.gen[rank]++;
  } else {
    --e.reserved;
  }
  ticket->generation = gen;
  for (const auto& t : e.tombstones) {
    if (t.first == gen) {
      std::string msg = t.second + " (rank " + std::to_string(rank) +
                        " arrived after the deadline)";
      MaybeEraseLocked(key);
      return Status::DeadlineExceeded(msg);
    }
  }
  Slot* slot = nullptr;
  for (auto& a : e.active) {
    if (a.first == gen) slot = a.second.get();
  }
  if (slot == nullptr) {
    e.active.emplace_back(gen, AcquireSlotLocked(nranks, info.total_steps));
    slot = e.active.back().second.get();
  }
  if (!early && static_cast<int64_t>(slot->flag_cap_) < info.total_steps) {
    // Only possible when ranks disagree on the schedule; they will fail the
    // fingerprint check before touching the flags, but keep them in bounds.
    // (Early start: peers may be running on these flags; this rank checks
    // its schedule against the first rank's, which sized them, before it
    // touches any.)
    slot->flags_.reset(new std::atomic<uint32_t>[info.total_steps]);
    for (int64_t i = 0; i < info.total_steps; ++i) slot->flags_[i].store(0);
    slot->flag_cap_ = info.total_steps;
  }
  slot->info[rank] = std::move(info);
  slot->present_[rank] = 1;
  slot->arrival_[rank] = Clock::now();
  ++slot->arrived_;
  ticket->slot = slot;
  ticket->epoch = slot->epoch;
  if (early) slot->MarkArrived(rank);
  const bool last = slot->arrived_ == nranks;
  if (last) {
    RecordArrivals(slot->arrival_);
    slot->state().store(1, std::memory_order_release);
  }
  lk.unlock();
  if (last) FutexWakeAll(&slot->state());
  if (early) {
    slot->WakeAwaiting(rank);
    return Status();
  }
  return last ? Status() : AwaitAll(*ticket, deadline, timeout_ms, spin, yield_ns);
}

bool Slot::AwaitArrivals(Clock::time_point until, int spin, int64_t yield_ns) {
  // A short spin, yield (other device threads may need this core to
  // arrive), then sleep.
  for (int i = 0; i < spin && state().load(std::memory_order_acquire) == 0; ++i) CpuRelax();
  if (yield_ns > 0) {
    const auto stop = std::min(until, Clock::now() + std::chrono::nanoseconds(yield_ns));
    while (state().load(std::memory_order_acquire) == 0 && Clock::now() < stop) {
      std::this_thread::yield();
    }
  }
  while (state().load(std::memory_order_acquire) == 0) {
    const auto now = Clock::now();
    if (now >= until) return false;
    const int64_t left_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(until - now).count();
    FutexWait(&state(), 0, std::min<int64_t>(left_ns, 100000000), ext_failure_ != nullptr);
  }
  return true;
}

Status Rendezvous::AwaitAll(const Ticket& ticket, Clock::time_point deadline,
                            int64_t timeout_ms, int spin, int64_t yield_ns) {
  Slot* slot = ticket.slot;
  if (!slot->AwaitArrivals(deadline, spin, yield_ns)) return AbortMissing(ticket, timeout_ms);
  if (slot->state().load(std::memory_order_acquire) == 2) {
    return Status::DeadlineExceeded(slot->abort_message_);
  }
  return Status();
}

Status Rendezvous::AbortMissing(const Ticket& ticket, int64_t timeout_ms) {
  Slot* slot = ticket.slot;
  std::unique_lock<std::mutex> lk(mu_);
  const uint32_t state = slot->state().load(std::memory_order_acquire);
  if (state == 1) return Status();
  if (state == 2) return Status::DeadlineExceeded(slot->abort_message_);
  auto it = impl_->entries.find(ticket.key);  // (held by the slot, which is active)
  Entry& e = it->second;
  const int64_t nranks = slot->nranks;
  std::vector<int64_t> missing, arrived;
  for (int64_t r = 0; r < nranks; ++r) {
    (slot->present_[r] ? arrived : missing).push_back(r);
  }
  std::ostringstream os;
  os << "jax_blink: rendezvous timed out after " << timeout_ms
     << " ms: op_id=" << ticket.key.op_id << " group=" << ticket.key.group
     << " generation=" << ticket.generation << " (" << nranks << " ranks): rank(s) "
     << DescribeRanks(missing)
     << " never arrived (arrived: " << DescribeRanks(arrived)
     << "). A device may be stuck or running a different program, or "
        "XLA's CPU thread pool may be too small for the queued executions "
        "(set PJRT_NPROC to at least twice the process's devices before "
        "jax starts: jax_blink.settings.set_xla_cpu_threads).";
  slot->abort_message_ = os.str();
  if (e.tombstones.empty()) {
    if (++impl_->tombstone_entries > kMaxTombstoneEntries) {
      // Never evict the entry we are using right now (it has an active
      // slot), only abandoned ones.
      EvictTombstonesLocked();
    }
  }
  // `e` may have been rehashed away only by erase of other keys, which does
  // not invalidate references to this element.
  e.tombstones.emplace_back(ticket.generation, slot->abort_message_);
  const Status aborted = Status::DeadlineExceeded(slot->abort_message_);
  slot->FailAll(aborted);
  slot->state().store(2, std::memory_order_release);
  // The missing ranks will find the tombstone and never run: they count as
  // finished, so that the ranks that did arrive leave (Slot::Finish).
  const uint32_t n = static_cast<uint32_t>(nranks);
  const uint32_t done =
      slot->finished().fetch_add(static_cast<uint32_t>(missing.size()), std::memory_order_seq_cst) +
      static_cast<uint32_t>(missing.size());
  lk.unlock();
  FutexWakeAll(&slot->state());
  if (done == n) FutexWakeAll(&slot->finished());
  return aborted;
}

void Rendezvous::Leave(Ticket* ticket) {
  if (ticket->slot == nullptr) return;
  std::lock_guard<std::mutex> lk(mu_);
  auto it = impl_->entries.find(ticket->key);
  if (it != impl_->entries.end()) {
    Entry& e = it->second;
    Slot* slot = ticket->slot;
    ++slot->left_;
    if (slot->left_ == slot->arrived_ &&
        slot->state().load(std::memory_order_acquire) != 0) {
      for (size_t i = 0; i < e.active.size(); ++i) {
        if (e.active[i].second.get() == slot) {
          std::unique_ptr<Slot> owned = std::move(e.active[i].second);
          e.active.erase(e.active.begin() + i);
          ReleaseSlotLocked(std::move(owned));
          break;
        }
      }
    }
    MaybeEraseLocked(ticket->key);
  }
  ticket->slot = nullptr;
}

namespace {

// Per rank count: the last kLatenessWindow calls' lateness (ns per rank) and
// their running sums.
struct LatenessWindow {
  std::deque<std::vector<double>> calls;
  std::vector<double> sum;
};
std::mutex lateness_mu;
std::map<int64_t, LatenessWindow>& LatenessTable() {
  static auto* t = new std::map<int64_t, LatenessWindow>();  // leaked: threads may record at exit
  return *t;
}

}  // namespace

void RecordArrivals(const std::vector<Clock::time_point>& arrivals) {
  if (arrivals.empty()) return;
  const Clock::time_point first = *std::min_element(arrivals.begin(), arrivals.end());
  const size_t n = arrivals.size();
  std::lock_guard<std::mutex> lk(lateness_mu);
  LatenessWindow& w = LatenessTable()[static_cast<int64_t>(n)];
  if (w.sum.empty()) w.sum.assign(n, 0.0);
  std::vector<double> late;
  if (static_cast<int64_t>(w.calls.size()) == kLatenessWindow) {  // the oldest call leaves
    late = std::move(w.calls.front());
    w.calls.pop_front();
    for (size_t r = 0; r < n; ++r) w.sum[r] -= late[r];
  } else {
    late.resize(n);
  }
  for (size_t r = 0; r < n; ++r) {
    late[r] = static_cast<double>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(arrivals[r] - first).count());
    w.sum[r] += late[r];
  }
  w.calls.push_back(std::move(late));
}

std::vector<LatenessSummary> ArrivalLateness(bool reset) {
  std::lock_guard<std::mutex> lk(lateness_mu);
  std::vector<LatenessSummary> out;
  for (const auto& [n, w] : LatenessTable()) {
    LatenessSummary s;
    s.nranks = n;
    s.calls = static_cast<int64_t>(w.calls.size());
    s.mean_ns.assign(n, 0.0);
    s.max_ns.assign(n, 0.0);
    for (const std::vector<double>& call : w.calls) {
      for (int64_t r = 0; r < n; ++r) s.max_ns[r] = std::max(s.max_ns[r], call[r]);
    }
    for (int64_t r = 0; r < n && s.calls > 0; ++r) s.mean_ns[r] = w.sum[r] / s.calls;
    out.push_back(std::move(s));
  }
  if (reset) LatenessTable().clear();
  return out;
}

RendezvousStats Rendezvous::Stats() {
  std::lock_guard<std::mutex> lk(mu_);
  RendezvousStats s;
  s.entries = static_cast<int64_t>(impl_->entries.size());
  s.pooled_slots = static_cast<int64_t>(impl_->pool.size());
  for (const auto& kv : impl_->entries) {
    s.active_slots += static_cast<int64_t>(kv.second.active.size());
    s.tombstones += static_cast<int64_t>(kv.second.tombstones.size());
  }
  return s;
}

}  // namespace jax_blink
