// The device executor's host build as a plain program, for ThreadSanitizer
// (.ci/sanitizers builds it with -fsanitize=thread: CMake option
// JAX_BLINK_TSAN). It runs the cases .ci/device_exec_cases.py wrote
// (testing/exec_case.h) and checks, bitwise, the outputs of the ranks in the
// case's check_mask after each of `repeat` calls on one executor; a case with
// a skipped or stopped rank must fail with DEADLINE_EXCEEDED on every started
// rank in its first call (with the case's timeout) and succeed in the next
// (with at least 20 s). Exit status 0 when every case passes.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/schedule.h"
#include "testing/device_host.h"
#include "testing/exec_case.h"

namespace {

using jax_blink::DeviceHostExecutor;
using jax_blink::DeviceHostFault;
using jax_blink::HostDeviceMemory;
using jax_blink::ErrorKind;
using jax_blink::Schedule;
using jax_blink::Status;

bool RunCase(const char* path) {
  jax_blink::ExecCase c;
  const std::string err = jax_blink::ReadExecCase(path, &c);
  if (!err.empty()) {
    std::fprintf(stderr, "%s: %s\n", path, err.c_str());
    return false;
  }
  const Schedule& s = c.schedule;
  const int64_t nranks = c.nranks, out_bytes = c.out_bytes;
  const int64_t check_mask = c.check_mask, skip_rank = c.skip_rank, fault_rank = c.fault_rank;
  const int64_t fault_publishes = c.fault_publishes, timeout_ms = c.timeout_ms, repeat = c.repeat;
  const int64_t max_blocks = c.max_blocks;
  const std::vector<std::vector<char>>& want = c.want;
  std::vector<std::vector<char>> out(nranks);
  std::vector<const void*> in_ptrs(nranks);
  std::vector<void*> out_ptrs(nranks);
  for (int64_t r = 0; r < nranks; ++r) {
    in_ptrs[r] = c.in[r].data();
    out[r].assign(out_bytes, 0x5a);
    out_ptrs[r] = out[r].data();
  }
  // One memory for every case, reusing freed blocks and delaying the setup's
  // writes until it waits for them (device_setup.h), as a GPU would.
  static const auto mem = std::make_shared<HostDeviceMemory>(/*delayed_writes=*/true);
  std::unique_ptr<DeviceHostExecutor> exec;
  const std::string cerr =
      DeviceHostExecutor::Create(s, static_cast<int>(max_blocks), mem, &exec);
  if (!cerr.empty()) {
    std::fprintf(stderr, "%s: %s\n", path, cerr.c_str());
    return false;
  }
  const bool faulty = skip_rank >= 0 || fault_rank >= 0;
  for (int64_t k = 0; k < repeat; ++k) {
    std::vector<uint8_t> skip(nranks, 0);
    DeviceHostFault fault;
    if (k == 0 && faulty) {
      if (skip_rank >= 0) skip[skip_rank] = 1;
      fault.rank = fault_rank;
      fault.publishes = fault_publishes;
    }
    // (the calls after a faulty one get a generous timeout: a loaded machine)
    const int64_t call_timeout_ms =
        k == 0 && faulty ? timeout_ms : std::max<int64_t>(timeout_ms, 20000);
    const std::vector<Status> st = exec->Run(in_ptrs, out_ptrs, call_timeout_ms, skip, fault);
    for (int64_t r = 0; r < nranks; ++r) {
      if (k == 0 && faulty) {
        if (r == skip_rank) continue;
        if (st[r].kind != ErrorKind::kDeadlineExceeded) {
          std::fprintf(stderr, "%s: rank %lld: want DEADLINE_EXCEEDED, got '%s'\n", path,
                       static_cast<long long>(r), st[r].Text().c_str());
          return false;
        }
        continue;
      }
      if (!st[r].ok()) {
        std::fprintf(stderr, "%s: call %lld rank %lld: %s\n", path, static_cast<long long>(k),
                     static_cast<long long>(r), st[r].Text().c_str());
        return false;
      }
      if ((check_mask >> r & 1) && out[r] != want[r]) {
        std::fprintf(stderr, "%s: call %lld rank %lld: output differs from the CPU executor's\n",
                     path, static_cast<long long>(k), static_cast<long long>(r));
        return false;
      }
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CASE_FILE...\n", argv[0]);
    return 2;
  }
  int failed = 0;
  for (int i = 1; i < argc; ++i) failed += !RunCase(argv[i]);
  std::printf("device executor (host build): %d of %d cases passed\n", argc - 1 - failed, argc - 1);
  return failed == 0 ? 0 : 1;
}
