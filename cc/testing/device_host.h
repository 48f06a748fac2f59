// The device executor's host build (test-only): the interpreter of
// device/device_interp.h with std::atomic_ref flags (the GPU's
// acquire/release pairs) and one std::thread per program block, the ranks of
// a call in one process. It verifies the interpreter and the program builder
// on CPU (tests/executor/test_device_exec.py, bitwise against the CPU
// executor; under ThreadSanitizer in .ci/sanitizers); the GPU runs the same
// header (device/device_kernel.cu).
#ifndef JAX_BLINK_CC_TESTING_DEVICE_HOST_H_
#define JAX_BLINK_CC_TESTING_DEVICE_HOST_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/schedule.h"
#include "core/status.h"
#include "device/device_program.h"

namespace jax_blink {

// A rank that stops in mid-call (a kernel that hangs or dies): after
// `publishes` step flags it writes no flag or control word more, and its
// blocks give up.
struct DeviceHostFault {
  int64_t rank = -1;  // -1: none
  int64_t publishes = 0;
};

class DeviceHostExecutor {
 public:
  // Builds the program of `s` (which must outlive the executor).
  // max_blocks_per_rank: as BuildDeviceProgram's. Returns "" or an error.
  static std::string Create(const Schedule& s, int max_blocks_per_rank,
                            std::unique_ptr<DeviceHostExecutor>* out);

  // One call: every rank but those in `skip` (never started) runs on its
  // blocks' threads; in[r] / out[r]: rank r's buffers (in_count and
  // out_count elements). Returns each rank's status (ok for a skipped one).
  // Flags and control words carry the call's generation: nothing is reset
  // between calls, failed ones included.
  std::vector<Status> Run(const std::vector<const void*>& in, const std::vector<void*>& out,
                          int64_t timeout_ms, const std::vector<uint8_t>& skip,
                          const DeviceHostFault& fault);

  const DeviceProgram& program() const { return program_; }

 private:
  const Schedule* s_ = nullptr;
  DeviceProgram program_;
  std::vector<std::vector<uint64_t>> flags_;      // per rank, one per step
  std::vector<uint64_t> control_;                 // DeviceControlWords
  std::vector<std::vector<unsigned char>> acc_;   // per rank: the workspace (acc_is_out: none)
  uint64_t generation_ = 0;
};

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_TESTING_DEVICE_HOST_H_
