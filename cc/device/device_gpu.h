// The device executor on NVIDIA GPUs (device_kernel.cu): the program of a
// schedule uploaded once, and one kernel launch per rank per call, a thread
// block per program block running device_interp.h. Flags and control words
// live in device memory and carry the call's generation (nothing is reset
// between calls); peers read each other's buffers and flags through peer
// pointers (one GPU: plain device pointers).
//
// Verified so far on CPU only, through the host build of the same
// interpreter (testing/device_host.h); this file compiles with nvcc for
// sm_90 in every CUDA build. The single-GPU harness
// (_blink_cuda_testing.run_device / time_device) runs it; the XLA handler
// uses it when JAX_BLINK_CUDA_EXECUTOR=device.
#ifndef JAX_BLINK_CC_DEVICE_DEVICE_GPU_H_
#define JAX_BLINK_CC_DEVICE_DEVICE_GPU_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/schedule.h"
#include "core/status.h"
#include "device/device_program.h"
#include "device/device_setup.h"

namespace jax_blink {

// The most ranks one kernel's parameters carry (their buffers by value).
inline constexpr int kDeviceGpuMaxRanks = 32;

// One rank's buffers for a call (device pointers).
struct DeviceGpuBuffers {
  const void* in = nullptr;
  void* out = nullptr;
  void* workspace = nullptr;  // DeviceProgram::WorkspaceBytes() (none when 0)
};

// A schedule's device program on the ranks' GPUs, shared by the ranks of one
// process (every rank's GPU in `devices`, one per rank).
class DeviceGpuExecutor {
 public:
  // Builds the program and sets up its device state (device_setup.h: the
  // program on each distinct device, each rank's flags on its device, the
  // control words on rank 0's device), complete when it returns, so a
  // launch on any stream reads all of it. Refuses (INVALID_ARGUMENT / INTERNAL, with the reason)
  // more ranks than kDeviceGpuMaxRanks, ranks on different GPUs without
  // peer access, and ranks of one GPU whose blocks cannot all be resident at
  // once (the occupancy API: a kernel waiting for a peer's flags that never
  // gets scheduled would otherwise wait for its timeout).
  static Status Create(const Schedule& s, const std::vector<int>& devices,
                       std::unique_ptr<DeviceGpuExecutor>* out);
  ~DeviceGpuExecutor();
  DeviceGpuExecutor(const DeviceGpuExecutor&) = delete;
  DeviceGpuExecutor& operator=(const DeviceGpuExecutor&) = delete;

  const DeviceProgram& program() const { return program_; }
  int threads_per_block() const { return threads_; }

  // Enqueues rank `rank`'s kernel for call `generation` (1, 2, ... : each
  // rank's calls in order) on `stream` (a cudaStream_t). `bufs`: every
  // rank's buffers for this call (from the join).
  Status Launch(int64_t rank, const std::vector<DeviceGpuBuffers>& bufs, uint64_t generation,
                int64_t timeout_ms, void* stream);
  // After the rank's kernel: waits for `stream`, reads the control words
  // and returns the call's outcome for the rank (DEADLINE_EXCEEDED naming
  // the ranks whose flags never came).
  Status Outcome(int64_t rank, uint64_t generation, int64_t timeout_ms, void* stream,
                 const std::string& where);

 private:
  DeviceGpuExecutor() = default;
  DeviceProgram program_;
  std::vector<int> devices_;
  int threads_ = 256;
  DeviceState state_;                  // the program, flags and control words
  std::vector<void*> host_control_;    // per rank: pinned copy of the control words
};

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_DEVICE_DEVICE_GPU_H_
