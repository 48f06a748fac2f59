// CUDA transport of the stream executor: reduction kernels, streams, events
// and peer copies. See cuda_transport.h and stream/stream_exec.h (model).
#include "cuda/cuda_transport.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>
#include <cstring>
#include <sstream>
#include "core/reduce_op.h"


namespace jax_blink {

namespace {

// ---- Per-dtype traits (device side) ------------------------------------
// T: element type of the buffers; A: accumulator type. Sums of signed
// integers wrap (core/reduce_op.h's Combine adds them as unsigned, like the
// CPU executor and lax.psum); max/min compare them signed.
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
  // A NaN widens as core/half.h's HalfToFloat does (sign and payload kept):
  // the hardware conversion may return a canonical NaN, which loses the sign.
  __device__ static A ToAcc(T x) {
    const unsigned int h = __half_as_ushort(x);
    if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0) {
      return __uint_as_float(((h & 0x8000u) << 16) | 0x7f800000u | ((h & 0x3ffu) << 13));
    }
    return __half2float(x);
  }
  // A NaN narrows as core/half.h's FloatToHalf does (quiet, sign kept), not
  // to CUDA's canonical 0x7fff: a broadcast or copy that passes through the
  // accumulator must give the CPU executor's bits.
  __device__ static T FromAcc(A x) {
    if (x != x) {
      return __ushort_as_half(
          static_cast<unsigned short>(0x7e00u | ((__float_as_uint(x) >> 16) & 0x8000u)));
    }
    return __float2half_rn(x);
  }
};
struct BF16Traits {
  using T = __nv_bfloat16;
  using A = float;
  static constexpr bool kSame = false;
  __device__ static A ToAcc(T x) { return __bfloat162float(x); }
  // NaN: core/half.h's FloatToBF16 (payload truncated, quiet bit set).
  __device__ static T FromAcc(A x) {
    if (x != x) {
      return __ushort_as_bfloat16(
          static_cast<unsigned short>((__float_as_uint(x) >> 16) | 0x40u));
    }
    return __float2bfloat16_rn(x);
  }
};

// V elements loaded/stored as one aligned vector (16 bytes for A).
template <typename X, int V>
struct alignas(sizeof(X) * V) Pack {
  X v[V];
};

// The operands of a fused reduction, passed by value to the kernel.
struct ReduceOperands {
  const void* p[kMaxFuse + 1];
  uint32_t input_mask = 0;  // bit j: operand j has the buffer type T
  int nops = 0;
  // A sum starts from a rank's input: add it to +0 first, as lax.psum
  // does (a sum of -0.0 only is +0.0; x + 0 == x otherwise). Never for
  // max/min.
  bool zero_first = false;
};

// Element i of operand j in the accumulator type.
template <class Tr>
__device__ __forceinline__ typename Tr::A LoadAcc(const ReduceOperands& ops, int j,
                                                  int64_t i) {
  if constexpr (!Tr::kSame) {
    if ((ops.input_mask >> j) & 1u) {
      return Tr::ToAcc(static_cast<const typename Tr::T*>(ops.p[j])[i]);
    }
  }
  return static_cast<const typename Tr::A*>(ops.p[j])[i];
}

// V consecutive elements (pack k after `head`) of operand j, widened.
template <class Tr, int V>
__device__ __forceinline__ Pack<typename Tr::A, V> LoadPack(const ReduceOperands& ops,
                                                            int j, int64_t head,
                                                            int64_t k) {
  using A = typename Tr::A;
  using T = typename Tr::T;
  if constexpr (!Tr::kSame) {
    if ((ops.input_mask >> j) & 1u) {
      const Pack<T, V> t =
          reinterpret_cast<const Pack<T, V>*>(static_cast<const T*>(ops.p[j]) + head)[k];
      Pack<A, V> a;
#pragma unroll
      for (int e = 0; e < V; ++e) a.v[e] = Tr::ToAcc(t.v[e]);
      return a;
    }
  }
  return reinterpret_cast<const Pack<A, V>*>(static_cast<const A*>(ops.p[j]) + head)[k];
}

// dst[i] = op(op(ops[0][i], ops[1][i]), ...) left to right (the CPU
// executor's order; op is core/reduce_op.h's Combine<kOp>). Elements [0, head) and [head + nvec * V, n) are scalar;
// the middle is vectorised (16-byte accesses of dst), valid only when the
// caller found every operand aligned at `head` (else nvec == 0). ops[0] may
// alias dst: every element is read before it is written, by one thread.
template <class Tr, ReduceOp kOp>
__global__ void ReduceKernel(typename Tr::A* __restrict__ dst, const ReduceOperands ops,
                             int64_t n, int64_t head, int64_t nvec) {
  using A = typename Tr::A;
  constexpr int V = 16 / sizeof(A);
  const int64_t tid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  auto* dv = reinterpret_cast<Pack<A, V>*>(dst + head);
  for (int64_t k = tid; k < nvec; k += stride) {
    Pack<A, V> acc = LoadPack<Tr, V>(ops, 0, head, k);
    if (ops.zero_first) {
#pragma unroll
      for (int e = 0; e < V; ++e) acc.v[e] = A(0) + acc.v[e];
    }
    for (int j = 1; j < ops.nops; ++j) {
      const Pack<A, V> x = LoadPack<Tr, V>(ops, j, head, k);
#pragma unroll
      for (int e = 0; e < V; ++e) acc.v[e] = Combine<kOp, A>(acc.v[e], x.v[e]);
    }
    dv[k] = acc;
  }
  const int64_t tail_begin = head + nvec * V;
  const int64_t nscalar = head + (n - tail_begin);
  for (int64_t k = tid; k < nscalar; k += stride) {
    const int64_t i = k < head ? k : tail_begin + (k - head);
    A acc = LoadAcc<Tr>(ops, 0, i);
    if (ops.zero_first) acc = A(0) + acc;
    for (int j = 1; j < ops.nops; ++j) acc = Combine<kOp, A>(acc, LoadAcc<Tr>(ops, j, i));
    dst[i] = acc;
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

template <class Tr, ReduceOp kOp>
cudaError_t ReduceTyped(void* dst_v, const StreamOperand* in_ops, int nops, int64_t n,
                        cudaStream_t stream) {
  using A = typename Tr::A;
  using T = typename Tr::T;
  constexpr int V = 16 / sizeof(A);
  if (n <= 0) return cudaSuccess;
  if (nops < 2 || nops > kMaxFuse + 1) return cudaErrorInvalidValue;
  A* dst = static_cast<A*>(dst_v);
  ReduceOperands ops;
  ops.nops = nops;
  ops.zero_first =
      kOp == ReduceOp::kSum && std::is_floating_point<A>::value && in_ops[0].is_input;
  for (int j = 0; j < nops; ++j) {
    ops.p[j] = in_ops[j].p;
    if (!Tr::kSame && in_ops[j].is_input) ops.input_mask |= 1u << j;
  }
  // Scalar head until dst is 16-byte aligned (element-aligned pointers
  // assumed, as XLA and cudaMalloc give).
  int64_t head = static_cast<int64_t>(
      ((16 - reinterpret_cast<uintptr_t>(dst) % 16) % 16) / sizeof(A));
  if (head > n || reinterpret_cast<uintptr_t>(dst) % sizeof(A) != 0) head = n;
  int64_t nvec = (n - head) / V;
  for (int j = 0; j < nops && nvec > 0; ++j) {
    const bool in = (ops.input_mask >> j) & 1u;
    const size_t size = in ? sizeof(T) : sizeof(A);
    if (!Aligned(static_cast<const char*>(ops.p[j]) + head * size, size * V)) {
      nvec = 0;  // operands misaligned relative to dst: all scalar
    }
  }
  const int64_t work = std::max<int64_t>(nvec, n - nvec * V);
  ReduceKernel<Tr, kOp><<<GridFor(work), kThreads, 0, stream>>>(dst, ops, n, head, nvec);
  return cudaGetLastError();
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

template <ReduceOp kOp>
cudaError_t LaunchReduceOp(DType d, void* dst, const StreamOperand* ops, int nops,
                           int64_t n, cudaStream_t s) {
  switch (d) {
    case DType::kF32: return ReduceTyped<SameTraits<float>, kOp>(dst, ops, nops, n, s);
    case DType::kF64: return ReduceTyped<SameTraits<double>, kOp>(dst, ops, nops, n, s);
    case DType::kF16: return ReduceTyped<F16Traits, kOp>(dst, ops, nops, n, s);
    case DType::kBF16: return ReduceTyped<BF16Traits, kOp>(dst, ops, nops, n, s);
    case DType::kI32: return ReduceTyped<SameTraits<int32_t>, kOp>(dst, ops, nops, n, s);
    case DType::kU32: return ReduceTyped<SameTraits<uint32_t>, kOp>(dst, ops, nops, n, s);
    case DType::kI64: return ReduceTyped<SameTraits<int64_t>, kOp>(dst, ops, nops, n, s);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchReduce(DType d, ReduceOp op, void* dst, const StreamOperand* ops, int nops,
                         int64_t n, cudaStream_t s) {
  switch (op) {
    case ReduceOp::kSum: return LaunchReduceOp<ReduceOp::kSum>(d, dst, ops, nops, n, s);
    case ReduceOp::kMax: return LaunchReduceOp<ReduceOp::kMax>(d, dst, ops, nops, n, s);
    case ReduceOp::kMin: return LaunchReduceOp<ReduceOp::kMin>(d, dst, ops, nops, n, s);
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
  for (int32_t id = 0; id < streams_.size(); ++id) {
    const StreamRec* r = streams_.Get(id);
    if (r != nullptr && r->owned && r->stream) {
      cudaSetDevice(r->device);
      cudaStreamDestroy(r->stream);
    }
  }
  for (int32_t id = 0; id < events_.size(); ++id) {
    const EventRec* r = events_.Get(id);
    if (r != nullptr && r->event && r->owned) {
      cudaSetDevice(r->device);
      cudaEventDestroy(r->event);
    }
  }
}

std::string CudaTransport::Use(int device) {
  int cur = -1;
  cudaError_t e = cudaGetDevice(&cur);
  if (e == cudaSuccess && cur == device) return std::string();
  e = cudaSetDevice(device);
  return e == cudaSuccess ? std::string() : CudaErrorText("cudaSetDevice", e);
}

StreamId CudaTransport::Adopt(int device, cudaStream_t stream) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = adopted_.find(stream);
  if (it != adopted_.end()) {
    const StreamRec* r = streams_.Get(it->second);
    if (r != nullptr && r->device == device) return it->second;
  }
  const StreamId id = streams_.Put(StreamRec{stream, device, false});
  if (id >= 0) adopted_[stream] = id;
  return id;
}

std::string CudaTransport::CreateStream(int device, StreamId* s) {
  std::string err = Use(device);
  if (!err.empty()) return err;
  cudaStream_t st = nullptr;
  cudaError_t e = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  if (e != cudaSuccess) return CudaErrorText("cudaStreamCreate", e);
  *s = streams_.Put(StreamRec{st, device, true});
  if (*s < 0) {
    cudaStreamDestroy(st);
    return "jax_blink CUDA executor: too many streams";
  }
  return std::string();
}

std::string CudaTransport::CreateEvent(int device, EventId* ev) {
  std::string err = Use(device);
  if (!err.empty()) return err;
  cudaEvent_t x = nullptr;
  cudaError_t e = cudaEventCreateWithFlags(
      &x, cudaEventDisableTiming | (interprocess_events_ ? cudaEventInterprocess : 0u));
  if (e != cudaSuccess) return CudaErrorText("cudaEventCreate", e);
  *ev = events_.Put(EventRec{x, device});
  if (*ev < 0) {
    cudaEventDestroy(x);
    return "jax_blink CUDA executor: too many events";
  }
  return std::string();
}

void CudaTransport::DestroyStream(StreamId s) {
  const StreamRec* r = streams_.Get(s);
  if (r == nullptr || !r->stream) return;
  if (r->owned) {
    cudaSetDevice(r->device);
    cudaStreamDestroy(r->stream);  // queued work still runs
  } else {
    std::lock_guard<std::mutex> lk(mu_);
    adopted_.erase(r->stream);
  }
  streams_.Erase(s);
}

void CudaTransport::DestroyEvent(EventId e) {
  const EventRec* r = events_.Get(e);
  if (r == nullptr || !r->event) return;
  if (r->owned) {
    cudaSetDevice(r->device);
    cudaEventDestroy(r->event);
  }
  events_.Erase(e);
}

EventId CudaTransport::AdoptEvent(int device, cudaEvent_t event) {
  return events_.Put(EventRec{event, device, /*owned=*/false});
}

cudaEvent_t CudaTransport::EventOf(EventId e) {
  const EventRec* r = events_.Get(e);
  return r == nullptr ? nullptr : r->event;
}

bool CudaTransport::PeerReadable(int reader, int owner) {
  if (reader == owner) return true;
  std::lock_guard<std::mutex> lk(mu_);
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
  const StreamRec* r = streams_.Get(s);
  if (r == nullptr || !r->stream) {
    return "jax_blink CUDA executor: unknown stream id " + std::to_string(s);
  }
  std::string err = Use(r->device);
  if (!err.empty()) return err;
  const cudaError_t e = launch(r->stream);
  return e == cudaSuccess ? std::string() : CudaErrorText(what, e);
}

std::string CudaTransport::Record(EventId ev, StreamId s) {
  const EventRec* r = events_.Get(ev);
  if (r == nullptr || !r->event) {
    return "jax_blink CUDA executor: unknown event id " + std::to_string(ev);
  }
  return OnStream(s, "cudaEventRecord",
                  [&](cudaStream_t st) { return cudaEventRecord(r->event, st); });
}

std::string CudaTransport::Wait(StreamId s, EventId ev) {
  const EventRec* r = events_.Get(ev);
  if (r == nullptr || !r->event) {
    return "jax_blink CUDA executor: unknown event id " + std::to_string(ev);
  }
  return OnStream(s, "cudaStreamWaitEvent",
                  [&](cudaStream_t st) { return cudaStreamWaitEvent(st, r->event, 0); });
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

std::string CudaTransport::Reduce(StreamId s, DType d, ReduceOp op, void* dst,
                                  const StreamOperand* ops, int nops, int64_t n) {
  return OnStream(s, "reduction kernel", [&](cudaStream_t st) {
    return LaunchReduce(d, op, dst, ops, nops, n, st);
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
