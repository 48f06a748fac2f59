// Checks around the rendezvous, shared by the CPU and CUDA custom calls:
// each rank checks its own buffers before joining (and still joins, so that
// its peers fail fast with its message instead of timing out), and after
// joining every rank computes the same verdict from what all published.
#ifndef JAX_BLINK_CC_JOIN_H_
#define JAX_BLINK_CC_JOIN_H_

#include <cstdint>
#include <string>

#include "rendezvous.h"
#include "schedule.h"

namespace jax_blink {

// "op_id=.. group=.. generation=..", naming a collective in messages.
std::string CallSiteText(int64_t op_id, int64_t group, int64_t generation);

// "" when the buffers fit the schedule, else what is wrong with them.
std::string CheckBuffers(const Schedule& s, int32_t dtype, int64_t in_count,
                         int64_t out_count, const void* in, const void* out);

// "" when every rank published no error and the same count, dtype and
// schedule; else the first problem, prefixed with "jax_blink: " and `where`.
std::string CheckConsistent(const Slot& slot, const std::string& where);

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_JOIN_H_
