// The outcome of an operation that can fail: ok, or an error kind and a
// message. The kind is what the FFI handlers turn into XLA's error code
// (cc/ffi/ffi_common.h), so it is decided where the error is found, never
// guessed from the message.
#ifndef JAX_BLINK_CC_CORE_STATUS_H_
#define JAX_BLINK_CC_CORE_STATUS_H_

#include <cstdint>
#include <string>
#include <utility>

namespace jax_blink {

enum class ErrorKind : uint8_t {
  kOk = 0,
  // The caller's mistake: buffers that do not fit the schedule, a rank
  // outside it, ranks that disagree on count, dtype or schedule.
  kInvalidArgument,
  // A peer did not arrive, or did not make progress, before the timeout.
  kDeadlineExceeded,
  // Anything else (allocation, runtime and driver errors).
  kInternal,
};

// The name XLA gives the corresponding error code ("INVALID_ARGUMENT", ...).
inline const char* ErrorKindName(ErrorKind k) {
  switch (k) {
    case ErrorKind::kOk:
      return "OK";
    case ErrorKind::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case ErrorKind::kDeadlineExceeded:
      return "DEADLINE_EXCEEDED";
    case ErrorKind::kInternal:
      return "INTERNAL";
  }
  return "?";
}

struct Status {
  ErrorKind kind = ErrorKind::kOk;
  std::string message;  // "" when ok

  bool ok() const { return kind == ErrorKind::kOk; }

  static Status InvalidArgument(std::string m) {
    return {ErrorKind::kInvalidArgument, std::move(m)};
  }
  static Status DeadlineExceeded(std::string m) {
    return {ErrorKind::kDeadlineExceeded, std::move(m)};
  }
  static Status Internal(std::string m) { return {ErrorKind::kInternal, std::move(m)}; }

  // The same error with `prefix` before its message.
  Status Prefixed(const std::string& prefix) const { return {kind, prefix + message}; }
  // "KIND: message" (XLA's format), or "" when ok.
  std::string Text() const {
    return ok() ? std::string() : std::string(ErrorKindName(kind)) + ": " + message;
  }
};

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_CORE_STATUS_H_
