// Checks around the rendezvous, shared by the CPU and CUDA custom calls:
// each rank checks its own buffers before joining (and still joins, so that
// its peers fail fast with its message instead of timing out), and after
// joining every rank computes the same verdict from what all published.
#ifndef JAX_BLINK_CC_JOIN_H_
#define JAX_BLINK_CC_JOIN_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "rendezvous.h"
#include "schedule.h"
#include "stream_exec.h"

namespace jax_blink {

// "op_id=.. group=.. generation=..", naming a collective in messages.
std::string CallSiteText(int64_t op_id, int64_t group, int64_t generation);

// "" when the buffers fit the schedule, else what is wrong with them.
std::string CheckBuffers(const Schedule& s, int32_t dtype, int64_t in_count,
                         int64_t out_count, const void* in, const void* out);

// "" when every rank published no error and the same count, dtype and
// schedule; else the first problem, prefixed with "jax_blink: " and `where`.
std::string CheckConsistent(const Slot& slot, const std::string& where);

// What a rank of a stream collective publishes for JoinAndEnqueue: its
// buffers, device and stream (an opaque handle), checked against the schedule
// unless `error` already says what is wrong with them.
RankInfo StreamRankInfo(const Schedule& s, int32_t dtype, const void* in, void* out,
                        int64_t in_count, int64_t out_count, int device, void* stream,
                        std::string error);

// Allocates `bytes` of device memory for one call (*p; null for 0 bytes)
// or returns an error.
using WorkspaceFn = std::function<std::string(size_t bytes, void** p)>;

// The stream executors' meeting (CUDA handler; the GPU harness and the
// emulator in tests): joins the rendezvous as `rank` with `info` (its
// buffers, device and stream; the executor's view and progress base are
// added here), and once all ranks arrived and agree, enqueues this rank's
// part with `ex` on its own streams (stream_exec.h): reads from a peer are
// staged unless `direct` and tp.PeerReadable allow reading it in place. The
// workspace comes from `workspace`. Returns "" or the error, the same on
// every rank where possible (a rank's failure is shared); a rank that never
// arrives makes the others time out naming it. *generation gets the call's
// rendezvous generation.
std::string JoinAndEnqueue(const RendezvousKey& key, const Schedule& s,
                           const StreamPlan& plan, int64_t rank, RankInfo info,
                           StreamId stream, bool direct, StreamTransport& tp,
                           StreamRankExecutor& ex, const WorkspaceFn& workspace,
                           Clock::time_point deadline, int64_t timeout_ms,
                           int64_t* generation);

// Whether JAX_BLINK_DEBUG asks for a log line per collective (read once).
bool DebugEnabled();

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_JOIN_H_
