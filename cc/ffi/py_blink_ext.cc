// Python module jax_blink._blink_ext (production, CPU): the FFI handlers of
// the custom call, the schedule validator, the executor's settings, and the
// executor's entry points for the test harness module (ffi/cpu_executor_api.h).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <climits>
#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

#include "core/debug.h"
#include "core/schedule.h"
#include "cpu/executor_cpu.h"
#include "ffi/cpu_executor_api.h"
#include "ffi/handlers.h"
#include "ffi/py_common.h"
#include "sync/host_rendezvous.h"
#include "sync/rendezvous.h"
#include "sync/worker_pool.h"

namespace py = pybind11;

namespace jax_blink {
namespace {

py::dict ValidateSchedule(const py::object& obj) {
  const Schedule s = ScheduleFromPython(obj);
  py::dict d;
  d["nranks"] = s.nranks;
  d["count"] = s.count;
  d["collective"] = CollectiveName(s.collective);
  d["root"] = s.root;
  d["dtype"] = DTypeName(s.dtype);
  d["op"] = ReduceOpName(s.op);
  d["in_count"] = s.in_count;
  d["out_count"] = s.out_count;
  d["nchunks"] = s.nchunks;
  d["ntrees"] = s.ntrees;
  d["total_steps"] = s.total_steps;
  d["fingerprint"] = s.fingerprint;
  d["inplace_ok"] = s.inplace_ok;
  return d;
}

// The limits of docs/schedule_format.md, named as the Python validator's
// jax_blink.schedule.constants.LIMITS (a test compares them).
py::dict ScheduleLimits() {
  py::dict d;
  d["ranks"] = kMaxRanks;
  d["count"] = kMaxCount;
  d["chunks"] = kMaxChunks;
  d["trees"] = kMaxTrees;
  d["steps per rank"] = kMaxStepsPerRank;
  d["words"] = kMaxWords;
  d["proof state"] = kMaxProofWords;
  return d;
}

void Configure(int64_t spin, int64_t yield_us, bool push, int64_t nt_bytes,
               int64_t hugepage_bytes, bool debug, bool barrier) {
  ExecTunables t;
  t.spin = static_cast<int>(CheckSetting("spin", spin, INT_MAX));
  t.yield_ns = CheckSetting("yield_us", yield_us, INT64_MAX / 1000) * 1000;
  t.push = push;
  t.nt_bytes = CheckSetting("nt_bytes", nt_bytes, INT64_MAX);
  t.hugepage_bytes = CheckSetting("hugepage_bytes", hugepage_bytes, INT64_MAX);
  t.barrier = barrier;
  SetExecTunables(t);
  SetDebugEnabled(debug);
}

py::dict Configuration() {
  const ExecTunables& t = GetExecTunables();
  py::dict d;
  d["spin"] = t.spin;
  d["yield_us"] = t.yield_ns / 1000;
  d["push"] = t.push;
  d["nt_bytes"] = t.nt_bytes;
  d["hugepage_bytes"] = t.hugepage_bytes;
  d["debug"] = DebugEnabled();
  d["barrier"] = t.barrier;
  return d;
}

py::dict WorkerThreads() {
  const WorkerPoolStats w = WorkerPool::Global().Stats();
  py::dict d;
  d["threads"] = w.threads;
  d["idle"] = w.idle;
  d["started"] = w.started;
  return d;
}

RendezvousStats GlobalRendezvousStats() { return Rendezvous::Global().Stats(); }

py::list Lateness(bool reset) {
  py::list out;
  for (const LatenessSummary& s : ArrivalLateness(reset)) {
    py::dict d;
    d["nranks"] = s.nranks;
    d["calls"] = s.calls;
    py::list mean, max;
    for (double v : s.mean_ns) mean.append(v / 1e6);
    for (double v : s.max_ns) max.append(v / 1e6);
    d["mean_late_ms"] = mean;
    d["max_late_ms"] = max;
    out.append(d);
  }
  return out;
}

const CpuExecutorApi kCpuExecutorApi = {CpuExecutorApiAbi(), &ExecuteCpu,
                                        &GlobalRendezvousStats};

}  // namespace
}  // namespace jax_blink

PYBIND11_MODULE(_blink_ext, m) {
  using namespace jax_blink;
  m.doc() = "jax_blink C++ extension: the CPU XLA FFI handlers and the schedule validator";

  m.def(
      "registrations",
      []() {
        return FfiTargets(CpuInstantiateHandler(), CpuExecuteHandler(), CpuExecuteSegmentsHandler());
      },
      "FFI targets: {name: {stage: PyCapsule}} for jax.ffi.register_ffi_target "
      "(platform cpu).");
  m.def(
      "type_registrations",
      []() { return FfiTypes(kStateTypeName, StateTypeId(), StateTypeInfo()); },
      "FFI state types: {name: {'type_id', 'type_info'}} for "
      "jax.ffi.register_ffi_type (platform cpu).");
  m.def("validate_schedule", &ValidateSchedule, py::arg("schedule"),
        "Decodes and validates an encoded schedule (1-D int64). Returns a dict "
        "of its header fields and 'inplace_ok' (whether the CPU executor can run it with "
        "the output aliasing the input, without a separate accumulator); raises "
        "ValueError with the reason otherwise.");
  m.def("schedule_limits", &ScheduleLimits,
        "The limits the schedule validator enforces (docs/schedule_format.md, "
        "\"Limits\"): {'ranks', 'count', 'chunks', 'trees', 'steps per rank', "
        "'words', 'proof state'}.");
  m.def("configure", &Configure, py::kw_only(), py::arg("spin"), py::arg("yield_us"),
        py::arg("push"), py::arg("nt_bytes"), py::arg("hugepage_bytes"), py::arg("debug"),
        py::arg("barrier") = false,
        "Sets the CPU executor's settings (jax_blink's settings module passes them; "
        "call it before running collectives). spin: busy-wait iterations before "
        "yielding when a step must wait; yield_us: then sched_yield for up to this "
        "long before sleeping on a futex; push: the rank that completes a chunk also "
        "writes it into ready receivers; nt_bytes: buffers at least this large copy "
        "final chunks with non-temporal stores (0: never); hugepage_bytes: output "
        "buffers at least this large get madvise(MADV_HUGEPAGE) (0: never); debug: "
        "log one line per collective to stderr; barrier: every rank waits for all "
        "before any data moves (instead of early start; for comparisons only). Until "
        "it is called: spin=0, yield_us=200, push=True, nt_bytes=1048576, "
        "hugepage_bytes=2097152, debug=False, barrier=False. Raises ValueError naming a parameter out of range.");
  m.def("configuration", &Configuration,
        "The settings in effect: {'spin', 'yield_us', 'push', 'nt_bytes', "
        "'hugepage_bytes', 'debug', 'barrier'} (configure's arguments).");
  m.def("worker_threads", &WorkerThreads,
        "The threads that run CPU collectives off XLA's threads (the handler returns a "
        "future and hands its rank to one): {'threads': alive, 'idle': waiting for work, "
        "'started': ever created}. Idle threads exit after 30 s.");
  m.def("arrival_lateness", &Lateness, py::kw_only(), py::arg("reset") = false,
        "How long after the first rank of each call every rank joined the in-process "
        "rendezvous, over each rank count's last 256 calls: [{'nranks', 'calls', "
        "'mean_late_ms': [per rank], 'max_late_ms': [per rank]}]. reset: forget them after.");
  m.def("host_arena", &HostArenaPy,
        "This process's arena for the host transport (an anonymous shared memory file, "
        "created on first call): (pid, fd). Other processes of the job map it through "
        "/proc/<pid>/fd/<fd>. Raises RuntimeError when the system refuses it.");
  m.def("host_attach", &HostAttachPy, py::arg("slot"), py::arg("processes"),
        "Maps the arenas of the processes of this host, [(pid, fd), ...] in the job's order, "
        "of which processes[slot] is this one. Calls lowered with transport=1 then meet there. "
        "Once per process (again with the same list: no-op). Raises RuntimeError saying why "
        "an arena cannot be mapped.");
  m.def("host_attached", &HostAttached, "Whether host_attach succeeded in this process.");
  m.attr("_cpu_executor") = py::capsule(&kCpuExecutorApi, kCpuExecutorApiCapsule);
}
