// CUDA transport of the stream executor: reduction kernels, streams, events
// and peer copies. See executor_cuda.h (status) and stream_exec.h (model).
#include "executor_cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstring>
#include <sstream>


namespace jax_blink {

namespace {

// ---- Per-dtype traits (device side) ------------------------------------
// T: element type of the buffers; A: accumulator type. Signed integers use
// unsigned arithmetic (wrapping, like the CPU executor and lax.psum).
template <typename E>
struct SameTraits {
  using T = E;
  using A = E;
  static constexpr bool kSame = true;
  __device__ static A ToAcc(T x) { return x; }
  __device__ static T FromAcc(A x) { return x; }
};
struct F16Traits {
  using T = __half;
  using A = float;
  static constexpr bool kSame = false;
  __device__ static A ToAcc(T x) { return __half2float(x); }
  __device__ static T FromAcc(A x) { return __float2half_rn(x); }
};
struct BF16Traits {
  using T = __nv_bfloat16;
  using A = float;
  static constexpr bool kSame = false;
  __device__ static A ToAcc(T x) { return __bfloat162float(x); }
  __device__ static T FromAcc(A x) { return __float2bfloat16_rn(x); }
};

// V elements loaded/stored as one aligned vector (16 bytes for A).
template <typename X, int V>
struct alignas(sizeof(X) * V) Pack {
  X v[V];
};

// Reads element i of an operand that is either the buffer type T (an input)
// or the accumulator type A.
template <class Tr, bool kIsInput>
__device__ __forceinline__ typename Tr::A LoadAcc(const void* p, int64_t i) {
  if constexpr (kIsInput) {
    return Tr::ToAcc(static_cast<const typename Tr::T*>(p)[i]);
  } else {
    return static_cast<const typename Tr::A*>(p)[i];
  }
}

template <class Tr, bool kIsInput>
using OperandT =
    typename std::conditional<kIsInput, typename Tr::T, typename Tr::A>::type;

// dst[i] = base[i] + src[i] (base first: the CPU executor's order).
// Elements [0, head) and [head + nvec * V, n) are scalar; the middle is
// vectorised (16-byte accesses of dst), valid only when the caller found
// every operand aligned at `head` (else nvec == 0).
template <class Tr, bool kBaseIn, bool kSrcIn>
__global__ void ReduceKernel(typename Tr::A* __restrict__ dst,
                             const void* __restrict__ base,
                             const void* __restrict__ src, int64_t n,
                             int64_t head, int64_t nvec) {
  using A = typename Tr::A;
  constexpr int V = 16 / sizeof(A);
  using BT = OperandT<Tr, kBaseIn>;
  using ST = OperandT<Tr, kSrcIn>;
  const int64_t tid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  // Vector body.
  const auto* bv = reinterpret_cast<const Pack<BT, V>*>(
      static_cast<const BT*>(base) + head);
  const auto* sv = reinterpret_cast<const Pack<ST, V>*>(
      static_cast<const ST*>(src) + head);
  auto* dv = reinterpret_cast<Pack<A, V>*>(dst + head);
  for (int64_t k = tid; k < nvec; k += stride) {
    const Pack<BT, V> b = bv[k];
    const Pack<ST, V> s = sv[k];
    Pack<A, V> d;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      A x, y;
      if constexpr (kBaseIn) x = Tr::ToAcc(b.v[j]); else x = b.v[j];
      if constexpr (kSrcIn) y = Tr::ToAcc(s.v[j]); else y = s.v[j];
      d.v[j] = x + y;
    }
    dv[k] = d;
  }
  // Scalar head and tail.
  const int64_t tail_begin = head + nvec * V;
  const int64_t nscalar = head + (n - tail_begin);
  for (int64_t k = tid; k < nscalar; k += stride) {
    const int64_t i = k < head ? k : tail_begin + (k - head);
    dst[i] = LoadAcc<Tr, kBaseIn>(base, i) + LoadAcc<Tr, kSrcIn>(src, i);
  }
}

// dst[i] = ToAcc(src[i]) (an input chunk of f16/bf16 into the float32
// accumulator).
template <class Tr>
__global__ void ToAccKernel(typename Tr::A* __restrict__ dst,
                            const typename Tr::T* __restrict__ src, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < n; i += stride) {
    dst[i] = Tr::ToAcc(src[i]);
  }
}

// out[i] = FromAcc(acc[i]) (round once, to nearest even).
template <class Tr>
__global__ void FinalizeKernel(typename Tr::T* __restrict__ out,
                               const typename Tr::A* __restrict__ acc,
                               int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < n; i += stride) {
    out[i] = Tr::FromAcc(acc[i]);
  }
}

constexpr int kThreads = 256;

int GridFor(int64_t work) {
  static int max_blocks = [] {
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) !=
            cudaSuccess ||
        sms <= 0) {
      sms = 132;
    }
    return sms * 8;
  }();
  int64_t blocks = (work + kThreads - 1) / kThreads;
  if (blocks < 1) blocks = 1;
  return static_cast<int>(std::min<int64_t>(blocks, max_blocks));
}

bool Aligned(const void* p, size_t a) {
  return (reinterpret_cast<uintptr_t>(p) % a) == 0;
}

template <class Tr, bool kBaseIn, bool kSrcIn>
cudaError_t ReduceTyped(void* dst_v, const void* base, const void* src,
                        int64_t n, cudaStream_t stream) {
  using A = typename Tr::A;
  using BT = OperandT<Tr, kBaseIn>;
  using ST = OperandT<Tr, kSrcIn>;
  constexpr int V = 16 / sizeof(A);
  if (n <= 0) return cudaSuccess;
  A* dst = static_cast<A*>(dst_v);
  // Scalar head until dst is 16-byte aligned (element-aligned pointers
  // assumed, as XLA and cudaMalloc give).
  int64_t head = static_cast<int64_t>(
      ((16 - reinterpret_cast<uintptr_t>(dst) % 16) % 16) / sizeof(A));
  if (head > n || reinterpret_cast<uintptr_t>(dst) % sizeof(A) != 0) head = n;
  int64_t nvec = (n - head) / V;
  if (nvec > 0 &&
      (!Aligned(static_cast<const BT*>(base) + head, sizeof(BT) * V) ||
       !Aligned(static_cast<const ST*>(src) + head, sizeof(ST) * V))) {
    nvec = 0;  // operands misaligned relative to dst: all scalar
  }
  const int64_t work = std::max<int64_t>(nvec, n - nvec * V);
  ReduceKernel<Tr, kBaseIn, kSrcIn><<<GridFor(work), kThreads, 0, stream>>>(
      dst, base, src, n, head, nvec);
  return cudaGetLastError();
}

template <class Tr>
cudaError_t ReduceDispatch(void* dst, const void* base, bool base_in,
                           const void* src, bool src_in, int64_t n,
                           cudaStream_t stream) {
  if constexpr (Tr::kSame) {
    return ReduceTyped<Tr, false, false>(dst, base, src, n, stream);
  } else {
    if (base_in && src_in) return ReduceTyped<Tr, true, true>(dst, base, src, n, stream);
    if (base_in) return ReduceTyped<Tr, true, false>(dst, base, src, n, stream);
    if (src_in) return ReduceTyped<Tr, false, true>(dst, base, src, n, stream);
    return ReduceTyped<Tr, false, false>(dst, base, src, n, stream);
  }
}

template <class Tr>
cudaError_t ToAccTyped(void* dst, const void* src, int64_t n, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  ToAccKernel<Tr><<<GridFor(n), kThreads, 0, s>>>(
      static_cast<typename Tr::A*>(dst), static_cast<const typename Tr::T*>(src), n);
  return cudaGetLastError();
}

template <class Tr>
cudaError_t FinalizeTyped(void* out, const void* acc, int64_t n, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  FinalizeKernel<Tr><<<GridFor(n), kThreads, 0, s>>>(
      static_cast<typename Tr::T*>(out), static_cast<const typename Tr::A*>(acc), n);
  return cudaGetLastError();
}

}  // namespace

std::string CudaErrorText(const char* what, cudaError_t e) {
  return std::string("jax_blink CUDA executor: ") + what + ": " +
         cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

cudaError_t LaunchToAcc(DType d, void* dst, const void* src, int64_t n,
                        cudaStream_t s) {
  switch (d) {
    case DType::kF16: return ToAccTyped<F16Traits>(dst, src, n, s);
    case DType::kBF16: return ToAccTyped<BF16Traits>(dst, src, n, s);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t LaunchReduce(DType d, void* dst, const void* base, bool base_in,
                         const void* src, bool src_in, int64_t n,
                         cudaStream_t s) {
  switch (d) {
    case DType::kF32: return ReduceDispatch<SameTraits<float>>(dst, base, base_in, src, src_in, n, s);
    case DType::kF64: return ReduceDispatch<SameTraits<double>>(dst, base, base_in, src, src_in, n, s);
    case DType::kF16: return ReduceDispatch<F16Traits>(dst, base, base_in, src, src_in, n, s);
    case DType::kBF16: return ReduceDispatch<BF16Traits>(dst, base, base_in, src, src_in, n, s);
    case DType::kI32:
    case DType::kU32: return ReduceDispatch<SameTraits<uint32_t>>(dst, base, base_in, src, src_in, n, s);
    case DType::kI64: return ReduceDispatch<SameTraits<uint64_t>>(dst, base, base_in, src, src_in, n, s);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchFinalize(DType d, void* out, const void* acc, int64_t n,
                           cudaStream_t s) {
  switch (d) {
    case DType::kF16: return FinalizeTyped<F16Traits>(out, acc, n, s);
    case DType::kBF16: return FinalizeTyped<BF16Traits>(out, acc, n, s);
    default:
      if (out == acc || n <= 0) return cudaSuccess;
      return cudaMemcpyAsync(out, acc, n * DTypeSize(d), cudaMemcpyDeviceToDevice, s);
  }
}

// ---- The transport ---------------------------------------------------------

CudaTransport::~CudaTransport() {
  for (const StreamRec& r : streams_) {
    if (r.owned && r.stream) {
      cudaSetDevice(r.device);
      cudaStreamDestroy(r.stream);
    }
  }
  for (const EventRec& r : events_) {
    if (r.event) {
      cudaSetDevice(r.device);
      cudaEventDestroy(r.event);
    }
  }
}

namespace {
// Stores rec in a freed entry of table if there is one, else appends it;
// returns its index (the id).
template <typename Rec>
int32_t Put(std::vector<Rec>& table, std::vector<int32_t>& freed, const Rec& rec) {
  if (freed.empty()) {
    table.push_back(rec);
    return static_cast<int32_t>(table.size() - 1);
  }
  const int32_t id = freed.back();
  freed.pop_back();
  table[id] = rec;
  return id;
}
}  // namespace

std::string CudaTransport::Use(int device) {
  int cur = -1;
  cudaError_t e = cudaGetDevice(&cur);
  if (e == cudaSuccess && cur == device) return std::string();
  e = cudaSetDevice(device);
  return e == cudaSuccess ? std::string() : CudaErrorText("cudaSetDevice", e);
}

std::string CudaTransport::UseStream(StreamId s, cudaStream_t* out) {
  if (s < 0 || static_cast<size_t>(s) >= streams_.size() || !streams_[s].stream) {
    return "jax_blink CUDA executor: unknown stream id " + std::to_string(s);
  }
  *out = streams_[s].stream;
  return Use(streams_[s].device);
}

StreamId CudaTransport::Adopt(int device, cudaStream_t stream) {
  auto it = adopted_.find(stream);
  if (it != adopted_.end() && streams_[it->second].device == device) return it->second;
  const StreamId id = Put(streams_, free_streams_, StreamRec{stream, device, false});
  adopted_[stream] = id;
  return id;
}

std::string CudaTransport::CreateStream(int device, StreamId* s) {
  std::string err = Use(device);
  if (!err.empty()) return err;
  cudaStream_t st = nullptr;
  cudaError_t e = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  if (e != cudaSuccess) return CudaErrorText("cudaStreamCreate", e);
  *s = Put(streams_, free_streams_, StreamRec{st, device, true});
  return std::string();
}

std::string CudaTransport::CreateEvent(int device, EventId* ev) {
  std::string err = Use(device);
  if (!err.empty()) return err;
  cudaEvent_t x = nullptr;
  cudaError_t e = cudaEventCreateWithFlags(&x, cudaEventDisableTiming);
  if (e != cudaSuccess) return CudaErrorText("cudaEventCreate", e);
  *ev = Put(events_, free_events_, EventRec{x, device});
  return std::string();
}

void CudaTransport::DestroyStream(StreamId s) {
  if (s < 0 || static_cast<size_t>(s) >= streams_.size()) return;
  StreamRec& r = streams_[s];
  if (!r.stream) return;
  if (r.owned) {
    cudaSetDevice(r.device);
    cudaStreamDestroy(r.stream);
  } else {
    adopted_.erase(r.stream);
  }
  r = StreamRec();
  free_streams_.push_back(s);
}

void CudaTransport::DestroyEvent(EventId e) {
  if (e < 0 || static_cast<size_t>(e) >= events_.size() || !events_[e].event) return;
  cudaSetDevice(events_[e].device);
  cudaEventDestroy(events_[e].event);
  events_[e] = EventRec();
  free_events_.push_back(e);
}

std::string CudaTransport::Alloc(int device, size_t bytes, void** p) {
  std::string err = Use(device);
  if (!err.empty()) return err;
  cudaError_t e = cudaMalloc(p, bytes ? bytes : 1);
  if (e != cudaSuccess) {
    *p = nullptr;
    return CudaErrorText("cudaMalloc", e) + " (" + std::to_string(bytes) +
           " bytes of executor scratch on device " + std::to_string(device) + ")";
  }
  return std::string();
}

void CudaTransport::Free(int device, void* p) {
  if (!p) return;
  cudaSetDevice(device);
  cudaFree(p);
}

bool CudaTransport::PeerReadable(int reader, int owner) {
  if (reader == owner) return true;
  auto key = std::make_pair(reader, owner);
  auto it = peer_.find(key);
  if (it != peer_.end()) return it->second;
  int can = 0;
  bool ok = cudaDeviceCanAccessPeer(&can, reader, owner) == cudaSuccess && can;
  if (ok && Use(reader).empty()) {
    cudaError_t e = cudaDeviceEnablePeerAccess(owner, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) {
      cudaGetLastError();  // not sticky; clear it
    } else if (e != cudaSuccess) {
      cudaGetLastError();
      ok = false;
    }
  } else {
    ok = false;
  }
  peer_[key] = ok;
  return ok;
}

template <typename Fn>
std::string CudaTransport::OnStream(StreamId s, const char* what, Fn&& launch) {
  cudaStream_t st;
  std::string err = UseStream(s, &st);
  if (!err.empty()) return err;
  const cudaError_t e = launch(st);
  return e == cudaSuccess ? std::string() : CudaErrorText(what, e);
}

std::string CudaTransport::Record(EventId ev, StreamId s) {
  return OnStream(s, "cudaEventRecord",
                  [&](cudaStream_t st) { return cudaEventRecord(events_[ev].event, st); });
}

std::string CudaTransport::Wait(StreamId s, EventId ev) {
  return OnStream(s, "cudaStreamWaitEvent", [&](cudaStream_t st) {
    return cudaStreamWaitEvent(st, events_[ev].event, 0);
  });
}

std::string CudaTransport::Copy(StreamId s, void* dst, int dst_device, const void* src,
                                int src_device, size_t bytes) {
  if (bytes == 0) return std::string();
  // Across devices without peer access the driver stages the copy through
  // pinned host memory.
  return OnStream(s, "copy", [&](cudaStream_t st) {
    return dst_device == src_device
               ? cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st)
               : cudaMemcpyPeerAsync(dst, dst_device, src, src_device, bytes, st);
  });
}

std::string CudaTransport::Reduce(StreamId s, DType d, void* dst, const void* base,
                                  bool base_is_input, const void* src, bool src_is_input,
                                  int64_t n) {
  return OnStream(s, "reduction kernel", [&](cudaStream_t st) {
    return LaunchReduce(d, dst, base, base_is_input, src, src_is_input, n, st);
  });
}

std::string CudaTransport::ToAcc(StreamId s, DType d, void* dst, const void* src,
                                 int64_t n) {
  return OnStream(s, "conversion kernel",
                  [&](cudaStream_t st) { return LaunchToAcc(d, dst, src, n, st); });
}

std::string CudaTransport::Finalize(StreamId s, DType d, void* out, const void* acc,
                                    int64_t n) {
  return OnStream(s, "rounding kernel",
                  [&](cudaStream_t st) { return LaunchFinalize(d, out, acc, n, st); });
}

}  // namespace jax_blink
