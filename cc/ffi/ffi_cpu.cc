// Typed XLA FFI handlers of the "jax_blink_collective" custom call (CPU).
//
// The schedule is decoded and validated once, at the instantiate stage, into
// FFI state; every execution then only checks its buffers and runs.
#include <cstdint>
#include <memory>
#include <string>

#include "core/schedule.h"
#include "cpu/executor_cpu.h"
#include "ffi/ffi_common.h"
#include "ffi/handlers.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jax_blink {
namespace {

// The decoded schedule, owned by XLA for the lifetime of the executable.
struct ScheduleState {
  static ffi::TypeId id;
  Schedule schedule;
};
ffi::TypeId ScheduleState::id = {};

const XLA_FFI_TypeInfo kScheduleStateInfo = ffi::MakeTypeInfo<ScheduleState>();

ffi::ErrorOr<std::unique_ptr<ScheduleState>> Instantiate(
    int64_t op_id, ffi::Span<const int64_t> schedule, int64_t timeout_ms) {
  auto state = std::make_unique<ScheduleState>();
  ffi::Error err = DecodeAttributes(op_id, schedule, timeout_ms, &state->schedule);
  if (err.failure()) return ffi::Unexpected(std::move(err));
  return state;
}

ffi::Error Execute(ffi::RunId run_id, ScheduleState* state, ffi::AnyBuffer x,
                   ffi::BufferR0<ffi::S32> rank, ffi::BufferR0<ffi::S32> group,
                   ffi::Result<ffi::AnyBuffer> out, int64_t op_id,
                   ffi::Span<const int64_t> /*schedule*/, int64_t timeout_ms) {
  if (state == nullptr) {
    return ffi::Error::Internal("jax_blink: missing schedule state");
  }
  ExecArgs a;
  a.schedule = &state->schedule;
  a.rank = rank.typed_data()[0];
  a.group = group.typed_data()[0];
  a.run_id = run_id.run_id;
  a.op_id = op_id;
  a.in = x.untyped_data();
  a.out = out->untyped_data();
  a.in_count = static_cast<int64_t>(x.element_count());
  a.out_count = static_cast<int64_t>(out->element_count());
  a.dtype = DTypeCode(x.element_type());
  a.local_error = BufferTypeError(x.element_type(), out->element_type());
  a.timeout_ms = timeout_ms;
  return ToFfiError(ExecuteCpu(a).status);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxBlinkCpuInstantiate, Instantiate,
    ffi::Ffi::BindInstantiate()
        .Attr<int64_t>("op_id")  // static call-site id
        .Attr<ffi::Span<const int64_t>>("schedule")
        .Attr<int64_t>("timeout_ms"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxBlinkCpuExecute, Execute,
    ffi::Ffi::Bind()
        .Ctx<ffi::RunId>()                 // same on all devices of a run
        .Ctx<ffi::State<ScheduleState>>()  // decoded once
        .Arg<ffi::AnyBuffer>()             // x: 1-D, count
        .Arg<ffi::BufferR0<ffi::S32>>()    // rank
        .Arg<ffi::BufferR0<ffi::S32>>()    // group
        .Ret<ffi::AnyBuffer>()             // out
        .Attr<int64_t>("op_id")            // call-site id
        .Attr<ffi::Span<const int64_t>>("schedule")
        .Attr<int64_t>("timeout_ms"));  // rendezvous limit

XLA_FFI_Handler* CpuInstantiateHandler() { return JaxBlinkCpuInstantiate; }
XLA_FFI_Handler* CpuExecuteHandler() { return JaxBlinkCpuExecute; }
void* StateTypeId() { return &ScheduleState::id; }
void* StateTypeInfo() {
  return const_cast<XLA_FFI_TypeInfo*>(&kScheduleStateInfo);
}

}  // namespace jax_blink
