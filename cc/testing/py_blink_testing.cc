// Python module jax_blink._blink_testing (test-only): harnesses that run the
// executors without jax. run_ranks runs the ranks of a schedule on plain
// threads through _blink_ext's CPU executor, the one the XLA custom call
// uses (ffi/cpu_executor_api.h); emulate_streams runs the stream engine
// (the CUDA executor's logic) over the host stream emulator with its race
// checker; run_device_ranks runs the device executor's interpreter in its
// host build (testing/device_host.h).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/schedule.h"
#include "core/status.h"
#include "cpu/executor_cpu.h"
#include "device/device_program.h"
#include "ffi/cpu_executor_api.h"
#include "ffi/py_common.h"
#include "stream/join_enqueue.h"
#include "stream/stream_exec.h"
#include "sync/host_rendezvous.h"
#include "sync/ipc_record.h"
#include "sync/rendezvous.h"
#include "testing/device_host.h"
#include "testing/sim_ranks.h"
#include "testing/stream_emulator.h"

namespace py = pybind11;

namespace jax_blink {
namespace {

// _blink_ext's CPU executor (set when the module is imported).
const CpuExecutorApi* cpu_executor = nullptr;

const CpuExecutorApi* ImportCpuExecutor() {
  const py::object capsule = py::module_::import("jax_blink._blink_ext").attr("_cpu_executor");
  const auto* api = static_cast<const CpuExecutorApi*>(
      PyCapsule_GetPointer(capsule.ptr(), kCpuExecutorApiCapsule));
  if (api == nullptr) throw py::error_already_set();
  if (api->abi != CpuExecutorApiAbi()) {
    throw py::import_error(
        "jax_blink._blink_testing and jax_blink._blink_ext come from different builds; "
        "rebuild both (docs/building.md)");
  }
  return api;
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
                  std::optional<int64_t> run_id_arg, const std::vector<double>& delays_ms,
                  const py::object& times_ns,
                  const std::optional<std::vector<std::vector<int64_t>>>& segments) {
  if (repeat < 1) throw py::value_error("repeat must be >= 1");
  // One schedule for all ranks, or a list with one per rank (to test
  // disagreeing ranks).
  std::vector<std::shared_ptr<Schedule>> scheds;
  if (py::isinstance<py::list>(schedule) ||
      py::isinstance<py::tuple>(schedule)) {
    for (py::handle h : schedule) {
      scheds.push_back(std::make_shared<Schedule>(ScheduleFromPython(h)));
    }
    if (scheds.empty()) throw py::value_error("empty list of schedules");
  } else {
    scheds.push_back(std::make_shared<Schedule>(ScheduleFromPython(schedule)));
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
  if (static_cast<int64_t>(delays_ms.size()) > nranks) {
    throw py::value_error("delays_ms: at most one delay per rank (" + std::to_string(nranks) + ")");
  }
  for (double d : delays_ms) {
    if (!(d >= 0 && d <= 60000)) throw py::value_error("delays_ms must be in [0, 60000]");
  }
  // times_ns: [rank, call, 0] when the rank's call began (after its delay),
  // [rank, call, 1] when it returned, on the steady clock.
  int64_t* times = nullptr;
  py::array_t<int64_t> times_array;
  if (!times_ns.is_none()) {
    const bool int64_array = py::isinstance<py::array_t<int64_t>>(times_ns);
    if (int64_array) times_array = py::reinterpret_borrow<py::array_t<int64_t>>(times_ns);
    if (!int64_array || times_array.ndim() != 3 ||
        times_array.shape(0) != nranks || times_array.shape(1) != repeat || times_array.shape(2) != 2 ||
        !(times_array.flags() & py::array::c_style) || !times_array.writeable()) {
      throw py::value_error("times_ns must be a writable C-contiguous int64 array of shape (" +
                            std::to_string(nranks) + ", " + std::to_string(repeat) + ", 2)");
    }
    times = times_array.mutable_data();
  }
  std::vector<uint8_t> skip(nranks, 0);
  for (int64_t r : skip_ranks) {
    if (r < 0 || r >= nranks) throw py::value_error("skip_ranks out of range");
    skip[r] = 1;
  }
  if (segments && segments->size() != 1 && static_cast<int64_t>(segments->size()) != nranks) {
    throw py::value_error("segments: one list of element counts for every rank, or one per rank");
  }
  std::vector<Buffer> ins, outs;
  std::vector<ExecArgs> args(nranks);
  // Segmented calls (ExecArgs::nsegs): each segment of a rank's input and
  // output in a heap block of its own (so that a read past a segment is a
  // sanitizer's heap overflow), copied from the input before and into the
  // output after.
  struct Segmented {
    std::vector<int64_t> offset;
    std::vector<std::vector<char>> in_blocks, out_blocks;
    std::vector<const void*> in;
    std::vector<void*> out;
  };
  std::vector<Segmented> segs(nranks);
  // Each rank's workspace for its accumulator (cpu/executor_cpu.h), held
  // across the repeats as the FFI handler's pool holds it across calls.
  struct FreeDeleter {
    void operator()(void* p) const { std::free(p); }
  };
  std::vector<std::unique_ptr<void, FreeDeleter>> workspaces(nranks);
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
    if (segments) {
      const std::vector<int64_t>& counts = (*segments)[segments->size() == 1 ? 0 : r];
      Segmented& g = segs[r];
      g.offset.push_back(0);
      for (int64_t c : counts) {
        if (c < 1) throw py::value_error("segments: every count must be at least 1");
        g.offset.push_back(g.offset.back() + c);
      }
      if (counts.empty() || g.offset.back() != a.in_count || a.in_count != a.out_count) {
        throw py::value_error("segments: rank " + std::to_string(r) + "'s counts must sum to its " +
                              std::to_string(a.in_count) + " input and output elements");
      }
      for (size_t i = 0; i < counts.size(); ++i) {
        const size_t bytes = static_cast<size_t>(counts[i]) * itemsize;
        const char* from = static_cast<const char*>(a.in) + g.offset[i] * itemsize;
        g.in_blocks.emplace_back(from, from + bytes);
        g.out_blocks.emplace_back(bytes);
      }
      for (size_t i = 0; i < counts.size(); ++i) {
        g.in.push_back(g.in_blocks[i].data());
        g.out.push_back(g.out_blocks[i].data());
      }
      a.nsegs = static_cast<int32_t>(counts.size());
      a.seg_offset = g.offset.data();
      a.in_segs = g.in.data();
      a.out_segs = g.out.data();
      a.in = g.in[0];
      a.out = g.out[0];
    }
    const int64_t ws = CpuWorkspaceBytes(s, a.in == a.out);
    if (ws > 0) {
      workspaces[r].reset(std::aligned_alloc(64, (static_cast<size_t>(ws) + 63) / 64 * 64));
      if (!workspaces[r]) throw std::bad_alloc();
      a.workspace = workspaces[r].get();
      a.workspace_bytes = ws;
    }
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
          if (r < static_cast<int64_t>(delays_ms.size()) && delays_ms[r] > 0) {  // a late rank
            std::this_thread::sleep_for(std::chrono::microseconds(
                static_cast<int64_t>(delays_ms[r] * 1000.0)));
          }
          const auto now_ns = [] {
            return static_cast<int64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                std::chrono::steady_clock::now().time_since_epoch()).count());
          };
          if (times) times[(r * repeat + k) * 2] = now_ns();
          const ExecResult res = cpu_executor->execute(args[r]);
          if (times) times[(r * repeat + k) * 2 + 1] = now_ns();
          if (!res.status.ok()) {
            errors[r] = res.status.Text();
            break;
          }
        }
      });
    }
    for (std::thread& t : threads) t.join();
  }
  for (int64_t r = 0; r < nranks; ++r) {  // a segmented call's outputs, back in one array
    if (errors[r]) continue;  // (a failed call leaves its output as it was)
    const Segmented& g = segs[r];
    for (size_t i = 0; i < g.out_blocks.size(); ++i) {
      std::memcpy(static_cast<char*>(outs[r].ptr) + g.offset[i] * DTypeSize(sched_of(r).dtype),
                  g.out_blocks[i].data(), g.out_blocks[i].size());
    }
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

// Runs the GPU executor's enqueueing (a StreamRankExecutor per rank, each on
// its own thread) over the host stream emulator: each rank's buffers are host memory labelled in[r] / out[r] on
// device devices[r], with a caller stream that writes the input before the
// collective (and again before each repeat, reading the previous output)
// and reuses both buffers after it, as XLA does. Returns the outputs, the
// races the emulator found and its counters.
py::dict EmulateStreams(const py::object& schedule, const py::sequence& inputs,
                        const std::optional<std::vector<int>>& devices,
                        const py::object& peer, bool direct, bool alias,
                        int64_t repeat, uint64_t seed, uint32_t omit,
                        const std::vector<int64_t>& skip_ranks, int64_t bad_count_rank,
                        int64_t timeout_ms, bool proxies) {
  if (repeat < 1) throw py::value_error("repeat must be >= 1");
  if (proxies && (!skip_ranks.empty() || bad_count_rank >= 0)) {
    throw py::value_error("proxies runs every rank with good buffers");
  }
  const Schedule s = ScheduleFromPython(schedule);
  const int64_t n = s.nranks;
  const size_t tsize = DTypeSize(s.dtype);
  const size_t in_bytes = static_cast<size_t>(s.in_count) * tsize;
  const size_t out_bytes = static_cast<size_t>(s.out_count) * tsize;
  if (static_cast<int64_t>(py::len(inputs)) != n) {
    throw py::value_error("need " + std::to_string(n) + " inputs, got " +
                          std::to_string(py::len(inputs)));
  }
  std::vector<Buffer> ins;
  for (int64_t r = 0; r < n; ++r) {
    ins.push_back(GetBuffer(inputs[r], false, "inputs", r, tsize));
    if (ins.back().count != s.in_count) {
      throw py::value_error("inputs[" + std::to_string(r) + "] has " +
                            std::to_string(ins.back().count) +
                            " elements but the schedule needs " +
                            std::to_string(s.in_count));
    }
  }
  std::vector<int> dev(n, 0);
  if (devices) {
    if (static_cast<int64_t>(devices->size()) != n) {
      throw py::value_error("need one device per rank (" + std::to_string(n) +
                            "), got " + std::to_string(devices->size()));
    }
    dev = *devices;
  }
  int ndev = 0;
  for (int d : dev) {
    if (d < 0) throw py::value_error("devices must be >= 0");
    ndev = std::max(ndev, d + 1);
  }
  StreamPlan plan;
  {
    const std::string err = plan.Build(s, omit);
    if (!err.empty()) throw std::runtime_error(err);
  }

  // Host memory standing in for the ranks' device buffers (declared before
  // the emulator, which refers to it), 64-byte aligned like XLA's buffers
  // and filled with 0xff until the input is written.
  struct FreeDeleter {
    void operator()(void* p) const { std::free(p); }
  };
  std::vector<std::unique_ptr<void, FreeDeleter>> host;
  auto host_buffer = [&](size_t bytes) -> char* {
    const size_t cap = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, cap);
    if (p == nullptr) throw std::bad_alloc();
    std::memset(p, 0xff, cap);
    host.emplace_back(p);
    return static_cast<char*>(p);
  };

  StreamEmulator em;
  if (!peer.is_none()) {
    py::module_ np = py::module_::import("numpy");
    py::array_t<bool, py::array::c_style> m =
        np.attr("ascontiguousarray")(peer, "bool");
    if (m.ndim() != 2 || m.shape(0) != m.shape(1) || m.shape(0) < ndev) {
      throw py::value_error(
          "peer must be a square boolean matrix covering devices 0.." +
          std::to_string(ndev - 1));
    }
    for (py::ssize_t a = 0; a < m.shape(0); ++a) {
      for (py::ssize_t b = 0; b < m.shape(1); ++b) {
        em.SetPeerAccess(static_cast<int>(a), static_cast<int>(b), m.at(a, b));
      }
    }
  }
  auto check = [](const std::string& err) {
    if (!err.empty()) throw std::runtime_error(err);
  };
  std::vector<StreamRank> ranks(n);
  for (int64_t r = 0; r < n; ++r) {
    StreamRank& R = ranks[r];
    const std::string rs = "[" + std::to_string(r) + "]";
    R.device = dev[r];
    if (alias && in_bytes != out_bytes) {
      throw py::value_error("alias needs input and output of one size (not a " +
                            std::string(CollectiveName(s.collective)) + ")");
    }
    char* in = host_buffer(std::max(in_bytes, out_bytes));
    R.in = in;
    R.out = alias ? in : host_buffer(out_bytes);
    check(em.Label(R.in, in_bytes, "in" + rs, R.device));
    check(em.Label(R.out, out_bytes, "out" + rs, R.device));
    check(em.CreateStream(R.device, &R.stream));
    em.NameStream(R.stream, "caller" + rs);
  }
  // The caller writing rank r's input (its producer, or the next step).
  auto write_input = [&](int64_t r, bool reads_out, const char* label) {
    const StreamRank& R = ranks[r];
    void* dst = const_cast<void*>(R.in);
    const void* src = ins[r].ptr;
    std::vector<Range> reads;
    if (reads_out) reads.push_back({R.out, out_bytes});
    return em.Touch(R.stream, reads, {{R.in, in_bytes}}, label,
                    [dst, src, in_bytes] { std::memcpy(dst, src, in_bytes); });
  };

  // One thread per rank, as XLA's device threads: each writes its input,
  // joins the rendezvous and enqueues its own part (JoinAndEnqueue, the CUDA
  // handler's protocol), `repeat` times; the caller reads the output and
  // rewrites the input between calls.
  std::vector<std::unique_ptr<StreamRankExecutor>> ex;
  for (int64_t r = 0; r < n; ++r) ex.push_back(std::make_unique<StreamRankExecutor>(&em));
  std::vector<void*> ws(n, nullptr);
  std::vector<size_t> ws_bytes(n, 0);
  std::vector<StreamExecStats> xs(n);
  static std::atomic<int64_t> next_run{int64_t{1} << 48};
  const int64_t run_id = next_run.fetch_add(1);
  std::vector<std::string> errs(n);
  // proxies: the meeting of ranks in several processes (the CUDA IPC
  // harness's), in one: a rank reads its peers through proxies of their
  // views (their buffers by PeerBuffers, their events) and their progress
  // where they publish it (StreamPublish), never through their executors.
  struct Published {
    const void* in = nullptr;
    void* acc = nullptr;
    std::vector<EventId> events;
  };
  std::vector<Published> published(n);
  std::unique_ptr<std::atomic<uint64_t>[]> shared(new std::atomic<uint64_t>[n]);
  std::barrier meet(n);
  std::atomic<uint32_t> proxy_failed{0};
  auto proxied_call = [&](int64_t r, const WorkspaceFn& workspace) -> std::string {
    const StreamRank& R = ranks[r];
    std::vector<uint8_t> staged(n, 0);
    for (int64_t q = 0; q < n; ++q) {
      staged[q] = q != r && (!direct || !em.PeerReadable(R.device, ranks[q].device));
    }
    std::string e = ex[r]->Prepare(plan, r, R.device);
    void* w = nullptr;
    const size_t bytes = StreamRankExecutor::WorkspaceBytes(s, plan, r, staged, alias);
    if (e.empty() && bytes > 0) e = workspace(bytes, &w);
    StreamRankExecutor::PeerBuffers(s, R, w, &published[r].in, &published[r].acc);
    published[r].events = ex[r]->view().events;
    shared[r].store(0, std::memory_order_relaxed);
    if (!e.empty()) proxy_failed.store(1);
    meet.arrive_and_wait();  // every rank published, its counter reset
    std::vector<StreamPeerView> proxy(n);
    std::vector<StreamPeer> peers(n);
    for (int64_t q = 0; q < n; ++q) {
      if (q == r) {
        peers[q] = {&ex[r]->view(), ex[r]->next_base(), nullptr};
        continue;
      }
      proxy[q].device = ranks[q].device;
      proxy[q].in = published[q].in;
      proxy[q].acc = published[q].acc;
      proxy[q].events = published[q].events;
      peers[q] = {&proxy[q], 0, &shared[q]};
    }
    if (e.empty() && proxy_failed.load() == 0) {
      e = ex[r]->Enqueue(s, plan, r, R, w, peers, staged,
                         Clock::now() + std::chrono::milliseconds(timeout_ms), &proxy_failed,
                         StreamPublish{&shared[r], 0}).Text();
      if (!e.empty()) proxy_failed.store(1);
    }
    meet.arrive_and_wait();  // nobody reads a counter the next call resets
    return e;
  };
  {
    py::gil_scoped_release nogil;
    std::vector<std::thread> threads;
    for (int64_t r = 0; r < n; ++r) {
      if (std::find(skip_ranks.begin(), skip_ranks.end(), r) != skip_ranks.end()) continue;
      threads.emplace_back([&, r] {
        const WorkspaceFn workspace = [&, r](size_t b, void** p) -> std::string {
          if (ws_bytes[r] < b) {
            if (ws[r] != nullptr) em.Free(dev[r], ws[r]);
            ws[r] = nullptr;
            std::string e = em.Alloc(dev[r], b, &ws[r]);
            if (!e.empty()) return e;
            ws_bytes[r] = b;
          }
          *p = ws[r];
          return std::string();
        };
        for (int64_t k = 0; k < repeat && errs[r].empty(); ++k) {
          errs[r] = write_input(r, k > 0, k > 0 ? "caller reads out, writes next in"
                                                : "caller writes in");
          if (!errs[r].empty()) break;
          if (proxies) {
            errs[r] = proxied_call(r, workspace);
            xs[r] = ex[r]->stats();
            continue;
          }
          const StreamRank& R = ranks[r];
          const int64_t bad = r == bad_count_rank ? 1 : 0;
          RankInfo info = StreamRankInfo(s, static_cast<int32_t>(s.dtype), R.in, R.out,
                                         s.in_count + bad, s.out_count + bad, R.device, nullptr,
                                         Status());
          int64_t generation = -1;
          errs[r] = JoinAndEnqueue(RendezvousKey{run_id, 0, 0}, s, plan, r, std::move(info),
                                   R.stream, direct, em, *ex[r], workspace,
                                   Clock::now() + std::chrono::milliseconds(timeout_ms),
                                   timeout_ms, &generation)
                        .Text();
          xs[r] = ex[r]->stats();
        }
      });
    }
    for (std::thread& t : threads) t.join();
  }
  py::list errors;
  for (int64_t r = 0; r < n; ++r) {
    const bool skipped =
        std::find(skip_ranks.begin(), skip_ranks.end(), r) != skip_ranks.end();
    errors.append(skipped ? py::object(py::str("skipped"))
                : errs[r].empty() ? py::object(py::none())
                                  : py::object(py::str(errs[r])));
  }
  for (const StreamRank& R : ranks) {
    check(em.Touch(R.stream, {}, {{R.in, in_bytes}, {R.out, out_bytes}},
                   "caller reuses in and out"));
  }
  // Destroying the executors releases their streams and events under queued
  // work (legal, as in CUDA); the workspaces are freed likewise. Run reports
  // any misuse.
  ex.clear();
  for (int64_t r = 0; r < n; ++r) {
    if (ws[r] != nullptr) em.Free(dev[r], ws[r]);
  }
  check(em.Run(seed));

  py::module_ np = py::module_::import("numpy");
  py::list outputs;
  for (int64_t r = 0; r < n; ++r) {
    py::array o = np.attr("empty")(s.out_count, py::reinterpret_borrow<py::array>(inputs[r]).dtype());
    std::memcpy(o.mutable_data(), ranks[r].out, out_bytes);
    outputs.append(o);
  }
  const StreamEmulatorStats& st = em.stats();
  py::list races;
  for (const std::string& x : em.races()) races.append(x);
  const int64_t unreported =
      st.races - static_cast<int64_t>(em.races().size());
  if (unreported > 0) {
    races.append("... and " + std::to_string(unreported) + " more races");
  }
  py::dict stats;
  stats["streams"] = st.streams;
  stats["events"] = st.events;
  stats["allocs"] = st.allocs;
  // After the executors are destroyed: what they leaked (the callers'
  // streams stay).
  stats["live_streams"] = st.live_streams;
  stats["live_events"] = st.live_events;
  stats["live_alloc_bytes"] = st.alloc_bytes;
  stats["peer_queries"] = st.peer_queries;
  stats["copy"] = st.copies;
  stats["reduce"] = st.reduces;
  stats["to_acc"] = st.to_accs;
  stats["finalize"] = st.finalizes;
  stats["record"] = st.records;
  stats["wait"] = st.waits;
  stats["noop_wait"] = st.noop_waits;
  stats["touch"] = st.touches;
  stats["executed"] = st.executed;
  stats["accesses"] = st.accesses;
  stats["races"] = st.races;
  // The executors' counters of the last call, summed over ranks.
  int64_t kernels = 0, copies = 0, waits = 0, records = 0, staged = 0, wsb = 0, fused = 0;
  for (const StreamExecStats& x : xs) {
    kernels += x.kernels;
    copies += x.copies;
    waits += x.waits;
    records += x.records;
    staged += x.staged_links;
    wsb = std::max(wsb, x.workspace_bytes);
  }
  for (const StreamPlan::Rank& R : plan.ranks) fused += R.fused_steps;
  stats["exec_kernels"] = kernels;
  stats["exec_copies"] = copies;
  stats["exec_waits"] = waits;
  stats["exec_records"] = records;
  stats["staged_links"] = staged;
  stats["max_workspace_bytes"] = wsb;
  stats["fused_steps"] = fused;
  py::dict result;
  result["errors"] = errors;
  result["outputs"] = outputs;
  result["races"] = races;
  result["stats"] = stats;
  return result;
}

// Every rank of the call publishes `blob` through the host transport's
// rendezvous (this module's own arena and attachment) and receives all
// ranks' blobs: how ranks in different processes hand each other their CUDA
// IPC records. Raises RuntimeError with 'KIND: message' for a rank's error.
std::vector<py::bytes> HostExchange(int64_t site, int64_t group, int64_t rank, int64_t nranks,
                                    const std::string& blob, int64_t timeout_ms,
                                    int64_t total_steps, int64_t acc_bytes) {
  HostRankArgs a;
  a.total_steps = total_steps;
  a.acc_bytes = acc_bytes;
  a.site = site;
  a.op_id = site;
  a.group = group;
  a.rank = rank;
  a.nranks = nranks;
  a.stage_input = false;
  a.blob = blob.data();
  a.blob_bytes = static_cast<int64_t>(blob.size());
  if (rank < 0 || rank >= nranks) throw py::value_error("rank must be in [0, nranks)");
  HostTicket ticket;
  Status st;
  {
    py::gil_scoped_release release;
    const int64_t generation = HostReserve(site, group, rank);
    st = HostJoin(a, generation, Clock::now() + std::chrono::milliseconds(timeout_ms), timeout_ms,
                  &ticket);
    for (int64_t r = 0; st.ok() && r < nranks; ++r) {  // a peer's own error, as the executor does
      if (!ticket.view.info[r].error.ok()) st = ticket.view.info[r].error.Prefixed(
          "rank " + std::to_string(r) + ": ");
    }
    HostLeave(&ticket);
  }
  if (!st.ok()) throw std::runtime_error(st.Text());
  std::vector<py::bytes> out;
  for (const std::string& b : ticket.blobs) out.emplace_back(b);
  return out;
}

std::string HandleBytes(const py::bytes& b) {
  std::string s = b;
  if (static_cast<int64_t>(s.size()) != kIpcHandleBytes) {
    throw py::value_error("an IPC handle has " + std::to_string(kIpcHandleBytes) + " bytes");
  }
  return s;
}

// ipc_record_encode(pid, uuid, event, buffers): the record a rank would
// publish, from its fields (buffers: [(handle, offset, bytes, alloc_bytes)]).
py::bytes IpcRecordEncode(int64_t pid, const py::bytes& uuid, const py::object& event,
                          const std::vector<std::tuple<py::bytes, int64_t, int64_t, int64_t>>& buffers) {
  IpcRankRecord r;
  r.pid = pid;
  const std::string u = uuid;
  if (u.size() != sizeof(r.device_uuid)) throw py::value_error("a device UUID has 16 bytes");
  std::memcpy(r.device_uuid, u.data(), u.size());
  if (!event.is_none()) {
    std::memcpy(r.event, HandleBytes(event.cast<py::bytes>()).data(), kIpcHandleBytes);
    r.has_event = 1;
  }
  if (static_cast<int64_t>(buffers.size()) > kIpcMaxBuffers) {
    throw py::value_error("at most " + std::to_string(kIpcMaxBuffers) + " buffers");
  }
  for (const auto& [handle, offset, bytes, alloc] : buffers) {
    IpcBufferRecord& b = r.buffers[r.num_buffers++];
    std::memcpy(b.handle, HandleBytes(handle).data(), kIpcHandleBytes);
    b.offset = offset;
    b.bytes = bytes;
    b.alloc_bytes = alloc;
  }
  return py::bytes(EncodeIpcRecord(r));
}

// The stream emulator under the shared single-GPU harness (testing/sim_ranks.h,
// the harness _blink_cuda_testing.run_schedule runs over CUDA): allocations
// and streams of one emulated device, uploads and fills as pseudo-ops on the
// stream they are given; Finish runs every queued op (in the seed's order).
class EmulatorHarnessDevice {
 public:
  EmulatorHarnessDevice(int device, uint64_t seed) : device_(device), seed_(seed) {}
  StreamEmulator& transport() { return em_; }
  std::string EnterThread() { return std::string(); }
  std::string Alloc(size_t bytes, void** p) { return em_.Alloc(device_, bytes, p); }
  void Free(void* p) { em_.Free(device_, p); }
  std::string CallerStream(int64_t rank, StreamId* s, void** handle) {
    std::string e = em_.CreateStream(device_, s);
    if (e.empty()) em_.NameStream(*s, "caller[" + std::to_string(rank) + "]");
    *handle = nullptr;
    return e;
  }
  std::string LegacyStream(StreamId* s) {
    std::string e = em_.CreateStream(device_, s);
    if (e.empty()) em_.NameStream(*s, "legacy default stream");
    return e;
  }
  std::string Upload(StreamId s, void* dst, const void* host, size_t bytes,
                     const std::string& what) {
    return em_.Touch(s, {}, {{dst, bytes}}, what,
                     [dst, host, bytes] { std::memcpy(dst, host, bytes); });
  }
  std::string Fill(StreamId s, void* dst, int byte, size_t bytes, const std::string& what) {
    return em_.Touch(s, {}, {{dst, bytes}}, what,
                     [dst, byte, bytes] { std::memset(dst, byte, bytes); });
  }
  std::string Finish() { return em_.Run(seed_); }
  std::string Download(void* host, const void* src, size_t bytes) {
    std::memcpy(host, src, bytes);
    return std::string();
  }
  void DestroyCallerStream(StreamId s) { em_.DestroyStream(s); }

 private:
  const int device_;
  const uint64_t seed_;
  StreamEmulator em_;
};

// The CUDA harness's run_schedule over the emulator: the same SimRanks code,
// so the race checker judges the harness's uploads and reads as well as the
// executor. Returns {'outputs', 'races'}.
py::dict EmulateRunSchedule(const py::object& schedule, const py::sequence& inputs, bool direct,
                            int64_t repeat, uint64_t seed, bool legacy_upload) {
  const Schedule s = ScheduleFromPython(schedule);
  const int64_t n = s.nranks;
  if (static_cast<int64_t>(py::len(inputs)) != n) {
    throw py::value_error("need " + std::to_string(n) + " inputs");
  }
  if (repeat < 1) throw py::value_error("repeat must be >= 1");
  std::vector<Buffer> host;
  for (int64_t r = 0; r < n; ++r) {
    host.push_back(GetBuffer(inputs[r], false, "inputs", r, DTypeSize(s.dtype)));
    if (host.back().count != s.in_count) {
      throw py::value_error("inputs[" + std::to_string(r) + "] must have " +
                            std::to_string(s.in_count) + " elements");
    }
  }
  EmulatorHarnessDevice dev(0, seed);
  py::module_ np = py::module_::import("numpy");
  py::list outputs, races;
  {
    SimRanks<EmulatorHarnessDevice> sim(s, dev, {0, legacy_upload});
    std::string err = sim.Init();
    for (int64_t r = 0; r < n && err.empty(); ++r) err = sim.Load(r, host[r].ptr);
    {
      py::gil_scoped_release nogil;
      if (err.empty()) err = sim.Run(repeat, direct, 20000);
      if (err.empty()) err = sim.Finish();
    }
    if (!err.empty()) throw std::runtime_error(err);
    for (int64_t r = 0; r < n; ++r) {
      py::array o = np.attr("empty")(
          s.out_count, py::reinterpret_borrow<py::array>(inputs[r]).dtype());
      sim.Read(r, o.mutable_data());
      outputs.append(o);
    }
  }
  for (const std::string& x : dev.transport().races()) races.append(x);
  py::dict d;
  d["outputs"] = outputs;
  d["races"] = races;
  d["race_count"] = dev.transport().stats().races;
  return d;
}

// ipc_record_decode(record, rank): its fields, checked as a peer checks them.
py::dict IpcRecordDecode(const py::bytes& record, int64_t rank) {
  IpcRankRecord r;
  Status st = DecodeIpcRecord(std::string(record), rank, &r);
  if (!st.ok()) throw py::value_error(st.message);
  py::dict d;
  d["pid"] = r.pid;
  d["uuid"] = py::bytes(reinterpret_cast<const char*>(r.device_uuid), sizeof(r.device_uuid));
  d["event"] = r.has_event ? py::object(py::bytes(reinterpret_cast<const char*>(r.event),
                                                  kIpcHandleBytes))
                           : py::object(py::none());
  py::list buffers;
  for (int32_t i = 0; i < r.num_buffers; ++i) {
    const IpcBufferRecord& b = r.buffers[i];
    buffers.append(py::make_tuple(py::bytes(reinterpret_cast<const char*>(b.handle), kIpcHandleBytes),
                                  b.offset, b.bytes, b.alloc_bytes));
  }
  d["buffers"] = buffers;
  return d;
}

}  // namespace
}  // namespace jax_blink

namespace jax_blink {
namespace {

// The device executor's host build: `repeat` calls on one executor (flags
// and control words carry each call's generation; nothing is reset), the
// first `faulty_calls` of them with skip_ranks never starting and rank
// fault_rank stopping after fault_publishes step flags.
py::list RunDeviceRanks(const py::object& schedule, const py::sequence& inputs,
                        const py::sequence& outputs, int64_t timeout_ms,
                        const std::vector<int64_t>& skip_ranks, int64_t repeat,
                        int64_t fault_rank, int64_t fault_publishes, int64_t faulty_calls,
                        int max_blocks, std::optional<int64_t> faulty_timeout_ms,
                        bool foreign_program) {
  if (repeat < 1) throw py::value_error("repeat must be >= 1");
  if (max_blocks < 0) throw py::value_error("max_blocks must be >= 0");
  const Schedule s = ScheduleFromPython(schedule);
  const int64_t nranks = s.nranks;
  if (static_cast<int64_t>(py::len(inputs)) != nranks ||
      static_cast<int64_t>(py::len(outputs)) != nranks) {
    throw py::value_error("need " + std::to_string(nranks) + " inputs and outputs");
  }
  if (fault_rank >= nranks) throw py::value_error("fault_rank out of range");
  std::vector<uint8_t> skip(nranks, 0);
  for (int64_t r : skip_ranks) {
    if (r < 0 || r >= nranks) throw py::value_error("skip_ranks out of range");
    skip[r] = 1;
  }
  std::vector<Buffer> ins, outs;
  std::vector<const void*> in_ptrs;
  std::vector<void*> out_ptrs;
  const size_t itemsize = DTypeSize(s.dtype);
  for (int64_t r = 0; r < nranks; ++r) {
    ins.push_back(GetBuffer(inputs[r], false, "inputs", r, itemsize));
    outs.push_back(GetBuffer(outputs[r], true, "outputs", r, itemsize));
    if (ins.back().count != s.in_count || outs.back().count != s.out_count) {
      throw py::value_error("rank " + std::to_string(r) + " needs " +
                            std::to_string(s.in_count) + " input and " +
                            std::to_string(s.out_count) + " output elements");
    }
    if (ins.back().ptr == outs.back().ptr) {
      throw py::value_error("the device executor needs an output apart from the input");
    }
    in_ptrs.push_back(ins.back().ptr);
    out_ptrs.push_back(outs.back().ptr);
  }
  std::unique_ptr<DeviceHostExecutor> exec;
  const std::string err = DeviceHostExecutor::Create(s, max_blocks, nullptr, &exec);
  if (!err.empty()) throw py::value_error(err);
  if (foreign_program) exec->WriteHeaderExecutor(exec->executor() + 1000);
  std::vector<std::vector<Status>> calls;
  {
    py::gil_scoped_release release;
    for (int64_t k = 0; k < repeat; ++k) {
      const bool faulty = k < faulty_calls;
      DeviceHostFault fault;
      if (faulty) {
        fault.rank = fault_rank;
        fault.publishes = fault_publishes;
      }
      calls.push_back(exec->Run(in_ptrs, out_ptrs,
                                faulty && faulty_timeout_ms ? *faulty_timeout_ms : timeout_ms,
                                faulty ? skip : std::vector<uint8_t>(nranks, 0), fault));
    }
  }
  py::list result;
  for (const auto& call : calls) {
    py::list ranks;
    for (const Status& st : call) {
      if (st.ok()) {
        ranks.append(py::none());
      } else {
        ranks.append(py::str(st.Text()));
      }
    }
    result.append(ranks);
  }
  return result;
}

// `executors` device executors built one after another in one emulated
// device memory (freed blocks reused with their bytes; delayed_writes: the
// setup's writes land only when it waits for them, or after a call), each
// running `calls` calls on fresh outputs. Returns, per executor, per call,
// (errors: per rank None or 'KIND: message', outputs: per rank).
py::list RunFreshDeviceExecutors(const py::object& schedule, const py::sequence& inputs,
                                 int64_t executors, int64_t calls, bool delayed_writes,
                                 int64_t timeout_ms) {
  if (executors < 1 || calls < 1) throw py::value_error("executors and calls must be >= 1");
  const Schedule s = ScheduleFromPython(schedule);
  const int64_t nranks = s.nranks;
  if (static_cast<int64_t>(py::len(inputs)) != nranks) {
    throw py::value_error("need " + std::to_string(nranks) + " inputs");
  }
  const size_t itemsize = DTypeSize(s.dtype);
  std::vector<Buffer> ins;
  std::vector<const void*> in_ptrs;
  for (int64_t r = 0; r < nranks; ++r) {
    ins.push_back(GetBuffer(inputs[r], false, "inputs", r, itemsize));
    if (ins.back().count != s.in_count) {
      throw py::value_error("rank " + std::to_string(r) + " needs " +
                            std::to_string(s.in_count) + " input elements");
    }
    in_ptrs.push_back(ins.back().ptr);
  }
  const auto mem = std::make_shared<HostDeviceMemory>(delayed_writes);
  const size_t out_bytes = static_cast<size_t>(s.out_count) * itemsize;
  // [executor][call]: statuses and the outputs' bytes (poisoned with 0xA5 before the call)
  std::vector<std::vector<std::pair<std::vector<Status>, std::vector<std::string>>>> runs;
  {
    py::gil_scoped_release release;
    for (int64_t e = 0; e < executors; ++e) {
      std::unique_ptr<DeviceHostExecutor> exec;
      const std::string err = DeviceHostExecutor::Create(s, 0, mem, &exec);
      if (!err.empty()) {
        py::gil_scoped_acquire acquire;
        throw py::value_error(err);
      }
      runs.emplace_back();
      for (int64_t k = 0; k < calls; ++k) {
        std::vector<std::string> outs(nranks, std::string(out_bytes, '\xA5'));
        std::vector<void*> out_ptrs;
        for (std::string& o : outs) out_ptrs.push_back(o.data());
        std::vector<Status> st =
            exec->Run(in_ptrs, out_ptrs, timeout_ms, std::vector<uint8_t>(nranks, 0), {});
        runs.back().emplace_back(std::move(st), std::move(outs));
      }
    }
  }
  const py::object dt = py::reinterpret_borrow<py::array>(inputs[0]).dtype();
  const py::module_ np = py::module_::import("numpy");
  py::list result;
  for (const auto& run : runs) {
    py::list per_call;
    for (const auto& [statuses, outs] : run) {
      py::list errors, outputs;
      for (const Status& st : statuses) {
        errors.append(st.ok() ? py::object(py::none()) : py::object(py::str(st.Text())));
      }
      for (const std::string& o : outs) {
        py::array a = np.attr("empty")(s.out_count, dt);
        std::memcpy(a.mutable_data(), o.data(), o.size());
        outputs.append(a);
      }
      per_call.append(py::make_tuple(errors, outputs));
    }
    result.append(per_call);
  }
  return result;
}

// The device program of a schedule, for tests of its partition.
py::dict DeviceProgramInfo(const py::object& schedule, int max_blocks) {
  const Schedule s = ScheduleFromPython(schedule);
  DeviceProgram p;
  const std::string err = BuildDeviceProgram(s, max_blocks, &p);
  if (!err.empty()) throw py::value_error(err);
  py::list blocks, recv_peers;
  for (int64_t r = 0; r < p.nranks; ++r) {
    py::list rank_blocks;
    for (int32_t b = p.ranks[r].block_begin; b < p.ranks[r].block_begin + p.ranks[r].nblocks;
         ++b) {
      py::list steps;
      for (int32_t k = p.blocks[b].instr_begin; k < p.blocks[b].instr_end; ++k) {
        steps.append(p.instrs[k].step);
      }
      rank_blocks.append(steps);
    }
    blocks.append(rank_blocks);
  }
  py::dict d;
  d["blocks"] = blocks;  // per rank, per block: the steps in the order the block runs them
  d["max_blocks"] = p.max_blocks;
  d["waits"] = static_cast<int64_t>(p.waits.size());
  d["acc_is_out"] = p.acc_is_out;
  d["workspace_bytes"] = p.WorkspaceBytes();
  return d;
}

}  // namespace
}  // namespace jax_blink

PYBIND11_MODULE(_blink_testing, m) {
  using namespace jax_blink;
  m.doc() = "jax_blink test harnesses: the CPU executor and the stream emulator without jax";
  cpu_executor = ImportCpuExecutor();

  m.def(
      "run_ranks", &RunRanks, py::arg("schedule"), py::arg("inputs"),
      py::arg("outputs"), py::arg("timeout_ms") = 10000,
      py::arg("skip_ranks") = std::vector<int64_t>{}, py::arg("op_id") = 0,
      py::arg("group") = 0, py::arg("repeat") = 1,
      py::arg("run_id") = py::none(), py::arg("delays_ms") = std::vector<double>{},
      py::arg("times_ns") = py::none(), py::arg("segments") = py::none(),
      "Test harness: runs every rank except skip_ranks on its own thread "
      "through the rendezvous and CPU executor used by the custom call "
      "(_blink_ext's, with the settings of _blink_ext.configure). "
      "inputs/outputs: one C-contiguous array per rank (itemsize of the "
      "schedule dtype; bfloat16 from ml_dtypes). schedule: one encoded "
      "schedule, or a list with one per rank. repeat: run the collective this "
      "many times on the same threads (one RunId, successive generations, "
      "like a call site inside lax.scan; for benchmarks). run_id: the "
      "rendezvous RunId (default: a fresh negative id). delays_ms: rank r "
      "sleeps delays_ms[r] before each call (a late rank). times_ns: an int64 "
      "array of shape (ranks, repeat, 2) that receives, per rank and call, the "
      "steady clock in ns when the call began (after the delay) and returned. segments: a list of "
      "element counts (one for every rank, or one list per rank): the call takes each rank's "
      "input and output in that many separate buffers (ExecArgs::nsegs), copied from the input "
      "array and back into the output array. Returns one entry "
      "per rank: None on success (or when skipped), else the first error as "
      "'KIND: message', KIND the error code the custom call would return "
      "(INVALID_ARGUMENT, DEADLINE_EXCEEDED or INTERNAL).");
  m.def("emulate_streams", &EmulateStreams, py::arg("schedule"),
        py::arg("inputs"), py::kw_only(), py::arg("devices") = py::none(),
        py::arg("peer") = py::none(), py::arg("direct") = true,
        py::arg("alias") = false, py::arg("repeat") = 1, py::arg("seed") = 0,
        py::arg("omit") = 0, py::arg("skip_ranks") = std::vector<int64_t>(),
        py::arg("bad_count_rank") = -1, py::arg("timeout_ms") = 10000,
        py::arg("proxies") = false,
        "Test harness: runs the GPU executor's enqueueing (StreamRankExecutor, a "
        "thread per rank meeting through JoinAndEnqueue as in the CUDA FFI "
        "handler) over the host stream emulator with its race checker. inputs: "
        "one C-contiguous array per rank of the schedule's dtype and count. "
        "devices: device label per rank (default all 0, one GPU). peer: "
        "optional [D, D] bool matrix, peer[a, b]: device a may read device "
        "b's memory (default all true). direct=False stages every read "
        "through copies. alias: the output buffer is the input buffer. "
        "repeat: calls on the same executors, the caller rewriting the input "
        "(same data) between them. seed: the emulator's execution order. "
        "omit: StreamOmit bits (OMIT_*) dropping waits, for tests. skip_ranks "
        "never join, bad_count_rank publishes a wrong element count, "
        "timeout_ms bounds the waits. proxies: the ranks meet as ranks of several "
        "processes do over CUDA IPC (the CUDA harness's ipc_run_rank): each reads its "
        "peers through proxies of their views and their progress where they publish it. "
        "Returns {'outputs': [array], 'errors': "
        "[None, an error ('KIND: message' as run_ranks), or 'skipped' per rank], "
        "'races': [str], 'stats': "
        "{str: int}}; raises ValueError for bad arguments, RuntimeError for "
        "an emulator error.");
  m.def("emulate_run_schedule", &EmulateRunSchedule, py::arg("schedule"), py::arg("inputs"),
        py::kw_only(), py::arg("direct") = true, py::arg("repeat") = 1, py::arg("seed") = 0,
        py::arg("legacy_upload") = false,
        "Test harness: the CUDA harness's run_schedule (testing/sim_ranks.h: N ranks of one "
        "device, each uploading its input on its caller stream, a thread each meeting "
        "through JoinAndEnqueue) over the stream emulator instead of CUDA. legacy_upload: "
        "upload on a stream the executor's streams do not wait for, as the harness once did "
        "with cudaMemcpy. Returns {'outputs': [array], 'races': [str], 'race_count': int}.");
  m.def("run_device_ranks", &RunDeviceRanks, py::arg("schedule"), py::arg("inputs"),
        py::arg("outputs"), py::kw_only(), py::arg("timeout_ms") = 10000,
        py::arg("skip_ranks") = std::vector<int64_t>{}, py::arg("repeat") = 1,
        py::arg("fault_rank") = -1, py::arg("fault_publishes") = 0,
        py::arg("faulty_calls") = 1, py::arg("max_blocks") = 0,
        py::arg("faulty_timeout_ms") = py::none(), py::arg("foreign_program") = false,
        "Test harness: the device executor's interpreter (device/device_interp.h) in its host "
        "build, a std::thread per program block. Runs `repeat` calls on one executor (flags "
        "carry generations, nothing is reset); in the first `faulty_calls` of them the "
        "skip_ranks never start and rank fault_rank stops after fault_publishes step flags "
        "(their timeout: faulty_timeout_ms, default timeout_ms). "
        "inputs/outputs: one C-contiguous array per rank (in_count and out_count elements). "
        "max_blocks: cap on a rank's blocks (0: one per peer it receives from). "
        "foreign_program: the program's header names another executor, as memory still "
        "holding an earlier executor's program would. Returns, per call, one entry per rank: "
        "None, or 'KIND: message'.");
  m.def("run_fresh_device_executors", &RunFreshDeviceExecutors, py::arg("schedule"),
        py::arg("inputs"), py::kw_only(), py::arg("executors"), py::arg("calls") = 1,
        py::arg("delayed_writes") = true, py::arg("timeout_ms") = 10000,
        "Test harness: `executors` device executors (host build) built one after another in "
        "one emulated device memory that hands freed blocks back with their bytes; "
        "delayed_writes: the setup's uploads and zeroing land only when the setup waits for "
        "them (or after a call, as a late DMA). Each runs `calls` calls. Returns, per "
        "executor, per call, (errors: per rank None or 'KIND: message', outputs).");
  m.def("device_program", &DeviceProgramInfo, py::arg("schedule"), py::kw_only(),
        py::arg("max_blocks") = 0,
        "The device executor's program of a schedule: {'blocks': per rank, per block, the "
        "steps in run order; 'max_blocks', 'waits', 'acc_is_out', 'workspace_bytes'}.");
  m.def("host_arena", &HostArenaPy,
        "This module's arena for the host transport (its own state, apart from _blink_ext's): "
        "(pid, fd).");
  m.def("host_attach", &HostAttachPy, py::arg("slot"), py::arg("processes"),
        "Maps the arenas of the host's processes [(pid, fd), ...] (this module's state).");
  m.def("host_exchange", &HostExchange, py::arg("site"), py::arg("group"), py::arg("rank"),
        py::arg("nranks"), py::arg("blob"), py::arg("timeout_ms") = 10000,
        py::arg("total_steps") = 0, py::arg("acc_bytes") = 0,
        "Test harness: rank `rank` of `nranks` (in this and the other attached processes) "
        "publishes `blob` through the host rendezvous and returns every rank's blob; "
        "RuntimeError 'KIND: message' for a rank's error or a timeout. total_steps and "
        "acc_bytes: what a schedule would ask of the host slot (its steps, the rank's "
        "accumulator in the arena), for the limits' errors.");
  m.def("ipc_record_encode", &IpcRecordEncode, py::arg("pid"), py::arg("uuid"),
        py::arg("event"), py::arg("buffers"),
        "The CUDA IPC record (sync/ipc_record.h) of these fields, as a rank publishes it.");
  m.def("ipc_record_decode", &IpcRecordDecode, py::arg("record"), py::arg("rank"),
        "A published CUDA IPC record's fields, checked as a peer checks them (ValueError "
        "naming the rank and what is wrong).");
  m.attr("HOST_BLOB_BYTES") = kHostBlobBytes;
  m.attr("OMIT_ENTRY_WAITS") = static_cast<int>(kOmitEntryWaits);
  m.attr("OMIT_DEP_WAITS") = static_cast<int>(kOmitDepWaits);
  m.attr("OMIT_GUARDS") = static_cast<int>(kOmitGuards);
  m.attr("OMIT_EXIT_WAITS") = static_cast<int>(kOmitExitWaits);
  m.def(
      "rendezvous_stats",
      []() {
        const RendezvousStats s = cpu_executor->rendezvous_stats();
        py::dict d;
        d["entries"] = s.entries;
        d["active_slots"] = s.active_slots;
        d["pooled_slots"] = s.pooled_slots;
        d["tombstones"] = s.tombstones;
        return d;
      },
      "Counts of live state of the rendezvous run_ranks and the CPU custom call use "
      "(_blink_ext's; for leak tests).");
}
