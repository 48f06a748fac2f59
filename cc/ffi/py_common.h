// What the pybind11 modules share: the dictionaries through which the
// production modules (_blink_ext for CPU, _blink_cuda for CUDA) hand their
// FFI handlers and state types to jax.ffi.register_ffi_target /
// jax.ffi.register_ffi_type (jax_blink/_ffi.py), decoding a schedule passed
// from Python, and checking configure()'s arguments.
#ifndef JAX_BLINK_CC_FFI_PY_COMMON_H_
#define JAX_BLINK_CC_FFI_PY_COMMON_H_

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/schedule.h"
#include "ffi/handlers.h"
#include "sync/host_rendezvous.h"

namespace jax_blink {

// {kTargetName: {"instantiate": capsule, "execute": capsule}}, and
// kSegmentsTargetName's stages where `segments` (its execute stage) is given.
inline pybind11::dict FfiTargets(XLA_FFI_Handler* instantiate, XLA_FFI_Handler* execute,
                                 XLA_FFI_Handler* segments = nullptr) {
  auto stages = [&](XLA_FFI_Handler* run) {
    pybind11::dict d;
    d["instantiate"] = pybind11::capsule(reinterpret_cast<void*>(instantiate));
    d["execute"] = pybind11::capsule(reinterpret_cast<void*>(run));
    return d;
  };
  pybind11::dict d;
  d[kTargetName] = stages(execute);
  if (segments != nullptr) d[kSegmentsTargetName] = stages(segments);
  return d;
}

// host_arena(): this process's arena for the host transport, (pid, fd).
inline pybind11::tuple HostArenaPy() {
  HostProcess self;
  Status st = HostArena(&self);
  if (!st.ok()) throw std::runtime_error(st.message);
  return pybind11::make_tuple(self.pid, self.fd);
}

// host_attach(slot, [(pid, fd), ...]): maps the arenas of the host's processes.
inline void HostAttachPy(int64_t slot, const std::vector<std::pair<int64_t, int64_t>>& processes) {
  std::vector<HostProcess> ps;
  for (const auto& [pid, fd] : processes) ps.push_back(HostProcess{pid, fd});
  Status st = HostAttach(slot, ps);
  if (!st.ok()) throw std::runtime_error(st.message);
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

// The decoded and validated schedule of `obj` (a 1-D int64 numpy array, or a
// sequence numpy reads as one). Raises TypeError for another dtype,
// ValueError with the validator's message otherwise.
inline Schedule ScheduleFromPython(const pybind11::handle& obj) {
  namespace py = pybind11;
  py::module_ np = py::module_::import("numpy");
  py::object arr = np.attr("asarray")(obj);
  py::object dtype = arr.attr("dtype");
  // Only int64, as the Python decoder (Schedule.decode): uint64 would wrap,
  // and no narrower type can hold the magic word.
  if (!dtype.equal(np.attr("dtype")("int64"))) {
    throw py::type_error("a schedule must be an int64 array, got dtype " +
                         py::str(dtype).cast<std::string>());
  }
  if (py::cast<int>(arr.attr("ndim")) != 1) {
    throw py::value_error("a schedule must be a 1-D int64 array");
  }
  py::array_t<int64_t, py::array::c_style> a = np.attr("ascontiguousarray")(arr);
  Schedule s;
  std::string err = DecodeSchedule(a.data(), static_cast<size_t>(a.size()), &s);
  if (!err.empty()) throw py::value_error(err);
  return s;
}

// configure(): `value` of parameter `name` must be in [0, max].
inline int64_t CheckSetting(const char* name, int64_t value, int64_t max) {
  if (value < 0 || value > max) {
    throw pybind11::value_error(std::string(name) + " must be in [0, " + std::to_string(max) +
                                "], got " + std::to_string(value));
  }
  return value;
}

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_FFI_PY_COMMON_H_
