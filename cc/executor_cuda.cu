// CUDA executor: reduction kernels and the event-ordered enqueueing of a
// decoded schedule. See executor_cuda.h for the model.
//
// STATUS: compile-checked only (nvcc, no GPU on the machine it was written
// on). Nothing here has been run yet; tests/test_cuda.py is the check.
#include "executor_cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "executor.h"  // StepTracker (shared with the CPU executor)

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

// Converts an f16/bf16 input chunk into the float32 accumulator.
cudaError_t LaunchToAcc(DType d, void* dst, const void* src, int64_t n,
                        cudaStream_t s) {
  switch (d) {
    case DType::kF16: return ToAccTyped<F16Traits>(dst, src, n, s);
    case DType::kBF16: return ToAccTyped<BF16Traits>(dst, src, n, s);
    default: return cudaErrorInvalidValue;
  }
}

std::string CudaErr(const char* what, cudaError_t e) {
  return std::string("jax_blink CUDA executor: ") + what + ": " +
         cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

}  // namespace

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

// ---- The executor --------------------------------------------------------

struct CudaExecutor::Impl {
  struct Rank {
    int device = -1;
    std::vector<cudaStream_t> link;  // [peer]: RECVs from peer (nullptr: self)
    std::vector<cudaEvent_t> tail;   // [peer]: end of link[peer]'s work
    std::vector<cudaEvent_t> step_ev;
    std::vector<int32_t> ev_stream;  // peer whose link stream recorded step_ev
    cudaEvent_t start = nullptr;
    void* scratch = nullptr;  // float32 accumulator (f16/bf16)
    size_t scratch_bytes = 0;
    std::vector<void*> stage;  // [peer]: staging of RECVs from peer
    std::vector<size_t> stage_bytes;
  };
  std::vector<Rank> ranks;

  ~Impl() { Release(); }

  void Release() {
    for (Rank& r : ranks) {
      if (r.device < 0) continue;
      cudaSetDevice(r.device);
      for (cudaStream_t s : r.link) if (s) cudaStreamDestroy(s);
      for (cudaEvent_t e : r.tail) if (e) cudaEventDestroy(e);
      for (cudaEvent_t e : r.step_ev) if (e) cudaEventDestroy(e);
      if (r.start) cudaEventDestroy(r.start);
      if (r.scratch) cudaFree(r.scratch);
      for (void* p : r.stage) if (p) cudaFree(p);
    }
    ranks.clear();
  }

  static cudaError_t NewEvent(cudaEvent_t* e) {
    return cudaEventCreateWithFlags(e, cudaEventDisableTiming);
  }

  // Streams, events and scratch for `n` ranks on `devices`; grows only.
  std::string Prepare(const Schedule& s, const std::vector<CudaRankBuffers>& b,
                      bool staged) {
    const int64_t n = s.nranks;
    bool same = static_cast<int64_t>(ranks.size()) == n;
    for (int64_t r = 0; same && r < n; ++r) same = ranks[r].device == b[r].device;
    if (!same) {
      Release();
      ranks.resize(n);
      for (int64_t r = 0; r < n; ++r) {
        Rank& R = ranks[r];
        R.device = b[r].device;
        cudaError_t e = cudaSetDevice(R.device);
        if (e != cudaSuccess) return CudaErr("cudaSetDevice", e);
        R.link.assign(n, nullptr);
        R.tail.assign(n, nullptr);
        R.stage.assign(n, nullptr);
        R.stage_bytes.assign(n, 0);
        if ((e = NewEvent(&R.start)) != cudaSuccess) return CudaErr("cudaEventCreate", e);
        for (int64_t p = 0; p < n; ++p) {
          if (p == r) continue;
          if ((e = cudaStreamCreateWithFlags(&R.link[p], cudaStreamNonBlocking)) != cudaSuccess)
            return CudaErr("cudaStreamCreate", e);
          if ((e = NewEvent(&R.tail[p])) != cudaSuccess) return CudaErr("cudaEventCreate", e);
        }
      }
    }
    const size_t tsize = DTypeSize(s.dtype);
    const size_t asize = AccSize(s.dtype);
    for (int64_t r = 0; r < n; ++r) {
      Rank& R = ranks[r];
      cudaError_t e = cudaSetDevice(R.device);
      if (e != cudaSuccess) return CudaErr("cudaSetDevice", e);
      const size_t nsteps = s.ranks[r].steps.size();
      while (R.step_ev.size() < nsteps) {
        cudaEvent_t ev;
        if ((e = NewEvent(&ev)) != cudaSuccess) return CudaErr("cudaEventCreate", e);
        R.step_ev.push_back(ev);
      }
      R.ev_stream.assign(nsteps, -1);
      if (HasScratchAcc(s.dtype)) {
        const size_t need = static_cast<size_t>(s.count) * asize;
        if (R.scratch_bytes < need) {
          if (R.scratch) cudaFree(R.scratch);
          R.scratch = nullptr;
          R.scratch_bytes = 0;
          if ((e = cudaMalloc(&R.scratch, need)) != cudaSuccess) return CudaErr("cudaMalloc scratch", e);
          R.scratch_bytes = need;
        }
      }
      if (staged) {
        // One staging area per link that carries a RECV, indexed like the
        // buffers (chunks never overlap; a link's copies are stream-ordered).
        std::vector<uint8_t> used(n, 0);
        for (const Step& st : s.ranks[r].steps) {
          if (st.op != Op::kSend) used[st.peer] = 1;
        }
        const size_t need = static_cast<size_t>(s.count) * std::max(tsize, asize);
        for (int64_t p = 0; p < n; ++p) {
          if (!used[p] || R.stage_bytes[p] >= need) continue;
          if (R.stage[p]) cudaFree(R.stage[p]);
          R.stage[p] = nullptr;
          R.stage_bytes[p] = 0;
          if ((e = cudaMalloc(&R.stage[p], need)) != cudaSuccess) return CudaErr("cudaMalloc staging", e);
          R.stage_bytes[p] = need;
        }
      }
    }
    return std::string();
  }

  // Can device `a` read device `b`'s memory in a kernel? Enables peer
  // access on first use.
  bool DirectOk(int a, int b) {
    if (a == b) return true;
    int can = 0;
    if (cudaDeviceCanAccessPeer(&can, a, b) != cudaSuccess || !can) return false;
    cudaSetDevice(a);
    cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) {
      cudaGetLastError();  // clear the sticky-free error
      return true;
    }
    return e == cudaSuccess;
  }
};

CudaExecutor::CudaExecutor() : impl_(new Impl) {}
CudaExecutor::~CudaExecutor() = default;

std::string CudaExecutor::Enqueue(const Schedule& s,
                                  const std::vector<CudaRankBuffers>& bufs,
                                  const CudaExecOptions& opts) {
  const int64_t n = s.nranks;
  if (static_cast<int64_t>(bufs.size()) != n) {
    return "jax_blink CUDA executor: need " + std::to_string(n) + " ranks' buffers, got " +
           std::to_string(bufs.size());
  }
  for (int64_t r = 0; r < n; ++r) {
    if (bufs[r].in == bufs[r].out && s.count > 0) {
      return "jax_blink CUDA executor: rank " + std::to_string(r) +
             ": output aliasing the input is not supported yet";
    }
  }
  // Per link (receiver r, sender p): read directly or through staging.
  std::vector<uint8_t> direct(n * n, 0);
  bool any_staged = false;
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t p = 0; p < n; ++p) {
      if (p == r) continue;
      direct[r * n + p] = opts.direct && impl_->DirectOk(bufs[r].device, bufs[p].device);
      any_staged |= !direct[r * n + p];
    }
  }
  std::string err = impl_->Prepare(s, bufs, any_staged);
  if (!err.empty()) return err;
  auto& R = impl_->ranks;
  const size_t tsize = DTypeSize(s.dtype);
  const size_t asize = AccSize(s.dtype);
  const bool scratch_acc = HasScratchAcc(s.dtype);
  auto acc_of = [&](int64_t r) -> char* {
    return static_cast<char*>(scratch_acc ? R[r].scratch : bufs[r].out);
  };
  auto in_of = [&](int64_t r) -> const char* {
    return static_cast<const char*>(bufs[r].in);
  };

  cudaError_t e;
#define JB_CHECK(call, what)                                  \
  do {                                                        \
    if ((e = (call)) != cudaSuccess) return CudaErr(what, e); \
  } while (0)

  // Entry: each link stream starts after its receiver's and its sender's
  // inputs are ready (their callers' streams reached this call).
  for (int64_t r = 0; r < n; ++r) {
    JB_CHECK(cudaSetDevice(R[r].device), "cudaSetDevice");
    JB_CHECK(cudaEventRecord(R[r].start, bufs[r].stream), "cudaEventRecord");
  }
  for (int64_t r = 0; r < n; ++r) {
    JB_CHECK(cudaSetDevice(R[r].device), "cudaSetDevice");
    for (int64_t p = 0; p < n; ++p) {
      if (p == r) continue;
      JB_CHECK(cudaStreamWaitEvent(R[r].link[p], R[r].start, 0), "cudaStreamWaitEvent");
      JB_CHECK(cudaStreamWaitEvent(R[r].link[p], R[p].start, 0), "cudaStreamWaitEvent");
    }
  }

  // Makes `stream` (link[peer_of_stream] of rank `rr`) wait for the value
  // produced by the local dependencies of step i of rank `owner`: the events
  // of the RECVs among them, and through SENDs (which do no work) the
  // dependencies of those.
  std::string werr;
  auto wait_deps = [&](auto&& self, cudaStream_t stream, int64_t rr, int64_t link_peer,
                       int64_t owner, int32_t i) -> void {
    const RankSteps& rs = s.ranks[owner];
    const Step& st = rs.steps[i];
    for (int32_t k = st.deps_begin; k < st.deps_end && werr.empty(); ++k) {
      const int32_t d = rs.deps[k];
      const Step& sd = rs.steps[d];
      if (sd.op == Op::kSend) {
        self(self, stream, rr, link_peer, owner, d);
        continue;
      }
      // Same stream: already ordered.
      if (owner == rr && R[owner].ev_stream[d] == link_peer) continue;
      cudaError_t we = cudaStreamWaitEvent(stream, R[owner].step_ev[d], 0);
      if (we != cudaSuccess) werr = CudaErr("cudaStreamWaitEvent", we);
    }
  };

  std::vector<StepTracker> tr(n);
  for (int64_t r = 0; r < n; ++r) tr[r].Reset(s.ranks[r]);

  auto run_step = [&](int64_t r, int32_t i) -> bool {
    const RankSteps& rs = s.ranks[r];
    const Step& st = rs.steps[i];
    if (st.op == Op::kSend) {  // the receiver does the work
      tr[r].MarkDone(i);
      return true;
    }
    const int64_t p = st.peer;
    // Host-side order: every event waited on must be recorded already.
    if (!st.src_input && !tr[p].Done(st.match)) return false;
    for (int32_t k = st.guards_begin; k < st.guards_end; ++k) {
      const Step& g = rs.steps[rs.guards[k]];
      if (!g.src_input && !tr[g.peer].Done(g.match)) return false;
    }
    if (!err.empty()) return false;
    cudaStream_t stream = R[r].link[p];
    if ((e = cudaSetDevice(R[r].device)) != cudaSuccess) {
      err = CudaErr("cudaSetDevice", e);
      return false;
    }
    wait_deps(wait_deps, stream, r, p, r, i);
    if (!st.src_input) wait_deps(wait_deps, stream, r, p, p, st.match);
    for (int32_t k = st.guards_begin; k < st.guards_end && werr.empty(); ++k) {
      const Step& g = rs.steps[rs.guards[k]];
      if (g.src_input) continue;  // its receiver read our input, not acc
      cudaError_t we = cudaStreamWaitEvent(stream, R[g.peer].step_ev[g.match], 0);
      if (we != cudaSuccess) werr = CudaErr("cudaStreamWaitEvent", we);
    }
    if (!werr.empty()) {
      err = werr;
      return false;
    }
    const int64_t off = s.chunk_offset[st.chunk];
    const int64_t len = s.chunk_length[st.chunk];
    const size_t src_size = st.src_input ? tsize : asize;
    const char* src = st.src_input ? in_of(p) + off * tsize : acc_of(p) + off * asize;
    char* dst = acc_of(r) + off * asize;
    const bool dir = direct[r * n + p];
    const int dev_r = R[r].device, dev_p = R[p].device;
    const bool convert = st.src_input && scratch_acc;  // T -> float32
    // Staged: bring the peer's chunk next to us first.
    auto stage_in = [&]() -> cudaError_t {
      char* stg = static_cast<char*>(R[r].stage[p]) + off * src_size;
      cudaError_t ce =
          dev_r == dev_p
              ? cudaMemcpyAsync(stg, src, len * src_size, cudaMemcpyDeviceToDevice, stream)
              : cudaMemcpyPeerAsync(stg, dev_r, src, dev_p, len * src_size, stream);
      src = stg;
      return ce;
    };
    cudaError_t ce = cudaSuccess;
    if (st.op == Op::kRecvCopy) {
      if (!convert) {
        ce = dev_r == dev_p
                 ? cudaMemcpyAsync(dst, src, len * asize, cudaMemcpyDeviceToDevice, stream)
                 : cudaMemcpyPeerAsync(dst, dev_r, src, dev_p, len * asize, stream);
      } else {
        if (!dir) ce = stage_in();
        if (ce == cudaSuccess) ce = LaunchToAcc(s.dtype, dst, src, len, stream);
      }
    } else {  // RECV_REDUCE
      if (!dir) ce = stage_in();
      const void* base = st.first_write ? static_cast<const void*>(in_of(r) + off * tsize)
                                        : static_cast<const void*>(dst);
      if (ce == cudaSuccess) {
        ce = LaunchReduce(s.dtype, dst, base, st.first_write, src, st.src_input, len,
                          stream);
      }
    }
    if (ce != cudaSuccess) {
      err = CudaErr(st.op == Op::kRecvCopy ? "RECV_COPY" : "RECV_REDUCE", ce);
      return false;
    }
    if ((e = cudaEventRecord(R[r].step_ev[i], stream)) != cudaSuccess) {
      err = CudaErr("cudaEventRecord", e);
      return false;
    }
    R[r].ev_stream[i] = static_cast<int32_t>(p);
    tr[r].MarkDone(i);
    return true;
  };

  // Host-side topological enqueueing: sweep every rank's ready steps until
  // all are enqueued. No GPU waits happen here.
  for (;;) {
    bool all = true, progress = false;
    for (int64_t r = 0; r < n; ++r) {
      if (tr[r].AllDone()) continue;
      progress |= tr[r].Sweep([&](int32_t i) { return run_step(r, i); });
      if (!err.empty()) return err;
      all &= tr[r].AllDone();
    }
    if (all) break;
    if (!progress) {
      std::ostringstream os;
      os << "jax_blink CUDA executor: the schedule's steps cannot be ordered "
            "(cross-rank dependency cycle);";
      for (int64_t r = 0; r < n; ++r) {
        os << " rank " << r << ": " << tr[r].NumDone() << "/" << tr[r].NumSteps();
      }
      return os.str();
    }
  }

  // Exit: each link stream's tail, then every caller stream waits for its
  // own link streams (writes) and its peers' link streams reading from it
  // (so XLA cannot reuse the input/output before every peer has read it).
  for (int64_t r = 0; r < n; ++r) {
    JB_CHECK(cudaSetDevice(R[r].device), "cudaSetDevice");
    for (int64_t p = 0; p < n; ++p) {
      if (p == r) continue;
      JB_CHECK(cudaEventRecord(R[r].tail[p], R[r].link[p]), "cudaEventRecord");
    }
  }
  for (int64_t r = 0; r < n; ++r) {
    JB_CHECK(cudaSetDevice(R[r].device), "cudaSetDevice");
    cudaStream_t main = bufs[r].stream;
    for (int64_t p = 0; p < n; ++p) {
      if (p == r) continue;
      JB_CHECK(cudaStreamWaitEvent(main, R[r].tail[p], 0), "cudaStreamWaitEvent");
      JB_CHECK(cudaStreamWaitEvent(main, R[p].tail[r], 0), "cudaStreamWaitEvent");
    }
    // Output: written chunks from the accumulator (rounded once for
    // f16/bf16), unwritten chunks are the input.
    const RankSteps& rs = s.ranks[r];
    char* out = static_cast<char*>(bufs[r].out);
    for (int64_t c = 0; c < s.nchunks; ++c) {
      const int64_t off = s.chunk_offset[c];
      const int64_t len = s.chunk_length[c];
      if (len == 0) continue;
      if (rs.chunk_written[c]) {
        if (scratch_acc) {
          JB_CHECK(LaunchFinalize(s.dtype, out + off * tsize, acc_of(r) + off * asize, len, main),
                   "finalize");
        }
      } else {
        JB_CHECK(cudaMemcpyAsync(out + off * tsize, in_of(r) + off * tsize, len * tsize,
                                 cudaMemcpyDeviceToDevice, main),
                 "cudaMemcpyAsync");
      }
    }
  }
#undef JB_CHECK
  return std::string();
}

}  // namespace jax_blink
