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
// The ranks meet in the in-process rendezvous (sync/rendezvous.h), check
// that they agree (sync/join.h) and run their steps with core/step_tracker.h.
#ifndef JAX_BLINK_CC_CPU_EXECUTOR_CPU_H_
#define JAX_BLINK_CC_CPU_EXECUTOR_CPU_H_

#include <cstdint>

#include "core/schedule.h"
#include "core/status.h"

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
  // An error found by the caller before joining (e.g. a buffer type that
  // does not fit the schedule). The rank still joins so that its peers fail
  // fast with the same error instead of timing out.
  Status local_error;
};

struct ExecResult {
  Status status;            // ok, or the error and its kind
  int64_t generation = -1;  // rendezvous generation of this call
};

// Runs rank args.rank of args.schedule; blocks until done or failed.
ExecResult ExecuteCpu(const ExecArgs& args);

// Tunables of the waits and copies (the values of the module's configure(),
// cc/ffi/py_blink_ext.cc; these defaults until it is called).
struct ExecTunables {
  int spin = 0;               // busy-wait iterations before yielding
  int64_t yield_ns = 200000;  // then sched_yield for this long before sleeping
  // Copies of at least this many bytes whose destination no peer reads
  // afterwards bypass the cache (non-temporal stores, x86-64 only); they
  // save the read-for-ownership traffic of large outputs.
  int64_t nt_bytes = int64_t{1} << 20;
  // A rank that completes a chunk writes it straight into the accumulators
  // of receivers whose RECV_COPY is ready (claimed with a CAS on its flag).
  bool push = true;
  // Output buffers at least this large get madvise(MADV_HUGEPAGE) (0: never).
  int64_t hugepage_bytes = int64_t{2} << 20;
};
const ExecTunables& GetExecTunables();
// Replaces the tunables (not thread-safe against running collectives: call
// it before any runs).
void SetExecTunables(const ExecTunables& t);

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_CPU_EXECUTOR_CPU_H_
