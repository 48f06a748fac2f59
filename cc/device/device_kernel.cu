// The device executor's CUDA build: the kernel that runs device_interp.h, a
// thread block per program block, and its host side (device_gpu.h).
#include <cuda/atomic>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "cuda/cuda_transport.h"
#include "device/device_gpu.h"
#include "device/device_interp.h"
#include "device/device_setup.h"
#include "device/device_status.h"

namespace jax_blink {

namespace {

// The interpreter's primitives on the GPU: thread 0 of the block waits and
// publishes with system-scope acquire/release (peers may be other GPUs);
// every thread moves data; __syncthreads orders the block's writes before
// the leader's release and its acquire before their reads.
struct GpuEnv {
  __host__ __device__ uint64_t Load(const uint64_t* p) const {
#if defined(__CUDA_ARCH__)
    cuda::atomic_ref<uint64_t, cuda::thread_scope_system> a(*const_cast<uint64_t*>(p));
    return a.load(cuda::memory_order_acquire);
#else
    return 0;
#endif
  }
  __host__ __device__ void Store(uint64_t* p, uint64_t v) const {
#if defined(__CUDA_ARCH__)
    cuda::atomic_ref<uint64_t, cuda::thread_scope_system> a(*p);
    a.store(v, cuda::memory_order_release);
#endif
  }
  __host__ __device__ void Publish(uint64_t* flag, uint64_t v) const { Store(flag, v); }
  __host__ __device__ void Fence() const {
#if defined(__CUDA_ARCH__)
    cuda::atomic_thread_fence(cuda::memory_order_seq_cst, cuda::thread_scope_system);
#endif
  }
  __host__ __device__ bool Poisoned(const uint64_t* error, uint64_t gen) const {
    return Load(error) >= gen;
  }
  __host__ __device__ int64_t Now() const {
#if defined(__CUDA_ARCH__)
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return static_cast<int64_t>(t);
#else
    return 0;
#endif
  }
  __host__ __device__ void Pause(uint32_t k) const {
#if defined(__CUDA_ARCH__)
    if (k >= 32) __nanosleep(k < 1024 ? 64 : 1000);
#endif
  }
  __host__ __device__ bool Leader() const {
#if defined(__CUDA_ARCH__)
    return threadIdx.x == 0;
#else
    return true;
#endif
  }
  __host__ __device__ int Lane() const {
#if defined(__CUDA_ARCH__)
    return threadIdx.x;
#else
    return 0;
#endif
  }
  __host__ __device__ int Lanes() const {
#if defined(__CUDA_ARCH__)
    return blockDim.x;
#else
    return 1;
#endif
  }
  __host__ __device__ void Sync() const {
#if defined(__CUDA_ARCH__)
    __syncthreads();
#endif
  }
  __host__ __device__ int Share(int v) const {
#if defined(__CUDA_ARCH__)
    __shared__ int shared;
    __syncthreads();
    if (threadIdx.x == 0) shared = v;
    __syncthreads();
    return shared;
#else
    return v;
#endif
  }
};

struct KernelArgs {
  DeviceProgramView prog;
  uint64_t* control;
  uint64_t generation;
  int64_t timeout_ns;
  uint64_t executor;
  int32_t rank;
  int32_t block_begin;  // the rank's first block in prog.blocks
  DeviceRankBuffers bufs[kDeviceGpuMaxRanks];
};

__global__ void DeviceRankKernel(const KernelArgs a) {
  GpuEnv env;
  const DeviceCallView call{a.bufs,     a.control, a.generation,     a.timeout_ns,
                            a.executor, a.rank,    a.block_begin,
                            static_cast<int32_t>(gridDim.x)};
  RunDeviceBlock(env, a.prog, call, static_cast<int32_t>(blockIdx.x));
}

Status CudaStatus(const char* what, cudaError_t e) {
  return Status::Internal("jax_blink: device executor: " + CudaErrorText(what, e));
}

// device_setup.h's backend on CUDA: device memory from cudaMalloc; uploads
// and zeroing on a non-blocking stream of the executor's own per device
// (never the legacy default stream, which XLA's streams do not wait for),
// and Finish() synchronises those streams, so the setup is complete on the
// host before any launch.
class CudaSetupMemory {
 public:
  ~CudaSetupMemory() {
    for (auto& [dev, st] : streams_) cudaStreamDestroy(st);
  }
  std::string Alloc(int device, size_t bytes, void** p) {
    cudaError_t c = cudaSetDevice(device);
    if (c == cudaSuccess) c = cudaMalloc(p, std::max<size_t>(bytes, 16));
    return c == cudaSuccess ? std::string() : CudaErrorText("cudaMalloc", c);
  }
  void Free(int device, void* p) {
    cudaSetDevice(device);
    cudaFree(p);
  }
  std::string Upload(int device, void* dst, const void* src, size_t bytes) {
    cudaStream_t st = nullptr;
    std::string e = StreamOf(device, &st);
    if (!e.empty()) return e;
    const cudaError_t c = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st);
    return c == cudaSuccess ? std::string() : CudaErrorText("uploading the program", c);
  }
  std::string Zero(int device, void* dst, size_t bytes) {
    cudaStream_t st = nullptr;
    std::string e = StreamOf(device, &st);
    if (!e.empty()) return e;
    const cudaError_t c = cudaMemsetAsync(dst, 0, bytes, st);
    return c == cudaSuccess ? std::string() : CudaErrorText("zeroing the flags", c);
  }
  std::string Finish() {
    std::string err;
    for (auto& [dev, st] : streams_) {
      const cudaError_t c = cudaStreamSynchronize(st);
      if (c != cudaSuccess && err.empty()) err = CudaErrorText("finishing the setup", c);
    }
    return err;
  }

 private:
  std::string StreamOf(int device, cudaStream_t* st) {
    auto it = streams_.find(device);
    if (it == streams_.end()) {
      cudaError_t c = cudaSetDevice(device);
      cudaStream_t s = nullptr;
      if (c == cudaSuccess) c = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      if (c != cudaSuccess) return CudaErrorText("cudaStreamCreate (setup)", c);
      it = streams_.emplace(device, s).first;
    }
    *st = it->second;
    return std::string();
  }
  std::map<int, cudaStream_t> streams_;
};

// Restores the current device on scope exit.
struct DeviceGuard {
  int saved = -1;
  DeviceGuard() { cudaGetDevice(&saved); }
  ~DeviceGuard() {
    if (saved >= 0) cudaSetDevice(saved);
  }
};

}  // namespace

Status DeviceGpuExecutor::Create(const Schedule& s, const std::vector<int>& devices,
                                 std::unique_ptr<DeviceGpuExecutor>* out) {
  if (static_cast<int64_t>(devices.size()) != s.nranks) {
    return Status::InvalidArgument("jax_blink: device executor: need one device per rank");
  }
  if (s.nranks > kDeviceGpuMaxRanks) {
    return Status::InvalidArgument("jax_blink: device executor: " + std::to_string(s.nranks) +
                                   " ranks, at most " + std::to_string(kDeviceGpuMaxRanks));
  }
  std::unique_ptr<DeviceGpuExecutor> e(new DeviceGpuExecutor());
  const std::string err = BuildDeviceProgram(s, 0, &e->program_);
  if (!err.empty()) return Status::InvalidArgument("jax_blink: " + err);
  const DeviceProgram& p = e->program_;
  e->devices_ = devices;
  DeviceGuard guard;

  // Co-residency: every block of the ranks sharing a GPU must run at once.
  std::map<int, int64_t> blocks_on;
  for (int64_t r = 0; r < s.nranks; ++r) blocks_on[devices[r]] += p.ranks[r].nblocks;
  for (const auto& [dev, nblocks] : blocks_on) {
    cudaError_t c = cudaSetDevice(dev);
    if (c != cudaSuccess) return CudaStatus("cudaSetDevice", c);
    int sms = 0, per_sm = 0;
    c = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (c != cudaSuccess) return CudaStatus("cudaDeviceGetAttribute", c);
    c = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, DeviceRankKernel, e->threads_, 0);
    if (c != cudaSuccess) return CudaStatus("cudaOccupancyMaxActiveBlocksPerMultiprocessor", c);
    if (static_cast<int64_t>(per_sm) * sms < nblocks) {
      return Status::InvalidArgument(
          "jax_blink: device executor: the ranks on GPU " + std::to_string(dev) + " need " +
          std::to_string(nblocks) + " resident thread blocks, the GPU holds " +
          std::to_string(static_cast<int64_t>(per_sm) * sms) +
          " of this kernel at once (use the stream executor: JAX_BLINK_CUDA_EXECUTOR=stream)");
    }
  }
  // Peer access between the ranks' GPUs.
  for (int a : devices) {
    for (int b : devices) {
      if (a == b) continue;
      int ok = 0;
      cudaDeviceCanAccessPeer(&ok, a, b);
      if (!ok) {
        return Status::InvalidArgument("jax_blink: device executor: GPU " + std::to_string(a) +
                                       " cannot access GPU " + std::to_string(b) +
                                       "'s memory (use the stream executor: "
                                       "JAX_BLINK_CUDA_EXECUTOR=stream)");
      }
      cudaSetDevice(a);
      const cudaError_t c = cudaDeviceEnablePeerAccess(b, 0);
      if (c != cudaSuccess && c != cudaErrorPeerAccessAlreadyEnabled) {
        return CudaStatus("cudaDeviceEnablePeerAccess", c);
      }
      cudaGetLastError();  // (clears cudaErrorPeerAccessAlreadyEnabled)
    }
  }
  // The program, flags and control words, complete before the first launch.
  {
    CudaSetupMemory mem;
    const std::string err = SetUpDeviceState(p, devices, NextDeviceExecutorId(), mem, &e->state_);
    if (!err.empty()) return Status::Internal("jax_blink: device executor: " + err);
  }
  const size_t control_bytes = DeviceControlWords(p.nranks, p.max_blocks) * sizeof(uint64_t);
  e->host_control_.assign(s.nranks, nullptr);
  for (int64_t r = 0; r < s.nranks; ++r) {
    const cudaError_t c = cudaMallocHost(&e->host_control_[r], control_bytes);
    if (c != cudaSuccess) return CudaStatus("cudaMallocHost", c);
  }
  *out = std::move(e);
  return Status();
}

DeviceGpuExecutor::~DeviceGpuExecutor() {
  DeviceGuard guard;
  CudaSetupMemory mem;
  FreeDeviceState(mem, &state_);
  for (void* h : host_control_) {
    if (h != nullptr) cudaFreeHost(h);
  }
}

Status DeviceGpuExecutor::Launch(int64_t rank, const std::vector<DeviceGpuBuffers>& bufs,
                                 uint64_t generation, int64_t timeout_ms, void* stream) {
  const DeviceProgram& p = program_;
  if (rank < 0 || rank >= p.nranks || static_cast<int64_t>(bufs.size()) != p.nranks) {
    return Status::InvalidArgument("jax_blink: device executor: bad rank or buffers");
  }
  KernelArgs a;
  std::memset(&a, 0, sizeof(a));
  a.prog = state_.on_device[state_.view_of_rank[rank]].view;
  a.control = state_.control;
  a.generation = generation;
  a.timeout_ns = std::max<int64_t>(timeout_ms, 1) * 1000000;
  a.executor = state_.executor;
  a.rank = static_cast<int32_t>(rank);
  a.block_begin = p.ranks[rank].block_begin;
  for (int64_t r = 0; r < p.nranks; ++r) {
    a.bufs[r].in = bufs[r].in;
    a.bufs[r].out = bufs[r].out;
    a.bufs[r].acc = p.acc_is_out ? bufs[r].out : bufs[r].workspace;
    a.bufs[r].flags = state_.flags[r];
    if (!p.acc_is_out && bufs[r].workspace == nullptr) {
      return Status::Internal("jax_blink: device executor: rank " + std::to_string(r) +
                              " has no workspace for its accumulator");
    }
  }
  DeviceGuard guard;
  cudaSetDevice(devices_[rank]);
  DeviceRankKernel<<<p.ranks[rank].nblocks, threads_, 0, static_cast<cudaStream_t>(stream)>>>(a);
  const cudaError_t c = cudaGetLastError();
  if (c != cudaSuccess) return CudaStatus("launching the device executor's kernel", c);
  return Status();
}

Status DeviceGpuExecutor::Outcome(int64_t rank, uint64_t generation, int64_t timeout_ms,
                                  void* stream, const std::string& where) {
  const DeviceProgram& p = program_;
  const size_t bytes = DeviceControlWords(p.nranks, p.max_blocks) * sizeof(uint64_t);
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  cudaError_t c =
      cudaMemcpyAsync(host_control_[rank], state_.control, bytes, cudaMemcpyDefault, st);
  if (c == cudaSuccess) c = cudaStreamSynchronize(st);
  if (c != cudaSuccess) return CudaStatus("reading the device executor's control words", c);
  return DeviceRankStatus(p, static_cast<const uint64_t*>(host_control_[rank]), rank, generation,
                          timeout_ms, state_.executor, where);
}

}  // namespace jax_blink
