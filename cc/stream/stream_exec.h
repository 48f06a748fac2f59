// Enqueueing a decoded schedule (core/schedule.h) on streams and events: the
// GPU executor's logic, independent of the runtime that carries it out.
//
// Two transports implement StreamTransport:
//   * CUDA (cuda/cuda_transport.cu): peer copies, reduction kernels, CUDA
//     events;
//   * the host emulator (testing/stream_emulator.cc): the same calls executed on host
//     memory in a random order that CUDA's rules allow, with a race checker
//     (happens-before over streams and events). It lets CI verify the event
//     ordering below without a GPU.
//
// Model (the CPU executor's semantics, cpu/executor_cpu.h, over another
// transport):
// a SEND does no work; the matching RECV runs on the receiver's stream for
// that link (one stream per link direction, so links run concurrently) and
// reads the sender's memory: directly when the receiver may read it (same
// device, or peer access), else through a staging copy next to the receiver.
// Consecutive RECV_REDUCEs of one chunk whose intermediate sums nothing else
// reads are fused into one kernel (dst = base + src1 + ... in step order, the
// CPU executor's summation order).
//
// Each rank enqueues its own work, on its own thread (in XLA: the device's
// handler), in the order of a StreamPlan computed once per schedule. A wait on
// a peer's event must be issued after the peer recorded it (CUDA binds a wait
// to the latest record at call time), so every rank publishes a progress
// counter, and a rank spins on the host until the peers it waits for have
// enqueued far enough (the plan's gates). The plan's order is a linear
// extension of the schedule's dependencies, so these gates cannot deadlock;
// the rendezvous at the start of each call keeps a call from recording events
// that a peer has not yet waited on in the previous one. Waits that stream
// order already implies are dropped when the plan is built, and an event is
// recorded only where some stream waits on it.
//
// At entry each rank's caller stream (XLA's) records `start`: a link stream
// waits on its rank's start and on the start of every peer whose memory it
// reads. At exit the caller stream waits for the last work of every stream
// that touches the rank's memory (its own link streams, and the peers' link
// streams that read it), so the caller may reuse the input and output as soon
// as its stream gets there. No call here synchronises with the device.
#ifndef JAX_BLINK_CC_STREAM_STREAM_EXEC_H_
#define JAX_BLINK_CC_STREAM_STREAM_EXEC_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/schedule.h"
#include "core/status.h"

namespace jax_blink {

using StreamId = int32_t;
using EventId = int32_t;

// One operand of a reduction: the buffer type T of the dtype (an input) or
// the accumulator type A (float32 for f16/bf16).
struct StreamOperand {
  const void* p = nullptr;
  bool is_input = false;
};

// The operations the executor needs from a stream-and-event runtime. Work
// calls are asynchronous and run in stream order. Wait(s, e) orders the later
// work of s after the work that preceded the most recent Record(e, .) issued
// before the Wait call (CUDA's rule; a never-recorded event is complete).
// Every call returns "" or an error message; none aborts. Implementations
// must allow concurrent calls from several threads (one per rank).
class StreamTransport {
 public:
  virtual ~StreamTransport() = default;

  // Resources.
  virtual std::string CreateStream(int device, StreamId* s) = 0;
  virtual std::string CreateEvent(int device, EventId* e) = 0;
  virtual void DestroyStream(StreamId s) = 0;
  virtual void DestroyEvent(EventId e) = 0;
  // Whether work on device `reader` may read memory of device `owner`
  // directly (same device, or peer access, which this enables on first use).
  virtual bool PeerReadable(int reader, int owner) = 0;

  // Ordering.
  virtual std::string Record(EventId e, StreamId s) = 0;
  virtual std::string Wait(StreamId s, EventId e) = 0;

  // Work. Pointers are device memory; `n` counts elements of dtype d.
  // Copies `bytes` from src (on src_device) to dst (on dst_device).
  virtual std::string Copy(StreamId s, void* dst, int dst_device,
                           const void* src, int src_device, size_t bytes) = 0;
  // dst[i] = op(...op(op(ops[0][i], ops[1][i]), ops[2][i])..., ops[nops-1][i]),
  // left to right in the accumulator type of d (float32 for f16/bf16) with
  // core/reduce_op.h's Combine (sums of integers wrap; a sum starting from
  // an input starts from +0); 2 <= nops <= kMaxFuse + 1. dst has type A;
  // ops[0] may equal dst (in place).
  virtual std::string Reduce(StreamId s, DType d, ReduceOp op, void* dst,
                             const StreamOperand* ops, int nops, int64_t n) = 0;
  // dst[i] = float32(src[i]) (d is f16 or bf16).
  virtual std::string ToAcc(StreamId s, DType d, void* dst, const void* src,
                            int64_t n) = 0;
  // out[i] = round-to-nearest-even(acc[i]) for f16/bf16; a copy otherwise
  // (nothing when out == acc).
  virtual std::string Finalize(StreamId s, DType d, void* out, const void* acc,
                               int64_t n) = 0;
};

// Fault injection for the race checker's own tests: each bit drops one
// class of waits from the plan, which must make the emulator report races.
// Never set outside tests.
enum StreamOmit : uint32_t {
  kOmitNone = 0,
  kOmitEntryWaits = 1u << 0,  // link streams waiting for the callers' inputs
  kOmitDepWaits = 1u << 1,    // a RECV waiting for the value it reads
  kOmitGuards = 1u << 2,      // a RECV waiting for earlier readers of a chunk
  kOmitExitWaits = 1u << 3,   // caller streams waiting for the link streams
};

// The order in which each rank enqueues its work, with the waits, events
// and host gates of every item. Built once per schedule (pure host code, no
// runtime calls); read-only afterwards, shared by all ranks.
struct StreamPlan {
  // A kernel operand or copy source at peer `peer`: its input (the schedule
  // said the value is still the input) or its accumulator.
  struct Src {
    int32_t peer = -1;
    bool input = false;
  };
  // Wait for event `event` of rank `owner` (an index into its events).
  struct WaitRef {
    int32_t owner = -1;
    int32_t event = -1;
  };
  // Before enqueueing, rank `owner` must have enqueued this much of the
  // call (progress counts: 1 once its start is recorded, k + 2 once its item
  // k is enqueued).
  struct Gate {
    int32_t owner = -1;
    int32_t progress = 0;
  };
  // One unit of work: a RECV_COPY, or one or more fused RECV_REDUCEs of a
  // chunk.
  struct Item {
    Op op = Op::kRecvCopy;
    int32_t link = -1;   // the peer whose link stream runs it
    int32_t chunk = -1;
    bool base_input = false;  // reduce: the base is the rank's input
    int32_t src_begin = 0, src_end = 0;    // into srcs, in summation order
    int32_t wait_begin = 0, wait_end = 0;  // into waits
    int32_t gate_begin = 0, gate_end = 0;  // into gates
    int32_t event = -1;  // recorded after it on its stream (-1: nobody waits)
  };
  // Elements [offset, offset + length) of the buffers.
  struct Span {
    int64_t offset = 0;
    int64_t length = 0;
  };
  static constexpr int32_t kStartEvent = 0;  // on the caller stream, at entry
  static constexpr int32_t kDoneEvent = 1;   // on the caller stream, at exit
  struct Rank {
    std::vector<Item> items;
    std::vector<Src> srcs;
    std::vector<WaitRef> waits;
    std::vector<Gate> gates;
    std::vector<int32_t> links;  // peers whose link streams have items
    // Exit: the caller stream's waits and their gates.
    std::vector<WaitRef> exit_waits;
    std::vector<Gate> exit_gates;
    // The chunks of the rank's output (all, or a reduce_scatter's shard)
    // some RECV writes here (merged runs; the output is the accumulator
    // rounded, or the accumulator itself) and the others (the output is the
    // input), in the accumulator's element offsets.
    std::vector<Span> written, unwritten;
    int32_t nevents = 2;  // start, done, then the items' events
    int64_t fused_steps = 0;  // RECV_REDUCEs that joined an earlier one
  };
  std::vector<Rank> ranks;
  uint32_t omit = kOmitNone;

  // Builds the plan of `s` (omit: StreamOmit bits, tests only). Returns ""
  // or an error (a schedule whose steps cannot be ordered).
  std::string Build(const Schedule& s, uint32_t omit = kOmitNone);
};

// One rank of a collective, as the caller hands it in.
struct StreamRank {
  int device = 0;             // device of the rank's buffers
  const void* in = nullptr;   // in_count elements of the schedule dtype
  void* out = nullptr;        // out_count elements; may equal `in`
  StreamId stream = -1;       // the caller's stream (e.g. XLA's)
};

// What a rank publishes to its peers for the duration of a call. Its address
// is stable (it lives in the rank's executor); the fields are written before
// `progress` reaches the call's base + 1, and read by peers only after they
// saw that (release/acquire).
struct StreamPeerView {
  std::atomic<uint64_t> progress{0};
  int device = -1;
  // The input as peers read it (a snapshot when aliased): in_count
  // elements, element 0 at the accumulator's Schedule::InputOffset(rank).
  const void* in = nullptr;
  void* acc = nullptr;       // the accumulator (the output, or scratch): count elements
  std::vector<EventId> events;  // StreamPlan::Rank::nevents events
};

// A peer as one call sees it: its view and its progress at the call's start
// (from the rendezvous). `progress`, when set, is where the peer's progress is
// read instead of view->progress: a peer in another process publishes it in
// shared memory (StreamPublish), and `view` is then this process's proxy of
// it (its buffers and events opened here).
struct StreamPeer {
  const StreamPeerView* view = nullptr;
  uint64_t base = 0;
  const std::atomic<uint64_t>* progress = nullptr;
};

// Where a rank also publishes its progress for peers in other processes:
// `at` gets base + the progress it stores in its view (see StreamPeer).
struct StreamPublish {
  std::atomic<uint64_t>* at = nullptr;
  uint64_t base = 0;
};

// Counters of a rank's last Enqueue (debug log, tests and benchmarks).
struct StreamExecStats {
  int64_t kernels = 0;  // Reduce/ToAcc/Finalize calls
  int64_t copies = 0;   // Copy calls
  int64_t waits = 0;    // Wait calls
  int64_t records = 0;  // Record calls
  int64_t staged_links = 0;   // peers whose reads go through staging
  int64_t workspace_bytes = 0;
  int64_t enqueue_ns = 0;  // host time of Enqueue
  int64_t gate_ns = 0;     // of which waiting for peers to enqueue
};

// Executes one rank's part of a collective, call after call: holds the
// rank's link streams and events (created on first use, destroyed with the
// executor) and its view. One executor per (call site, device); Enqueue
// calls on one executor must not overlap.
class StreamRankExecutor {
 public:
  explicit StreamRankExecutor(StreamTransport* transport);
  ~StreamRankExecutor();
  StreamRankExecutor(const StreamRankExecutor&) = delete;
  StreamRankExecutor& operator=(const StreamRankExecutor&) = delete;

  const StreamPeerView& view() const { return view_; }
  // The progress base of the next call (publish it at the rendezvous).
  uint64_t next_base() const { return view_.progress.load(std::memory_order_relaxed); }

  // Device memory the rank needs for one call: the accumulator when the
  // output cannot hold it (float32 for f16/bf16; count elements for a
  // reduce_scatter, whose output is one shard), a snapshot of the input when
  // the output aliases it, and staging for reads from peers with staged[p]
  // set.
  static size_t WorkspaceBytes(const Schedule& s, const StreamPlan& plan, int64_t rank,
                               const std::vector<uint8_t>& staged, bool alias);

  // What peers read of rank `me` in a call with `workspace` (the pointers
  // its view will hold): the input as peers read it (a snapshot in the
  // workspace when the output aliases the input) and the accumulator.
  static void PeerBuffers(const Schedule& s, const StreamRank& me, void* workspace,
                          const void** in, void** acc);

  // Creates the rank's link streams and events for `plan` on `device` (once;
  // Enqueue calls it too). After it, view().events are the events peers wait
  // on, which a rank exports to peers in other processes before the call.
  std::string Prepare(const StreamPlan& plan, int64_t rank, int device);

  // Enqueues rank `rank` of `s` on its streams (see the file comment).
  // peers[q] for every rank q (peers[rank] is this executor). staged[p]:
  // reads from peer p go through staging. workspace: WorkspaceBytes() bytes
  // on me.device (null when 0). Waits at most until `deadline` for peers to
  // enqueue (else DeadlineExceeded), and stops early when *failed becomes
  // non-zero. `publish`: also publish the progress there (peers in other
  // processes). Returns ok or an error (a transport's error is Internal);
  // never synchronises with the device.
  Status Enqueue(const Schedule& s, const StreamPlan& plan, int64_t rank,
                 const StreamRank& me, void* workspace,
                 const std::vector<StreamPeer>& peers,
                 const std::vector<uint8_t>& staged,
                 std::chrono::steady_clock::time_point deadline,
                 const std::atomic<uint32_t>* failed, StreamPublish publish = {});

  const StreamExecStats& stats() const { return stats_; }

 private:
  void Release();

  StreamTransport* tp_;
  StreamPeerView view_;
  const StreamPlan* plan_ = nullptr;  // what the streams and events are for
  int64_t rank_ = -1;
  std::vector<StreamId> link_;  // [peer]
  StreamId last_caller_ = -1;
  StreamExecStats stats_;
};

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_STREAM_STREAM_EXEC_H_
