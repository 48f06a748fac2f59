// Checks around the rendezvous, shared by the CPU executor and the stream
// executors' meeting (stream/join_enqueue.h): each rank checks its own
// buffers before joining (and still joins, so that its peers fail fast with
// its error instead of timing out), and after joining every rank computes
// the same verdict from what all published.
#ifndef JAX_BLINK_CC_SYNC_JOIN_H_
#define JAX_BLINK_CC_SYNC_JOIN_H_

#include <cstdint>
#include <string>

#include "core/schedule.h"
#include "core/status.h"
#include "sync/rendezvous.h"

namespace jax_blink {

// "op_id=.. group=.. generation=..", naming a collective in messages.
std::string CallSiteText(int64_t op_id, int64_t group, int64_t generation);

// Ok when the buffers fit the schedule, else InvalidArgument saying what is
// wrong with them.
Status CheckBuffers(const Schedule& s, int32_t dtype, int64_t in_count,
                    int64_t out_count, const void* in, const void* out);

// Ok when every rank published no error and the same count, dtype and
// schedule; else the first problem, its message prefixed with "jax_blink: "
// and `where`: a rank's published error keeps its kind, a disagreement is
// InvalidArgument.
Status CheckConsistent(const Slot& slot, const std::string& where);

// Early start's check of one peer before touching its buffers: it published
// no error and runs the same schedule on the same count and dtype (and, in
// the same process, the same segments) as `mine`. When some pair of ranks
// fails it, CheckConsistent fails too.
bool Agrees(const RankInfo& mine, const RankInfo& peer);

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_SYNC_JOIN_H_
