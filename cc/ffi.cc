// Typed XLA FFI handlers of the "jax_blink_collective" custom call (CPU).
//
// The schedule is decoded and validated once, at the instantiate stage, into
// FFI state; every execution then only checks its buffers and runs.
#include "ffi.h"

#include <cstdint>
#include <memory>
#include <string>

#include "executor.h"
#include "schedule.h"
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

int32_t DTypeCode(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F32:
      return static_cast<int32_t>(DType::kF32);
    case ffi::DataType::F64:
      return static_cast<int32_t>(DType::kF64);
    case ffi::DataType::F16:
      return static_cast<int32_t>(DType::kF16);
    case ffi::DataType::BF16:
      return static_cast<int32_t>(DType::kBF16);
    case ffi::DataType::S32:
      return static_cast<int32_t>(DType::kI32);
    case ffi::DataType::S64:
      return static_cast<int32_t>(DType::kI64);
    case ffi::DataType::U32:
      return static_cast<int32_t>(DType::kU32);
    default:
      return -1;
  }
}

ffi::ErrorOr<std::unique_ptr<ScheduleState>> Instantiate(
    int64_t op_id, ffi::Span<const int64_t> schedule, int64_t timeout_ms) {
  auto state = std::make_unique<ScheduleState>();
  std::string err =
      DecodeSchedule(schedule.begin(), schedule.size(), &state->schedule);
  if (!err.empty()) {
    return ffi::Unexpected(ffi::Error::InvalidArgument(
        "jax_blink (op_id=" + std::to_string(op_id) + "): " + err));
  }
  if (timeout_ms < 1) {
    return ffi::Unexpected(
        ffi::Error::InvalidArgument("jax_blink: timeout_ms must be >= 1, got " +
                                    std::to_string(timeout_ms)));
  }
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
  if (out->element_type() != x.element_type()) {
    a.local_error = "the output dtype differs from the input dtype";
  } else if (a.dtype < 0) {
    a.local_error =
        "unsupported buffer dtype (the schedule dtypes are "
        "float32, float64, float16, bfloat16, int32, int64, uint32)";
  }
  a.timeout_ms = timeout_ms;
  ExecResult r = ExecuteCpu(a);
  if (!r.error.empty()) return ffi::Error::Internal(r.error);
  return ffi::Error::Success();
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
