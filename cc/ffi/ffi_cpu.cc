// Typed XLA FFI handlers of the "jax_blink_collective" custom call (CPU).
//
// The schedule is decoded and validated once, at the instantiate stage, into
// FFI state; every execution then only checks its buffers and runs.
#include <algorithm>
#include <cfenv>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/schedule.h"
#include "cpu/executor_cpu.h"
#include "ffi/ffi_common.h"
#include "ffi/handlers.h"
#include "sync/host_rendezvous.h"
#include "sync/worker_pool.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jax_blink {
namespace {

// The decoded schedule, owned by XLA for the lifetime of the executable,
// and the workspaces its calls keep their accumulators in when the output
// cannot hold it (cpu/executor_cpu.h, CpuWorkspaceBytes): allocated on first
// need and reused by later calls, one per call running at a time.
struct ScheduleState {
  static ffi::TypeId id;
  Schedule schedule;
  std::unique_ptr<WorkspacePool> workspaces;
  int32_t transport = kTransportInProcess;
};

// Holds a workspace of the pool for one call.
class WorkspaceLease {
 public:
  WorkspaceLease(WorkspacePool* pool, bool needed)
      : pool_(pool), p_(needed && pool != nullptr ? pool->Acquire() : nullptr) {}
  ~WorkspaceLease() {
    if (pool_ != nullptr) pool_->Release(p_);
  }
  void* get() const { return p_; }

 private:
  WorkspacePool* pool_;
  void* p_;
};
ffi::TypeId ScheduleState::id = {};

const XLA_FFI_TypeInfo kScheduleStateInfo = ffi::MakeTypeInfo<ScheduleState>();

ffi::ErrorOr<std::unique_ptr<ScheduleState>> Instantiate(
    int64_t op_id, ffi::Span<const int64_t> schedule, int64_t collective,
    int64_t reduce_op, int64_t timeout_ms, int64_t transport) {
  auto state = std::make_unique<ScheduleState>();
  ffi::Error err = DecodeAttributes(op_id, schedule, collective, reduce_op, timeout_ms,
                                    &state->schedule);
  if (err.failure()) return ffi::Unexpected(std::move(err));
  if (transport != kTransportInProcess && transport != kTransportHost) {
    return ffi::Unexpected(ffi::Error::InvalidArgument(
        "jax_blink (op_id=" + std::to_string(op_id) + "): unknown transport " +
        std::to_string(transport) + " (0: in-process, 1: the processes of this host)"));
  }
  if (transport == kTransportHost && !HostAttached()) {
    return ffi::Unexpected(ffi::Error::Internal(
        "jax_blink (op_id=" + std::to_string(op_id) + "): lowered for the host transport, but "
        "this process is not attached to its host's processes"));
  }
  state->transport = static_cast<int32_t>(transport);
  // The largest workspace a call may need (an aliased call's that cannot
  // run in place: a whole accumulator); none is allocated until a call
  // needs it.
  const int64_t bytes = CpuWorkspaceBytes(state->schedule, /*aliased=*/true);
  state->workspaces = std::make_unique<WorkspacePool>(bytes);
  return state;
}

// A segmented call's buffer table (ExecArgs::nsegs), owned by its rank's
// work until the call is over.
struct Segments {
  std::vector<int64_t> offset;
  std::vector<const void*> in;
  std::vector<void*> out;
};

// Asynchronous: the rank's work (meeting its peers, running its steps) goes
// to the worker pool (sync/worker_pool.h) and the handler returns a future
// at once, so XLA's thread never waits for a peer and XLA can run
// independent work, other collectives included, meanwhile. XLA keeps the
// buffers alive until the future completes; the worker thread runs with
// the caller's floating-point environment (XLA flushes denormals).
// `a` holds the call's buffers; Launch fills in the rest.
ffi::Future Launch(ffi::RunId run_id, ScheduleState* state, ExecArgs a,
                   ffi::BufferR0<ffi::S32> rank, ffi::BufferR0<ffi::S32> group, int64_t op_id,
                   int64_t timeout_ms, std::shared_ptr<Segments> segments) {
  ffi::Promise promise;
  ffi::Future future(promise);
  if (state == nullptr || state->workspaces == nullptr) {
    promise.SetError(ffi::Error::Internal("jax_blink: missing schedule state"));
    return future;
  }
  const bool aliased = a.in == a.out;
  // The host transport keeps the accumulator in shared memory instead.
  const bool host = state->transport == kTransportHost;
  auto ws = std::make_shared<WorkspaceLease>(
      state->workspaces.get(),
      !host && CpuWorkspaceBytes(state->schedule, aliased) > 0);
  a.workspace = ws->get();
  a.workspace_bytes = ws->get() == nullptr ? 0 : state->workspaces->bytes();
  a.schedule = &state->schedule;
  a.rank = rank.typed_data()[0];
  a.group = group.typed_data()[0];
  a.run_id = run_id.run_id;
  a.op_id = op_id;
  a.timeout_ms = timeout_ms;
  a.transport = state->transport;
  // The order of this rank's calls of one call site is the order XLA makes
  // them on this thread, not the order the workers start in.
  Status reserved = ReserveGeneration(&a);
  if (!reserved.ok()) {
    promise.SetError(ToFfiError(reserved));
    return future;
  }
  std::fenv_t env;
  const bool have_env = std::fegetenv(&env) == 0;
  std::string err = WorkerPool::Global().Run([a, ws, segments, promise, env, have_env]() mutable {
    if (have_env) std::fesetenv(&env);
    ffi::Error result = ToFfiError(ExecuteCpu(a).status);
    ws.reset();  // the workspace is free for the next call before XLA goes on
    if (result.success()) {
      promise.SetAvailable();  // XLA may go on with this device's program here
    } else {
      promise.SetError(std::move(result));
    }
  });
  if (!err.empty()) {
    promise.SetError(ffi::Error::Internal("jax_blink (op_id=" + std::to_string(op_id) + "): " + err));
  }
  return future;
}

ffi::Future Execute(ffi::RunId run_id, ScheduleState* state, ffi::AnyBuffer x,
                    ffi::BufferR0<ffi::S32> rank, ffi::BufferR0<ffi::S32> group,
                    ffi::Result<ffi::AnyBuffer> out, int64_t op_id,
                    ffi::Span<const int64_t> /*schedule*/, int64_t /*collective*/,
                    int64_t /*reduce_op*/, int64_t timeout_ms, int64_t /*transport*/) {
  ExecArgs a;
  a.in = x.untyped_data();
  a.out = out->untyped_data();
  a.in_count = static_cast<int64_t>(x.element_count());
  a.out_count = static_cast<int64_t>(out->element_count());
  a.dtype = DTypeCode(x.element_type());
  a.local_error = BufferTypeError(x.element_type(), out->element_type());
  return Launch(run_id, state, a, rank, group, op_id, timeout_ms, nullptr);
}

// An allreduce whose vector is the concatenation of several operands (one
// bucket's leaves, 1-D, of one dtype), each summed into its own result: the
// executor reads and writes them where XLA put them (ExecArgs::nsegs), so
// the bucket is not copied into one buffer and back.
ffi::Future ExecuteSegments(ffi::RunId run_id, ScheduleState* state,
                            ffi::BufferR0<ffi::S32> rank, ffi::BufferR0<ffi::S32> group,
                            ffi::RemainingArgs xs, ffi::RemainingRets outs, int64_t op_id,
                            ffi::Span<const int64_t> /*schedule*/, int64_t /*collective*/,
                            int64_t /*reduce_op*/, int64_t timeout_ms, int64_t /*transport*/) {
  auto segments = std::make_shared<Segments>();
  ExecArgs a;
  std::string bad;
  if (xs.size() == 0 || xs.size() != outs.size()) {
    bad = "takes one result per operand and at least one operand, got " + std::to_string(xs.size()) +
          " operand(s) and " + std::to_string(outs.size()) + " result(s)";
  }
  segments->offset.push_back(0);
  for (size_t i = 0; i < xs.size() && bad.empty(); ++i) {
    auto x = xs.get<ffi::AnyBuffer>(i);
    auto r = outs.get<ffi::AnyBuffer>(i);
    if (!x.has_value() || !r.has_value()) {
      bad = "operand or result " + std::to_string(i) + " is not a buffer";
      break;
    }
    const int64_t n = static_cast<int64_t>(x->element_count());
    if (static_cast<int64_t>((*r)->element_count()) != n) {
      bad = "result " + std::to_string(i) + " has " + std::to_string((*r)->element_count()) +
            " elements, its operand " + std::to_string(n);
      break;
    }
    const Status types = BufferTypeError(x->element_type(), (*r)->element_type());
    if (i == 0) {
      a.dtype = DTypeCode(x->element_type());
      a.local_error = types;
    } else if (DTypeCode(x->element_type()) != a.dtype && a.local_error.ok()) {
      a.local_error = Status::InvalidArgument("operand " + std::to_string(i) +
                                              "'s dtype differs from operand 0's");
    }
    segments->in.push_back(x->untyped_data());
    segments->out.push_back((*r)->untyped_data());
    segments->offset.push_back(segments->offset.back() + n);
  }
  if (!bad.empty()) {
    a.local_error = Status::InvalidArgument("jax_blink (op_id=" + std::to_string(op_id) +
                                            "): the segmented allreduce " + bad);
    segments->offset.assign(1, 0);
    segments->in.clear();
    segments->out.clear();
  }
  a.in_count = a.out_count = segments->offset.back();
  if (!segments->in.empty()) {
    a.nsegs = static_cast<int32_t>(segments->in.size());
    a.seg_offset = segments->offset.data();
    a.in_segs = segments->in.data();
    a.out_segs = segments->out.data();
    a.in = segments->in[0];
    a.out = segments->out[0];
  }
  return Launch(run_id, state, a, rank, group, op_id, timeout_ms, std::move(segments));
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxBlinkCpuInstantiate, Instantiate,
    ffi::Ffi::BindInstantiate()
        .Attr<int64_t>("op_id")  // static call-site id
        .Attr<ffi::Span<const int64_t>>("schedule")
        .Attr<int64_t>("collective")  // the schedule must perform it
        .Attr<int64_t>("reduce_op")   // and reduce with it
        .Attr<int64_t>("timeout_ms")
        .Attr<int64_t>("transport"));  // 0: in-process, 1: this host's processes

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxBlinkCpuExecute, Execute,
    ffi::Ffi::Bind()
        .Ctx<ffi::RunId>()                 // same on all devices of a run
        .Ctx<ffi::State<ScheduleState>>()  // decoded once
        .Arg<ffi::AnyBuffer>()             // x: 1-D, the schedule's in_count
        .Arg<ffi::BufferR0<ffi::S32>>()    // rank
        .Arg<ffi::BufferR0<ffi::S32>>()    // group
        .Ret<ffi::AnyBuffer>()             // out: 1-D, the schedule's out_count
        .Attr<int64_t>("op_id")            // call-site id
        .Attr<ffi::Span<const int64_t>>("schedule")
        .Attr<int64_t>("collective")       // checked at instantiation
        .Attr<int64_t>("reduce_op")        // checked at instantiation
        .Attr<int64_t>("timeout_ms")     // rendezvous limit
        .Attr<int64_t>("transport"));    // checked at instantiation

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxBlinkCpuExecuteSegments, ExecuteSegments,
    ffi::Ffi::Bind()
        .Ctx<ffi::RunId>()                 // same on all devices of a run
        .Ctx<ffi::State<ScheduleState>>()  // decoded once
        .Arg<ffi::BufferR0<ffi::S32>>()    // rank
        .Arg<ffi::BufferR0<ffi::S32>>()    // group
        .RemainingArgs()                   // the segments' inputs: 1-D, of one dtype
        .RemainingRets()                   // their sums, one per input
        .Attr<int64_t>("op_id")
        .Attr<ffi::Span<const int64_t>>("schedule")
        .Attr<int64_t>("collective")
        .Attr<int64_t>("reduce_op")
        .Attr<int64_t>("timeout_ms")
        .Attr<int64_t>("transport"));

XLA_FFI_Handler* CpuInstantiateHandler() { return JaxBlinkCpuInstantiate; }
XLA_FFI_Handler* CpuExecuteSegmentsHandler() { return JaxBlinkCpuExecuteSegments; }
XLA_FFI_Handler* CpuExecuteHandler() { return JaxBlinkCpuExecute; }
void* StateTypeId() { return &ScheduleState::id; }
void* StateTypeInfo() {
  return const_cast<XLA_FFI_TypeInfo*>(&kScheduleStateInfo);
}

}  // namespace jax_blink
