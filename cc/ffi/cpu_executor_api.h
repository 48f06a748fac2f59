// The CPU executor of _blink_ext as other extension modules call it: a
// table of function pointers in a PyCapsule (CPython's way for one extension
// module to export C functions to another). The test harness
// (_blink_testing's run_ranks and rendezvous_stats) runs the collective
// through it, so on _blink_ext's state: the settings of its configure() and
// the rendezvous its FFI handler uses. Both modules come from one build; the
// ABI tag catches a stale one.
#ifndef JAX_BLINK_CC_FFI_CPU_EXECUTOR_API_H_
#define JAX_BLINK_CC_FFI_CPU_EXECUTOR_API_H_

#include <cstdint>

#include "core/schedule.h"
#include "cpu/executor_cpu.h"
#include "sync/rendezvous.h"

namespace jax_blink {

struct CpuExecutorApi {
  uint64_t abi;  // CpuExecutorApiAbi() of the exporting build
  ExecResult (*execute)(const ExecArgs& args);
  RendezvousStats (*rendezvous_stats)();
};

// Changes with the version and with the size of every type that crosses.
inline constexpr uint64_t CpuExecutorApiAbi() {
  constexpr uint64_t kVersion = 1;
  return kVersion << 56 ^ uint64_t{sizeof(ExecArgs)} << 40 ^
         uint64_t{sizeof(ExecResult)} << 28 ^ uint64_t{sizeof(Schedule)} << 16 ^
         uint64_t{sizeof(Step)} << 8 ^ uint64_t{sizeof(RankSteps)};
}

// The capsule's name (PyCapsule_GetPointer checks it): _blink_ext's attribute
// `_cpu_executor`.
inline constexpr const char* kCpuExecutorApiCapsule = "jax_blink._blink_ext._cpu_executor";

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_FFI_CPU_EXECUTOR_API_H_
