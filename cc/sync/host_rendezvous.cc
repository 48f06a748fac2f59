// The host transport's rendezvous; see host_rendezvous.h.
#include "sync/host_rendezvous.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <tuple>
#include <unordered_map>

#if defined(__linux__)
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "sync/join.h"

namespace jax_blink {
namespace {

// What a rank publishes, as its peers read it (offsets into its process's
// arena, since every process maps the arenas at its own addresses).
struct HostRankInfo {
  int32_t process = -1;
  int32_t error_kind = 0;
  int64_t in_off = 0;
  int64_t acc_off = 0;
  int64_t count = 0;
  int32_t dtype = -1;
  int32_t nsegs = 0;  // a segmented call's buffers (HostRankArgs::nsegs)
  int64_t nranks = 0;
  int64_t total_steps = 0;
  uint64_t fingerprint = 0;
  uint64_t local_in = 0;  // the input as its own process sees it (0: read the copy)
  uint64_t local_out = 0;  // the output as its own process sees it
  // a segmented call's buffer table, as its own process sees it
  uint64_t local_seg_offset = 0;
  uint64_t local_in_segs = 0;
  uint64_t local_out_segs = 0;
  char error[176] = {};
};
static_assert(sizeof(HostRankInfo) == 280, "HostRankInfo layout");

// A rank's opaque blob (HostRankArgs::blob).
struct HostBlob {
  int64_t bytes = 0;
  char data[kHostBlobBytes] = {};
};

// The shared part of one host slot.
struct alignas(64) HostEntry {
  std::atomic<uint32_t> lock;  // guards the fields up to `info`
  uint32_t busy;               // in use by the call (site, group, generation)
  uint32_t epoch;              // flags hold 2*epoch (claimed) or 2*epoch+1 (done)
  uint32_t nranks;
  int64_t site;
  int64_t group;
  int64_t generation;
  uint32_t arrived;
  uint32_t left;
  uint8_t present[kHostMaxRanks];
  int64_t arrival_ns[kHostMaxRanks];  // when each rank joined (steady clock: one per host)
  char abort_message[1024];
  SlotWords words;
  SharedFailure failure;
  HostRankInfo info[kHostMaxRanks];
  HostBlob blobs[kHostMaxRanks];
  Bell bells[kHostMaxRanks];
};

constexpr int64_t kPage = 4096;
constexpr int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
constexpr int64_t kEntryBytes = RoundUp(sizeof(HostEntry), kPage);
constexpr int64_t kFlagsOffset = RoundUp(kHostEntries * kEntryBytes, kPage);
constexpr int64_t kFlagBytes = kHostMaxSteps * 4;
constexpr int64_t kStagingOffset = RoundUp(kFlagsOffset + kHostEntries * kFlagBytes, int64_t{1} << 21);
// The arena is sparse: only the pages a process touches take memory.
constexpr int64_t kStagingBytes = int64_t{64} << 30;
constexpr int64_t kArenaBytes = kStagingOffset + kStagingBytes;
constexpr uint64_t kMagic = 0x6a61785f626c6e6bull;  // "jax_blnk"
constexpr unsigned kMfdCloexec = 1;  // MFD_CLOEXEC (linux/memfd.h)
// The first bytes of the staging region of slot 0's arena hold kMagic.

struct HostState {
  std::mutex mu;
  int self_fd = -1;
  char* self_base = nullptr;
  bool attached = false;
  int64_t slot = -1;
  std::vector<HostProcess> processes;
  std::vector<char*> bases;  // each process's arena as mapped here
  // Staging buffers of this process's arena: free ones by size, and the
  // first byte never handed out.
  std::multimap<int64_t, int64_t> free_buffers;  // bytes -> offset
  int64_t next = kStagingOffset + 64;
  std::map<std::tuple<int64_t, int64_t, int64_t>, int64_t> generations;
};

HostState& State() {
  static HostState* s = new HostState();  // leaked: workers may still run at exit
  return *s;
}

HostEntry* EntryAt(int64_t i) {
  return reinterpret_cast<HostEntry*>(State().bases[0] + i * kEntryBytes);
}
std::atomic<uint32_t>* FlagsOf(int64_t i) {
  return reinterpret_cast<std::atomic<uint32_t>*>(State().bases[0] + kFlagsOffset +
                                                  i * kFlagBytes);
}

Status MapArena(int fd, char** base, const std::string& what) {
#if defined(__linux__)
  void* p = mmap(nullptr, kArenaBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  if (p == MAP_FAILED) {
    return Status::Internal("jax_blink host transport: cannot map " + what + ": " +
                            std::strerror(errno));
  }
  *base = static_cast<char*>(p);
  return Status();
#else
  (void)fd;
  (void)base;
  return Status::Internal("jax_blink host transport: " + what + ": needs Linux");
#endif
}

// Gone, or a zombie its parent has not reaped yet (kill() still reaches a
// zombie, so its state in /proc/<pid>/stat decides).
bool ProcessExited(int64_t pid) {
#if defined(__linux__)
  if (kill(static_cast<pid_t>(pid), 0) != 0) return errno == ESRCH;
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (f == nullptr) return true;
  char buf[512];
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* paren = std::strrchr(buf, ')');  // the name may hold spaces and parentheses
  return paren != nullptr && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
#else
  (void)pid;
  return false;
#endif
}

// "; process 1 of this host (pid 123) has exited" for each exited process
// among `processes` (all of the host's when empty).
std::string ExitedText(const std::vector<int>& processes = {}) {
  HostState& st = State();
  std::ostringstream os;
  for (size_t p = 0; p < st.processes.size(); ++p) {
    const bool asked = processes.empty() ||
                       std::find(processes.begin(), processes.end(), static_cast<int>(p)) !=
                           processes.end();
    if (asked && static_cast<int64_t>(p) != st.slot && ProcessExited(st.processes[p].pid)) {
      os << "; process " << p << " of this host (pid " << st.processes[p].pid << ") has exited";
    }
  }
  return os.str();
}

// Slot::peers_gone of a host slot: ExitedText() of its ranks' processes,
// without the leading "; ".
std::string PeersGone(const Slot& slot) {
  std::vector<int> processes;
  for (int64_t r = 0; r < slot.nranks; ++r) {
    if (slot.info[r].process < 0) {  // not mapped yet (early start): any of the host's
      processes.clear();
      break;
    }
    processes.push_back(slot.info[r].process);
  }
  const std::string text = ExitedText(processes);
  return text.empty() ? text : text.substr(2);
}

void MapRank(HostTicket* ticket, int64_t r);

// The entry lock: held for a few stores only, so spin, then yield.
bool LockEntry(HostEntry* e, Clock::time_point deadline) {
  for (int i = 0;; ++i) {
    uint32_t expected = 0;
    if (e->lock.compare_exchange_weak(expected, 1, std::memory_order_acquire)) return true;
    if (i > 64) {
      if ((i & 1023) == 0 && Clock::now() >= deadline) return false;
      std::this_thread::yield();
    } else {
      CpuRelax();
    }
  }
}
void UnlockEntry(HostEntry* e) { e->lock.store(0, std::memory_order_release); }

int64_t AcquireStaging(int64_t bytes) {
  HostState& st = State();
  std::lock_guard<std::mutex> lk(st.mu);
  auto it = st.free_buffers.find(bytes);
  if (it != st.free_buffers.end()) {
    const int64_t off = it->second;
    st.free_buffers.erase(it);
    return off;
  }
  if (st.next + bytes > kArenaBytes) return -1;
  const int64_t off = st.next;
  st.next += bytes;
  return off;
}

void ReleaseStaging(int64_t off, int64_t bytes) {
  HostState& st = State();
  std::lock_guard<std::mutex> lk(st.mu);
  st.free_buffers.emplace(bytes, off);
}

uint64_t Mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  return h * 0xBF58476D1CE4E5B9ull;
}

// Prepares a free entry for a call (under its lock).
void ClaimEntry(HostEntry* e, int64_t index, const HostRankArgs& a, int64_t generation) {
  e->busy = 1;
  e->site = a.site;
  e->group = a.group;
  e->generation = generation;
  e->nranks = static_cast<uint32_t>(a.nranks);
  if (++e->epoch >= (uint32_t{1} << 31)) {  // wrapped: old flags could alias
    std::memset(static_cast<void*>(FlagsOf(index)), 0, kFlagBytes);
    for (Bell& b : e->bells) b.arrived.store(0, std::memory_order_relaxed);
    e->epoch = 1;
  }
  e->arrived = 0;
  e->left = 0;
  std::memset(e->present, 0, sizeof(e->present));
  e->abort_message[0] = '\0';
  e->words.state.store(0, std::memory_order_relaxed);
  e->words.failed.store(0, std::memory_order_relaxed);
  e->words.finished.store(0, std::memory_order_relaxed);
  e->failure.ready.store(0, std::memory_order_relaxed);
  for (int64_t r = 0; r < a.nranks; ++r) {
    e->bells[r].shared = 1;
    e->bells[r].ResetFilters();
  }
}

}  // namespace

Status HostArena(HostProcess* self) {
  HostState& st = State();
  std::lock_guard<std::mutex> lk(st.mu);
#if defined(__linux__)
  if (st.self_fd < 0) {
    // close-on-exec: a program this process starts must not keep the arena alive
    const int fd = static_cast<int>(syscall(SYS_memfd_create, "jax_blink_arena", kMfdCloexec));
    if (fd < 0) {
      return Status::Internal(std::string("jax_blink host transport: memfd_create failed: ") +
                              std::strerror(errno));
    }
    if (ftruncate(fd, kArenaBytes) != 0) {
      const std::string why = std::strerror(errno);
      close(fd);
      return Status::Internal("jax_blink host transport: cannot size the arena: " + why);
    }
    char* base = nullptr;
    Status mapped = MapArena(fd, &base, "this process's arena");
    if (!mapped.ok()) {
      close(fd);
      return mapped;
    }
    std::memcpy(base + kStagingOffset, &kMagic, sizeof(kMagic));
    st.self_fd = fd;
    st.self_base = base;
  }
  self->pid = getpid();
  self->fd = st.self_fd;
  return Status();
#else
  (void)self;
  return Status::Internal("jax_blink host transport: needs Linux");
#endif
}

Status HostAttach(int64_t slot, const std::vector<HostProcess>& processes) {
  HostProcess self;
  Status made = HostArena(&self);
  if (!made.ok()) return made;
  HostState& st = State();
  std::lock_guard<std::mutex> lk(st.mu);
  if (st.attached) {
    bool same = st.slot == slot && st.processes.size() == processes.size();
    for (size_t p = 0; same && p < processes.size(); ++p) {
      same = processes[p].pid == st.processes[p].pid && processes[p].fd == st.processes[p].fd;
    }
    return same ? Status()
                : Status::InvalidArgument(
                      "jax_blink host transport: already attached to other processes");
  }
  if (slot < 0 || slot >= static_cast<int64_t>(processes.size()) ||
      processes[slot].pid != self.pid || processes[slot].fd != self.fd) {
    return Status::InvalidArgument(
        "jax_blink host transport: this process is not processes[slot]");
  }
  std::vector<char*> bases(processes.size(), nullptr);
  auto unmap = [&] {
#if defined(__linux__)
    for (size_t p = 0; p < bases.size(); ++p) {
      if (bases[p] != nullptr && static_cast<int64_t>(p) != slot) munmap(bases[p], kArenaBytes);
    }
#endif
  };
  for (size_t p = 0; p < processes.size(); ++p) {
    if (static_cast<int64_t>(p) == slot) {
      bases[p] = st.self_base;
      continue;
    }
#if defined(__linux__)
    const std::string path = "/proc/" + std::to_string(processes[p].pid) + "/fd/" +
                             std::to_string(processes[p].fd);
    const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      const std::string why = std::strerror(errno);
      unmap();
      return Status::Internal("jax_blink host transport: cannot open the arena of process " +
                              std::to_string(p) + " of this host (" + path + "): " + why);
    }
    struct stat info;
    if (fstat(fd, &info) != 0 || info.st_size != kArenaBytes) {  // mapping it would fault
      close(fd);
      unmap();
      return Status::Internal("jax_blink host transport: " + path +
                              " is not a jax_blink arena (the process list is stale)");
    }
    Status mapped = MapArena(fd, &bases[p], "the arena of process " + std::to_string(p));
    close(fd);  // the mapping keeps the memory file
    if (!mapped.ok()) {
      unmap();
      return mapped;
    }
    uint64_t magic = 0;
    std::memcpy(&magic, bases[p] + kStagingOffset, sizeof(magic));
    if (magic != kMagic) {
      unmap();
      return Status::Internal("jax_blink host transport: " + path +
                              " is not a jax_blink arena (the process list is stale)");
    }
#endif
  }
  st.slot = slot;
  st.processes = processes;
  st.bases = std::move(bases);
  st.attached = true;
  return Status();
}

bool HostAttached() {
  HostState& st = State();
  std::lock_guard<std::mutex> lk(st.mu);
  return st.attached;
}

int64_t HostReserve(int64_t site, int64_t group, int64_t rank) {
  HostState& st = State();
  std::lock_guard<std::mutex> lk(st.mu);
  return st.generations[{site, group, rank}]++;
}

Status HostJoin(const HostRankArgs& a, int64_t generation, Clock::time_point deadline,
                int64_t timeout_ms, HostTicket* ticket, bool early) {
  HostState& st = State();
  if (!HostAttached()) {
    return Status::Internal(
        "jax_blink host transport: this process is not attached to its host's processes "
        "(the call was lowered for the host transport in another process state)");
  }
  std::ostringstream where;
  where << CallSiteText(a.op_id, a.group, generation);
  if (a.nranks > kHostMaxRanks || a.total_steps > kHostMaxSteps) {
    return Status::InvalidArgument(
        "jax_blink host transport (" + where.str() + "): the schedule has " +
        std::to_string(a.nranks) + " ranks and " + std::to_string(a.total_steps) +
        " steps; the host transport takes at most " + std::to_string(kHostMaxRanks) +
        " ranks and " + std::to_string(kHostMaxSteps) +
        " steps (use fewer chunks: chunks= or JAX_BLINK_CHUNKS)");
  }
  ticket->rank = a.rank;
  ticket->generation = generation;
  // This rank's staging: its input's copy, then its accumulator.
  const int64_t in_bytes = RoundUp(a.in_bytes, 64);
  const int64_t bytes = RoundUp(in_bytes + a.acc_bytes, kPage);
  const int64_t off = a.error.ok() ? AcquireStaging(bytes) : -1;
  Status local = a.error;
  const bool blob_fits = a.blob_bytes >= 0 && a.blob_bytes <= kHostBlobBytes &&
                         (a.blob_bytes == 0 || a.blob != nullptr);
  if (local.ok() && !blob_fits) {  // still joins, so that its peers fail at once
    local = Status::InvalidArgument("jax_blink host transport: rank " + std::to_string(a.rank) +
                                    " publishes " + std::to_string(a.blob_bytes) +
                                    " bytes for its peers; at most " +
                                    std::to_string(kHostBlobBytes) + " fit");
  }
  if (local.ok() && off < 0) {
    local = Status::Internal("jax_blink host transport: " + std::to_string(bytes) +
                             " bytes do not fit in the rest of this process's " +
                             std::to_string(kStagingBytes >> 30) + " GiB staging arena");
  }
  if (off >= 0) {
    ticket->staging = st.self_base + off;
    ticket->staging_bytes = bytes;
    if (a.stage_input && a.in_bytes > 0) std::memcpy(ticket->staging, a.in, a.in_bytes);
  }
  const uint64_t h = Mix(Mix(Mix(0, a.site), a.group), generation);
  const int64_t index = static_cast<int64_t>(h % kHostEntries);
  HostEntry* e = EntryAt(index);
  // Find the entry free or holding this call.
  for (int spins = 0;; ++spins) {
    if (!LockEntry(e, deadline)) {
      return Status::DeadlineExceeded("jax_blink host transport (" + where.str() +
                                      "): the slot table stayed locked" + ExitedText());
    }
    if (!e->busy) ClaimEntry(e, index, a, generation);
    if (e->site == a.site && e->group == a.group && e->generation == generation) break;
    UnlockEntry(e);
    if (Clock::now() >= deadline) {
      return Status::DeadlineExceeded(
          "jax_blink host transport (" + where.str() + "): its slot stayed busy with another "
          "call (generation " + std::to_string(e->generation) + ") for " +
          std::to_string(timeout_ms) + " ms" + ExitedText());
    }
    if (spins < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  ticket->entry = index;
  if (e->nranks != static_cast<uint32_t>(a.nranks)) {
    const uint32_t theirs = e->nranks;
    ++e->arrived;  // leaves like an arrived rank
    e->present[a.rank < kHostMaxRanks ? a.rank : 0] = 1;
    UnlockEntry(e);
    return Status::InvalidArgument(
        "jax_blink host transport (" + where.str() + "): rank " + std::to_string(a.rank) +
        " expects " + std::to_string(a.nranks) + " ranks but other ranks expect " +
        std::to_string(theirs) + " (the processes run different schedules)");
  }
  HostRankInfo& mine = e->info[a.rank];
  mine.process = static_cast<int32_t>(st.slot);
  mine.error_kind = static_cast<int32_t>(local.kind);
  std::snprintf(mine.error, sizeof(mine.error), "%s", local.message.c_str());
  mine.in_off = off;
  mine.acc_off = off < 0 ? -1 : off + in_bytes;
  mine.count = a.count;
  mine.dtype = a.dtype;
  mine.nranks = a.nranks;
  mine.total_steps = a.total_steps;
  mine.fingerprint = a.fingerprint;
  mine.local_in = a.stage_input ? 0 : reinterpret_cast<uint64_t>(a.in);
  mine.local_out = reinterpret_cast<uint64_t>(a.out);
  mine.nsegs = a.nsegs;
  mine.local_seg_offset = reinterpret_cast<uint64_t>(a.seg_offset);
  mine.local_in_segs = reinterpret_cast<uint64_t>(a.in_segs);
  mine.local_out_segs = reinterpret_cast<uint64_t>(a.out_segs);
  e->blobs[a.rank].bytes = blob_fits ? a.blob_bytes : 0;
  if (blob_fits && a.blob_bytes > 0) std::memcpy(e->blobs[a.rank].data, a.blob, a.blob_bytes);
  e->arrival_ns[a.rank] = std::chrono::duration_cast<std::chrono::nanoseconds>(
                              Clock::now().time_since_epoch()).count();
  e->present[a.rank] = 1;
  ++e->arrived;
  const uint32_t epoch = e->epoch;
  std::atomic<uint32_t>& state = e->words.state;
  if (state.load(std::memory_order_acquire) == 2) {
    std::string msg = std::string(e->abort_message) + " (rank " + std::to_string(a.rank) +
                      " arrived after the deadline)";
    UnlockEntry(e);
    return Status::DeadlineExceeded(msg);
  }
  if (early) e->bells[a.rank].arrived.store(epoch, std::memory_order_seq_cst);  // Slot::MarkArrived
  const bool last = e->arrived == e->nranks;
  if (last) state.store(1, std::memory_order_release);
  UnlockEntry(e);
  if (last) FutexWakeAll(&state, true);
  // The executor's view: peers' buffers as mapped in this process.
  ticket->where = where.str();
  ticket->mapped.assign(a.nranks, 0);
  ticket->blobs.assign(a.nranks, std::string());
  Slot& v = ticket->view;
  v.AttachShared(a.nranks, epoch, FlagsOf(index), e->bells, &e->words, &e->failure);
  v.peers_gone = &PeersGone;
  if (!early) return HostAwaitAll(ticket, deadline, timeout_ms);
  MapRank(ticket, a.rank);
  v.WakeAwaiting(a.rank);
  return Status();
}

namespace {
// Fills the view's info[r] and blobs[r] from what rank r published.
void MapRank(HostTicket* ticket, int64_t r) {
  HostState& st = State();
  HostEntry* e = EntryAt(ticket->entry);
  const HostBlob& b = e->blobs[r];
  ticket->blobs[r].assign(b.data, static_cast<size_t>(std::clamp<int64_t>(b.bytes, 0, kHostBlobBytes)));
  const HostRankInfo& hi = e->info[r];
  RankInfo& ri = ticket->view.info[r];
  const bool mapped = hi.process >= 0 && hi.process < static_cast<int32_t>(st.bases.size()) &&
                      hi.in_off >= 0;
  char* base = mapped ? st.bases[hi.process] : nullptr;
  ri.in = mapped ? base + hi.in_off : nullptr;
  if (hi.process == st.slot && hi.local_in != 0) {  // a rank of this process
    ri.in = reinterpret_cast<const void*>(hi.local_in);
  }
  ri.acc = mapped ? base + hi.acc_off : nullptr;
  ri.acc_out = nullptr;
  // the output of a rank of another process is not visible here, nor are its
  // segments: its input is read from the arena's copy, one buffer
  const bool local = hi.process == st.slot;
  ri.out = local ? reinterpret_cast<void*>(hi.local_out) : nullptr;
  ri.nsegs = local ? hi.nsegs : 0;
  ri.seg_offset = local ? reinterpret_cast<const int64_t*>(hi.local_seg_offset) : nullptr;
  ri.in_segs = local ? reinterpret_cast<const void* const*>(hi.local_in_segs) : nullptr;
  ri.out_segs = local ? reinterpret_cast<void* const*>(hi.local_out_segs) : nullptr;
  ri.acc_segs = false;  // the accumulator lives in the arena
  ri.count = hi.count;
  ri.dtype = hi.dtype;
  ri.nranks = hi.nranks;
  ri.total_steps = hi.total_steps;
  ri.fingerprint = hi.fingerprint;
  ri.error = Status{static_cast<ErrorKind>(hi.error_kind), hi.error};
  ri.process = hi.process;
  ticket->mapped[r] = 1;
}
}  // namespace

bool HostArrived(HostTicket* ticket, int64_t r) {
  if (ticket->mapped[r]) return true;
  if (!ticket->view.Arrived(r)) return false;
  MapRank(ticket, r);
  return true;
}

Status HostAwaitAll(HostTicket* ticket, Clock::time_point deadline, int64_t timeout_ms) {
  HostEntry* e = EntryAt(ticket->entry);
  std::atomic<uint32_t>& state = e->words.state;
  auto checked = Clock::now();
  while (state.load(std::memory_order_acquire) == 0) {
    const auto now = Clock::now();
    // A process of the host that exited will not send its ranks: give up at
    // once (its job cannot go on) rather than at the deadline.
    if (now - checked >= std::chrono::milliseconds(100)) {
      checked = now;
      if (!ExitedText().empty()) break;
    }
    if (now >= deadline) break;
    const int64_t left_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now).count();
    FutexWait(&state, 0, std::min<int64_t>(left_ns, 100000000), true);
  }
  Status st = HostAbortMissing(ticket, timeout_ms);
  if (!st.ok()) return st;
  for (int64_t r = 0; r < ticket->view.nranks; ++r) {
    if (!ticket->mapped[r]) MapRank(ticket, r);
  }
  return Status();
}

Status HostAbortMissing(HostTicket* ticket, int64_t timeout_ms) {
  HostEntry* e = EntryAt(ticket->entry);
  std::atomic<uint32_t>& state = e->words.state;
  if (state.load(std::memory_order_acquire) == 1) return Status();
  const auto now = Clock::now();
  if (state.load(std::memory_order_acquire) == 0 && LockEntry(e, now + std::chrono::seconds(1))) {
    if (state.load(std::memory_order_acquire) == 0) {
      const int64_t n = ticket->view.nranks;
      const std::string exited = ExitedText();
      std::vector<int64_t> missing, arrived;
      for (int64_t r = 0; r < n; ++r) (e->present[r] ? arrived : missing).push_back(r);
      std::ostringstream os;
      os << "jax_blink: host rendezvous "
         << (exited.empty() ? "timed out after " + std::to_string(timeout_ms) + " ms"
                            : std::string("given up"))
         << ": " << ticket->where << " (" << n
         << " ranks in the processes of this host): rank(s) " << DescribeRanks(missing)
         << " never arrived (arrived: " << DescribeRanks(arrived) << ")" << exited
         << ". A process may be stuck, have died, or be running a different program.";
      std::snprintf(e->abort_message, sizeof(e->abort_message), "%s", os.str().c_str());
      ticket->view.FailAll(Status::DeadlineExceeded(e->abort_message));
      state.store(2, std::memory_order_release);
      // The missing ranks will fail at once if they arrive: they count as
      // finished, so that the ranks that did arrive leave (Slot::Finish).
      const uint32_t done =
          e->words.finished.fetch_add(static_cast<uint32_t>(missing.size()),
                                      std::memory_order_seq_cst) +
          static_cast<uint32_t>(missing.size());
      UnlockEntry(e);
      FutexWakeAll(&state, true);
      if (done == static_cast<uint32_t>(n)) FutexWakeAll(&e->words.finished, true);
    } else {
      UnlockEntry(e);
    }
  }
  if (state.load(std::memory_order_acquire) == 1) return Status();
  return Status::DeadlineExceeded(e->abort_message[0] != '\0'
                                      ? std::string(e->abort_message)
                                      : "jax_blink host transport: rendezvous aborted");
}

void HostLeave(HostTicket* ticket) {
  if (ticket->entry >= 0) {
    HostEntry* e = EntryAt(ticket->entry);
    std::vector<Clock::time_point> arrivals;
    // A dead peer can only have held the lock for a few stores: wait long.
    if (LockEntry(e, Clock::now() + std::chrono::seconds(10))) {
      ++e->left;
      const uint32_t state = e->words.state.load(std::memory_order_acquire);
      // The first rank of each process records the call's arrivals for its
      // process's jax_blink.stats() (every rank of the call arrived).
      const int64_t n = e->nranks;
      int64_t first = 0;
      while (first < n && e->info[first].process != e->info[ticket->rank].process) ++first;
      if (state == 1 && first == ticket->rank) {
        for (int64_t r = 0; r < n; ++r) {
          arrivals.push_back(Clock::time_point(std::chrono::nanoseconds(e->arrival_ns[r])));
        }
      }
      if ((state == 1 && e->left == e->nranks) || (state != 1 && e->left == e->arrived)) {
        e->busy = 0;
      }
      UnlockEntry(e);
    }
    if (!arrivals.empty()) RecordArrivals(arrivals);
    ticket->entry = -1;
  }
  if (ticket->staging != nullptr) {
    ReleaseStaging(static_cast<char*>(ticket->staging) - State().self_base, ticket->staging_bytes);
    ticket->staging = nullptr;
  }
}

std::string HostExitedText() { return ExitedText(); }

}  // namespace jax_blink
