// A host emulator of StreamTransport (stream/stream_exec.h) with a race checker:
// CI verifies the event ordering of the stream executor with it, without a
// GPU.
//
// Streams, events and allocations are host objects; devices are integer
// labels. Nothing runs at call time: every call appends an op to its
// stream's FIFO queue. Record(e, s) makes its op e's latest record; Wait(s,
// e) binds to e's latest record AT CALL TIME (none: the wait is a no-op),
// which is CUDA's rule. Run() then executes the queued ops in a random order
// that these rules allow (a seeded choice among the streams whose head op
// may run), computing on host memory exactly what the CUDA kernels compute,
// so an ordering bug shows up as wrong results for some seeds as well.
//
// The race checker does not depend on the order Run picks: happens-before
// is fixed at call time. Each op gets a vector clock (one component per
// stream): the previous op of its stream's clock, joined with the bound
// record's clock for a wait, with its own component incremented. Op a
// happens before op b iff clock(b)[stream(a)] >= clock(a)[stream(a)]. Two
// ops of different streams race when their byte ranges overlap, one of them
// writes, and neither happens before the other. Accesses are checked across
// Run() calls (an executor is reused across collectives) until Reset().
//
// Every method may be called from several threads at once (one per rank, as
// the executors enqueue); a call's effect is atomic, and "at call time" means
// in the order the calls take the emulator's lock.
//
// Beyond CUDA's ordering rules the emulator checks what a GPU would reject
// or fault on, and returns it as the error of the offending call: a kernel
// touching another device's memory without PeerReadable() having granted
// it, an event recorded on a stream of another device, a copy whose
// pointers are not on the devices it names, and any access outside an
// allocation or a Label()led buffer (host memory is written for real, so
// this also keeps an executor bug from corrupting the process).
#ifndef JAX_BLINK_CC_TESTING_STREAM_EMULATOR_H_
#define JAX_BLINK_CC_TESTING_STREAM_EMULATOR_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/schedule.h"
#include "stream/stream_exec.h"

namespace jax_blink {

// Bytes [p, p + bytes) of host memory.
struct Range {
  const void* p = nullptr;
  size_t bytes = 0;
};

struct StreamEmulatorStats {
  int64_t streams = 0;       // streams created
  int64_t events = 0;        // events created
  int64_t allocs = 0;        // Alloc calls
  int64_t live_streams = 0;  // created and not destroyed (leak checks)
  int64_t live_events = 0;
  int64_t alloc_bytes = 0;   // bytes of live allocations
  int64_t peer_queries = 0;  // PeerReadable calls
  // Ops issued, by kind (since construction).
  int64_t copies = 0;
  int64_t reduces = 0;
  int64_t to_accs = 0;
  int64_t finalizes = 0;
  int64_t records = 0;
  int64_t waits = 0;
  int64_t noop_waits = 0;  // waits on an event with no record (subset)
  int64_t touches = 0;
  int64_t executed = 0;    // ops executed by Run
  int64_t accesses = 0;    // memory accesses checked for races
  int64_t races = 0;       // racing op pairs found (all, not only reported)
};

class StreamEmulator : public StreamTransport {
 public:
  // Races reported as text; the rest are only counted (stats().races).
  static constexpr size_t kMaxReportedRaces = 50;

  StreamEmulator();
  ~StreamEmulator() override;
  StreamEmulator(const StreamEmulator&) = delete;
  StreamEmulator& operator=(const StreamEmulator&) = delete;

  // StreamTransport.
  std::string CreateStream(int device, StreamId* s) override;
  std::string CreateEvent(int device, EventId* e) override;
  void DestroyStream(StreamId s) override;
  void DestroyEvent(EventId e) override;
  // true for reader == owner, else the peer-access matrix (SetPeerAccess;
  // default: all pairs may). A true answer enables the pair for kernels.
  bool PeerReadable(int reader, int owner) override;
  std::string Record(EventId e, StreamId s) override;
  std::string Wait(StreamId s, EventId e) override;
  std::string Copy(StreamId s, void* dst, int dst_device, const void* src,
                   int src_device, size_t bytes) override;
  std::string Reduce(StreamId s, DType d, ReduceOp op, void* dst,
                     const StreamOperand* ops, int nops, int64_t n) override;
  std::string ToAcc(StreamId s, DType d, void* dst, const void* src,
                    int64_t n) override;
  std::string Finalize(StreamId s, DType d, void* out, const void* acc,
                       int64_t n) override;

  // ---- Emulator only.
  // Device memory for the harness (the executor's workspace): 64-byte
  // aligned host memory filled with 0xff bytes (NaN / -1), so a read of
  // never-written scratch shows in the results.
  std::string Alloc(int device, size_t bytes, void** p);
  // Retires the allocation now (later calls may not touch it) and releases
  // the memory after the queued ops have run (cudaFree waits for the
  // device, so freeing under queued work is legal).
  void Free(int device, void* p);
  // Whether work on device `reader` may read device `owner`'s memory.
  void SetPeerAccess(int reader, int owner, bool ok);
  // Names caller memory [p, p + bytes) of `device` (-1: host memory any
  // device may touch) in reports, and makes it accessible to ops. Labelling
  // the same range twice joins the names ("in[0]=out[0]": XLA aliased the
  // buffers); a partial overlap with another buffer is an error.
  std::string Label(const void* p, size_t bytes, std::string name,
                    int device = -1);
  // Names a stream in reports (e.g. "caller[3]").
  void NameStream(StreamId s, std::string name);
  // A pseudo-op modelling the caller's own work on its stream: it reads and
  // writes the given ranges (checked for races like any op) and, when it
  // runs, calls `fn` (e.g. to write fresh input data).
  std::string Touch(StreamId s, std::vector<Range> reads,
                    std::vector<Range> writes, std::string label,
                    std::function<void()> fn = nullptr);
  // Executes every queued op, then checks the ops issued since the last
  // Run against each other and against all earlier ones (since Reset).
  // Returns "" or an error: a deadlock (no stream can run while ops
  // remain; their ops are dropped), or a misuse by a call that cannot
  // return one (Free of an unknown pointer, destroying an unknown stream).
  // Races are not errors: see races().
  std::string Run(uint64_t seed);
  // Forgets the access history (ops before it are never compared with ops
  // after it) and the races found. Returns an error (and does nothing)
  // while ops are queued.
  std::string Reset();

  // The first kMaxReportedRaces races, as readable text.
  const std::vector<std::string>& races() const;
  const StreamEmulatorStats& stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_TESTING_STREAM_EMULATOR_H_
