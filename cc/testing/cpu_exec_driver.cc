// The CPU executor as a plain program, for ThreadSanitizer (.ci/sanitizers
// builds it with -fsanitize=thread: CMake option JAX_BLINK_TSAN): one thread
// per rank runs ExecuteCpu over the cases .ci/device_exec_cases.py wrote
// (testing/exec_case.h), through the in-process rendezvous and through the
// host transport (this one process attached as the whole host: its slot
// table, arena, staging and lazy mapping of peers), with early start and
// with the barrier (ExecTunables::barrier). Each call makes some ranks late
// by a few milliseconds; outputs must equal the case's bitwise. Then, per
// case, a rank that publishes an error, late, must fail every rank with one
// INVALID_ARGUMENT; in the cases with a faulty rank, that rank never starts,
// and every other rank must fail with DEADLINE_EXCEEDED naming it; and the
// next call must succeed. Exit status 0 when every case passes.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/schedule.h"
#include "core/status.h"
#include "cpu/executor_cpu.h"
#include "sync/host_rendezvous.h"
#include "testing/exec_case.h"

namespace {

using jax_blink::ErrorKind;
using jax_blink::ExecArgs;
using jax_blink::ExecCase;
using jax_blink::Status;

struct Free {
  void operator()(void* p) const { std::free(p); }
};

// What one call of a case does differently from a punctual one.
struct Call {
  std::vector<int> delay_ms;  // per rank, before it calls
  int64_t skip_rank = -1;     // never calls
  int64_t error_rank = -1;    // publishes a local error
  int64_t timeout_ms = 20000;
};

class Runner {
 public:
  Runner(const ExecCase& c, int32_t transport) : c_(c), transport_(transport) {
    const jax_blink::Schedule& s = c.schedule;
    out_.assign(c.nranks, std::vector<char>(c.out_bytes));
    ws_.resize(c.nranks);
    const int64_t ws = jax_blink::CpuWorkspaceBytes(s, false);
    for (int64_t r = 0; r < c.nranks && ws > 0; ++r) {
      ws_[r].reset(std::aligned_alloc(64, (ws + 63) / 64 * 64));
    }
  }

  // The ranks' statuses (ok for a rank that did not call).
  std::vector<Status> Run(const Call& call) {
    static int64_t run_id = 1;
    const int64_t id = run_id++;
    std::vector<Status> st(c_.nranks);
    std::vector<std::thread> threads;
    for (int64_t r = 0; r < c_.nranks; ++r) {
      if (r == call.skip_rank) {
        // Over the host transport a rank pairs with its peers by the count of
        // its calls of the site: the skipped call still takes its generation.
        if (transport_ == jax_blink::kTransportHost) {
          ExecArgs a = Args(r, id, call);
          (void)jax_blink::ReserveGeneration(&a);
        }
        continue;
      }
      for (char& b : out_[r]) b = 0x5a;
      threads.emplace_back([&, r] {
        ExecArgs a = Args(r, id, call);
        if (r < static_cast<int64_t>(call.delay_ms.size()) && call.delay_ms[r] > 0) {
          std::this_thread::sleep_for(std::chrono::milliseconds(call.delay_ms[r]));
        }
        st[r] = jax_blink::ExecuteCpu(a).status;
      });
    }
    for (std::thread& t : threads) t.join();
    return st;
  }

  bool OutputsRight() const {
    for (int64_t r = 0; r < c_.nranks; ++r) {
      if ((c_.check_mask >> r & 1) && out_[r] != c_.want[r]) return false;
    }
    return true;
  }

 private:
  ExecArgs Args(int64_t r, int64_t run_id, const Call& call) {
    const jax_blink::Schedule& s = c_.schedule;
    ExecArgs a;
    a.schedule = &s;
    a.rank = r;
    a.run_id = run_id;
    a.op_id = 58;
    a.in = c_.in[r].data();
    a.out = out_[r].data();
    a.in_count = s.in_count;
    a.out_count = s.out_count;
    a.workspace = ws_[r].get();
    a.workspace_bytes = ws_[r] ? jax_blink::CpuWorkspaceBytes(s, false) : 0;
    a.dtype = static_cast<int32_t>(s.dtype);
    a.timeout_ms = call.timeout_ms;
    a.transport = transport_;
    if (r == call.error_rank) a.local_error = Status::InvalidArgument("a bad buffer (test)");
    return a;
  }

  const ExecCase& c_;
  const int32_t transport_;
  std::vector<std::vector<char>> out_;
  std::vector<std::unique_ptr<void, Free>> ws_;
};

bool Fail(const char* path, const char* what, const std::string& detail) {
  std::fprintf(stderr, "%s: %s: %s\n", path, what, detail.c_str());
  return false;
}

bool RunCase(const char* path, int32_t transport, bool barrier) {
  ExecCase c;
  const std::string err = jax_blink::ReadExecCase(path, &c);
  if (!err.empty()) return Fail(path, "unreadable", err);
  jax_blink::ExecTunables t = jax_blink::GetExecTunables();
  t.barrier = barrier;
  jax_blink::SetExecTunables(t);
  Runner run(c, transport);
  const int64_t n = c.nranks;
  for (int64_t k = 0; k < std::max<int64_t>(c.repeat, 2); ++k) {
    Call call;
    for (int64_t r = 0; r < n; ++r) call.delay_ms.push_back(static_cast<int>((r * 3 + k) % 4));
    for (const Status& st : run.Run(call)) {
      if (!st.ok()) return Fail(path, "a punctual call failed", st.Text());
    }
    if (!run.OutputsRight()) return Fail(path, "wrong output", "call " + std::to_string(k));
  }
  Call bad;
  bad.error_rank = n - 1;
  bad.delay_ms.assign(n, 0);
  bad.delay_ms[n - 1] = 3;
  const std::vector<Status> failed = run.Run(bad);
  for (const Status& st : failed) {
    if (st.kind != ErrorKind::kInvalidArgument || st.message != failed[0].message) {
      return Fail(path, "a rank's error: want one INVALID_ARGUMENT on every rank", st.Text());
    }
  }
  if (c.skip_rank < 0 && c.fault_rank < 0) return true;  // (the timeouts: the faulty cases only)
  Call missing;
  missing.skip_rank = c.skip_rank >= 0 ? c.skip_rank : c.fault_rank;
  missing.timeout_ms = 300;
  const std::vector<Status> timed_out = run.Run(missing);
  const std::string named = "rank(s) [" + std::to_string(missing.skip_rank) + "] never arrived";
  for (int64_t r = 0; r < n; ++r) {
    if (r == missing.skip_rank) continue;
    const Status& st = timed_out[r];
    if (st.kind != ErrorKind::kDeadlineExceeded || st.message.find(named) == std::string::npos) {
      return Fail(path, "a missing rank: want DEADLINE_EXCEEDED naming it", st.Text());
    }
  }
  for (const Status& st : run.Run(Call())) {
    if (!st.ok()) return Fail(path, "the call after the failures", st.Text());
  }
  if (!run.OutputsRight()) return Fail(path, "wrong output", "after the failures");
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CASE_FILE...\n", argv[0]);
    return 2;
  }
  jax_blink::HostProcess self;
  Status st = jax_blink::HostArena(&self);
  if (st.ok()) st = jax_blink::HostAttach(0, {self});
  if (!st.ok()) {
    std::fprintf(stderr, "host transport: %s\n", st.Text().c_str());
    return 1;
  }
  int failed = 0, runs = 0;
  for (int32_t transport : {jax_blink::kTransportInProcess, jax_blink::kTransportHost}) {
    for (bool barrier : {false, true}) {
      for (int i = 1; i < argc; ++i, ++runs) failed += !RunCase(argv[i], transport, barrier);
    }
  }
  std::printf("CPU executor: %d of %d case runs passed (in-process and host transport, early start and "
              "barrier)\n", runs - failed, runs);
  return failed == 0 ? 0 : 1;
}
