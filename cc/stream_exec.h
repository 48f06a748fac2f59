// Enqueueing a decoded schedule (cc/schedule.h) on streams and events: the
// GPU executor's logic, independent of the runtime that carries it out.
//
// Two transports implement StreamTransport:
//   * CUDA (executor_cuda.cu): peer copies, reduction kernels, CUDA events;
//   * the host emulator (stream_emulator.cc): the same calls executed on host
//     memory in a random order that CUDA's rules allow, with a race checker
//     (happens-before over streams and events). It lets CI verify the event
//     ordering below without a GPU.
//
// Model (the CPU executor's semantics, executor.h, over another transport):
// a SEND does no work; the matching RECV runs on the receiver's stream for
// that link (one stream per link direction, so links run concurrently) and
// reads the sender's memory: directly when the receiver may read it
// (same device, or peer access), else it first copies the chunk into a
// per-link staging buffer next to the receiver. A RECV's stream waits on the
// events of the steps its value depends on at the sender, on its own local
// dependencies, and on the receivers of the earlier SENDs of the chunk it
// overwrites (the guards). The host enqueues the steps of all ranks in a
// dependency order found with the shared StepTracker and never waits on the
// device. At the end each rank's caller stream waits on its own link streams
// and on every peer's link stream that read its memory, so the caller may
// reuse the input and output as soon as its stream reaches that point.
#ifndef JAX_BLINK_CC_STREAM_EXEC_H_
#define JAX_BLINK_CC_STREAM_EXEC_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "schedule.h"

namespace jax_blink {

using StreamId = int32_t;
using EventId = int32_t;

// The operations the executor needs from a stream-and-event runtime. Work
// calls are asynchronous and run in stream order. Wait(s, e) orders the later
// work of s after the work that preceded the most recent Record(e, .) issued
// before the Wait call (CUDA's rule; a never-recorded event is complete).
// Every call returns "" or an error message; none aborts.
class StreamTransport {
 public:
  virtual ~StreamTransport() = default;

  // Resources.
  virtual std::string CreateStream(int device, StreamId* s) = 0;
  virtual std::string CreateEvent(int device, EventId* e) = 0;
  virtual void DestroyStream(StreamId s) = 0;
  virtual void DestroyEvent(EventId e) = 0;
  virtual std::string Alloc(int device, size_t bytes, void** p) = 0;
  virtual void Free(int device, void* p) = 0;
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
  // dst[i] = base[i] + src[i] in the accumulator type of d (float32 for
  // f16/bf16; wrapping for integers). An operand flagged *_is_input has the
  // buffer type T of d, else the accumulator type A; dst has type A. base
  // may equal dst.
  virtual std::string Reduce(StreamId s, DType d, void* dst, const void* base,
                             bool base_is_input, const void* src,
                             bool src_is_input, int64_t n) = 0;
  // dst[i] = float32(src[i]) (d is f16 or bf16).
  virtual std::string ToAcc(StreamId s, DType d, void* dst, const void* src,
                            int64_t n) = 0;
  // out[i] = round-to-nearest-even(acc[i]) for f16/bf16; a copy otherwise
  // (nothing when out == acc).
  virtual std::string Finalize(StreamId s, DType d, void* out, const void* acc,
                               int64_t n) = 0;
};

// One rank of a collective, as the caller hands it in.
struct StreamRank {
  int device = 0;             // device of the rank's buffers
  const void* in = nullptr;   // count elements of the schedule dtype
  void* out = nullptr;        // count elements; may equal `in`
  StreamId stream = -1;       // the caller's stream (e.g. XLA's)
};

// Fault injection for the race checker's own tests: each bit drops one
// class of waits, which must make the emulator report races. Never set
// outside tests.
enum StreamOmit : uint32_t {
  kOmitNone = 0,
  kOmitEntryWaits = 1u << 0,  // link streams waiting for the callers' inputs
  kOmitDepWaits = 1u << 1,    // a RECV waiting for the value it reads
  kOmitGuards = 1u << 2,      // a RECV waiting for earlier readers of a chunk
  kOmitExitWaits = 1u << 3,   // caller streams waiting for the link streams
};

struct StreamExecOptions {
  // Kernels read peers' memory when the transport says they may; false:
  // always stage through copies, as between devices without peer access.
  bool direct = true;
  uint32_t omit = kOmitNone;  // StreamOmit bits (tests only)
};

// Counters of the last Enqueue (for tests and benchmarks).
struct StreamExecStats {
  int64_t kernels = 0;  // Reduce/ToAcc/Finalize calls
  int64_t copies = 0;   // Copy calls
  int64_t waits = 0;    // Wait calls
  int64_t records = 0;  // Record calls
  int64_t staged_links = 0;  // receiver-sender pairs that stage their reads
};

// Holds the streams, events and scratch buffers of one set of devices and
// reuses them across calls (they only grow). Not thread-safe: callers
// serialise Enqueue calls on one instance. Consecutive Enqueue calls on one
// instance are ordered on the device as well: each call's link streams wait
// for the end of the previous call on every rank, so scratch and staging
// buffers are never overwritten while still being read.
class StreamExecutor {
 public:
  explicit StreamExecutor(StreamTransport* transport);
  ~StreamExecutor();
  StreamExecutor(const StreamExecutor&) = delete;
  StreamExecutor& operator=(const StreamExecutor&) = delete;

  // Enqueues the whole collective for all ranks of `s` (ranks[r] is rank r)
  // on their streams. Returns "" or an error; never synchronises.
  std::string Enqueue(const Schedule& s, const std::vector<StreamRank>& ranks,
                      const StreamExecOptions& opts);

  const StreamExecStats& stats() const { return stats_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  StreamExecStats stats_;
};

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_STREAM_EXEC_H_
