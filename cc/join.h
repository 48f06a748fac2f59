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

// What a rank of a stream collective publishes for JoinAndLead: its buffers,
// device and stream (an opaque handle), checked against the schedule unless
// `error` already says what is wrong with them.
RankInfo StreamRankInfo(const Schedule& s, int32_t dtype, const void* in, void* out,
                        int64_t in_count, int64_t out_count, int device, void* stream,
                        std::string error);

// The StreamExecutor's view of the ranks that met in `slot`; stream_id maps
// a published (device, stream handle) to the transport's stream.
std::vector<StreamRank> StreamRanksOf(
    const Slot& slot, const std::function<StreamId(int device, void* stream)>& stream_id);

// The stream executors' meeting (CUDA handler; emulated in tests): joins the
// rendezvous as `rank` with `info` (info.total_steps must be 1); once all
// ranks arrived and agree, rank 0 calls lead(slot) to enqueue the whole
// collective for every rank, and the others wait until it has returned (on
// the host only), so that nothing their caller enqueues afterwards can come
// before the collective's work on their streams. Returns "" or the error,
// the same on every rank where possible (lead's error is shared); a rank
// that never arrives makes the others time out naming it. *generation gets
// the call's rendezvous generation.
std::string JoinAndLead(const RendezvousKey& key, int64_t rank, int64_t nranks,
                        RankInfo info, Clock::time_point deadline, int64_t timeout_ms,
                        const std::function<std::string(const Slot&)>& lead,
                        int64_t* generation);

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_JOIN_H_
