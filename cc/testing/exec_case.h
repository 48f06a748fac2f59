// A case file of the sanitizer drivers (cc/testing/device_exec_driver.cc,
// cc/testing/cpu_exec_driver.cc), as .ci/device_exec_cases.py writes it: int64
// words
//   [nwords, nranks, in_bytes, out_bytes, check_mask, skip_rank, fault_rank,
//    fault_publishes, timeout_ms, repeat, max_blocks]
// then the schedule's words, every rank's input (in_bytes each) and every
// rank's expected output (out_bytes each; the CPU executor's, checked
// against numpy by the case writer).
#ifndef JAX_BLINK_CC_TESTING_EXEC_CASE_H_
#define JAX_BLINK_CC_TESTING_EXEC_CASE_H_

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/schedule.h"

namespace jax_blink {

struct ExecCase {
  Schedule schedule;
  int64_t nranks = 0, in_bytes = 0, out_bytes = 0;
  int64_t check_mask = 0;  // ranks whose output is checked
  int64_t skip_rank = -1;  // never starts in the first call
  int64_t fault_rank = -1, fault_publishes = 0;  // stops in mid-call (device executor)
  int64_t timeout_ms = 0, repeat = 1, max_blocks = 0;
  std::vector<std::vector<char>> in, want;
};

// Reads `path` into *c; "" or what is wrong with the file.
inline std::string ReadExecCase(const char* path, ExecCase* c) {
  std::ifstream f(path, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  constexpr size_t kHeader = 11;
  if (bytes.size() < kHeader * 8) return "too short";
  int64_t h[kHeader];
  std::memcpy(h, bytes.data(), sizeof(h));
  const int64_t nwords = h[0];
  c->nranks = h[1];
  c->in_bytes = h[2];
  c->out_bytes = h[3];
  c->check_mask = h[4];
  c->skip_rank = h[5];
  c->fault_rank = h[6];
  c->fault_publishes = h[7];
  c->timeout_ms = h[8];
  c->repeat = h[9];
  c->max_blocks = h[10];
  const size_t need = (kHeader + nwords) * 8 + c->nranks * (c->in_bytes + c->out_bytes);
  if (bytes.size() != need) {
    return std::to_string(bytes.size()) + " bytes, header says " + std::to_string(need);
  }
  const char* p = bytes.data() + kHeader * 8;
  std::vector<int64_t> words(nwords);
  std::memcpy(words.data(), p, nwords * 8);
  p += nwords * 8;
  const std::string err = DecodeSchedule(words.data(), words.size(), &c->schedule);
  if (!err.empty()) return err;
  c->in.assign(c->nranks, {});
  c->want.assign(c->nranks, {});
  for (auto* v : {&c->in, &c->want}) {
    const int64_t n = v == &c->in ? c->in_bytes : c->out_bytes;
    for (int64_t r = 0; r < c->nranks; ++r) {
      (*v)[r].assign(p, p + n);
      p += n;
    }
  }
  return "";
}

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_TESTING_EXEC_CASE_H_
