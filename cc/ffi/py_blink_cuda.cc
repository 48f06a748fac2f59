// Python module jax_blink._blink_cuda (production, built when a CUDA compiler
// is found): the CUDA FFI handlers of the custom call, its debug setting,
// and the device queries topology detection needs.
#include <cuda_runtime.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <stdexcept>
#include <string>

#include "core/debug.h"
#include "cuda/cuda_transport.h"
#include "ffi/handlers.h"
#include "ffi/py_common.h"

namespace py = pybind11;

namespace jax_blink {
namespace {

// The PCI bus id ("dddd:bb:dd.f") of CUDA device `ordinal`.
std::string PciBusId(int ordinal) {
  char buf[64] = {0};
  const cudaError_t e = cudaDeviceGetPCIBusId(buf, sizeof(buf), ordinal);
  if (e != cudaSuccess) throw std::runtime_error(CudaErrorText("cudaDeviceGetPCIBusId", e));
  return std::string(buf);
}

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace
}  // namespace jax_blink

PYBIND11_MODULE(_blink_cuda, m) {
  using namespace jax_blink;
  m.doc() = "jax_blink CUDA executor: the CUDA XLA FFI handlers";
  m.def("has_cuda", []() { return true; });
  m.def(
      "registrations",
      []() { return FfiTargets(CudaInstantiateHandler(), CudaExecuteHandler()); },
      "FFI targets: {name: {stage: PyCapsule}} for jax.ffi.register_ffi_target "
      "(platform CUDA).");
  m.def(
      "type_registrations",
      []() { return FfiTypes(kCudaStateTypeName, CudaStateTypeId(), CudaStateTypeInfo()); },
      "FFI state types: {name: {type_id, type_info}} for jax.ffi.register_ffi_type "
      "(platform CUDA).");
  m.def("device_count", &DeviceCount, "CUDA devices visible (0 without a GPU or driver)");
  m.def("pci_bus_id", &PciBusId, py::arg("ordinal"),
        "The PCI bus id of a CUDA device ordinal, as the CUDA runtime reports it.");
  m.def(
      "configure",
      [](bool debug, std::optional<std::string> executor) {
        if (executor && *executor != "stream" && *executor != "device") {
          throw py::value_error("executor must be 'stream' or 'device', got '" + *executor + "'");
        }
        SetDebugEnabled(debug);
        if (executor) SetCudaDeviceExecutor(*executor == "device");
      },
      py::kw_only(), py::arg("debug"), py::arg("executor") = py::none(),
      "Sets the CUDA executor's settings (jax_blink's settings module passes them). "
      "debug: log one line per collective to stderr (False until it is called). executor: "
      "'stream' (the default) or 'device' (JAX_BLINK_CUDA_EXECUTOR; one kernel per rank per "
      "call) for executables instantiated afterwards; None leaves it as it is.");
  m.def(
      "configuration",
      []() {
        py::dict d;
        d["debug"] = DebugEnabled();
        d["executor"] = CudaDeviceExecutor() ? "device" : "stream";
        return d;
      },
      "The settings in effect: {'debug', 'executor'} (configure's arguments).");
}
