// Pieces shared by the CPU (ffi/ffi_cpu.cc) and CUDA (cuda/ffi_cuda.cc) FFI
// handlers of the "jax_blink_collective" custom call.
#ifndef JAX_BLINK_CC_FFI_FFI_COMMON_H_
#define JAX_BLINK_CC_FFI_FFI_COMMON_H_

#include <cstdint>
#include <string>

#include "core/schedule.h"
#include "core/status.h"
#include "xla/ffi/api/ffi.h"

namespace jax_blink {

// The schedule dtype code of an XLA element type, or -1.
inline int32_t DTypeCode(xla::ffi::DataType t) {
  using xla::ffi::DataType;
  switch (t) {
    case DataType::F32: return static_cast<int32_t>(DType::kF32);
    case DataType::F64: return static_cast<int32_t>(DType::kF64);
    case DataType::F16: return static_cast<int32_t>(DType::kF16);
    case DataType::BF16: return static_cast<int32_t>(DType::kBF16);
    case DataType::S32: return static_cast<int32_t>(DType::kI32);
    case DataType::S64: return static_cast<int32_t>(DType::kI64);
    case DataType::U32: return static_cast<int32_t>(DType::kU32);
    default: return -1;
  }
}

// What is wrong with the buffer element types before any schedule check
// (InvalidArgument), or ok.
inline Status BufferTypeError(xla::ffi::DataType in, xla::ffi::DataType out) {
  if (out != in) return Status::InvalidArgument("the output dtype differs from the input dtype");
  if (DTypeCode(in) < 0) {
    return Status::InvalidArgument(
        "unsupported buffer dtype (the schedule dtypes are float32, float64, "
        "float16, bfloat16, int32, int64, uint32)");
  }
  return Status();
}

// The FFI error of a Status: InvalidArgument, DeadlineExceeded and Internal
// keep their XLA error codes.
inline xla::ffi::Error ToFfiError(const Status& st) {
  using xla::ffi::ErrorCode;
  switch (st.kind) {
    case ErrorKind::kOk:
      return xla::ffi::Error::Success();
    case ErrorKind::kInvalidArgument:
      return xla::ffi::Error(ErrorCode::kInvalidArgument, st.message);
    case ErrorKind::kDeadlineExceeded:
      return xla::ffi::Error(ErrorCode::kDeadlineExceeded, st.message);
    case ErrorKind::kInternal:
      break;
  }
  return xla::ffi::Error(ErrorCode::kInternal, st.message);
}

// Instantiate stage: decodes and validates the `schedule` attribute into
// *out, checks that it performs the `collective` and `reduce_op` (codes of
// docs/schedule_format.md) the lowering asked for, and checks the timeout.
inline xla::ffi::Error DecodeAttributes(int64_t op_id,
                                        xla::ffi::Span<const int64_t> schedule,
                                        int64_t collective, int64_t reduce_op,
                                        int64_t timeout_ms, Schedule* out) {
  std::string err = DecodeSchedule(schedule.begin(), schedule.size(), out);
  if (!err.empty()) {
    return xla::ffi::Error::InvalidArgument(
        "jax_blink (op_id=" + std::to_string(op_id) + "): " + err);
  }
  auto name = [](int64_t code, int64_t n, const char* (*fn)(int)) {
    return code >= 0 && code < n ? std::string(fn(static_cast<int>(code)))
                                 : "code " + std::to_string(code);
  };
  const auto coll_name = [](int c) { return CollectiveName(static_cast<Collective>(c)); };
  const auto op_name = [](int c) { return ReduceOpName(static_cast<ReduceOp>(c)); };
  if (collective != static_cast<int64_t>(out->collective)) {
    return xla::ffi::Error::InvalidArgument(
        "jax_blink (op_id=" + std::to_string(op_id) + "): the custom call is a " +
        name(collective, kNumCollectives, coll_name) + " but its schedule is a " +
        CollectiveName(out->collective));
  }
  if (reduce_op != static_cast<int64_t>(out->op)) {
    return xla::ffi::Error::InvalidArgument(
        "jax_blink (op_id=" + std::to_string(op_id) + "): the custom call reduces with " +
        name(reduce_op, kNumReduceOps, op_name) + " but its schedule with " +
        ReduceOpName(out->op));
  }
  // At most a week (jax_blink.settings.MAX_TIMEOUT_S): deadlines are
  // computed as now + timeout and must not overflow.
  constexpr int64_t kMaxTimeoutMs = int64_t{7} * 24 * 3600 * 1000;
  if (timeout_ms < 1 || timeout_ms > kMaxTimeoutMs) {
    return xla::ffi::Error::InvalidArgument(
        "jax_blink: timeout_ms must be in [1, " + std::to_string(kMaxTimeoutMs) + "], got " +
        std::to_string(timeout_ms));
  }
  return xla::ffi::Error::Success();
}

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_FFI_FFI_COMMON_H_
