// Typed XLA FFI handlers of the "jax_blink_collective" custom call for the
// CUDA platform: one process driving several local GPUs (jax.pmap,
// jax.shard_map).
//
// Each device's invocation runs on that device's XLA thread with its own
// stream (PlatformStream). The invocations meet in the same in-process
// rendezvous as on CPU, keyed by (RunId, op_id, group) plus a per-rank
// generation, and publish their device, stream, buffers and executor view.
// Each then enqueues its own part of the collective on its own streams
// (StreamRankExecutor over CudaTransport: peer copies and reduction kernels
// on one stream per link, ordered across devices by CUDA events, in the order
// of the StreamPlan built at instantiation), and returns without waiting for
// the GPU: XLA's later work on its stream comes after the collective's final
// waits. The executor's workspace (float32 accumulator for f16/bf16, staging
// where peers cannot read each other) comes from XLA's scratch allocator. The
// handler is not command-buffer compatible (it does not declare the trait):
// it meets its peers on the host at every execution.
//
// With JAX_BLINK_CUDA_EXECUTOR=device (configure(executor="device")) the
// ranks run the device executor instead (device/device_gpu.h): after the
// same rendezvous, one kernel launch per rank on XLA's stream, whose outcome
// the handler reads back (it waits for its stream) so that a timeout is
// DEADLINE_EXCEEDED naming the missing ranks. Not yet verified on a GPU: the
// stream executor stays the default.
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/debug.h"
#include "core/schedule.h"
#include "core/status.h"
#include "cuda/cuda_transport.h"
#include "device/device_gpu.h"
#include "ffi/ffi_common.h"
#include "ffi/handlers.h"
#include "stream/join_enqueue.h"
#include "stream/stream_exec.h"
#include "sync/join.h"
#include "sync/rendezvous.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jax_blink {
namespace {

// One process-wide transport: executors of every call site and device share
// its stream, event and peer-access tables. Never destroyed (states may be
// destroyed during process exit in any order).
CudaTransport& Transport() {
  static auto* t = new CudaTransport();
  return *t;
}

// Which executor runs the calls of executables instantiated from now on
// (configure(executor=...)): the device executor, else the stream executor.
std::atomic<bool> use_device_executor{false};

// What one device plays in an executable: its rank and group (read from the
// device once) and its executor (streams and events, released with the
// state).
struct DeviceRank {
  int32_t rank = -1;
  int32_t group = -1;
  std::mutex mu;  // serialises executions on the device
  StreamRankExecutor executor{&Transport()};
  uint64_t device_calls = 0;  // the device executor's generation of this rank's last call
};

// The decoded schedule and its enqueue plan (built once, at instantiation),
// and the devices that ran it.
struct CudaState {
  static ffi::TypeId id;
  Schedule schedule;
  StreamPlan plan;
  // The device executor runs this executable's calls (decided at
  // instantiation: the setting, and a schedule it takes).
  bool device = false;
  int64_t device_workspace_bytes = 0;
  std::mutex mu;  // guards `devices` and the device executor (not the DeviceRanks)
  std::map<int, std::unique_ptr<DeviceRank>> devices;
  // Created by the first call that has met its peers (it needs their GPUs);
  // its error, if creating it failed, is every later call's.
  std::unique_ptr<DeviceGpuExecutor> device_exec;
  Status device_error;
  bool device_tried = false;
};
ffi::TypeId CudaState::id = {};
const XLA_FFI_TypeInfo kCudaStateInfo = ffi::MakeTypeInfo<CudaState>();

// The device's rank and group arrive as device scalars (computed from
// axis_index); they are fixed for an executable on a device, so they are read
// once (one stream synchronisation, outside any lock) and cached.
std::string DeviceRankOf(CudaState* st, int device, cudaStream_t stream,
                         const int32_t* rank_dev, const int32_t* group_dev,
                         DeviceRank** out) {
  {
    std::lock_guard<std::mutex> lk(st->mu);
    auto it = st->devices.find(device);
    if (it != st->devices.end()) {
      *out = it->second.get();
      return std::string();
    }
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
  std::lock_guard<std::mutex> lk(st->mu);
  auto& slot = st->devices[device];
  if (!slot) {
    slot = std::make_unique<DeviceRank>();
    slot->rank = host[0];
    slot->group = host[1];
  }
  *out = slot.get();
  return std::string();
}

ffi::ErrorOr<std::unique_ptr<CudaState>> Instantiate(int64_t op_id,
                                                     ffi::Span<const int64_t> schedule,
                                                     int64_t collective, int64_t reduce_op,
                                                     int64_t timeout_ms) {
  auto state = std::make_unique<CudaState>();
  ffi::Error err = DecodeAttributes(op_id, schedule, collective, reduce_op, timeout_ms,
                                    &state->schedule);
  if (err.failure()) return ffi::Unexpected(std::move(err));
  std::string e = state->plan.Build(state->schedule);
  if (!e.empty()) {
    return ffi::Unexpected(ffi::Error::InvalidArgument(
        "jax_blink (op_id=" + std::to_string(op_id) + "): " + e));
  }
  // The device executor where it is asked for and takes the schedule (else
  // the stream executor, its fallback).
  if (use_device_executor.load() && state->schedule.nranks <= kDeviceGpuMaxRanks) {
    DeviceProgram p;
    if (BuildDeviceProgram(state->schedule, 0, &p).empty()) {
      state->device = true;
      state->device_workspace_bytes = p.WorkspaceBytes();
    }
  }
  return state;
}

// A call on the device executor: the rendezvous (every rank's buffers, its
// workspace and GPU), the executor (created once, with the ranks' GPUs), one
// kernel launch on XLA's stream, then the call's outcome (the handler waits
// for its stream), all or nothing over the ranks.
Status ExecuteOnDevice(CudaState* state, DeviceRank* dr, const RendezvousKey& key,
                       int64_t rank, RankInfo info, cudaStream_t stream,
                       ffi::ScratchAllocator& scratch, Clock::time_point deadline,
                       int64_t timeout_ms, int64_t* generation) {
  const Schedule& s = state->schedule;
  if (info.error.ok() && info.in == info.out && s.count > 0) {
    // (the CUDA lowering never aliases them; peers read the input throughout)
    info.error = Status::InvalidArgument(
        "jax_blink: the device executor needs an output buffer apart from the input");
  }
  if (info.error.ok() && state->device_workspace_bytes > 0) {
    std::optional<void*> mem = scratch.Allocate(state->device_workspace_bytes, 16);
    if (!mem.has_value()) {
      info.error = Status::Internal("XLA's scratch allocator could not provide " +
                                    std::to_string(state->device_workspace_bytes) +
                                    " bytes for the device executor's accumulator");
    } else {
      info.acc = *mem;
    }
  }
  Rendezvous& rv = Rendezvous::Global();
  Ticket ticket;
  Status err = rv.Join(key, rank, s.nranks, std::move(info), deadline, timeout_ms, &ticket);
  *generation = ticket.generation;
  if (err.ok()) {
    Slot& slot = *ticket.slot;
    const std::string where = CallSiteText(key.op_id, key.group, ticket.generation);
    err = CheckConsistent(slot, where);
    DeviceGpuExecutor* ex = nullptr;
    if (err.ok()) {
      std::lock_guard<std::mutex> lk(state->mu);
      if (!state->device_tried) {
        state->device_tried = true;
        std::vector<int> devices(s.nranks);
        for (int64_t q = 0; q < s.nranks; ++q) devices[q] = slot.info[q].device;
        state->device_error = DeviceGpuExecutor::Create(s, devices, &state->device_exec);
      }
      err = state->device_error;
      ex = state->device_exec.get();
    }
    if (err.ok()) {
      std::vector<DeviceGpuBuffers> bufs(s.nranks);
      for (int64_t q = 0; q < s.nranks; ++q) {
        bufs[q].in = slot.info[q].in;
        bufs[q].out = slot.info[q].out;
        bufs[q].workspace = state->device_workspace_bytes > 0 ? slot.info[q].acc : nullptr;
      }
      // Every rank counts its calls alike (a failed launch counts too), so
      // the ranks' generations agree.
      const uint64_t gen = ++dr->device_calls;
      err = ex->Launch(rank, bufs, gen, timeout_ms, stream);
      if (err.ok()) err = ex->Outcome(rank, gen, timeout_ms, stream, where);
    }
    if (!err.ok()) slot.Fail(rank, err);  // (its messages name the call site)
    const Status all =
        slot.Finish(deadline + std::chrono::milliseconds(timeout_ms) + std::chrono::seconds(1),
                    /*spin=*/256, /*yield_ns=*/100000);
    if (!all.ok()) err = all;
  }
  if (ticket.slot != nullptr) rv.Leave(&ticket);
  return err;
}

ffi::Error Execute(cudaStream_t stream, ffi::RunId run_id, int32_t device,
                   CudaState* state, ffi::ScratchAllocator scratch, ffi::AnyBuffer x,
                   ffi::BufferR0<ffi::S32> rank_buf, ffi::BufferR0<ffi::S32> group_buf,
                   ffi::Result<ffi::AnyBuffer> out, int64_t op_id,
                   ffi::Span<const int64_t> /*schedule*/, int64_t /*collective*/,
                   int64_t /*reduce_op*/, int64_t timeout_ms) {
  if (state == nullptr) return ffi::Error::Internal("jax_blink: missing schedule state");
  const Schedule& s = state->schedule;
  const auto t0 = Clock::now();
  const auto deadline = t0 + std::chrono::milliseconds(std::max<int64_t>(timeout_ms, 1));
  DeviceRank* dr = nullptr;
  std::string err = DeviceRankOf(state, device, stream, rank_buf.typed_data(),
                                 group_buf.typed_data(), &dr);
  if (!err.empty()) return ffi::Error::Internal(err);
  const int32_t rank = dr->rank, group = dr->group;
  if (rank < 0 || rank >= s.nranks) {
    return ffi::Error::InvalidArgument(
        "jax_blink: rank " + std::to_string(rank) + " is outside the schedule's " +
        std::to_string(s.nranks) + " ranks (op_id=" + std::to_string(op_id) + ")");
  }
  RankInfo info = StreamRankInfo(
      s, DTypeCode(x.element_type()), x.untyped_data(), out->untyped_data(),
      static_cast<int64_t>(x.element_count()), static_cast<int64_t>(out->element_count()),
      device, stream, BufferTypeError(x.element_type(), out->element_type()));
  CudaTransport& tp = Transport();
  std::lock_guard<std::mutex> lk(dr->mu);
  CudaDeviceGuard keep_device;  // XLA's thread keeps its current device
  int64_t generation = -1;
  const WorkspaceFn workspace = [&scratch](size_t bytes, void** p) -> std::string {
    std::optional<void*> mem = scratch.Allocate(bytes, 16);
    if (!mem.has_value()) {
      return "XLA's scratch allocator could not provide " + std::to_string(bytes) +
             " bytes for the executor's workspace";
    }
    *p = *mem;
    return std::string();
  };
  const RendezvousKey key{run_id.run_id, op_id, group};
  if (state->device) {
    const Status st = ExecuteOnDevice(state, dr, key, rank, std::move(info), stream, scratch,
                                      deadline, timeout_ms, &generation);
    if (DebugEnabled()) {
      const int64_t us =
          std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count();
      std::fprintf(stderr,
                   "jax_blink cuda: op=%" PRId64 " group=%d rank=%d gen=%" PRId64
                   " run=%" PRId64 " device=%d bytes=%" PRId64 " us=%" PRId64
                   " executor=device launches=1 %s%s\n",
                   op_id, group, rank, generation, static_cast<int64_t>(run_id.run_id), device,
                   static_cast<int64_t>(x.size_bytes()), us, st.ok() ? "ok" : "error: ",
                   st.message.c_str());
    }
    return ToFfiError(st);
  }
  const Status st = JoinAndEnqueue(key, s, state->plan,
                                   rank, std::move(info), tp.Adopt(device, stream),
                                   /*direct=*/true, tp, dr->executor, workspace, deadline,
                                   timeout_ms, &generation);
  if (DebugEnabled()) {
    const StreamExecStats& xs = dr->executor.stats();
    const int64_t us =
        std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count();
    std::fprintf(stderr,
                 "jax_blink cuda: op=%" PRId64 " group=%d rank=%d gen=%" PRId64
                 " run=%" PRId64 " device=%d bytes=%" PRId64 " us=%" PRId64
                 " enqueue_us=%" PRId64 " gate_us=%" PRId64 " kernels=%" PRId64
                 " copies=%" PRId64 " waits=%" PRId64 " records=%" PRId64
                 " workspace=%" PRId64 " staged_links=%" PRId64 " executor=stream %s%s\n",
                 op_id, group, rank, generation, static_cast<int64_t>(run_id.run_id), device,
                 static_cast<int64_t>(x.size_bytes()), us, xs.enqueue_ns / 1000,
                 xs.gate_ns / 1000, xs.kernels, xs.copies, xs.waits, xs.records,
                 xs.workspace_bytes, xs.staged_links, st.ok() ? "ok" : "error: ",
                 st.message.c_str());
  }
  return ToFfiError(st);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxBlinkCudaInstantiate, Instantiate,
    ffi::Ffi::BindInstantiate()
        .Attr<int64_t>("op_id")
        .Attr<ffi::Span<const int64_t>>("schedule")
        .Attr<int64_t>("collective")  // the schedule must perform it
        .Attr<int64_t>("reduce_op")   // and reduce with it
        .Attr<int64_t>("timeout_ms"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxBlinkCudaExecute, Execute,
    ffi::Ffi::Bind()
        .Ctx<ffi::PlatformStream<cudaStream_t>>()  // XLA's stream of this device
        .Ctx<ffi::RunId>()                         // same on all devices of a run
        .Ctx<ffi::DeviceOrdinal>()                 // local CUDA device
        .Ctx<ffi::State<CudaState>>()              // decoded and planned once
        .Ctx<ffi::ScratchAllocator>()              // the executor's workspace
        .Arg<ffi::AnyBuffer>()                     // x: 1-D, the schedule's in_count
        .Arg<ffi::BufferR0<ffi::S32>>()            // rank (device scalar)
        .Arg<ffi::BufferR0<ffi::S32>>()            // group (device scalar)
        .Ret<ffi::AnyBuffer>()                     // out: 1-D, the schedule's out_count
        .Attr<int64_t>("op_id")
        .Attr<ffi::Span<const int64_t>>("schedule")
        .Attr<int64_t>("collective")               // checked at instantiation
        .Attr<int64_t>("reduce_op")                // checked at instantiation
        .Attr<int64_t>("timeout_ms"));

XLA_FFI_Handler* CudaInstantiateHandler() { return JaxBlinkCudaInstantiate; }
void SetCudaDeviceExecutor(bool on) { use_device_executor.store(on); }
bool CudaDeviceExecutor() { return use_device_executor.load(); }
XLA_FFI_Handler* CudaExecuteHandler() { return JaxBlinkCudaExecute; }
void* CudaStateTypeId() { return &CudaState::id; }
void* CudaStateTypeInfo() { return const_cast<XLA_FFI_TypeInfo*>(&kCudaStateInfo); }

}  // namespace jax_blink
