// CUDA transport of the stream executor (stream/stream_exec.h): streams,
// events, peer copies and the reduction kernels. It allocates no device
// memory: the executor's workspace comes from its caller (XLA's scratch
// allocator in the FFI handler).
#ifndef JAX_BLINK_CC_CUDA_CUDA_TRANSPORT_H_
#define JAX_BLINK_CC_CUDA_CUDA_TRANSPORT_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/schedule.h"
#include "stream/stream_exec.h"

namespace jax_blink {

// A table of records whose ids stay valid while others are added: lookups
// take no lock (records live in fixed blocks that never move), additions
// and removals take a mutex. Several rank threads use one transport.
template <typename Rec>
class StableTable {
 public:
  StableTable() {
    for (auto& b : blocks_) b.store(nullptr, std::memory_order_relaxed);
  }
  ~StableTable() {
    for (auto& b : blocks_) delete[] b.load(std::memory_order_relaxed);
  }
  StableTable(const StableTable&) = delete;
  StableTable& operator=(const StableTable&) = delete;

  // Stores `rec`; returns its id, or -1 when the table is full.
  int32_t Put(const Rec& rec) {
    std::lock_guard<std::mutex> lk(mu_);
    int32_t id;
    if (!freed_.empty()) {
      id = freed_.back();
      freed_.pop_back();
    } else {
      id = size_.load(std::memory_order_relaxed);
      if (id >= kBlock * kMaxBlocks) return -1;
      if (blocks_[id >> kBlockBits].load(std::memory_order_relaxed) == nullptr) {
        blocks_[id >> kBlockBits].store(new Rec[kBlock](), std::memory_order_release);
      }
      size_.store(id + 1, std::memory_order_release);
    }
    blocks_[id >> kBlockBits].load(std::memory_order_relaxed)[id & (kBlock - 1)] = rec;
    return id;
  }
  // The record of `id`, or null for an id never handed out.
  Rec* Get(int32_t id) const {
    if (id < 0 || id >= size_.load(std::memory_order_acquire)) return nullptr;
    Rec* b = blocks_[id >> kBlockBits].load(std::memory_order_acquire);
    return b == nullptr ? nullptr : &b[id & (kBlock - 1)];
  }
  // Clears the record of `id` and makes the id reusable.
  void Erase(int32_t id) {
    std::lock_guard<std::mutex> lk(mu_);
    Rec* r = Get(id);
    if (r == nullptr) return;
    *r = Rec();
    freed_.push_back(id);
  }
  int32_t size() const { return size_.load(std::memory_order_acquire); }

 private:
  static constexpr int kBlockBits = 10;
  static constexpr int32_t kBlock = 1 << kBlockBits;
  static constexpr int32_t kMaxBlocks = 1 << 12;
  std::atomic<Rec*> blocks_[kMaxBlocks];
  std::atomic<int32_t> size_{0};
  std::mutex mu_;
  std::vector<int32_t> freed_;
};

// StreamTransport over the CUDA runtime. Streams it creates are
// non-blocking; caller-owned streams (XLA's) join through Adopt(). Calls
// select the device they need and leave the thread's current device
// changed (callers restore it, see CudaDeviceGuard). Peer access, once
// enabled, stays enabled for the process (CUDA keeps it per context).
// Thread-safe: the rank threads of a collective share one transport.
class CudaTransport : public StreamTransport {
 public:
  // interprocess_events: the events it creates can be exported to other
  // processes (cudaEventInterprocess; for ranks whose peers live there).
  explicit CudaTransport(bool interprocess_events = false)
      : interprocess_events_(interprocess_events) {}
  ~CudaTransport() override;
  CudaTransport(const CudaTransport&) = delete;
  CudaTransport& operator=(const CudaTransport&) = delete;

  // The id of a caller-owned stream on `device` (the same id for the same
  // handle; never destroyed here).
  StreamId Adopt(int device, cudaStream_t stream);
  // The id of an event this transport does not own (one opened from another
  // process's IPC handle; never destroyed here), or -1 when the table is full.
  EventId AdoptEvent(int device, cudaEvent_t event);
  // The CUDA event of id `e` (null for an unknown id).
  cudaEvent_t EventOf(EventId e);

  std::string CreateStream(int device, StreamId* s) override;
  std::string CreateEvent(int device, EventId* e) override;
  void DestroyStream(StreamId s) override;
  void DestroyEvent(EventId e) override;
  bool PeerReadable(int reader, int owner) override;
  std::string Record(EventId e, StreamId s) override;
  std::string Wait(StreamId s, EventId e) override;
  std::string Copy(StreamId s, void* dst, int dst_device, const void* src,
                   int src_device, size_t bytes) override;
  std::string Reduce(StreamId s, DType d, ReduceOp op, void* dst,
                     const StreamOperand* ops, int nops, int64_t n) override;
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
    bool owned = true;
  };
  // Makes `device` current on this thread; returns "" or an error.
  std::string Use(int device);
  // Calls launch(stream) on stream s's device; "" or the CUDA error as
  // `what` failed.
  template <typename Fn>
  std::string OnStream(StreamId s, const char* what, Fn&& launch);

  StableTable<StreamRec> streams_;
  StableTable<EventRec> events_;
  const bool interprocess_events_;
  std::mutex mu_;  // guards the maps below
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
// dst[i] = op(...op(ops[0][i], ops[1][i])..., ops[nops-1][i]) over n
// elements of dtype `d` (see StreamTransport::Reduce for the operand types).
cudaError_t LaunchReduce(DType d, ReduceOp op, void* dst, const StreamOperand* ops, int nops,
                         int64_t n, cudaStream_t stream);
// dst[i] = float32(src[i]) for f16/bf16.
cudaError_t LaunchToAcc(DType d, void* dst, const void* src, int64_t n,
                        cudaStream_t stream);
// out[i] = round(acc[i]) (f16/bf16) or a copy.
cudaError_t LaunchFinalize(DType d, void* out, const void* acc, int64_t n,
                           cudaStream_t stream);

std::string CudaErrorText(const char* what, cudaError_t e);

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_CUDA_CUDA_TRANSPORT_H_
