// CUDA executor of a decoded schedule (cc/schedule.h): peer copies plus
// reduction kernels, one stream per link direction, cross-device ordering by
// CUDA events only (no host synchronisation in the steady state).
//
// STATUS: written and compile-checked with nvcc on a machine WITHOUT a GPU.
// None of this has been run. tests/test_cuda.py and benchmarks/bench_cuda.py
// exercise it on one GPU (N simulated ranks) once a GPU is available.
//
// Model (same semantics as the CPU executor, executor.h, different
// transport): a SEND does no work; the matching RECV runs on the receiver's
// stream for that link and reads the sender's memory (directly when the
// devices share memory or have peer access, else via cudaMemcpyPeerAsync
// into a per-link staging buffer). A RECV waits (cudaStreamWaitEvent) on the
// events of the steps the value depends on at the sender, on its own local
// dependencies, and on the receivers of the earlier SENDs of the chunk it
// overwrites (the guards). The host enqueues the steps of all ranks in a
// dependency order found with the shared StepTracker; it never waits on the
// GPU. At the end each rank's main stream waits on its own link streams and
// on every peer's link stream that reads its memory, so the caller (XLA) may
// reuse the input and output once the main stream reaches that point.
#ifndef JAX_BLINK_CC_EXECUTOR_CUDA_H_
#define JAX_BLINK_CC_EXECUTOR_CUDA_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "schedule.h"

namespace jax_blink {

struct CudaRankBuffers {
  int device = 0;             // CUDA device of this rank's buffers
  const void* in = nullptr;   // count elements of the schedule dtype
  void* out = nullptr;        // count elements (must not alias `in`)
  cudaStream_t stream = nullptr;  // the caller's stream (XLA's compute stream)
};

struct CudaExecOptions {
  // Read peers' memory directly in the kernels when possible (same device or
  // peer access enabled). false: always copy into staging buffers first
  // (cudaMemcpyPeerAsync), as between devices without peer access.
  bool direct = true;
};

// Reusable resources (streams, events, scratch) for one set of ranks. Not
// thread-safe; one instance per concurrently running collective.
class CudaExecutor {
 public:
  CudaExecutor();
  ~CudaExecutor();
  CudaExecutor(const CudaExecutor&) = delete;
  CudaExecutor& operator=(const CudaExecutor&) = delete;

  // Enqueues the whole collective for all ranks of `s` on their streams.
  // Returns "" on success, else an error message. Does not synchronise.
  std::string Enqueue(const Schedule& s,
                      const std::vector<CudaRankBuffers>& ranks,
                      const CudaExecOptions& opts);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Kernel-level entry points (for tests and benchmarks), on `stream`:
// dst[i] = base[i] + src[i] over n elements of dtype `d` (all three of the
// dtype's accumulator type when !base_is_input / !src_is_input, else the
// buffer type; f16/bf16 accumulate in float32).
cudaError_t LaunchReduce(DType d, void* dst, const void* base, bool base_is_input,
                         const void* src, bool src_is_input, int64_t n,
                         cudaStream_t stream);
// out[i] = round(acc[i]) (f16/bf16) or a copy.
cudaError_t LaunchFinalize(DType d, void* out, const void* acc, int64_t n,
                           cudaStream_t stream);

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_EXECUTOR_CUDA_H_
