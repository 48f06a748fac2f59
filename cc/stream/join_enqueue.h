// The stream executors' meeting (the CUDA FFI handler; the single-GPU
// harness and the stream emulator in tests): every rank joins the
// rendezvous with its buffers, device and stream, and once all agree,
// enqueues its own part of the collective (stream/stream_exec.h).
#ifndef JAX_BLINK_CC_STREAM_JOIN_ENQUEUE_H_
#define JAX_BLINK_CC_STREAM_JOIN_ENQUEUE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "core/schedule.h"
#include "core/status.h"
#include "stream/stream_exec.h"
#include "sync/rendezvous.h"

namespace jax_blink {

// What a rank of a stream collective publishes for JoinAndEnqueue: its
// buffers, device and stream (an opaque handle), checked against the schedule
// unless `error` already says what is wrong with them.
RankInfo StreamRankInfo(const Schedule& s, int32_t dtype, const void* in, void* out,
                        int64_t in_count, int64_t out_count, int device, void* stream,
                        Status error);

// Allocates `bytes` of device memory for one call (*p; null for 0 bytes)
// or returns an error.
using WorkspaceFn = std::function<std::string(size_t bytes, void** p)>;

// Joins the rendezvous as `rank` with `info` (its buffers, device and
// stream; the executor's view and progress base are added here), and once
// all ranks arrived and agree (sync/join.h), enqueues this rank's part with
// `ex` on its own streams: reads from a peer are staged unless `direct` and
// tp.PeerReadable allow reading it in place. The workspace comes from
// `workspace`. Returns ok or the error, the same on every rank where
// possible (a rank's failure is shared, with its kind); a rank that never
// arrives makes the others time out naming it. *generation gets the call's
// rendezvous generation.
Status JoinAndEnqueue(const RendezvousKey& key, const Schedule& s, const StreamPlan& plan,
                      int64_t rank, RankInfo info, StreamId stream, bool direct,
                      StreamTransport& tp, StreamRankExecutor& ex,
                      const WorkspaceFn& workspace, Clock::time_point deadline,
                      int64_t timeout_ms, int64_t* generation);

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_STREAM_JOIN_ENQUEUE_H_
