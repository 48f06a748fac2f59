// The dictionaries through which the pybind11 modules (_blink_ext for CPU,
// _blink_cuda for CUDA) hand their FFI handlers and state types to
// jax.ffi.register_ffi_target / jax.ffi.register_ffi_type (jax_blink/_ffi.py).
#ifndef JAX_BLINK_CC_PY_FFI_H_
#define JAX_BLINK_CC_PY_FFI_H_

#include <pybind11/pybind11.h>

#include "ffi.h"

namespace jax_blink {

// {kTargetName: {"instantiate": capsule, "execute": capsule}}
inline pybind11::dict FfiTargets(XLA_FFI_Handler* instantiate, XLA_FFI_Handler* execute) {
  pybind11::dict stages;
  stages["instantiate"] = pybind11::capsule(reinterpret_cast<void*>(instantiate));
  stages["execute"] = pybind11::capsule(reinterpret_cast<void*>(execute));
  pybind11::dict d;
  d[kTargetName] = stages;
  return d;
}

// {name: {"type_id": capsule, "type_info": capsule}}
inline pybind11::dict FfiTypes(const char* name, void* type_id, void* type_info) {
  pybind11::dict reg;
  reg["type_id"] = pybind11::capsule(type_id);
  reg["type_info"] = pybind11::capsule(type_info);
  pybind11::dict d;
  d[name] = reg;
  return d;
}

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_PY_FFI_H_
