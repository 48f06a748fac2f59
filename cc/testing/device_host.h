// The device executor's host build (test-only): the interpreter of
// device/device_interp.h with std::atomic_ref flags (the GPU's
// acquire/release pairs) and one std::thread per program block, the ranks of
// a call in one process, its state set up by device/device_setup.h as on the
// GPU, over emulated device memory that can delay the setup's writes. It verifies the interpreter and the program builder
// on CPU (tests/executor/test_device_exec.py, bitwise against the CPU
// executor; under ThreadSanitizer in .ci/sanitizers); the GPU runs the same
// header (device/device_kernel.cu).
#ifndef JAX_BLINK_CC_TESTING_DEVICE_HOST_H_
#define JAX_BLINK_CC_TESTING_DEVICE_HOST_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/schedule.h"
#include "core/status.h"
#include "device/device_program.h"
#include "device/device_setup.h"

namespace jax_blink {

// A rank that stops in mid-call (a kernel that hangs or dies): after
// `publishes` step flags it writes no flag or control word more, and its
// blocks give up.
struct DeviceHostFault {
  int64_t rank = -1;  // -1: none
  int64_t publishes = 0;
};

// The host build's device memory, device_setup.h's backend. As a caching
// allocator does, a freed block goes back to a pool and a later allocation
// of the same size gets it again with its bytes (an earlier executor's
// program, flags and control words); other blocks start zeroed. With
// delayed writes, Upload and Zero land at Finish() or, as a DMA that lands
// late, at Land() (after a call): a setup that lets a kernel run before
// Finish reads stale memory, as on a GPU. Thread-safe.
class HostDeviceMemory {
 public:
  explicit HostDeviceMemory(bool delayed_writes) : delayed_(delayed_writes) {}
  HostDeviceMemory(const HostDeviceMemory&) = delete;
  HostDeviceMemory& operator=(const HostDeviceMemory&) = delete;

  std::string Alloc(int device, size_t bytes, void** p);
  void Free(int device, void* p);
  std::string Upload(int device, void* dst, const void* src, size_t bytes);
  std::string Zero(int device, void* dst, size_t bytes);
  std::string Finish();
  // Lands every write still pending (no kernel may be running).
  void Land();

 private:
  void Write(void* dst, const void* src, size_t bytes);  // src null: zeros
  std::mutex mu_;
  const bool delayed_;
  struct Block {
    size_t bytes = 0;
    std::unique_ptr<uint64_t[]> words;
  };
  std::map<size_t, std::vector<Block>> pool_;  // freed blocks by size
  std::map<void*, Block> live_;
  struct Pending {
    void* dst = nullptr;
    std::vector<unsigned char> bytes;
    bool zero = false;
  };
  std::vector<Pending> pending_;
};

class DeviceHostExecutor {
 public:
  // Builds the program of `s` (which must outlive the executor) and sets up
  // its state (device_setup.h) in `mem` (null: memory of its own whose writes
  // land at once), all ranks on one device. max_blocks_per_rank: as
  // BuildDeviceProgram's. Returns "" or an error.
  static std::string Create(const Schedule& s, int max_blocks_per_rank,
                            std::shared_ptr<HostDeviceMemory> mem,
                            std::unique_ptr<DeviceHostExecutor>* out);
  ~DeviceHostExecutor();
  DeviceHostExecutor(const DeviceHostExecutor&) = delete;
  DeviceHostExecutor& operator=(const DeviceHostExecutor&) = delete;

  // One call: every rank but those in `skip` (never started) runs on its
  // blocks' threads; in[r] / out[r]: rank r's buffers (in_count and
  // out_count elements). Returns each rank's status (ok for a skipped one).
  // Flags and control words carry the call's generation: nothing is reset
  // between calls, failed ones included.
  std::vector<Status> Run(const std::vector<const void*>& in, const std::vector<void*>& out,
                          int64_t timeout_ms, const std::vector<uint8_t>& skip,
                          const DeviceHostFault& fault);

  const DeviceProgram& program() const { return program_; }
  uint64_t executor() const { return state_.executor; }
  // Tests: writes `executor` into the program's header, as memory that still
  // holds another executor's program would read.
  void WriteHeaderExecutor(uint64_t executor);

 private:
  DeviceHostExecutor() = default;
  const Schedule* s_ = nullptr;
  DeviceProgram program_;
  std::shared_ptr<HostDeviceMemory> mem_;
  DeviceState state_;
  std::vector<std::vector<unsigned char>> acc_;   // per rank: the workspace (acc_is_out: none)
  uint64_t generation_ = 0;
};

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_TESTING_DEVICE_HOST_H_
