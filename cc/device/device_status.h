// The outcome of one rank's call of the device executor, read from the
// call's control words (device_program.h) after its blocks are over: ok, or
// DEADLINE_EXCEEDED naming the ranks that never started, the ranks whose
// flags never came, and what each timed-out wait waited for; or INTERNAL
// when a kernel found another program than the executor's. Shared by the
// CUDA handler (which copies the words back from the GPU) and the host build.
#ifndef JAX_BLINK_CC_DEVICE_DEVICE_STATUS_H_
#define JAX_BLINK_CC_DEVICE_DEVICE_STATUS_H_

#include <cstdint>
#include <string>

#include "core/status.h"
#include "device/device_program.h"

namespace jax_blink {

// `control`: the call's DeviceControlWords(p.nranks, p.max_blocks) words;
// `executor`: the executor's id (DeviceState::executor); `where`: the call
// site's text for the message. A block that found another program than the
// executor's makes the outcome INTERNAL, naming both.
Status DeviceRankStatus(const DeviceProgram& p, const uint64_t* control, int64_t rank,
                        uint64_t generation, int64_t timeout_ms, uint64_t executor,
                        const std::string& where);

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_DEVICE_DEVICE_STATUS_H_
