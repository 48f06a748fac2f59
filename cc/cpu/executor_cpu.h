// The CPU executor: runs one rank's steps of a schedule over shared memory.
//
// It is a pull model: a SEND only publishes "done" (the value stays where it
// is: the rank's input while the chunk is unwritten, else its accumulator);
// the matching RECV waits for that flag and reads the peer's memory
// directly. Value semantics are kept by waiting, before a chunk is
// overwritten, until the receivers of the earlier SENDs of that chunk have
// read it, and by waiting, before returning, until every receiver has read
// every SEND.
//
// The ranks meet in the in-process rendezvous (sync/rendezvous.h) and run
// their steps with core/step_tracker.h. There is no barrier: a rank starts
// as soon as it has published its buffers, and a step that reads from or
// writes into a peer waits for that peer alone to arrive and checks, once
// per peer, that the two agree (sync/join.h). A disagreement fails the call
// on every rank with the verdict the barrier gave (CheckConsistent once all
// have arrived); a rank that never arrives is named at the deadline.
#ifndef JAX_BLINK_CC_CPU_EXECUTOR_CPU_H_
#define JAX_BLINK_CC_CPU_EXECUTOR_CPU_H_

#include <cstdint>
#include <mutex>
#include <vector>

#include "core/schedule.h"
#include "core/status.h"

namespace jax_blink {

struct ExecArgs {
  const Schedule* schedule = nullptr;
  int64_t rank = -1;
  int64_t run_id = 0;
  int64_t op_id = 0;
  int64_t group = 0;
  const void* in = nullptr;   // schedule.in_count elements
  void* out = nullptr;        // schedule.out_count elements
  int64_t in_count = 0;   // elements in `in`
  int64_t out_count = 0;  // elements in `out`
  // The rank's workspace for the accumulator, 64-byte aligned: at least
  // CpuWorkspaceBytes() bytes (none needed when that is 0). Peers read it
  // until every rank's call returned.
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
  int32_t dtype = -1;  // dtype code of the buffers (-1: not a schedule dtype)
  int64_t timeout_ms = 60000;
  // An error found by the caller before joining (e.g. a buffer type that
  // does not fit the schedule). The rank still joins so that its peers fail
  // fast with the same error instead of timing out.
  Status local_error;
  // A segmented call (an allreduce whose vector is several buffers: the
  // leaves of one bucket, passed as separate operands instead of
  // concatenated): nsegs > 0 pairs of buffers, segment i holding elements
  // [seg_offset[i], seg_offset[i + 1]) of the vector in in_segs[i] and
  // out_segs[i] (seg_offset: nsegs + 1 increasing entries from 0 to the
  // count). `in` and `out` are then the first segment's buffers. In this
  // process the accumulator is the output segments (the workspace for a
  // dtype with a wider accumulator, as in a one-buffer call); over the host
  // transport it is where a one-buffer call's is (the arena, and the output
  // segments for the chunks only the rank's process reads). The arrays must
  // outlive the call; the segments of the ranks of one process must match.
  int32_t nsegs = 0;
  const int64_t* seg_offset = nullptr;
  const void* const* in_segs = nullptr;
  void* const* out_segs = nullptr;
  // The call's rendezvous generation when ReserveGeneration() took it on the
  // calling thread; -1: taken when the rank joins.
  int64_t generation = -1;
  // Where the ranks meet: kInProcess (every rank in this process), or
  // kHost (ranks in several processes of this host, sync/host_rendezvous.h:
  // the chunks that other processes read are copied into shared memory).
  int32_t transport = 0;
};

inline constexpr int32_t kTransportInProcess = 0;
inline constexpr int32_t kTransportHost = 1;

struct ExecResult {
  Status status;            // ok, or the error and its kind
  int64_t generation = -1;  // rendezvous generation of this call
};

// Runs rank args.rank of args.schedule; blocks until done or failed.
ExecResult ExecuteCpu(const ExecArgs& args);

// Takes the call's rendezvous generation (args->generation) on the calling
// thread, for an ExecuteCpu() on another thread: a rank's calls of one call
// site then pair with its peers' in the order the rank made them, whatever
// order the threads join in. Errors as ExecuteCpu's (a rank outside the
// schedule, ranks that disagree on their number).
Status ReserveGeneration(ExecArgs* args);

// Whether a call whose output aliases its input (`aliased`) runs in place:
// the one buffer is input, accumulator and output. Needs an accumulator of
// the buffer's type and size and a schedule that cannot deadlock when writes
// also wait for the readers of the input's values (Schedule::inplace_ok).
inline bool CpuInPlace(const Schedule& s, bool aliased) {
  return aliased && s.inplace_ok && !HasScratchAcc(s.dtype) && s.out_count == s.count;
}

// Bytes of workspace a call of `s` needs for its accumulator when it is not
// the output buffer: count elements of the accumulator type for f16/bf16
// (float32), when the input aliases the output and the call cannot run in
// place (peers still read the input), and for reduce_scatter (the output is
// one shard: it holds that shard of the accumulator, the workspace the
// chunks of other shards the rank reduces on their way); else 0. (A
// segmented call, ExecArgs::nsegs, is never aliased and accumulates in its
// output segments, or over the host transport in the arena.)
inline int64_t CpuWorkspaceBytes(const Schedule& s, bool aliased) {
  const bool separate = HasScratchAcc(s.dtype) ||
                        (aliased && !CpuInPlace(s, aliased)) || s.out_count != s.count;
  return separate ? s.count * static_cast<int64_t>(AccSize(s.dtype)) : 0;
}

// Workspaces of one size, reused across calls (the CPU FFI handler's state
// holds one per executable): Acquire hands out one no other call holds,
// allocating only when all are in use, so calls allocate nothing in the
// steady state. Thread-safe.
class WorkspacePool {
 public:
  explicit WorkspacePool(int64_t bytes) : bytes_(bytes) {}
  ~WorkspacePool();
  WorkspacePool(const WorkspacePool&) = delete;
  WorkspacePool& operator=(const WorkspacePool&) = delete;
  int64_t bytes() const { return bytes_; }
  // A 64-byte aligned buffer of bytes() bytes, or null when out of memory.
  void* Acquire();
  void Release(void* p);

 private:
  const int64_t bytes_;
  std::mutex mu_;
  std::vector<void*> free_;
  std::vector<void*> all_;
};

// Tunables of the waits and copies (the values of the module's configure(),
// cc/ffi/py_blink_ext.cc; these defaults until it is called).
struct ExecTunables {
  int spin = 0;               // busy-wait iterations before yielding
  int64_t yield_ns = 200000;  // then sched_yield for this long before sleeping
  // When the collective's vector has at least this many bytes, copies and
  // final reductions whose destination is the output and that no peer reads
  // afterwards bypass the cache (non-temporal stores, x86-64 only); they
  // save the read-for-ownership traffic of large outputs.
  int64_t nt_bytes = int64_t{1} << 20;
  // A rank that completes a chunk writes it straight into the accumulators
  // of receivers whose RECV_COPY is ready (claimed with a CAS on its flag).
  bool push = true;
  // Output buffers at least this large get madvise(MADV_HUGEPAGE) (0: never).
  int64_t hugepage_bytes = int64_t{2} << 20;
  // Every rank waits for all the others before any data moves, as before
  // early start: kept only to measure early start against it.
  bool barrier = false;
};
const ExecTunables& GetExecTunables();
// Replaces the tunables (not thread-safe against running collectives: call
// it before any runs).
void SetExecTunables(const ExecTunables& t);

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_CPU_EXECUTOR_CPU_H_
