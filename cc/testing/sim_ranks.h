// N simulated ranks of one schedule on one device, each on its own host thread
// with its own caller stream, meeting through JoinAndEnqueue as the CUDA FFI
// handler's device threads do (test scaffolding). One harness, two runtimes:
// the CUDA harness (_blink_cuda_testing.run_schedule, time_schedule) runs it
// over CUDA, and _blink_testing.emulate_run_schedule runs the same code over
// the host stream emulator, whose race checker judges the harness's own
// ordering in CI, without a GPU.
//
// The executor's contract (stream/stream_exec.h): a rank's input is written,
// and its output read, in its caller stream's order; the executor's start
// event on that stream is what peers wait for before they read the input.
// So the harness writes each rank's input and poisons its output ON THAT
// RANK'S CALLER STREAM, and reads the outputs only after every stream has
// finished. Writing them with cudaMemcpy / cudaMemset on the legacy default
// stream would order nothing: the executor's streams are non-blocking and a
// pageable cudaMemcpy returns before its DMA lands, so a peer could read part
// of an input before it arrives (under parallel test processes sharing a GPU,
// a peer's contribution went missing from 9% of the elements that way).
// Options::legacy_upload keeps that order, so that tests show the race
// checker flags it and the GPU stress script can show its effect.
//
// `Device` is the runtime (see CudaHarnessDevice in py_blink_cuda_testing.cc,
// EmulatorHarnessDevice in py_blink_testing.cc):
//   Transport& transport();                        // the executors' transport
//   std::string Alloc(size_t bytes, void** p);     // device memory
//   void Free(void* p);
//   std::string CallerStream(int64_t rank, StreamId* s, void** handle);
//   std::string LegacyStream(StreamId* s);         // the legacy default stream
//   std::string Upload(StreamId s, void* dst, const void* host, size_t bytes,
//                      const std::string& what);   // enqueued on s
//   std::string Fill(StreamId s, void* dst, int byte, size_t bytes,
//                    const std::string& what);     // enqueued on s
//   std::string Finish();                          // every stream done
//   std::string Download(void* host, const void* src, size_t bytes);  // after Finish
//   void DestroyCallerStream(StreamId s);
//   std::string EnterThread();                     // on each rank's thread first
// Alloc and the transport are called from several rank threads at once.
#ifndef JAX_BLINK_CC_TESTING_SIM_RANKS_H_
#define JAX_BLINK_CC_TESTING_SIM_RANKS_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/schedule.h"
#include "core/status.h"
#include "stream/join_enqueue.h"
#include "stream/stream_exec.h"
#include "sync/rendezvous.h"

namespace jax_blink {

template <class Device>
class SimRanks {
 public:
  struct Options {
    int device = 0;             // the device label every rank's buffers are on
    bool legacy_upload = false;  // tests only: upload as the harness once did (see above)
  };

  // Builds the plan and every rank's buffers and caller stream. Errors are
  // returned by Init(), never thrown.
  SimRanks(const Schedule& s, Device& dev, Options opt) : s_(s), dev_(dev), opt_(opt) {
    static std::atomic<int64_t> next_run{int64_t{3} << 48};
    run_id_ = next_run.fetch_add(1);
    in_bytes_ = static_cast<size_t>(s.in_count) * DTypeSize(s.dtype);
    out_bytes_ = static_cast<size_t>(s.out_count) * DTypeSize(s.dtype);
  }
  ~SimRanks() {
    dev_.Finish();  // nothing is freed under queued work
    ex_.clear();    // their streams and events, before the caller streams go
    for (StreamId st : streams_) dev_.DestroyCallerStream(st);
    for (void* p : owned_) dev_.Free(p);
  }
  SimRanks(const SimRanks&) = delete;
  SimRanks& operator=(const SimRanks&) = delete;

  std::string Init() {
    std::string e = plan_.Build(s_);
    const int64_t n = s_.nranks;
    ws_.assign(n, nullptr);
    ws_bytes_.assign(n, 0);
    stats_.resize(n);
    for (int64_t r = 0; r < n && e.empty(); ++r) {
      void *in = nullptr, *out = nullptr, *handle = nullptr;
      StreamId st = -1;
      e = Own(in_bytes_, &in);
      if (e.empty()) e = Own(out_bytes_, &out);
      if (e.empty()) e = dev_.CallerStream(r, &st, &handle);
      if (!e.empty()) break;
      in_.push_back(in);
      out_.push_back(out);
      streams_.push_back(st);
      handles_.push_back(handle);
      ex_.push_back(std::make_unique<StreamRankExecutor>(&dev_.transport()));
    }
    if (e.empty() && opt_.legacy_upload) e = dev_.LegacyStream(&legacy_);
    return e;
  }

  // Writes rank r's input from `host` (in_count elements) and poisons its
  // output (0xA5 bytes), on its caller stream (see the file comment).
  std::string Load(int64_t r, const void* host) {
    const StreamId st = opt_.legacy_upload ? legacy_ : streams_[r];
    const std::string rs = "[" + std::to_string(r) + "]";
    std::string e = dev_.Upload(st, in_[r], host, in_bytes_, "harness writes in" + rs);
    if (e.empty()) e = dev_.Fill(st, out_[r], 0xA5, out_bytes_, "harness poisons out" + rs);
    return e;
  }
  // Zeros rank r's input on its caller stream (benchmarks).
  std::string Zero(int64_t r) {
    return dev_.Fill(streams_[r], in_[r], 0, in_bytes_, "harness zeros in[" + std::to_string(r) + "]");
  }

  // `calls` collectives back to back: every rank on its own thread joins and
  // enqueues its part, as XLA's device threads do. Returns "" or the first
  // rank's error.
  std::string Run(int64_t calls, bool direct, int64_t timeout_ms = 60000) {
    const int64_t n = s_.nranks;
    std::vector<std::string> errs(n);
    std::vector<std::thread> threads;
    for (int64_t r = 0; r < n; ++r) {
      threads.emplace_back([this, r, calls, direct, timeout_ms, &errs] {
        const WorkspaceFn workspace = [this, r](size_t b, void** p) -> std::string {
          if (ws_bytes_[r] < b) {  // grows once; the harness, not the executor
            std::string e = Own(b, &ws_[r]);
            if (!e.empty()) return e;
            ws_bytes_[r] = b;
          }
          *p = ws_[r];
          return std::string();
        };
        errs[r] = dev_.EnterThread();
        for (int64_t k = 0; k < calls && errs[r].empty(); ++k) {
          RankInfo info = StreamRankInfo(s_, static_cast<int32_t>(s_.dtype), in_[r], out_[r],
                                         s_.in_count, s_.out_count, opt_.device, handles_[r],
                                         Status());
          int64_t generation = -1;
          errs[r] = JoinAndEnqueue(RendezvousKey{run_id_, 0, 0}, s_, plan_, r, std::move(info),
                                   streams_[r], direct, dev_.transport(), *ex_[r], workspace,
                                   Clock::now() + std::chrono::milliseconds(timeout_ms),
                                   timeout_ms, &generation)
                        .Text();
          stats_[r] = ex_[r]->stats();
        }
      });
    }
    for (std::thread& t : threads) t.join();
    for (const std::string& e : errs) {
      if (!e.empty()) return e;
    }
    return std::string();
  }

  // Every stream finished; then rank r's output into `host` (out_count elements).
  std::string Finish() { return dev_.Finish(); }
  std::string Read(int64_t r, void* host) { return dev_.Download(host, out_[r], out_bytes_); }

  const StreamPlan& plan() const { return plan_; }
  const std::vector<StreamExecStats>& stats() const { return stats_; }
  // Rank r's caller stream as the runtime's handle (CUDA: its cudaStream_t).
  void* handle(int64_t r) const { return handles_[r]; }

 private:
  std::string Own(size_t bytes, void** p) {
    std::string e = dev_.Alloc(bytes, p);
    if (e.empty()) {
      std::lock_guard<std::mutex> lk(mu_);
      owned_.push_back(*p);
    }
    return e;
  }

  const Schedule& s_;
  Device& dev_;
  Options opt_;
  int64_t run_id_ = 0;
  size_t in_bytes_ = 0, out_bytes_ = 0;
  StreamPlan plan_;
  std::mutex mu_;  // guards owned_ (rank threads allocate workspaces)
  std::vector<void*> in_, out_, ws_, owned_;
  std::vector<size_t> ws_bytes_;
  std::vector<StreamId> streams_;
  std::vector<void*> handles_;
  StreamId legacy_ = -1;
  std::vector<std::unique_ptr<StreamRankExecutor>> ex_;
  std::vector<StreamExecStats> stats_;
};

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_TESTING_SIM_RANKS_H_
