// Python module jax_blink._blink_cuda: a single-GPU harness for the CUDA
// executor (N simulated ranks on one device, each with its own streams) and
// kernel/copy timers for benchmarks/bench_cuda.py.
//
// STATUS: compile-checked only (built without a GPU present); never run.
// The event ordering it drives is verified on the host by the stream
// emulator (tests/test_stream_emulator.py).
#include <cuda_runtime.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "executor_cuda.h"
#include "ffi.h"
#include "py_ffi.h"
#include "schedule.h"
#include "stream_exec.h"

namespace py = pybind11;

namespace jax_blink {
namespace {

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string("jax_blink._blink_cuda: ") + what + ": " +
                             cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
  }
}

Schedule Decode(const py::object& obj) {
  py::module_ np = py::module_::import("numpy");
  py::array_t<int64_t, py::array::c_style | py::array::forcecast> a =
      np.attr("ascontiguousarray")(obj, "int64");
  if (a.ndim() != 1) throw py::value_error("a schedule must be a 1-D int64 array");
  Schedule s;
  std::string err = DecodeSchedule(a.data(), a.size(), &s);
  if (!err.empty()) throw py::value_error(err);
  return s;
}

// Device buffers freed on scope exit.
struct DevBuf {
  void* p = nullptr;
  DevBuf() = default;
  explicit DevBuf(size_t bytes) { Check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc"); }
  DevBuf(DevBuf&& o) noexcept : p(o.p) { o.p = nullptr; }
  DevBuf(const DevBuf&) = delete;
  ~DevBuf() { if (p) cudaFree(p); }
};
struct Streams {
  std::vector<cudaStream_t> s;
  explicit Streams(int64_t n) : s(n, nullptr) {
    for (auto& x : s) Check(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~Streams() { for (auto x : s) if (x) cudaStreamDestroy(x); }
};

// N simulated ranks on one device: an input buffer, an output buffer and a
// stream each, and the executor (with its transport) over them.
struct SimRanks {
  std::vector<DevBuf> in, out;
  Streams streams;
  std::vector<StreamRank> buffers;
  CudaTransport transport;
  StreamExecutor executor{&transport};
  SimRanks(int64_t n, size_t bytes, int device) : streams(n), buffers(n) {
    for (int64_t r = 0; r < n; ++r) {
      in.emplace_back(bytes);
      out.emplace_back(bytes);
      buffers[r] = {device, in[r].p, out[r].p, transport.Adopt(device, streams.s[r])};
    }
  }
};

// Runs `schedule` over N device buffers on one GPU; returns the outputs.
py::list RunSchedule(const py::object& schedule, const py::sequence& inputs, bool direct,
                     int64_t repeat, int device) {
  Schedule s = Decode(schedule);
  const int64_t n = s.nranks;
  if (static_cast<int64_t>(py::len(inputs)) != n) {
    throw py::value_error("need " + std::to_string(n) + " inputs");
  }
  if (repeat < 1) throw py::value_error("repeat must be >= 1");
  const size_t tsize = DTypeSize(s.dtype);
  const size_t bytes = static_cast<size_t>(s.count) * tsize;
  Check(cudaSetDevice(device), "cudaSetDevice");
  std::vector<py::array> host;
  for (int64_t r = 0; r < n; ++r) {
    py::array a = py::reinterpret_borrow<py::array>(inputs[r]);
    if (!py::isinstance<py::array>(inputs[r]) || !(a.flags() & py::array::c_style) ||
        static_cast<size_t>(a.itemsize()) != tsize || a.size() != s.count) {
      throw py::value_error("inputs[" + std::to_string(r) + "] must be a C-contiguous array of " +
                            std::to_string(s.count) + " " + DTypeName(s.dtype) + " elements");
    }
    host.push_back(a);
  }
  SimRanks sim(n, bytes, device);
  for (int64_t r = 0; r < n; ++r) {
    Check(cudaMemcpy(sim.in[r].p, host[r].data(), bytes, cudaMemcpyHostToDevice),
          "cudaMemcpy H2D");
    Check(cudaMemset(sim.out[r].p, 0xA5, bytes ? bytes : 1), "cudaMemset");  // poison
  }
  StreamExecOptions opts;
  opts.direct = direct;
  {
    py::gil_scoped_release nogil;
    for (int64_t k = 0; k < repeat; ++k) {
      std::string err = sim.executor.Enqueue(s, sim.buffers, opts);
      if (!err.empty()) {
        py::gil_scoped_acquire g;
        throw std::runtime_error(err);
      }
    }
    for (int64_t r = 0; r < n; ++r) {
      cudaError_t e = cudaStreamSynchronize(sim.streams.s[r]);
      if (e != cudaSuccess) {
        py::gil_scoped_acquire g;
        Check(e, "cudaStreamSynchronize");
      }
    }
  }
  py::module_ np = py::module_::import("numpy");
  py::list out;
  for (int64_t r = 0; r < n; ++r) {
    py::array o = np.attr("empty_like")(host[r]);
    Check(cudaMemcpy(o.mutable_data(), sim.out[r].p, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    out.append(o);
  }
  return out;
}

// Seconds per call of the whole collective (N ranks on one GPU), measured
// with events on rank 0's stream after `warmup` calls; buffers are zeros.
double TimeSchedule(const py::object& schedule, int64_t iters, int64_t warmup, bool direct,
                    int device) {
  Schedule s = Decode(schedule);
  const int64_t n = s.nranks;
  const size_t bytes = static_cast<size_t>(s.count) * DTypeSize(s.dtype);
  Check(cudaSetDevice(device), "cudaSetDevice");
  SimRanks sim(n, bytes, device);
  for (int64_t r = 0; r < n; ++r) Check(cudaMemset(sim.in[r].p, 0, bytes), "cudaMemset");
  StreamExecOptions opts;
  opts.direct = direct;
  cudaEvent_t t0, t1, joined;
  Check(cudaEventCreate(&t0), "cudaEventCreate");
  Check(cudaEventCreate(&t1), "cudaEventCreate");
  Check(cudaEventCreateWithFlags(&joined, cudaEventDisableTiming), "cudaEventCreate");
  float ms = 0;
  std::string err;
  {
    py::gil_scoped_release nogil;
    for (int64_t k = 0; k < warmup + iters && err.empty(); ++k) {
      if (k == warmup) {
        // All ranks' streams join rank 0's before the timed region.
        for (int64_t r = 0; r < n; ++r) Check(cudaStreamSynchronize(sim.streams.s[r]), "sync");
        Check(cudaEventRecord(t0, sim.streams.s[0]), "cudaEventRecord");
      }
      err = sim.executor.Enqueue(s, sim.buffers, opts);
    }
    if (err.empty()) {
      for (int64_t r = 1; r < n; ++r) {
        Check(cudaEventRecord(joined, sim.streams.s[r]), "cudaEventRecord");
        Check(cudaStreamWaitEvent(sim.streams.s[0], joined, 0), "cudaStreamWaitEvent");
      }
      Check(cudaEventRecord(t1, sim.streams.s[0]), "cudaEventRecord");
      Check(cudaEventSynchronize(t1), "cudaEventSynchronize");
      Check(cudaEventElapsedTime(&ms, t0, t1), "cudaEventElapsedTime");
    }
  }
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  cudaEventDestroy(joined);
  if (!err.empty()) throw std::runtime_error(err);
  return ms / 1e3 / static_cast<double>(iters);
}

// Seconds per launch of dst = base + src over `count` elements of dtype
// code `dtype` (accumulator-typed operands; inputs for f16/bf16 when
// `from_input`), or of a device-to-device copy of count elements when
// `copy`.
double TimeKernel(int dtype, int64_t count, int64_t iters, bool from_input, bool copy,
                  int device) {
  if (dtype < 0 || dtype >= kNumDTypes) throw py::value_error("bad dtype code");
  const DType d = static_cast<DType>(dtype);
  Check(cudaSetDevice(device), "cudaSetDevice");
  const size_t asize = AccSize(d), tsize = DTypeSize(d);
  DevBuf dst(count * asize), a(count * asize), b(count * asize);
  Check(cudaMemset(a.p, 0, count * asize), "cudaMemset");
  Check(cudaMemset(b.p, 0, count * asize), "cudaMemset");
  cudaStream_t stream;
  Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaEvent_t t0, t1;
  Check(cudaEventCreate(&t0), "cudaEventCreate");
  Check(cudaEventCreate(&t1), "cudaEventCreate");
  auto once = [&]() {
    if (copy) {
      Check(cudaMemcpyAsync(dst.p, a.p, count * tsize, cudaMemcpyDeviceToDevice, stream),
            "cudaMemcpyAsync");
    } else {
      Check(LaunchReduce(d, dst.p, a.p, from_input, b.p, from_input, count, stream), "reduce");
    }
  };
  once();
  Check(cudaEventRecord(t0, stream), "cudaEventRecord");
  for (int64_t k = 0; k < iters; ++k) once();
  Check(cudaEventRecord(t1, stream), "cudaEventRecord");
  Check(cudaEventSynchronize(t1), "cudaEventSynchronize");
  float ms = 0;
  Check(cudaEventElapsedTime(&ms, t0, t1), "cudaEventElapsedTime");
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  cudaStreamDestroy(stream);
  return ms / 1e3 / static_cast<double>(iters);
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
  m.doc() = "jax_blink CUDA executor: FFI handlers and a single-GPU harness "
            "(compile-checked only; see docs/building.md)";
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
  m.def("run_schedule", &RunSchedule, py::arg("schedule"), py::arg("inputs"),
        py::arg("direct") = true, py::arg("repeat") = 1, py::arg("device") = 0,
        "Runs every rank of `schedule` on one GPU (N simulated ranks, each with its own "
        "streams) over copies of `inputs` (numpy arrays); returns the outputs. "
        "direct=False copies peers' chunks into staging buffers first.");
  m.def("time_schedule", &TimeSchedule, py::arg("schedule"), py::arg("iters") = 10,
        py::arg("warmup") = 2, py::arg("direct") = true, py::arg("device") = 0,
        "Seconds per collective call (all N ranks on one GPU).");
  m.def("time_kernel", &TimeKernel, py::arg("dtype"), py::arg("count"), py::arg("iters") = 20,
        py::arg("from_input") = false, py::arg("copy") = false, py::arg("device") = 0,
        "Seconds per reduction kernel launch (or per D2D copy when copy=True).");
}
