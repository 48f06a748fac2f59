// XLA FFI handlers of the "jax_blink_collective" custom call: CPU
// (ffi/ffi_cpu.cc, module _blink_ext) and CUDA (cuda/ffi_cuda.cc, module
// _blink_cuda).
#ifndef JAX_BLINK_CC_FFI_HANDLERS_H_
#define JAX_BLINK_CC_FFI_HANDLERS_H_

#include "xla/ffi/api/c_api.h"

namespace jax_blink {

// Instantiate stage: decodes and validates the `schedule` attribute once.
XLA_FFI_Handler* CpuInstantiateHandler();
// Execute stage: rendezvous with the other ranks and run this rank's steps.
XLA_FFI_Handler* CpuExecuteHandler();
// Execute stage of kSegmentsTargetName: an allreduce whose vector is several
// operands (one per leaf of a bucket), summed into as many results; its
// instantiate stage is CpuInstantiateHandler's.
XLA_FFI_Handler* CpuExecuteSegmentsHandler();
// The FFI state type (the decoded schedule), for jax.ffi.register_ffi_type.
void* StateTypeId();
void* StateTypeInfo();
inline constexpr const char* kTargetName = "jax_blink_collective";
inline constexpr const char* kSegmentsTargetName = "jax_blink_collective_segments";
inline constexpr const char* kStateTypeName = "jax_blink_schedule_state";

// CUDA: the same stages; the state also caches each device's rank and group.
XLA_FFI_Handler* CudaInstantiateHandler();
XLA_FFI_Handler* CudaExecuteHandler();
void* CudaStateTypeId();
void* CudaStateTypeInfo();
// The CUDA handler's executor for executables instantiated afterwards: the
// device executor (one kernel per rank per call) when on, else the stream
// executor (configure(executor=...), JAX_BLINK_CUDA_EXECUTOR).
void SetCudaDeviceExecutor(bool on);
bool CudaDeviceExecutor();
inline constexpr const char* kCudaStateTypeName = "jax_blink_cuda_schedule_state";

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_FFI_HANDLERS_H_
