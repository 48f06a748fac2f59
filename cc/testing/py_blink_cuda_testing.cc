// Python module jax_blink._blink_cuda_testing (test-only, built with the CUDA
// executor): a single-GPU harness for the CUDA executor (N simulated ranks on
// one device, each on its own thread with its own streams, meeting through
// the same rendezvous and JoinAndEnqueue as the FFI handler) and
// kernel/copy timers for benchmarks/bench_cuda.py; run_device / time_device
// run the device executor (device/device_gpu.h: one kernel per rank per call)
// over N ranks of one GPU.
#include <cuda_runtime.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/schedule.h"
#include "core/status.h"
#include "cuda/cuda_ipc.h"
#include "cuda/cuda_transport.h"
#include "device/device_gpu.h"
#include "ffi/py_common.h"
#include "stream/join_enqueue.h"
#include "stream/stream_exec.h"
#include "sync/host_rendezvous.h"
#include "sync/ipc_record.h"
#include "sync/join.h"
#include "sync/rendezvous.h"
#include "testing/sim_ranks.h"

namespace py = pybind11;

namespace jax_blink {
namespace {

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(CudaErrorText(what, e));
}

// Device buffers freed on scope exit (test scaffolding: the executor itself
// never allocates).
struct DevBuf {
  void* p = nullptr;
  DevBuf() = default;
  explicit DevBuf(size_t bytes) { Check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc"); }
  DevBuf(DevBuf&& o) noexcept : p(o.p) { o.p = nullptr; }
  DevBuf& operator=(DevBuf&& o) noexcept {
    std::swap(p, o.p);
    return *this;
  }
  DevBuf(const DevBuf&) = delete;
  ~DevBuf() { if (p) cudaFree(p); }
};

// The CUDA runtime under the shared harness (testing/sim_ranks.h): buffers
// from cudaMalloc, non-blocking caller streams, uploads and fills enqueued
// with cudaMemcpyAsync / cudaMemsetAsync on the stream they are given.
class CudaHarnessDevice {
 public:
  explicit CudaHarnessDevice(int device) : device_(device) {}
  ~CudaHarnessDevice() {
    for (auto& [id, st] : created_) cudaStreamDestroy(st);
  }
  CudaTransport& transport() { return tp_; }
  std::string EnterThread() {
    const cudaError_t e = cudaSetDevice(device_);
    return e == cudaSuccess ? std::string() : CudaErrorText("cudaSetDevice", e);
  }
  std::string Alloc(size_t bytes, void** p) {
    std::string e = EnterThread();
    if (e.empty()) e = Text(cudaMalloc(p, bytes ? bytes : 1), "cudaMalloc");
    return e;
  }
  void Free(void* p) { cudaFree(p); }
  std::string CallerStream(int64_t /*rank*/, StreamId* s, void** handle) {
    cudaStream_t st = nullptr;
    const std::string e =
        Text(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreate");
    if (!e.empty()) return e;
    *s = tp_.Adopt(device_, st);
    *handle = st;
    std::lock_guard<std::mutex> lk(mu_);
    created_[*s] = st;
    return std::string();
  }
  std::string LegacyStream(StreamId* s) {
    *s = tp_.Adopt(device_, cudaStreamLegacy);
    std::lock_guard<std::mutex> lk(mu_);
    legacy_ = *s;
    return std::string();
  }
  std::string Upload(StreamId s, void* dst, const void* host, size_t bytes,
                     const std::string& what) {
    return Text(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, StreamOf(s)),
                what.c_str());
  }
  std::string Fill(StreamId s, void* dst, int byte, size_t bytes, const std::string& what) {
    return Text(cudaMemsetAsync(dst, byte, bytes, StreamOf(s)), what.c_str());
  }
  std::string Finish() { return Text(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }
  std::string Download(void* host, const void* src, size_t bytes) {
    return Text(cudaMemcpy(host, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  }
  void DestroyCallerStream(StreamId s) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = created_.find(s);
    if (it == created_.end()) return;
    cudaStreamDestroy(it->second);
    created_.erase(it);
  }

 private:
  static std::string Text(cudaError_t e, const char* what) {
    return e == cudaSuccess ? std::string() : CudaErrorText(what, e);
  }
  cudaStream_t StreamOf(StreamId s) {
    std::lock_guard<std::mutex> lk(mu_);
    if (s == legacy_) return cudaStreamLegacy;
    auto it = created_.find(s);
    return it == created_.end() ? nullptr : it->second;
  }

  const int device_;
  CudaTransport tp_;
  std::mutex mu_;  // guards the maps
  std::map<StreamId, cudaStream_t> created_;
  StreamId legacy_ = -1;
};
using CudaSimRanks = SimRanks<CudaHarnessDevice>;

void ThrowIfError(const std::string& e) {
  if (!e.empty()) throw std::runtime_error(e);
}

// Per-rank counters of the last call, and their means.
py::dict StatsDict(const CudaSimRanks& sim) {
  py::dict d;
  py::list per_rank;
  double enqueue = 0, gate = 0, calls = 0, ws = 0;
  for (const StreamExecStats& st : sim.stats()) {
    py::dict r;
    r["kernels"] = st.kernels;
    r["copies"] = st.copies;
    r["waits"] = st.waits;
    r["records"] = st.records;
    r["api_calls"] = st.kernels + st.copies + st.waits + st.records;
    r["workspace_bytes"] = st.workspace_bytes;
    r["enqueue_us"] = st.enqueue_ns / 1e3;
    r["gate_us"] = st.gate_ns / 1e3;
    per_rank.append(r);
    enqueue += st.enqueue_ns / 1e3;
    gate += st.gate_ns / 1e3;
    calls += st.kernels + st.copies + st.waits + st.records;
    ws = std::max<double>(ws, st.workspace_bytes);
  }
  const double n = static_cast<double>(sim.stats().size());
  d["per_rank"] = per_rank;
  d["api_calls_per_rank"] = calls / n;
  d["enqueue_us_per_rank"] = enqueue / n;
  d["gate_us_per_rank"] = gate / n;
  d["max_workspace_bytes"] = ws;
  int64_t fused = 0;
  for (const StreamPlan::Rank& R : sim.plan().ranks) fused += R.fused_steps;
  d["fused_steps"] = fused;
  return d;
}

// Runs `schedule` over N device buffers on one GPU; returns the outputs.
// legacy_upload: tests only, the harness's old upload order (sim_ranks.h).
py::list RunSchedule(const py::object& schedule, const py::sequence& inputs, bool direct,
                     int64_t repeat, int device, bool legacy_upload) {
  Schedule s = ScheduleFromPython(schedule);
  const int64_t n = s.nranks;
  if (static_cast<int64_t>(py::len(inputs)) != n) {
    throw py::value_error("need " + std::to_string(n) + " inputs");
  }
  if (repeat < 1) throw py::value_error("repeat must be >= 1");
  const size_t tsize = DTypeSize(s.dtype);
  std::vector<py::array> host;
  for (int64_t r = 0; r < n; ++r) {
    py::array a = py::reinterpret_borrow<py::array>(inputs[r]);
    if (!py::isinstance<py::array>(inputs[r]) || !(a.flags() & py::array::c_style) ||
        static_cast<size_t>(a.itemsize()) != tsize || a.size() != s.in_count) {
      throw py::value_error("inputs[" + std::to_string(r) + "] must be a C-contiguous array of " +
                            std::to_string(s.in_count) + " " + DTypeName(s.dtype) + " elements");
    }
    host.push_back(a);
  }
  Check(cudaSetDevice(device), "cudaSetDevice");
  CudaHarnessDevice dev(device);
  py::module_ np = py::module_::import("numpy");
  py::list out;
  {
    CudaSimRanks sim(s, dev, {device, legacy_upload});
    std::string err = sim.Init();
    for (int64_t r = 0; r < n && err.empty(); ++r) err = sim.Load(r, host[r].data());
    {
      py::gil_scoped_release nogil;
      if (err.empty()) err = sim.Run(repeat, direct);
      if (err.empty()) err = sim.Finish();
    }
    ThrowIfError(err);
    for (int64_t r = 0; r < n; ++r) {
      py::array o = np.attr("empty")(s.out_count, host[r].dtype());
      ThrowIfError(sim.Read(r, o.mutable_data()));
      out.append(o);
    }
  }
  return out;
}

// Times `iters` back-to-back calls of the whole collective (N ranks on one
// GPU, each rank's host thread enqueueing its part) after `warmup` calls,
// with events: from rank 0's stream before the first timed call to the end
// of every rank's stream. Buffers are zeros. Returns {"seconds": per call,
// plus StatsDict of the last call}.
py::dict TimeSchedule(const py::object& schedule, int64_t iters, int64_t warmup, bool direct,
                      int device) {
  if (iters < 1 || warmup < 0) throw py::value_error("need iters >= 1 and warmup >= 0");
  Schedule s = ScheduleFromPython(schedule);
  const int64_t n = s.nranks;
  Check(cudaSetDevice(device), "cudaSetDevice");
  CudaHarnessDevice dev(device);
  CudaSimRanks sim(s, dev, {device, false});
  std::string err = sim.Init();
  for (int64_t r = 0; r < n && err.empty(); ++r) err = sim.Zero(r);
  ThrowIfError(err);
  auto stream = [&sim](int64_t r) { return static_cast<cudaStream_t>(sim.handle(r)); };
  cudaEvent_t t0, t1, joined;
  Check(cudaEventCreate(&t0), "cudaEventCreate");
  Check(cudaEventCreate(&t1), "cudaEventCreate");
  Check(cudaEventCreateWithFlags(&joined, cudaEventDisableTiming), "cudaEventCreate");
  float ms = 0;
  {
    py::gil_scoped_release nogil;
    if (warmup > 0) err = sim.Run(warmup, direct);
    if (err.empty()) err = sim.Finish();
    if (err.empty()) {
      // Every rank's stream starts after t0.
      Check(cudaEventRecord(t0, stream(0)), "cudaEventRecord");
      for (int64_t r = 1; r < n; ++r) {
        Check(cudaStreamWaitEvent(stream(r), t0, 0), "cudaStreamWaitEvent");
      }
      err = sim.Run(iters, direct);
    }
    if (err.empty()) {
      for (int64_t r = 1; r < n; ++r) {
        Check(cudaEventRecord(joined, stream(r)), "cudaEventRecord");
        Check(cudaStreamWaitEvent(stream(0), joined, 0), "cudaStreamWaitEvent");
      }
      Check(cudaEventRecord(t1, stream(0)), "cudaEventRecord");
      Check(cudaEventSynchronize(t1), "cudaEventSynchronize");
      Check(cudaEventElapsedTime(&ms, t0, t1), "cudaEventElapsedTime");
    }
  }
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  cudaEventDestroy(joined);
  if (!err.empty()) throw std::runtime_error(err);
  py::dict d = StatsDict(sim);
  d["seconds"] = ms / 1e3 / static_cast<double>(iters);
  return d;
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
  cudaStream_t stream;
  Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  // On the timed stream: a non-blocking stream does not wait for the legacy one.
  Check(cudaMemsetAsync(a.p, 0, count * asize, stream), "cudaMemsetAsync");
  Check(cudaMemsetAsync(b.p, 0, count * asize, stream), "cudaMemsetAsync");
  cudaEvent_t t0, t1;
  Check(cudaEventCreate(&t0), "cudaEventCreate");
  Check(cudaEventCreate(&t1), "cudaEventCreate");
  auto once = [&]() {
    if (copy) {
      Check(cudaMemcpyAsync(dst.p, a.p, count * tsize, cudaMemcpyDeviceToDevice, stream),
            "cudaMemcpyAsync");
    } else {
      const StreamOperand ops[2] = {{a.p, from_input}, {b.p, from_input}};
      Check(LaunchReduce(d, ReduceOp::kSum, dst.p, ops, 2, count, stream), "reduce");
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

// CUDA IPC between processes (cuda/cuda_ipc.h): buffers and events this
// process exported for its peers, kept until ipc_close().
struct IpcExports {
  std::vector<DevBuf> buffers;
  std::vector<cudaEvent_t> events;
};
IpcExports& Exports() {
  static IpcExports* e = new IpcExports();
  return *e;
}

void ThrowIfError(const Status& st) {
  if (!st.ok()) throw std::runtime_error(st.Text());
}

// A buffer of `nbytes` bytes ((i * 31 + seed) mod 256) that starts 256 bytes
// into its allocation (as XLA's sub-allocated buffers do), an interprocess
// event recorded after it was written, and the record a rank publishes.
py::bytes IpcExportTestBuffer(int device, int64_t nbytes, int seed) {
  constexpr int64_t kOffset = 256;
  Check(cudaSetDevice(device), "cudaSetDevice");
  DevBuf buf(static_cast<size_t>(nbytes + kOffset));
  std::vector<uint8_t> host(static_cast<size_t>(nbytes));
  for (int64_t i = 0; i < nbytes; ++i) host[i] = static_cast<uint8_t>((i * 31 + seed) & 0xff);
  char* data = static_cast<char*>(buf.p) + kOffset;
  Check(cudaMemcpy(data, host.data(), host.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
  cudaEvent_t event = nullptr;
  Check(cudaEventCreateWithFlags(&event, cudaEventInterprocess | cudaEventDisableTiming),
        "cudaEventCreateWithFlags");
  Exports().events.push_back(event);
  Check(cudaEventRecord(event, 0), "cudaEventRecord");
  IpcRankRecord record;
  ThrowIfError(FillIpcIdentity(&record));
  ThrowIfError(ExportIpcBuffer(data, nbytes, &record));
  ThrowIfError(ExportIpcEvent(event, &record));
  Exports().buffers.push_back(std::move(buf));
  return py::bytes(EncodeIpcRecord(record));
}

// The bytes of buffer 0 of the record `rank` published, read on `device`
// through the opened handle after waiting on the opened event.
py::bytes IpcReadPeer(int device, const py::bytes& blob, int64_t rank) {
  Check(cudaSetDevice(device), "cudaSetDevice");
  IpcRankRecord record;
  ThrowIfError(DecodeIpcRecord(std::string(blob), rank, &record));
  void* data = nullptr;
  cudaEvent_t event = nullptr;
  ThrowIfError(OpenIpcBuffer(record, 0, rank, &data));
  ThrowIfError(OpenIpcEvent(record, rank, &event));
  std::string host(static_cast<size_t>(record.buffers[0].bytes), '\0');
  cudaStream_t stream = nullptr;
  Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaError_t e = cudaStreamWaitEvent(stream, event, 0);
  if (e == cudaSuccess) e = cudaMemcpyAsync(host.data(), data, host.size(), cudaMemcpyDeviceToHost, stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
  Check(e, "reading a peer's buffer");
  return py::bytes(host);
}

// ---- Ranks in several processes on one GPU, over CUDA IPC -------------------
// One rank per process: the stream executor runs the rank's part against
// peers of other processes whose buffers and events it opened through CUDA
// IPC, meeting them through the host rendezvous (sync/host_rendezvous.h),
// which carries each rank's IPC record (its input and accumulator) and its
// shared block below.

// What a rank shares with the ranks of other processes, in its part of its
// process's host arena (the host rendezvous copies it there before the rank
// joins): the progress it publishes (StreamPublish), then the IPC handles of
// its events, which its peers open and wait on.
struct IpcSharedBlock {
  std::atomic<uint64_t> progress{0};
  int64_t nevents = 0;
  uint8_t pad[48] = {};
};
static_assert(sizeof(IpcSharedBlock) == 64, "the handles start 64 bytes in");

// What a rank's calls keep: its shared block and record (its events and
// buffers do not change between calls of one executor and plan) and the
// ids of the peers' events it opened.
struct IpcRankCache {
  std::vector<uint8_t> block;
  IpcRankRecord mine;
  std::string blob;
  Status exported;
  std::map<cudaEvent_t, EventId> adopted;
};

Status IpcRunCall(const Schedule& s, const StreamPlan& plan, int64_t rank, int device,
                  const StreamRank& me, void* ws, int64_t site, int64_t timeout_ms,
                  CudaTransport& tp, StreamRankExecutor& ex, IpcRankCache& cache) {
  const int64_t n = s.nranks;
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  const int64_t generation = HostReserve(site, 0, rank);
  const std::string prepared = ex.Prepare(plan, rank, device);
  // Once: the shared block, and the record of the input and accumulator.
  if (prepared.empty() && cache.block.empty()) {
    const int64_t nevents = static_cast<int64_t>(ex.view().events.size());
    cache.block.assign(sizeof(IpcSharedBlock) + nevents * kIpcHandleBytes, 0);
    new (cache.block.data()) IpcSharedBlock();
    reinterpret_cast<IpcSharedBlock*>(cache.block.data())->nevents = nevents;
    Status& local = cache.exported;
    for (int64_t k = 0; local.ok() && k < nevents; ++k) {
      local = ExportIpcEventHandle(
          tp.EventOf(ex.view().events[k]),
          cache.block.data() + sizeof(IpcSharedBlock) + k * kIpcHandleBytes);
    }
    const void* peer_in = nullptr;
    void* peer_acc = nullptr;
    StreamRankExecutor::PeerBuffers(s, me, ws, &peer_in, &peer_acc);
    if (local.ok()) local = FillIpcIdentity(&cache.mine);
    if (local.ok()) local = ExportIpcBuffer(peer_in, s.in_count * DTypeSize(s.dtype), &cache.mine);
    if (local.ok()) local = ExportIpcBuffer(peer_acc, s.count * AccSize(s.dtype), &cache.mine);
    cache.blob = EncodeIpcRecord(cache.mine);
  }
  const IpcRankRecord& mine = cache.mine;
  const std::vector<uint8_t>& block = cache.block;
  const std::string& blob = cache.blob;
  // A local error still joins, so that peers fail at once.
  const Status local = prepared.empty() ? cache.exported : Status::Internal(prepared);
  HostRankArgs a;
  a.site = site;
  a.op_id = site;
  a.rank = rank;
  a.nranks = n;
  a.fingerprint = s.fingerprint;
  a.count = s.count;
  a.dtype = static_cast<int32_t>(s.dtype);
  a.error = local;
  a.in = block.data();
  a.in_bytes = static_cast<int64_t>(block.size());
  a.stage_input = true;
  a.blob = blob.data();
  a.blob_bytes = static_cast<int64_t>(blob.size());
  HostTicket ticket;
  Status st = HostJoin(a, generation, deadline, timeout_ms, &ticket);
  if (st.ok()) {
    const std::string where = CallSiteText(site, 0, generation);
    st = CheckConsistent(ticket.view, where);
    // Proxies of the peers: their buffers and events opened here.
    std::vector<StreamPeerView> proxy(n);
    std::vector<StreamPeer> peers(n);
    for (int64_t q = 0; st.ok() && q < n; ++q) {
      if (q == rank) {
        peers[q] = {&ex.view(), ex.next_base(), nullptr};
        continue;
      }
      IpcRankRecord rec;
      st = DecodeIpcRecord(ticket.blobs[q], q, &rec);
      if (st.ok() && std::memcmp(rec.device_uuid, mine.device_uuid, sizeof(mine.device_uuid))) {
        st = Status::InvalidArgument("rank " + std::to_string(q) +
                                     " is on another GPU: this harness runs ranks of one GPU");
      }
      void* in_q = nullptr;
      if (st.ok()) st = OpenIpcBuffer(rec, 0, q, &in_q);
      if (st.ok()) st = OpenIpcBuffer(rec, 1, q, &proxy[q].acc);
      proxy[q].in = in_q;
      proxy[q].device = device;
      auto* shared = static_cast<IpcSharedBlock*>(const_cast<void*>(ticket.view.info[q].in));
      const auto* handles = reinterpret_cast<const uint8_t*>(shared + 1);
      for (int64_t k = 0; st.ok() && k < shared->nevents; ++k) {
        cudaEvent_t ev = nullptr;
        st = OpenIpcEventHandle(rec, handles + k * kIpcHandleBytes, q, &ev);
        if (!st.ok()) break;
        auto [it, added] = cache.adopted.emplace(ev, -1);
        if (added) it->second = tp.AdoptEvent(device, ev);
        if (it->second < 0) st = Status::Internal("too many events");
        proxy[q].events.push_back(it->second);
      }
      peers[q] = {&proxy[q], 0, &shared->progress};
    }
    if (st.ok()) {
      auto* self = static_cast<IpcSharedBlock*>(ticket.staging);
      const std::vector<uint8_t> staged(n, 0);  // one GPU: every peer is read in place
      st = ex.Enqueue(s, plan, rank, me, ws, peers, staged, deadline, &ticket.view.failed(),
                      StreamPublish{&self->progress, 0});
      if (!st.ok()) ticket.view.Fail(rank, st.Prefixed("jax_blink: " + where + ": "));
    } else {
      ticket.view.Fail(rank, st);
    }
    // All or nothing, as JoinAndEnqueue: spin and yield (100 us) before sleeping.
    const Status all = ticket.view.Finish(deadline + std::chrono::milliseconds(timeout_ms),
                                          /*spin=*/256, /*yield_ns=*/100000);
    if (!all.ok()) st = all;
  }
  if (ticket.entry >= 0) HostLeave(&ticket);
  return st;
}

// Rank `rank` of `schedule`, this process's only rank, over CUDA IPC: `calls`
// collectives; returns the output of the last. The peers run it in their
// processes, attached to this one (host_attach).
py::object IpcRunRank(const py::object& schedule, int64_t rank, const py::array& input,
                      int64_t site, int64_t calls, int64_t timeout_ms, int device, bool timed) {
  Schedule s = ScheduleFromPython(schedule);
  const size_t tsize = DTypeSize(s.dtype);
  if (rank < 0 || rank >= s.nranks) throw py::value_error("rank must be in [0, nranks)");
  if (!(input.flags() & py::array::c_style) || static_cast<size_t>(input.itemsize()) != tsize ||
      input.size() != s.in_count) {
    throw py::value_error("input must be a C-contiguous array of " + std::to_string(s.in_count) +
                          " " + DTypeName(s.dtype) + " elements");
  }
  if (calls < 1) throw py::value_error("calls must be >= 1");
  StreamPlan plan;
  std::string e = plan.Build(s);
  if (!e.empty()) throw std::runtime_error(e);
  Check(cudaSetDevice(device), "cudaSetDevice");
  // Buffers 256 bytes into their allocations, as XLA's sub-allocated ones.
  constexpr size_t kOffset = 256;
  const size_t in_bytes = s.in_count * tsize, out_bytes = s.out_count * tsize;
  DevBuf in_alloc(in_bytes + kOffset), out_alloc(out_bytes + kOffset);
  char* in = static_cast<char*>(in_alloc.p) + kOffset;
  char* out = static_cast<char*>(out_alloc.p) + kOffset;
  cudaStream_t stream;
  Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  // The input and the poisoned output are written on the rank's caller stream,
  // whose start event the peers wait for (testing/sim_ranks.h: a blocking
  // cudaMemcpy on the legacy stream is not ordered before the executor's
  // non-blocking streams).
  Check(cudaMemcpyAsync(in, input.data(), in_bytes, cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync H2D");
  Check(cudaMemsetAsync(out, 0xA5, out_bytes, stream), "cudaMemsetAsync");  // poison
  CudaTransport tp(/*interprocess_events=*/true);
  Status st;
  double seconds = 0;
  {
    py::gil_scoped_release nogil;
    auto ex = std::make_unique<StreamRankExecutor>(&tp);
    const StreamRank me{device, in, out, tp.Adopt(device, stream)};
    const size_t ws_bytes = StreamRankExecutor::WorkspaceBytes(
        s, plan, rank, std::vector<uint8_t>(s.nranks, 0), /*alias=*/false);
    DevBuf ws(ws_bytes + kOffset);
    void* ws_p = ws_bytes > 0 ? static_cast<char*>(ws.p) + kOffset : nullptr;
    IpcRankCache cache;
    const auto t0 = Clock::now();
    for (int64_t k = 0; k < calls && st.ok(); ++k) {
      st = IpcRunCall(s, plan, rank, device, me, ws_p, site, timeout_ms, tp, *ex, cache);
    }
    const cudaError_t synced = cudaStreamSynchronize(stream);
    seconds = std::chrono::duration<double>(Clock::now() - t0).count() / calls;
    if (st.ok() && synced != cudaSuccess) st = Status::Internal(CudaErrorText("sync", synced));
    // Every process has finished with every other's memory and events before
    // any closes or frees them.
    HostRankArgs done;
    done.site = site;
    done.op_id = site;
    done.rank = rank;
    done.nranks = s.nranks;
    HostTicket ticket;
    const Status met = HostJoin(done, HostReserve(site, 0, rank),
                                Clock::now() + std::chrono::milliseconds(timeout_ms), timeout_ms,
                                &ticket);
    if (ticket.entry >= 0) HostLeave(&ticket);
    if (st.ok()) st = met;
    CloseIpcPeers();
    ex.reset();  // its streams and events
  }
  if (!st.ok()) {
    cudaStreamDestroy(stream);
    throw std::runtime_error(st.Text());
  }
  py::module_ np = py::module_::import("numpy");
  py::array o = np.attr("empty")(s.out_count, input.dtype());
  Check(cudaMemcpy(o.mutable_data(), out, out_bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  cudaStreamDestroy(stream);
  if (!timed) return o;
  py::dict d;
  d["output"] = o;
  d["seconds"] = seconds;
  return d;
}

void IpcClose() {
  CloseIpcPeers();
  for (cudaEvent_t event : Exports().events) cudaEventDestroy(event);
  Exports().events.clear();
  Exports().buffers.clear();
}

// ---- The device executor (device/device_gpu.h) over N ranks of one GPU.
// Each rank has its own non-blocking stream, and its input and poisoned
// output are written on that stream before its kernel, as XLA orders a
// handler's operands: a peer reads the input only after the rank's kernel
// has published its first flag. Nothing synchronises the device before the
// first launch, so the first call relies on the executor's own setup
// ordering (device_setup.h), as under XLA.
struct DeviceRanks {
  std::unique_ptr<DeviceGpuExecutor> exec;
  std::vector<cudaStream_t> streams;
  std::vector<DevBuf> in, out, ws;
  std::vector<DeviceGpuBuffers> bufs;
  ~DeviceRanks() {
    for (cudaStream_t st : streams) cudaStreamDestroy(st);
  }
};

void SetUpDeviceRanks(const Schedule& s, const py::sequence& inputs, int device, DeviceRanks* d) {
  Check(cudaSetDevice(device), "cudaSetDevice");
  const int64_t n = s.nranks;
  const Status st = DeviceGpuExecutor::Create(s, std::vector<int>(n, device), &d->exec);
  if (!st.ok()) throw std::runtime_error(st.Text());
  const size_t tsize = DTypeSize(s.dtype);
  const int64_t ws = d->exec->program().WorkspaceBytes();
  for (int64_t r = 0; r < n; ++r) {
    cudaStream_t stream;
    Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    d->streams.push_back(stream);
    d->in.emplace_back(s.in_count * tsize);
    d->out.emplace_back(s.out_count * tsize);
    d->ws.emplace_back(ws > 0 ? ws : 0);
    if (py::len(inputs) != 0) {
      const py::array x = py::reinterpret_borrow<py::array>(inputs[r]);
      if (x.nbytes() != static_cast<py::ssize_t>(s.in_count * tsize) ||
          !(x.flags() & py::array::c_style)) {
        throw py::value_error("inputs[" + std::to_string(r) + "] must be C-contiguous with " +
                              std::to_string(s.in_count) + " elements of the schedule's dtype");
      }
      Check(cudaMemcpyAsync(d->in.back().p, x.data(), x.nbytes(), cudaMemcpyHostToDevice, stream),
            "cudaMemcpyAsync (input)");
    } else {
      Check(cudaMemsetAsync(d->in.back().p, 0, s.in_count * tsize, stream), "cudaMemsetAsync");
    }
    Check(cudaMemsetAsync(d->out.back().p, 0xff, s.out_count * tsize, stream), "cudaMemsetAsync");
    d->bufs.push_back({d->in.back().p, d->out.back().p, ws > 0 ? d->ws.back().p : nullptr});
  }
}

// One call on every rank but `skip`: launches all (they must be resident
// together), then each rank's outcome. Returns the errors ("" when ok).
std::vector<std::string> DeviceCall(DeviceRanks& d, uint64_t generation, int64_t timeout_ms,
                                    const std::vector<uint8_t>& skip) {
  const int64_t n = static_cast<int64_t>(d.streams.size());
  std::vector<std::string> errors(n);
  for (int64_t r = 0; r < n; ++r) {
    if (skip[r]) continue;
    const Status st = d.exec->Launch(r, d.bufs, generation, timeout_ms, d.streams[r]);
    if (!st.ok()) errors[r] = st.Text();
  }
  for (int64_t r = 0; r < n; ++r) {
    if (skip[r] || !errors[r].empty()) continue;
    const Status st = d.exec->Outcome(r, generation, timeout_ms, d.streams[r],
                                      "generation " + std::to_string(generation));
    if (!st.ok()) errors[r] = st.Text();
  }
  return errors;
}

py::dict RunDevice(const py::object& schedule, const py::sequence& inputs, int64_t repeat,
                   int64_t timeout_ms, const std::vector<int64_t>& skip_ranks, int device) {
  if (repeat < 1) throw py::value_error("repeat must be >= 1");
  const Schedule s = ScheduleFromPython(schedule);
  if (static_cast<int64_t>(py::len(inputs)) != s.nranks) {
    throw py::value_error("need one input per rank");
  }
  std::vector<uint8_t> skip(s.nranks, 0);
  for (int64_t r : skip_ranks) {
    if (r < 0 || r >= s.nranks) throw py::value_error("skip_ranks out of range");
    skip[r] = 1;
  }
  DeviceRanks d;
  SetUpDeviceRanks(s, inputs, device, &d);
  py::list calls;
  {
    py::gil_scoped_release release;
    std::vector<std::vector<std::string>> all;
    for (int64_t k = 0; k < repeat; ++k) {
      // skip_ranks miss the first call only; the next ones run on the same flags.
      all.push_back(DeviceCall(d, static_cast<uint64_t>(k + 1), timeout_ms,
                               k == 0 ? skip : std::vector<uint8_t>(s.nranks, 0)));
    }
    py::gil_scoped_acquire acquire;
    for (const auto& errs : all) {
      py::list ranks;
      for (const std::string& e : errs) ranks.append(e.empty() ? py::object(py::none()) : py::str(e));
      calls.append(ranks);
    }
  }
  py::list outputs;
  const py::dtype dt = py::reinterpret_borrow<py::array>(inputs[0]).dtype();
  for (int64_t r = 0; r < s.nranks; ++r) {
    py::array out(dt, {s.out_count});
    Check(cudaMemcpyAsync(out.mutable_data(), d.out[r].p, s.out_count * DTypeSize(s.dtype),
                          cudaMemcpyDeviceToHost, d.streams[r]),
          "cudaMemcpyAsync (output)");
    Check(cudaStreamSynchronize(d.streams[r]), "cudaStreamSynchronize");
    outputs.append(out);
  }
  py::dict res;
  res["outputs"] = outputs;
  res["errors"] = calls;
  res["blocks_per_rank"] = d.exec->program().max_blocks;
  return res;
}

py::dict TimeDevice(const py::object& schedule, int64_t iters, int64_t warmup, int device,
                    int64_t timeout_ms) {
  const Schedule s = ScheduleFromPython(schedule);
  DeviceRanks d;
  SetUpDeviceRanks(s, py::list(), device, &d);
  const std::vector<uint8_t> none(s.nranks, 0);
  std::vector<double> seconds;
  {
    py::gil_scoped_release release;
    uint64_t gen = 0;
    for (int64_t k = 0; k < warmup + iters; ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      const std::vector<std::string> errs = DeviceCall(d, ++gen, timeout_ms, none);
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      for (const std::string& e : errs) {
        if (!e.empty()) {
          py::gil_scoped_acquire acquire;
          throw std::runtime_error(e);
        }
      }
      if (k >= warmup) seconds.push_back(dt);
    }
  }
  std::vector<double> sorted = seconds;
  std::sort(sorted.begin(), sorted.end());
  py::dict res;
  res["seconds"] = sorted[sorted.size() / 2];  // median per call
  res["all_seconds"] = seconds;
  res["launches_per_rank"] = 1;
  res["blocks_per_rank"] = d.exec->program().max_blocks;
  res["threads_per_block"] = d.exec->threads_per_block();
  return res;
}

}  // namespace
}  // namespace jax_blink

PYBIND11_MODULE(_blink_cuda_testing, m) {
  using namespace jax_blink;
  m.doc() = "jax_blink CUDA executor test harness: N simulated ranks on one GPU, timers";
  m.def("ipc_export_test_buffer", &IpcExportTestBuffer, py::arg("device"), py::arg("nbytes"),
        py::arg("seed"),
        "Test harness: a device buffer of nbytes bytes ((i * 31 + seed) % 256) and an "
        "interprocess event, exported: returns the CUDA IPC record a rank publishes.");
  m.def("ipc_read_peer", &IpcReadPeer, py::arg("device"), py::arg("record"), py::arg("rank"),
        "Test harness: opens the buffer and event of a record another process published and "
        "returns the buffer's bytes.");
  m.def("host_arena", &HostArenaPy,
        "This process's host arena (pid, fd), for host_attach in every process of the test.");
  m.def("host_attach", &HostAttachPy, py::arg("slot"), py::arg("processes"),
        "Maps the arenas of the host's processes ([(pid, fd), ...]; `slot` is this one).");
  m.def("ipc_run_rank", &IpcRunRank, py::arg("schedule"), py::arg("rank"), py::arg("input"),
        py::arg("site"), py::arg("calls") = 1, py::arg("timeout_ms") = 20000,
        py::arg("device") = 0, py::arg("timed") = false,
        "Runs rank `rank` of `schedule` in this process (its only rank) with the stream "
        "executor, its peers in the other attached processes on the same GPU, their buffers "
        "and events opened through CUDA IPC; `calls` collectives, returns the last output "
        "(timed: {'output', 'seconds': wall time per call, the calls back to back and a "
        "final sync; a rank exports its handles once and each call meets its peers anew}).");
  m.def("ipc_close", &IpcClose, "Closes what ipc_read_peer opened and frees what "
        "ipc_export_test_buffer made.");
  m.def("run_schedule", &RunSchedule, py::arg("schedule"), py::arg("inputs"),
        py::arg("direct") = true, py::arg("repeat") = 1, py::arg("device") = 0,
        py::arg("legacy_upload") = false,
        "Runs every rank of `schedule` on one GPU (N simulated ranks, each with its own "
        "streams) over copies of `inputs` (numpy arrays); returns the outputs. "
        "direct=False copies peers' chunks into staging buffers first. legacy_upload "
        "(tests only): upload the inputs on the legacy default stream, unordered with the "
        "executor's streams, as the harness once did (testing/sim_ranks.h).");
  m.def("time_schedule", &TimeSchedule, py::arg("schedule"), py::arg("iters") = 10,
        py::arg("warmup") = 2, py::arg("direct") = true, py::arg("device") = 0,
        "Times back-to-back collective calls (all N ranks on one GPU, a host thread "
        "each): {'seconds': per call, 'api_calls_per_rank', 'enqueue_us_per_rank', "
        "'gate_us_per_rank', 'max_workspace_bytes', 'fused_steps', 'per_rank': [...]}.");
  m.def("run_device", &RunDevice, py::arg("schedule"), py::arg("inputs"), py::kw_only(),
        py::arg("repeat") = 1, py::arg("timeout_ms") = 10000,
        py::arg("skip_ranks") = std::vector<int64_t>{}, py::arg("device") = 0,
        "Runs `schedule` with the device executor (one kernel per rank per call) over N ranks "
        "of one GPU, `repeat` calls on the same flags, skip_ranks missing the first call. "
        "Returns {'outputs': [array], 'errors': per call, per rank None or 'KIND: message', "
        "'blocks_per_rank'}.");
  m.def("time_device", &TimeDevice, py::arg("schedule"), py::arg("iters") = 10,
        py::arg("warmup") = 2, py::arg("device") = 0, py::arg("timeout_ms") = 10000,
        "Times device-executor calls (N ranks of one GPU: every rank's kernel launched, then "
        "every rank's outcome read, as the handler does): {'seconds': median per call, "
        "'all_seconds', 'launches_per_rank', 'blocks_per_rank', 'threads_per_block'}.");
  m.def("time_kernel", &TimeKernel, py::arg("dtype"), py::arg("count"), py::arg("iters") = 20,
        py::arg("from_input") = false, py::arg("copy") = false, py::arg("device") = 0,
        "Seconds per reduction kernel launch (or per D2D copy when copy=True).");
}
