// Typed XLA FFI handlers of the "jax_blink_collective" custom call for the
// CUDA platform: one process driving several local GPUs (jax.pmap,
// jax.shard_map).
//
// STATUS: compile-checked only; no GPU was available while writing it. The
// event ordering it enqueues is verified by the host stream emulator.
//
// Each device's invocation runs on that device's XLA thread with its own
// stream (PlatformStream). The invocations meet in the same in-process
// rendezvous as on CPU, keyed by (RunId, op_id, group) plus a per-rank
// generation, and publish their device, stream and buffers. Rank 0 then
// enqueues the whole collective for every rank (StreamExecutor over
// CudaTransport: peer copies and reduction kernels on one stream per link
// direction, ordered across devices by CUDA events), while the other ranks
// wait only for that host-side enqueueing to finish, never for the GPU: once
// they return, XLA enqueues their next work behind the collective's final
// cross-device waits. No host synchronisation happens in the steady state.
// The handler is not command-buffer compatible (it does not declare the
// trait): it meets its peers on the host at every execution.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "executor_cuda.h"
#include "ffi.h"
#include "ffi_common.h"
#include "join.h"
#include "rendezvous.h"
#include "schedule.h"
#include "stream_exec.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jax_blink {
namespace {

// The decoded schedule and, per device, the rank and group that the device
// plays in it. Those arrive as device scalars (computed from axis_index);
// they are fixed for an executable on a device, so they are read from the
// device once (one stream synchronisation) and cached.
struct CudaState {
  static ffi::TypeId id;
  Schedule schedule;
  std::mutex mu;
  std::map<int, std::pair<int32_t, int32_t>> rank_group;  // device -> (rank, group)
};
ffi::TypeId CudaState::id = {};
const XLA_FFI_TypeInfo kCudaStateInfo = ffi::MakeTypeInfo<CudaState>();

std::string RankAndGroup(CudaState* st, int device, cudaStream_t stream,
                         const int32_t* rank_dev, const int32_t* group_dev,
                         int32_t* rank, int32_t* group) {
  std::lock_guard<std::mutex> lk(st->mu);
  auto it = st->rank_group.find(device);
  if (it != st->rank_group.end()) {
    *rank = it->second.first;
    *group = it->second.second;
    return std::string();
  }
  int32_t host[2] = {-1, -1};
  cudaError_t e = cudaMemcpyAsync(&host[0], rank_dev, sizeof(int32_t),
                                  cudaMemcpyDeviceToHost, stream);
  if (e == cudaSuccess) {
    e = cudaMemcpyAsync(&host[1], group_dev, sizeof(int32_t), cudaMemcpyDeviceToHost,
                        stream);
  }
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) return CudaErrorText("reading the rank and group", e);
  st->rank_group[device] = {host[0], host[1]};
  *rank = host[0];
  *group = host[1];
  return std::string();
}

// One StreamExecutor (with its transport: streams, events, scratch and the
// peer-access table) per ordered list of devices, shared by every call site
// over those devices; Enqueue calls on it are serialised by its mutex.
struct Pooled {
  std::mutex mu;
  CudaTransport transport;
  StreamExecutor executor{&transport};
};

Pooled& ExecutorFor(const std::vector<int>& devices) {
  static std::mutex mu;
  static auto* pool = new std::map<std::vector<int>, std::unique_ptr<Pooled>>();
  std::lock_guard<std::mutex> lk(mu);
  auto& slot = (*pool)[devices];
  if (!slot) slot = std::make_unique<Pooled>();
  return *slot;
}

// Rank 0's part: enqueue every rank's steps on their streams.
std::string EnqueueAll(const Schedule& s, const Slot& slot) {
  const int64_t n = s.nranks;
  std::vector<int> devices(n);
  for (int64_t r = 0; r < n; ++r) devices[r] = slot.info[r].device;
  Pooled& p = ExecutorFor(devices);
  std::lock_guard<std::mutex> lk(p.mu);
  CudaDeviceGuard keep_device;  // XLA's thread keeps its current device
  const std::vector<StreamRank> ranks = StreamRanksOf(slot, [&p](int dev, void* st) {
    return p.transport.Adopt(dev, static_cast<cudaStream_t>(st));
  });
  return p.executor.Enqueue(s, ranks, StreamExecOptions());
}

ffi::ErrorOr<std::unique_ptr<CudaState>> Instantiate(int64_t op_id,
                                                     ffi::Span<const int64_t> schedule,
                                                     int64_t timeout_ms) {
  auto state = std::make_unique<CudaState>();
  ffi::Error err = DecodeAttributes(op_id, schedule, timeout_ms, &state->schedule);
  if (err.failure()) return ffi::Unexpected(std::move(err));
  return state;
}

ffi::Error Execute(cudaStream_t stream, ffi::RunId run_id, int32_t device,
                   CudaState* state, ffi::AnyBuffer x, ffi::BufferR0<ffi::S32> rank_buf,
                   ffi::BufferR0<ffi::S32> group_buf, ffi::Result<ffi::AnyBuffer> out,
                   int64_t op_id, ffi::Span<const int64_t> /*schedule*/,
                   int64_t timeout_ms) {
  if (state == nullptr) return ffi::Error::Internal("jax_blink: missing schedule state");
  const Schedule& s = state->schedule;
  const auto t0 = Clock::now();
  const auto deadline = t0 + std::chrono::milliseconds(std::max<int64_t>(timeout_ms, 1));
  int32_t rank = -1, group = -1;
  std::string err = RankAndGroup(state, device, stream, rank_buf.typed_data(),
                                 group_buf.typed_data(), &rank, &group);
  if (!err.empty()) return ffi::Error::Internal(err);
  if (rank < 0 || rank >= s.nranks) {
    return ffi::Error::InvalidArgument(
        "jax_blink: rank " + std::to_string(rank) + " is outside the schedule's " +
        std::to_string(s.nranks) + " ranks (op_id=" + std::to_string(op_id) + ")");
  }

  RankInfo info = StreamRankInfo(
      s, DTypeCode(x.element_type()), x.untyped_data(), out->untyped_data(),
      static_cast<int64_t>(x.element_count()), static_cast<int64_t>(out->element_count()),
      device, stream, BufferTypeError(x.element_type(), out->element_type()));

  int64_t generation = -1;
  err = JoinAndLead(RendezvousKey{run_id.run_id, op_id, group}, rank, s.nranks,
                    std::move(info), deadline, timeout_ms,
                    [&s](const Slot& slot) { return EnqueueAll(s, slot); }, &generation);
  if (!err.empty()) return ffi::Error::Internal(err);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxBlinkCudaInstantiate, Instantiate,
    ffi::Ffi::BindInstantiate()
        .Attr<int64_t>("op_id")
        .Attr<ffi::Span<const int64_t>>("schedule")
        .Attr<int64_t>("timeout_ms"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxBlinkCudaExecute, Execute,
    ffi::Ffi::Bind()
        .Ctx<ffi::PlatformStream<cudaStream_t>>()  // XLA's stream of this device
        .Ctx<ffi::RunId>()                         // same on all devices of a run
        .Ctx<ffi::DeviceOrdinal>()                 // local CUDA device
        .Ctx<ffi::State<CudaState>>()              // decoded once
        .Arg<ffi::AnyBuffer>()                     // x: 1-D, count
        .Arg<ffi::BufferR0<ffi::S32>>()            // rank (device scalar)
        .Arg<ffi::BufferR0<ffi::S32>>()            // group (device scalar)
        .Ret<ffi::AnyBuffer>()                     // out
        .Attr<int64_t>("op_id")
        .Attr<ffi::Span<const int64_t>>("schedule")
        .Attr<int64_t>("timeout_ms"));

XLA_FFI_Handler* CudaInstantiateHandler() { return JaxBlinkCudaInstantiate; }
XLA_FFI_Handler* CudaExecuteHandler() { return JaxBlinkCudaExecute; }
void* CudaStateTypeId() { return &CudaState::id; }
void* CudaStateTypeInfo() { return const_cast<XLA_FFI_TypeInfo*>(&kCudaStateInfo); }

}  // namespace jax_blink
