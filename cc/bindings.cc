// Python module jax_blink._blink_ext: FFI capsules, the schedule validator and
// a test harness that runs ranks on plain threads through the same
// rendezvous and executor code as the XLA custom call.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "executor.h"
#include "ffi.h"
#include "rendezvous.h"
#include "schedule.h"

namespace py = pybind11;

namespace jax_blink {
namespace {

py::capsule Capsule(void* p) { return py::capsule(p); }

// A C-contiguous int64 vector view of `obj` (a numpy array or a sequence).
std::vector<int64_t> Int64Words(const py::handle& obj) {
  py::module_ np = py::module_::import("numpy");
  py::object arr = np.attr("asarray")(obj);
  py::object dtype = arr.attr("dtype");
  if (!dtype.equal(np.attr("dtype")("int64"))) {
    if (py::str(dtype.attr("kind")).cast<std::string>() != "i" &&
        py::str(dtype.attr("kind")).cast<std::string>() != "u") {
      throw py::type_error("a schedule must be an int64 array, got dtype " +
                           py::str(dtype).cast<std::string>());
    }
    arr = arr.attr("astype")("int64");
  }
  if (py::cast<int>(arr.attr("ndim")) != 1) {
    throw py::value_error("a schedule must be a 1-D int64 array");
  }
  py::array_t<int64_t, py::array::c_style> a =
      np.attr("ascontiguousarray")(arr);
  return std::vector<int64_t>(a.data(), a.data() + a.size());
}

Schedule DecodeOrThrow(const py::handle& obj) {
  std::vector<int64_t> words = Int64Words(obj);
  Schedule s;
  std::string err = DecodeSchedule(words.data(), words.size(), &s);
  if (!err.empty()) throw py::value_error(err);
  return s;
}

py::dict ValidateSchedule(const py::object& obj) {
  Schedule s = DecodeOrThrow(obj);
  py::dict d;
  d["nranks"] = s.nranks;
  d["count"] = s.count;
  d["collective"] = CollectiveName(s.collective);
  d["root"] = s.root;
  d["dtype"] = DTypeName(s.dtype);
  d["nchunks"] = s.nchunks;
  d["ntrees"] = s.ntrees;
  d["total_steps"] = s.total_steps;
  d["fingerprint"] = s.fingerprint;
  return d;
}

std::atomic<int64_t> next_test_run_id{-1};

// A numpy array's raw memory (works for any dtype, including ml_dtypes'
// bfloat16, which the buffer protocol cannot describe).
struct Buffer {
  py::array array;  // keeps the memory alive
  void* ptr = nullptr;
  int64_t count = 0;
};

Buffer GetBuffer(const py::handle& obj, bool writable, const char* what,
                 int64_t rank, size_t itemsize) {
  const std::string where =
      std::string(what) + "[" + std::to_string(rank) + "]";
  if (!py::isinstance<py::array>(obj)) {
    throw py::type_error(where + " must be a numpy array");
  }
  Buffer b;
  b.array = py::reinterpret_borrow<py::array>(obj);
  if (static_cast<size_t>(b.array.itemsize()) != itemsize) {
    throw py::value_error(
        where + " has itemsize " + std::to_string(b.array.itemsize()) +
        " but the schedule dtype needs " + std::to_string(itemsize));
  }
  if (!(b.array.flags() & py::array::c_style)) {
    throw py::value_error(where + " must be C-contiguous");
  }
  if (writable && !b.array.writeable()) {
    throw py::value_error(where + " must be writable");
  }
  b.ptr = const_cast<void*>(b.array.data());
  b.count = static_cast<int64_t>(b.array.size());
  return b;
}

py::list RunRanks(const py::object& schedule, const py::sequence& inputs,
                  const py::sequence& outputs, int64_t timeout_ms,
                  const std::vector<int64_t>& skip_ranks, int64_t op_id,
                  int64_t group, int64_t repeat,
                  std::optional<int64_t> run_id_arg) {
  if (repeat < 1) throw py::value_error("repeat must be >= 1");
  // One schedule for all ranks, or a list with one per rank (to test
  // disagreeing ranks).
  std::vector<std::shared_ptr<Schedule>> scheds;
  if (py::isinstance<py::list>(schedule) ||
      py::isinstance<py::tuple>(schedule)) {
    for (py::handle h : schedule) {
      scheds.push_back(std::make_shared<Schedule>(DecodeOrThrow(h)));
    }
    if (scheds.empty()) throw py::value_error("empty list of schedules");
  } else {
    scheds.push_back(std::make_shared<Schedule>(DecodeOrThrow(schedule)));
  }
  const int64_t nranks = scheds[0]->nranks;
  if (scheds.size() != 1 && static_cast<int64_t>(scheds.size()) != nranks) {
    throw py::value_error("need one schedule, or one per rank");
  }
  auto sched_of = [&](int64_t r) -> const Schedule& {
    return *scheds[scheds.size() == 1 ? 0 : r];
  };
  if (static_cast<int64_t>(py::len(inputs)) != nranks ||
      static_cast<int64_t>(py::len(outputs)) != nranks) {
    throw py::value_error("need " + std::to_string(nranks) +
                          " inputs and outputs, got " +
                          std::to_string(py::len(inputs)) + " and " +
                          std::to_string(py::len(outputs)));
  }
  std::vector<uint8_t> skip(nranks, 0);
  for (int64_t r : skip_ranks) {
    if (r < 0 || r >= nranks) throw py::value_error("skip_ranks out of range");
    skip[r] = 1;
  }
  std::vector<Buffer> ins, outs;
  std::vector<ExecArgs> args(nranks);
  // Harness runs use negative RunIds (XLA's are not negative).
  const int64_t run_id =
      run_id_arg ? *run_id_arg : next_test_run_id.fetch_sub(1);
  for (int64_t r = 0; r < nranks; ++r) {
    const Schedule& s = sched_of(r);
    const size_t itemsize = DTypeSize(s.dtype);
    ins.push_back(GetBuffer(inputs[r], false, "inputs", r, itemsize));
    outs.push_back(GetBuffer(outputs[r], true, "outputs", r, itemsize));
    ExecArgs& a = args[r];
    a.schedule = &s;
    a.rank = r;
    a.run_id = run_id;
    a.op_id = op_id;
    a.group = group;
    a.in = ins.back().ptr;
    a.out = outs.back().ptr;
    a.in_count = ins.back().count;
    a.out_count = outs.back().count;
    a.dtype = static_cast<int32_t>(s.dtype);  // trust the schedule's dtype
    a.timeout_ms = timeout_ms;
  }
  std::vector<std::optional<std::string>> errors(nranks);
  {
    py::gil_scoped_release release;
    std::vector<std::thread> threads;
    threads.reserve(nranks);
    for (int64_t r = 0; r < nranks; ++r) {
      if (skip[r]) continue;
      threads.emplace_back([&, r] {
        // Repeats reuse one RunId: generations tell them apart, as for a
        // call site inside lax.scan.
        for (int64_t k = 0; k < repeat; ++k) {
          ExecResult res = ExecuteCpu(args[r]);
          if (!res.error.empty()) {
            errors[r] = std::move(res.error);
            break;
          }
        }
      });
    }
    for (std::thread& t : threads) t.join();
  }
  py::list result;
  for (int64_t r = 0; r < nranks; ++r) {
    if (errors[r]) {
      result.append(py::str(*errors[r]));
    } else {
      result.append(py::none());
    }
  }
  return result;
}

}  // namespace
}  // namespace jax_blink

PYBIND11_MODULE(_blink_ext, m) {
  using namespace jax_blink;
  m.doc() = "jax_blink C++ extension: XLA FFI handlers and test harness";

  m.def(
      "registrations",
      []() {
        py::dict stages;
        stages["instantiate"] =
            Capsule(reinterpret_cast<void*>(CpuInstantiateHandler()));
        stages["execute"] =
            Capsule(reinterpret_cast<void*>(CpuExecuteHandler()));
        py::dict d;
        d[kTargetName] = stages;
        return d;
      },
      "FFI targets: {name: {stage: PyCapsule}} for jax.ffi.register_ffi_target "
      "(platform cpu).");
  m.def(
      "type_registrations",
      []() {
        py::dict reg;
        reg["type_id"] = Capsule(StateTypeId());
        reg["type_info"] = Capsule(StateTypeInfo());
        py::dict d;
        d[kStateTypeName] = reg;
        return d;
      },
      "FFI state types: {name: {'type_id', 'type_info'}} for "
      "jax.ffi.register_ffi_type (platform cpu).");
  m.def("validate_schedule", &ValidateSchedule, py::arg("schedule"),
        "Decodes and validates an encoded schedule (1-D int64). Returns a dict "
        "of its header fields; raises ValueError with the reason otherwise.");
  m.def(
      "has_cuda", []() { return false; },
      "Whether this build contains the CUDA executor.");
  m.def(
      "run_ranks", &RunRanks, py::arg("schedule"), py::arg("inputs"),
      py::arg("outputs"), py::arg("timeout_ms") = 10000,
      py::arg("skip_ranks") = std::vector<int64_t>{}, py::arg("op_id") = 0,
      py::arg("group") = 0, py::arg("repeat") = 1,
      py::arg("run_id") = py::none(),
      "Test harness: runs every rank except skip_ranks on its own thread "
      "through the rendezvous and CPU executor used by the custom call. "
      "inputs/outputs: one C-contiguous array per rank (itemsize of the "
      "schedule dtype; bfloat16 from ml_dtypes). schedule: one encoded "
      "schedule, or a list with one per rank. repeat: run the collective this "
      "many times on the same threads (one RunId, successive generations, "
      "like a call site inside lax.scan; for benchmarks). run_id: the "
      "rendezvous RunId (default: a fresh negative id). Returns one entry "
      "per rank: None on success (or when skipped), else the first error "
      "message.");
  m.def(
      "rendezvous_stats",
      []() {
        RendezvousStats s = Rendezvous::Global().Stats();
        py::dict d;
        d["entries"] = s.entries;
        d["active_slots"] = s.active_slots;
        d["pooled_slots"] = s.pooled_slots;
        d["tombstones"] = s.tombstones;
        return d;
      },
      "Counts of live rendezvous state (for leak tests).");
  m.def(
      "_set_tunables",
      [](int spin, int64_t yield_us, int64_t nt_bytes, bool push,
         int64_t hugepage_bytes) {
        ExecTunables t;
        t.spin = spin;
        t.yield_ns = yield_us * 1000;
        t.nt_bytes = nt_bytes;
        t.push = push;
        t.hugepage_bytes = hugepage_bytes;
        SetExecTunables(t);
      },
      py::arg("spin"), py::arg("yield_us"), py::arg("nt_bytes"),
      py::arg("push") = true, py::arg("hugepage_bytes") = int64_t{2} << 20,
      "Benchmark hook: overrides JAX_BLINK_SPIN / JAX_BLINK_YIELD_US / "
      "JAX_BLINK_NT_BYTES / JAX_BLINK_PUSH / JAX_BLINK_HUGEPAGE_BYTES. Do not "
      "call while collectives run.");
  m.def("_get_tunables", []() {
    const ExecTunables& t = GetExecTunables();
    py::dict d;
    d["spin"] = t.spin;
    d["yield_us"] = t.yield_ns / 1000;
    d["nt_bytes"] = t.nt_bytes;
    d["hugepage_bytes"] = t.hugepage_bytes;
    d["push"] = t.push;
    return d;
  });
  m.attr("TARGET") = kTargetName;
}
