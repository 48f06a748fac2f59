// CUDA transport of the stream executor (cc/stream_exec.h): streams,
// events, peer copies and the reduction kernels.
//
// STATUS: compile-checked with nvcc on machines WITHOUT a GPU; the event
// ordering it carries out is verified on the host by the stream emulator
// (tests/test_stream_emulator.py). The kernels and the CUDA calls themselves
// have not run yet: tests/test_cuda.py and benchmarks/bench_cuda.py are the
// checks once a GPU is available.
#ifndef JAX_BLINK_CC_EXECUTOR_CUDA_H_
#define JAX_BLINK_CC_EXECUTOR_CUDA_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "schedule.h"
#include "stream_exec.h"

namespace jax_blink {

// StreamTransport over the CUDA runtime. Streams it creates are
// non-blocking; caller-owned streams (XLA's) join through Adopt(). Calls
// select the device they need and leave the thread's current device
// changed (callers restore it, see CudaDeviceGuard). Peer access, once
// enabled, stays enabled for the process (CUDA keeps it per context).
// Not thread-safe: one user at a time, like its StreamExecutor.
class CudaTransport : public StreamTransport {
 public:
  CudaTransport() = default;
  ~CudaTransport() override;
  CudaTransport(const CudaTransport&) = delete;
  CudaTransport& operator=(const CudaTransport&) = delete;

  // The id of a caller-owned stream on `device` (the same id for the same
  // handle; never destroyed here).
  StreamId Adopt(int device, cudaStream_t stream);

  std::string CreateStream(int device, StreamId* s) override;
  std::string CreateEvent(int device, EventId* e) override;
  void DestroyStream(StreamId s) override;
  void DestroyEvent(EventId e) override;
  std::string Alloc(int device, size_t bytes, void** p) override;
  void Free(int device, void* p) override;
  bool PeerReadable(int reader, int owner) override;
  std::string Record(EventId e, StreamId s) override;
  std::string Wait(StreamId s, EventId e) override;
  std::string Copy(StreamId s, void* dst, int dst_device, const void* src,
                   int src_device, size_t bytes) override;
  std::string Reduce(StreamId s, DType d, void* dst, const void* base,
                     bool base_is_input, const void* src, bool src_is_input,
                     int64_t n) override;
  std::string ToAcc(StreamId s, DType d, void* dst, const void* src,
                    int64_t n) override;
  std::string Finalize(StreamId s, DType d, void* out, const void* acc,
                       int64_t n) override;

 private:
  struct StreamRec {
    cudaStream_t stream = nullptr;
    int device = -1;
    bool owned = false;
  };
  struct EventRec {
    cudaEvent_t event = nullptr;
    int device = -1;
  };
  // Makes `device` current on this thread; returns "" or an error.
  std::string Use(int device);
  std::string UseStream(StreamId s, cudaStream_t* out);
  // Calls launch(stream) on stream s's device; "" or the CUDA error as
  // `what` failed.
  template <typename Fn>
  std::string OnStream(StreamId s, const char* what, Fn&& launch);

  std::vector<StreamRec> streams_;
  std::vector<StreamId> free_streams_;
  std::vector<EventRec> events_;
  std::vector<EventId> free_events_;
  std::map<cudaStream_t, StreamId> adopted_;
  std::map<std::pair<int, int>, bool> peer_;  // (reader, owner) -> readable
};

// Restores the thread's current CUDA device on scope exit.
class CudaDeviceGuard {
 public:
  CudaDeviceGuard() { ok_ = cudaGetDevice(&device_) == cudaSuccess; }
  ~CudaDeviceGuard() {
    if (ok_) cudaSetDevice(device_);
  }
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  int device_ = 0;
  bool ok_ = false;
};

// Kernel-level entry points (for tests and benchmarks), on `stream`:
// dst[i] = base[i] + src[i] over n elements of dtype `d` (see
// StreamTransport::Reduce for the operand types).
cudaError_t LaunchReduce(DType d, void* dst, const void* base, bool base_is_input,
                         const void* src, bool src_is_input, int64_t n,
                         cudaStream_t stream);
// dst[i] = float32(src[i]) for f16/bf16.
cudaError_t LaunchToAcc(DType d, void* dst, const void* src, int64_t n,
                        cudaStream_t stream);
// out[i] = round(acc[i]) (f16/bf16) or a copy.
cudaError_t LaunchFinalize(DType d, void* out, const void* acc, int64_t n,
                           cudaStream_t stream);

std::string CudaErrorText(const char* what, cudaError_t e);

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_EXECUTOR_CUDA_H_
