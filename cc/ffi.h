// XLA FFI handlers of the "jax_blink_collective" custom call (CPU).
#ifndef JAX_BLINK_CC_FFI_H_
#define JAX_BLINK_CC_FFI_H_

#include "xla/ffi/api/c_api.h"

namespace jax_blink {

// Instantiate stage: decodes and validates the `schedule` attribute once.
XLA_FFI_Handler* CpuInstantiateHandler();
// Execute stage: rendezvous with the other ranks and run this rank's steps.
XLA_FFI_Handler* CpuExecuteHandler();
// The FFI state type (the decoded schedule), for jax.ffi.register_ffi_type.
void* StateTypeId();
void* StateTypeInfo();
inline constexpr const char* kTargetName = "jax_blink_collective";
inline constexpr const char* kStateTypeName = "jax_blink_schedule_state";

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_FFI_H_
