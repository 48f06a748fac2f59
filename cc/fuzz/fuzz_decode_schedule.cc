// libFuzzer target of the schedule decoder (DecodeSchedule, core/schedule.h):
// the input's bytes are read as little-endian int64 words (a trailing
// partial word is dropped), decoded and validated. Built with
// -DJAX_BLINK_FUZZ=ON under clang's -fsanitize=fuzzer,address,undefined
// (docs/building.md, "Fuzzing and sanitizers"); the seed corpus is real
// encoded schedules (tools/fuzz_schedules.py --write-corpus DIR).
//
// Besides crashes, leaks and undefined behaviour, the target checks what the
// executors rely on in an accepted schedule (every index the decoder
// precomputed is in range and consistent), and that decoding is
// deterministic. A custom mutator changes whole words (small values,
// neighbours, the limits, copied and deleted steps) as well as bytes, so the
// fuzzer gets past the header into the steps and the proof.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/schedule.h"

namespace jax_blink {
namespace {

void Require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_decode_schedule: broken invariant: %s\n", what);
    std::abort();  // libFuzzer reports the crash and saves the input
  }
}

// The invariants of an accepted schedule that executors index with.
void CheckDecoded(const Schedule& s) {
  Require(s.nranks >= 1 && s.nranks <= kMaxRanks, "nranks");
  Require(s.nchunks >= 1 && s.nchunks <= s.count, "nchunks");
  Require(static_cast<int64_t>(s.ranks.size()) == s.nranks, "ranks");
  Require(static_cast<int64_t>(s.step_base.size()) == s.nranks + 1, "step_base");
  int64_t off = 0;
  for (int64_t c = 0; c < s.nchunks; ++c) {
    Require(s.chunk_offset[c] == off && s.chunk_length[c] >= 1, "chunk table");
    off += s.chunk_length[c];
  }
  Require(off == s.count, "chunks cover count");
  Require(static_cast<int>(s.op) >= 0 && static_cast<int>(s.op) < kNumReduceOps, "op");
  const bool gather = s.collective == Collective::kAllGather;
  const bool scatter = s.collective == Collective::kReduceScatter;
  Require(s.in_count == (gather ? s.count / s.nranks : s.count) &&
              s.out_count == (scatter ? s.count / s.nranks : s.count) &&
              (!(gather || scatter) || s.count % s.nranks == 0),
          "in_count and out_count");
  int64_t total = 0;
  for (int64_t r = 0; r < s.nranks; ++r) {
    const RankSteps& rs = s.ranks[r];
    const int32_t n = static_cast<int32_t>(rs.steps.size());
    Require(s.step_base[r] == total, "step_base value");
    total += n;
    Require(static_cast<int64_t>(rs.chunk_written.size()) == s.nchunks, "chunk_written");
    for (int32_t i = 0; i < n; ++i) {
      const Step& st = rs.steps[i];
      Require(st.chunk >= 0 && st.chunk < s.nchunks, "chunk");
      Require(st.peer >= 0 && st.peer < s.nranks && st.peer != r, "peer");
      Require(st.tree >= 0 && st.tree < s.ntrees, "tree");
      const RankSteps& ps = s.ranks[st.peer];
      Require(st.match >= 0 && st.match < static_cast<int32_t>(ps.steps.size()), "match");
      const Step& m = ps.steps[st.match];
      Require(m.peer == r && m.chunk == st.chunk && m.match == i, "match is mutual");
      Require((st.op == Op::kSend) != (m.op == Op::kSend), "SEND matches RECV");
      // Executors read a value sent from the input (and the base of a first
      // RECV_REDUCE) from the rank's input buffer: the chunk must be in it.
      const int64_t lo = s.InputOffset(r);
      const bool in_input = s.chunk_offset[st.chunk] >= lo &&
                            s.chunk_offset[st.chunk] + s.chunk_length[st.chunk] <= lo + s.in_count;
      if (st.op == Op::kSend && st.src_input) Require(in_input, "sent input lies in the input");
      if (st.op == Op::kRecvReduce && st.first_write) Require(in_input, "reduced input lies in the input");
      Require(0 <= st.deps_begin && st.deps_begin <= st.deps_end &&
                  st.deps_end <= static_cast<int32_t>(rs.deps.size()),
              "deps range");
      for (int32_t k = st.deps_begin; k < st.deps_end; ++k) {
        Require(rs.deps[k] >= 0 && rs.deps[k] < i, "dep points backwards");
      }
      Require(0 <= st.succ_begin && st.succ_begin <= st.succ_end &&
                  st.succ_end <= static_cast<int32_t>(rs.succs.size()),
              "succs range");
      for (int32_t k = st.succ_begin; k < st.succ_end; ++k) {
        Require(rs.succs[k] > i && rs.succs[k] < n, "succ points forwards");
      }
      if (st.op != Op::kSend) {
        Require(0 <= st.guards_begin && st.guards_begin <= st.guards_end &&
                    st.guards_end <= static_cast<int32_t>(rs.guards.size()),
                "guards range");
        for (int32_t k = st.guards_begin; k < st.guards_end; ++k) {
          const int32_t g = rs.guards[k];
          Require(g >= 0 && g < i && rs.steps[g].op == Op::kSend &&
                      rs.steps[g].chunk == st.chunk,
                  "guard is an earlier SEND of the chunk");
        }
        Require(st.fuse_next == -1 ||
                    (st.fuse_next > i && st.fuse_next < n &&
                     rs.steps[st.fuse_next].op == Op::kRecvReduce &&
                     rs.steps[st.fuse_next].chunk == st.chunk),
                "fuse_next");
        Require(st.nsends_after >= 0, "nsends_after");
      }
    }
  }
  Require(total == s.total_steps && s.step_base[s.nranks] == total, "total_steps");
}

}  // namespace
}  // namespace jax_blink

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace jax_blink;
  std::vector<int64_t> words(size / 8);
  if (!words.empty()) std::memcpy(words.data(), data, words.size() * 8);
  Schedule s;
  const std::string err = DecodeSchedule(words.data(), words.size(), &s);
  if (err.empty()) {
    CheckDecoded(s);
    Schedule again;
    Require(DecodeSchedule(words.data(), words.size(), &again).empty(), "deterministic");
    Require(again.fingerprint == s.fingerprint, "fingerprint");
  } else {
    Require(err.rfind("invalid jax_blink schedule: ", 0) == 0, "error prefix");
  }
  return 0;
}

// ---- Word-level mutations --------------------------------------------------

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace {

constexpr int64_t kInteresting[] = {
    0, 1, -1, 2, 3, 63, 64, 65, int64_t{1} << 31, (int64_t{1} << 31) - 1,
    int64_t{1} << 32, int64_t{1} << 62, INT64_MAX, INT64_MIN,
    jax_blink::kMaxRanks, jax_blink::kMaxRanks + 1, jax_blink::kMaxCount,
    jax_blink::kMaxCount + 1, jax_blink::kMaxChunks, jax_blink::kMaxChunks + 1,
    jax_blink::kMaxProofWords, jax_blink::kMaxProofWords + 1};

}  // namespace

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size,
                                          unsigned int seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + size;
  auto next = [&x](uint64_t n) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return n == 0 ? 0 : x % n;
  };
  const size_t nwords = size / 8;
  if (nwords == 0 || next(4) == 0) return LLVMFuzzerMutate(data, size, max_size);
  std::vector<int64_t> w(nwords);
  std::memcpy(w.data(), data, nwords * 8);
  const size_t i = next(nwords);
  switch (next(6)) {
    case 0:  // a small value (op codes, ranks, chunks, dependency indices)
      w[i] = static_cast<int64_t>(next(70)) - 2;
      break;
    case 1:  // a neighbour (wrapping, without signed overflow)
      w[i] = static_cast<int64_t>(static_cast<uint64_t>(w[i]) + next(7) - 3);
      break;
    case 2:  // an extreme value or a limit
      w[i] = kInteresting[next(sizeof(kInteresting) / sizeof(kInteresting[0]))];
      break;
    case 3: {  // copy a run of words (a step and its deps) elsewhere
      const size_t len = 1 + next(8);
      if (i + len <= nwords && (nwords + len) * 8 <= max_size) {
        const size_t at = next(nwords + 1);
        std::vector<int64_t> run(w.begin() + i, w.begin() + i + len);
        w.insert(w.begin() + at, run.begin(), run.end());
      }
      break;
    }
    case 4: {  // delete a run of words
      const size_t len = 1 + next(8);
      w.erase(w.begin() + i, w.begin() + std::min(nwords, i + len));
      break;
    }
    default:  // swap two words
      std::swap(w[i], w[next(nwords)]);
      break;
  }
  const size_t out = std::min(w.size() * 8, max_size / 8 * 8);
  std::memcpy(data, w.data(), out);
  return out;
}
