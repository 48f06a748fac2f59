// The phases of DecodeSchedule; see core/validate.h.
#include "core/validate.h"

#include <algorithm>
#include <cstring>
#include <sstream>
#include <tuple>
#include <utility>

namespace jax_blink {

namespace {

template <typename... Args>
std::string Err(Args&&... args) {
  std::ostringstream os;
  os << "invalid jax_blink schedule: ";
  (os << ... << std::forward<Args>(args));
  return os.str();
}

std::string DescribeStep(const Schedule& s, int64_t rank, int64_t idx) {
  const Step& st = s.ranks[rank].steps[idx];
  std::ostringstream os;
  os << "rank " << rank << " step " << idx << " (" << OpName(st.op) << " chunk "
     << st.chunk << (st.op == Op::kSend ? " to" : " from") << " rank "
     << st.peer << ")";
  return os.str();
}

struct MatchKey {
  int32_t sender, receiver, chunk;
  int32_t rank, idx;  // where the step lives
  bool operator<(const MatchKey& o) const {
    return std::tie(sender, receiver, chunk, rank, idx) <
           std::tie(o.sender, o.receiver, o.chunk, o.rank, o.idx);
  }
  bool SameTriple(const MatchKey& o) const {
    return sender == o.sender && receiver == o.receiver && chunk == o.chunk;
  }
};

// Reachability inside one rank's dependency DAG (deps point backwards).
class Reach {
 public:
  explicit Reach(const RankSteps& rs) : rs_(rs), stamp_(rs.steps.size(), 0) {}

  // True when step `a` is a transitive dependency of step `b` (a < b).
  bool operator()(int32_t a, int32_t b) {
    if (a >= b) return false;
    const Step& sb = rs_.steps[b];
    for (int32_t k = sb.deps_begin; k < sb.deps_end; ++k) {
      if (rs_.deps[k] == a) return true;
    }
    ++cur_;
    stack_.clear();
    stack_.push_back(b);
    stamp_[b] = cur_;
    while (!stack_.empty()) {
      int32_t x = stack_.back();
      stack_.pop_back();
      const Step& sx = rs_.steps[x];
      for (int32_t k = sx.deps_begin; k < sx.deps_end; ++k) {
        int32_t d = rs_.deps[k];
        if (d == a) return true;
        if (d > a && stamp_[d] != cur_) {
          stamp_[d] = cur_;
          stack_.push_back(d);
        }
      }
    }
    return false;
  }

 private:
  const RankSteps& rs_;
  std::vector<uint32_t> stamp_;
  std::vector<int32_t> stack_;
  uint32_t cur_ = 0;
};

std::string DescribeSet(const uint64_t* set, int64_t nranks) {
  std::ostringstream os;
  os << "{";
  bool first = true;
  int shown = 0;
  for (int64_t r = 0; r < nranks; ++r) {
    if (set[r / 64] >> (r % 64) & 1) {
      if (shown == 16) {
        os << ", ...";
        break;
      }
      os << (first ? "" : ", ") << r;
      first = false;
      ++shown;
    }
  }
  os << "}";
  return os.str();
}

// Phase 4, first half: an order of all steps (global ids) in which every
// step comes after its dependencies, its matched SEND and the receivers of
// the earlier SENDs of the chunk it overwrites; "" or the deadlock.
std::string ExecutionOrder(const Schedule& s, const GuardWrites& guard_write,
                           std::vector<int64_t>* order) {
  const int64_t total = s.total_steps;
  std::vector<int64_t>& topo = *order;
  topo.clear();
  topo.reserve(total);
  auto gid = [&](int64_t r, int64_t i) { return s.step_base[r] + i; };
  std::vector<int32_t> indeg(total, 0);
  for (int64_t r = 0; r < s.nranks; ++r) {
    const RankSteps& rs = s.ranks[r];
    for (size_t i = 0; i < rs.steps.size(); ++i) {
      const Step& st = rs.steps[i];
      indeg[gid(r, i)] += st.deps_end - st.deps_begin;
      if (st.op != Op::kSend) indeg[gid(r, i)] += 1;
      if (guard_write[r][i] != -1) indeg[gid(r, guard_write[r][i])] += 1;
    }
  }
  // rank_of for popping: decode gid by binary search on step_base.
  auto rank_of = [&](int64_t g) {
    return static_cast<int64_t>(
        std::upper_bound(s.step_base.begin(), s.step_base.end(), g) -
        s.step_base.begin() - 1);
  };
  std::vector<int64_t> stack;
  for (int64_t g = 0; g < total; ++g) {
    if (indeg[g] == 0) stack.push_back(g);
  }
  auto release = [&](int64_t g) {
    if (--indeg[g] == 0) stack.push_back(g);
  };
  while (!stack.empty()) {
    const int64_t g = stack.back();
    stack.pop_back();
    topo.push_back(g);
    const int64_t r = rank_of(g);
    const int64_t i = g - s.step_base[r];
    const RankSteps& rs = s.ranks[r];
    const Step& st = rs.steps[i];
    for (int32_t k = st.succ_begin; k < st.succ_end; ++k) {
      release(gid(r, rs.succs[k]));
    }
    if (st.op == Op::kSend) {
      release(gid(st.peer, st.match));
    } else {
      // This RECV read the peer's SEND; a write guarded by it may proceed.
      const int32_t w = guard_write[st.peer][st.match];
      if (w != -1) release(gid(st.peer, w));
    }
  }
  if (static_cast<int64_t>(topo.size()) != total) {
    std::ostringstream os;
    int shown = 0;
    for (int64_t g = 0; g < total && shown < 4; ++g) {
      if (indeg[g] > 0) {
        const int64_t r = rank_of(g);
        os << (shown ? "; " : "") << DescribeStep(s, r, g - s.step_base[r]);
        ++shown;
      }
    }
    return Err(
        "the steps deadlock (the dependencies, the SEND->RECV "
        "matching and the rule that a sent chunk is not overwritten "
        "before its receiver read it form a cycle); stuck steps "
        "include: ",
        os.str());
  }
  return std::string();
}

}  // namespace

std::string DecodeStructure(const int64_t* words, size_t n, Schedule* out) {
  Schedule& s = *out;
  if (words == nullptr && n > 0) return Err("null data");
  if (n > static_cast<size_t>(kMaxWords)) {
    return Err("the encoding has ", n, " words, more than the limit of ",
               kMaxWords);
  }
  if (n < 2) {
    return Err("array has ", n, " words, the header alone needs ", kHeaderWords);
  }
  if (words[0] != kScheduleMagic) {
    return Err("bad magic ", words[0], " (expected ", kScheduleMagic,
               " = \"BLINK\")");
  }
  const int64_t version = words[1];
  if (version != 1 && version != kScheduleVersion) {
    return Err("unsupported format version ", version,
               " (this build reads versions 1 and ", kScheduleVersion, ")");
  }
  const int64_t header_words = version == 1 ? kHeaderWordsV1 : kHeaderWords;
  if (n < static_cast<size_t>(header_words)) {
    return Err("array has ", n, " words, the version ", version,
               " header alone needs ", header_words);
  }
  // The words limit applies to the version 2 encoding (a version 1 array is
  // 3 words shorter), as the Python validator counts it.
  if (version == 1 && n + (kHeaderWords - kHeaderWordsV1) > static_cast<size_t>(kMaxWords)) {
    return Err("the encoding has ", n + (kHeaderWords - kHeaderWordsV1),
               " words in format version 2, more than the limit of ", kMaxWords);
  }
  s.nranks = words[2];
  s.count = words[3];
  const int64_t collective = words[4];
  s.root = words[5];
  const int64_t dtype = words[6];
  int64_t op = 0, in_count = s.count, out_count = s.count;
  if (version == 1) {
    s.nchunks = words[7];
    s.ntrees = words[8];
  } else {
    op = words[7];
    in_count = words[8];
    out_count = words[9];
    s.nchunks = words[10];
    s.ntrees = words[11];
  }
  if (s.nranks < 1 || s.nranks > kMaxRanks) {
    return Err("nranks = ", s.nranks, " (must be in [1, ", kMaxRanks, "])");
  }
  if (s.count < 1 || s.count > kMaxCount) {
    return Err("count = ", s.count, " (must be in [1, 2^48])");
  }
  if (collective < 0 || collective >= kNumCollectives) {
    return Err("unknown collective code ", collective);
  }
  s.collective = static_cast<Collective>(collective);
  const bool rooted = s.collective == Collective::kBroadcast ||
                      s.collective == Collective::kReduce;
  const bool sharded = s.collective == Collective::kReduceScatter ||
                       s.collective == Collective::kAllGather;
  if (!rooted) {
    if (s.root != -1) {
      return Err(CollectiveName(s.collective), " has no root: needs root = -1, got ",
                 s.root);
    }
  } else if (s.root < 0 || s.root >= s.nranks) {
    return Err(CollectiveName(s.collective), " root = ", s.root,
               " is not a rank in [0, ", s.nranks, ")");
  }
  if (dtype < 0 || dtype >= kNumDTypes)
    return Err("unknown dtype code ", dtype);
  s.dtype = static_cast<DType>(dtype);
  if (op < 0 || op >= kNumReduceOps) return Err("unknown reduce-op code ", op);
  s.op = static_cast<ReduceOp>(op);
  if (s.nchunks < 1 || s.nchunks > s.count || s.nchunks > kMaxChunks) {
    return Err("nchunks = ", s.nchunks, " (must be in [1, min(count = ",
               s.count, ", ", kMaxChunks, ")])");
  }
  if (s.ntrees < 1 || s.ntrees > kMaxTrees) {
    return Err("ntrees = ", s.ntrees, " (must be in [1, ", kMaxTrees, "])");
  }
  // The buffers' sizes follow from the collective (docs/schedule_format.md).
  s.in_count = s.count;
  s.out_count = s.count;
  if (sharded) {
    if (s.count % s.nranks != 0) {
      return Err(CollectiveName(s.collective), " needs count divisible by nranks, got count ",
                 s.count, " and ", s.nranks, " ranks");
    }
    (s.collective == Collective::kAllGather ? s.in_count : s.out_count) = s.count / s.nranks;
  }
  if (in_count != s.in_count) {
    return Err("in_count is ", in_count, ", but a ", CollectiveName(s.collective),
               " of count ", s.count, " over ", s.nranks, " ranks takes ", s.in_count,
               " input elements");
  }
  if (out_count != s.out_count) {
    return Err("out_count is ", out_count, ", but a ", CollectiveName(s.collective),
               " of count ", s.count, " over ", s.nranks, " ranks gives ", s.out_count,
               " output elements");
  }
  size_t pos = static_cast<size_t>(header_words);
  const size_t table_words = 2 * static_cast<size_t>(s.nchunks);
  if (n - pos < table_words + static_cast<size_t>(s.nranks)) {
    return Err("array of ", n,
               " words ends inside the chunk table or the "
               "step counts (",
               s.nchunks, " chunks, ", s.nranks, " ranks)");
  }
  s.chunk_offset.resize(s.nchunks);
  s.chunk_length.resize(s.nchunks);
  int64_t expect = 0;
  for (int64_t c = 0; c < s.nchunks; ++c) {
    const int64_t off = words[pos++];
    const int64_t len = words[pos++];
    if (off != expect) {
      return Err("chunk ", c, " starts at ", off, ", expected ", expect,
                 " (chunks must be contiguous and ascending from 0)");
    }
    if (len < 1 || len > s.count - off) {
      return Err("chunk ", c, " has length ", len, " at offset ", off,
                 " (must be >= 1 and end by count = ", s.count, ")");
    }
    s.chunk_offset[c] = off;
    s.chunk_length[c] = len;
    expect = off + len;
  }
  if (expect != s.count) {
    return Err("chunks cover [0, ", expect, "), not [0, count = ", s.count,
               ")");
  }
  if (sharded) {
    const int64_t shard = s.count / s.nranks;
    for (int64_t c = 0; c < s.nchunks; ++c) {
      const int64_t lo = s.chunk_offset[c], hi = lo + s.chunk_length[c];
      if (lo / shard != (hi - 1) / shard) {
        return Err("chunk ", c, " = [", lo, ", ", hi, ") crosses the boundary of shard ",
                   lo / shard, " (shards of ", shard, " elements); a ",
                   CollectiveName(s.collective), " chunk lies inside one shard");
      }
    }
  }
  std::vector<int64_t> nsteps(s.nranks);
  // Every step takes at least 5 words, so the steps all ranks claim must fit
  // in the words after the step counts.
  const int64_t step_words = static_cast<int64_t>(n - pos) - s.nranks;
  int64_t total = 0;
  for (int64_t r = 0; r < s.nranks; ++r) {
    nsteps[r] = words[pos++];
    if (nsteps[r] < 0 || nsteps[r] > kMaxStepsPerRank) {
      return Err("rank ", r, " has ", nsteps[r], " steps (must be in [0, ",
                 kMaxStepsPerRank, "])");
    }
    total += nsteps[r];
    if (total > step_words / 5) {
      return Err("ranks 0..", r, " claim ", total, " steps but only ",
                 step_words, " words remain for them");
    }
  }
  s.total_steps = total;
  // The later phases' state is at most proof-state-sized: refuse here,
  // before any of it is allocated.
  const int64_t set_words = (s.nranks + 63) / 64;
  const int64_t proof_words = (s.nranks * s.nchunks + total) * set_words;
  if (proof_words > kMaxProofWords) {
    return Err("too large to verify: (nranks * nchunks + steps) * ceil(nranks / 64) = ",
               proof_words, " words of proof state, more than the limit of ",
               kMaxProofWords, " (use fewer ranks, chunks or steps)");
  }
  s.step_base.resize(s.nranks + 1);
  s.ranks.resize(s.nranks);
  for (int64_t r = 0; r < s.nranks; ++r) {
    s.step_base[r] = (r == 0 ? 0 : s.step_base[r - 1] + nsteps[r - 1]);
  }
  s.step_base[s.nranks] = total;

  // ---- Steps -------------------------------------------------------------
  std::vector<int32_t> listed_by;  // per step: the last step listing it as a dep
  for (int64_t r = 0; r < s.nranks; ++r) {
    RankSteps& rs = s.ranks[r];
    rs.steps.resize(nsteps[r]);
    listed_by.assign(nsteps[r], -1);
    for (int64_t i = 0; i < nsteps[r]; ++i) {
      if (n - pos < 5) {
        return Err("array ends inside rank ", r, " step ", i);
      }
      const int64_t op = words[pos];
      const int64_t chunk = words[pos + 1];
      const int64_t peer = words[pos + 2];
      const int64_t tree = words[pos + 3];
      const int64_t ndeps = words[pos + 4];
      pos += 5;
      if (op < 0 || op > 2) {
        return Err("rank ", r, " step ", i, ": unknown op code ", op);
      }
      if (chunk < 0 || chunk >= s.nchunks) {
        return Err("rank ", r, " step ", i, ": chunk ", chunk, " not in [0, ",
                   s.nchunks, ")");
      }
      if (peer < 0 || peer >= s.nranks) {
        return Err("rank ", r, " step ", i, ": peer ", peer, " not in [0, ",
                   s.nranks, ")");
      }
      if (peer == r) {
        return Err("rank ", r, " step ", i, ": peer is the rank itself");
      }
      if (tree < 0 || tree >= s.ntrees) {
        return Err("rank ", r, " step ", i, ": tree ", tree, " not in [0, ",
                   s.ntrees, ")");
      }
      if (ndeps < 0 || ndeps > i) {
        return Err("rank ", r, " step ", i, ": ndeps = ", ndeps,
                   " (deps are distinct earlier steps of the rank, and it has ",
                   i, ")");
      }
      if (static_cast<int64_t>(n - pos) < ndeps) {
        return Err("array ends inside the deps of rank ", r, " step ", i);
      }
      Step& st = rs.steps[i];
      st = Step{};
      st.op = static_cast<Op>(op);
      st.chunk = static_cast<int32_t>(chunk);
      st.peer = static_cast<int32_t>(peer);
      st.tree = static_cast<int32_t>(tree);
      st.match = -1;
      st.fuse_next = -1;
      st.deps_begin = static_cast<int32_t>(rs.deps.size());
      for (int64_t k = 0; k < ndeps; ++k) {
        const int64_t d = words[pos++];
        if (d < 0 || d >= i) {
          return Err("rank ", r, " step ", i, ": dependency ", d,
                     " is not an earlier step of the rank (deps must point "
                     "backwards)");
        }
        if (listed_by[d] == i) {
          return Err("rank ", r, " step ", i, ": dependency ", d,
                     " is listed twice (deps must be distinct)");
        }
        listed_by[d] = static_cast<int32_t>(i);
        rs.deps.push_back(static_cast<int32_t>(d));
      }
      st.deps_end = static_cast<int32_t>(rs.deps.size());
      if (st.op == Op::kSend) rs.sends.push_back(static_cast<int32_t>(i));
    }
  }
  if (pos != n) {
    return Err("array has ", n, " words but the schedule ends at word ", pos,
               " (trailing words)");
  }

  // ---- Successor lists ---------------------------------------------------
  for (int64_t r = 0; r < s.nranks; ++r) {
    RankSteps& rs = s.ranks[r];
    const int32_t ns = static_cast<int32_t>(rs.steps.size());
    std::vector<int32_t> cnt(ns + 1, 0);
    for (int32_t d : rs.deps) ++cnt[d + 1];
    for (int32_t i = 0; i < ns; ++i) cnt[i + 1] += cnt[i];
    rs.succs.assign(rs.deps.size(), 0);
    for (int32_t i = 0; i < ns; ++i) {
      rs.steps[i].succ_begin = cnt[i];
      rs.steps[i].succ_end = cnt[i];
    }
    for (int32_t i = 0; i < ns; ++i) {
      const Step& st = rs.steps[i];
      for (int32_t k = st.deps_begin; k < st.deps_end; ++k) {
        Step& d = rs.steps[rs.deps[k]];
        rs.succs[d.succ_end++] = i;
      }
    }
  }
  return std::string();
}

std::string MatchSendsToRecvs(Schedule* out) {
  Schedule& s = *out;
  std::vector<MatchKey> sends, recvs;
  for (int64_t r = 0; r < s.nranks; ++r) {
    const RankSteps& rs = s.ranks[r];
    for (size_t i = 0; i < rs.steps.size(); ++i) {
      const Step& st = rs.steps[i];
      if (st.op == Op::kSend) {
        sends.push_back({static_cast<int32_t>(r), st.peer, st.chunk,
                         static_cast<int32_t>(r), static_cast<int32_t>(i)});
      } else {
        recvs.push_back({st.peer, static_cast<int32_t>(r), st.chunk,
                         static_cast<int32_t>(r), static_cast<int32_t>(i)});
      }
    }
  }
  // Sorted, the steps of one triple are adjacent and in list order: the
  // k-th SEND of a triple matches its k-th RECV.
  std::sort(sends.begin(), sends.end());
  std::sort(recvs.begin(), recvs.end());
  auto triple_less = [](const MatchKey& a, const MatchKey& b) {
    return std::tie(a.sender, a.receiver, a.chunk) <
           std::tie(b.sender, b.receiver, b.chunk);
  };
  std::vector<Reach> reach;  // per rank, built on first use
  std::vector<int8_t> have_reach(s.nranks, 0);
  reach.reserve(s.nranks);
  std::vector<int32_t> reach_index(s.nranks, -1);
  size_t a = 0, b = 0;
  while (a < sends.size() || b < recvs.size()) {
    if (b == recvs.size() || (a < sends.size() && triple_less(sends[a], recvs[b]))) {
      return Err(DescribeStep(s, sends[a].rank, sends[a].idx),
                 " has no matching RECV at rank ", sends[a].receiver);
    }
    if (a == sends.size() || !sends[a].SameTriple(recvs[b])) {
      return Err(DescribeStep(s, recvs[b].rank, recvs[b].idx),
                 " has no matching SEND at rank ", recvs[b].sender);
    }
    size_t a_end = a, b_end = b;
    while (a_end < sends.size() && sends[a_end].SameTriple(sends[a])) ++a_end;
    while (b_end < recvs.size() && recvs[b_end].SameTriple(recvs[b])) ++b_end;
    if (a_end - a != b_end - b) {
      return Err("chunk ", sends[a].chunk, " is sent ", sends[a].sender, "->",
                 sends[a].receiver, " ", a_end - a, " time(s) but received ",
                 b_end - b, " time(s) (first: ",
                 DescribeStep(s, sends[a].rank, sends[a].idx), ")");
    }
    // Repeated SENDs of a triple are ordered by deps (the RECVs, writes of
    // the chunk, are ordered by the determinism rule).
    for (size_t k = a + 1; k < a_end; ++k) {
      const int32_t r = sends[k].rank;
      if (!have_reach[r]) {
        have_reach[r] = 1;
        reach_index[r] = static_cast<int32_t>(reach.size());
        reach.emplace_back(s.ranks[r]);
      }
      if (!reach[reach_index[r]](sends[k - 1].idx, sends[k].idx)) {
        return Err(DescribeStep(s, r, sends[k].idx), " and ",
                   DescribeStep(s, r, sends[k - 1].idx),
                   " send the same chunk over the same link but are not "
                   "ordered by deps (repeated sends must be)");
      }
    }
    for (; a < a_end; ++a, ++b) {
      Step& snd = s.ranks[sends[a].rank].steps[sends[a].idx];
      Step& rcv = s.ranks[recvs[b].rank].steps[recvs[b].idx];
      snd.match = recvs[b].idx;
      rcv.match = sends[a].idx;
    }
  }
  return std::string();
}

std::string CheckDeterminism(Schedule* out, GuardWrites* guards,
                             GuardWrites* inplace_guards) {
  Schedule& s = *out;
  GuardWrites& guard_write = *guards;
  GuardWrites& inplace_guard_write = *inplace_guards;
  guard_write.assign(s.nranks, {});
  inplace_guard_write.assign(s.nranks, {});
  for (int64_t r = 0; r < s.nranks; ++r) {
    RankSteps& rs = s.ranks[r];
    const int32_t ns = static_cast<int32_t>(rs.steps.size());
    guard_write[r].assign(ns, -1);
    inplace_guard_write[r].assign(ns, -1);
    rs.chunk_written.assign(s.nchunks, 0);
    // Bucket the steps by chunk, keeping list order inside a bucket.
    std::vector<int32_t> start(s.nchunks + 1, 0);
    for (const Step& st : rs.steps) ++start[st.chunk + 1];
    for (int64_t c = 0; c < s.nchunks; ++c) start[c + 1] += start[c];
    std::vector<int32_t> order(ns);
    {
      std::vector<int32_t> fill(start.begin(), start.end() - 1);
      for (int32_t i = 0; i < ns; ++i) order[fill[rs.steps[i].chunk]++] = i;
    }
    Reach reach(rs);
    std::vector<int32_t> pending;
    for (int64_t c = 0; c < s.nchunks; ++c) {
      int32_t prev_write = -1;
      pending.clear();
      for (int32_t k = start[c]; k < start[c + 1]; ++k) {
        const int32_t x = order[k];
        Step& st = rs.steps[x];
        if (st.op == Op::kSend) {
          st.src_input = (prev_write == -1);
          if (prev_write != -1) {
            rs.steps[prev_write].sent_after = true;
            ++rs.steps[prev_write].nsends_after;
          }
          if (prev_write != -1 && !reach(prev_write, x)) {
            return Err(DescribeStep(s, r, x), " and ",
                       DescribeStep(s, r, prev_write),
                       " touch the same chunk but are not ordered by deps");
          }
          pending.push_back(x);
          continue;
        }
        st.first_write = (prev_write == -1);
        if (!pending.empty()) {
          for (int32_t p : pending) {
            if (!reach(p, x)) {
              return Err(DescribeStep(s, r, x), " and ", DescribeStep(s, r, p),
                         " touch the same chunk but are not ordered by deps");
            }
          }
        } else if (prev_write != -1 && !reach(prev_write, x)) {
          return Err(DescribeStep(s, r, x), " and ",
                     DescribeStep(s, r, prev_write),
                     " touch the same chunk but are not ordered by deps");
        }
        st.guards_begin = static_cast<int32_t>(rs.guards.size());
        for (int32_t p : pending) {
          rs.guards.push_back(p);
          if (!rs.steps[p].src_input) guard_write[r][p] = x;
          inplace_guard_write[r][p] = x;
        }
        st.guards_end = static_cast<int32_t>(rs.guards.size());
        if (prev_write != -1) {
          Step& pw = rs.steps[prev_write];
          if (pending.empty() && pw.op == Op::kRecvReduce &&
              st.op == Op::kRecvReduce) {
            pw.fuse_next = x;
          }
        }
        pending.clear();
        prev_write = x;
        rs.chunk_written[c] = 1;
      }
      if (prev_write != -1) rs.steps[prev_write].last_write = true;
    }
  }
  // A RECV reads where the matched SEND says the value lives.
  for (int64_t r = 0; r < s.nranks; ++r) {
    for (Step& st : s.ranks[r].steps) {
      if (st.op != Op::kSend) {
        st.src_input = s.ranks[st.peer].steps[st.match].src_input;
        st.sink = st.op == Op::kRecvCopy && st.succ_begin == st.succ_end;
      } else {
        st.trivially_done = st.src_input && st.deps_begin == st.deps_end;
      }
    }
  }
  return std::string();
}

bool InPlaceSafe(const Schedule& s, const GuardWrites& inplace_guard_write) {
  std::vector<int64_t> topo;
  return ExecutionOrder(s, inplace_guard_write, &topo).empty();
}

std::string SymbolicRun(const Schedule& s, const GuardWrites& guard_write) {
  const int64_t total = s.total_steps;
  std::vector<int64_t> topo;
  std::string err = ExecutionOrder(s, guard_write, &topo);
  if (!err.empty()) return err;
  // DecodeStructure refused a schedule whose state exceeds kMaxProofWords.
  const int64_t set_words = (s.nranks + 63) / 64;
  {
    std::vector<uint64_t> acc(s.nranks * s.nchunks * set_words, 0);
    std::vector<uint64_t> snap(total * set_words, 0);
    auto acc_at = [&](int64_t r, int64_t c) {
      return acc.data() + (r * s.nchunks + c) * set_words;
    };
    // A chunk's set is empty while it is UNDEFINED (an allgather's chunks
    // outside the rank's shard, until a RECV_COPY writes them).
    // (reduce_scatter and allgather only: their count divides by nranks)
    const int64_t shard = std::max<int64_t>(s.count / s.nranks, 1);
    auto shard_of = [&](int64_t c) { return s.chunk_offset[c] / shard; };
    for (int64_t r = 0; r < s.nranks; ++r) {
      for (int64_t c = 0; c < s.nchunks; ++c) {
        if (s.collective == Collective::kAllGather && shard_of(c) != r) continue;
        acc_at(r, c)[r / 64] |= uint64_t{1} << (r % 64);
      }
    }
    auto undefined = [&](const uint64_t* set) {
      for (int64_t w = 0; w < set_words; ++w) {
        if (set[w] != 0) return false;
      }
      return true;
    };
    for (int64_t g : topo) {
      const int64_t r = static_cast<int64_t>(
          std::upper_bound(s.step_base.begin(), s.step_base.end(), g) -
          s.step_base.begin() - 1);
      const int64_t i = g - s.step_base[r];
      const Step& st = s.ranks[r].steps[i];
      uint64_t* a = acc_at(r, st.chunk);
      if (st.op == Op::kSend) {
        if (undefined(a)) {
          return Err(DescribeStep(s, r, i), " sends a chunk that is UNDEFINED at rank ",
                     r, " (nothing wrote it yet)");
        }
        std::memcpy(snap.data() + g * set_words, a, set_words * 8);
        continue;
      }
      const uint64_t* v =
          snap.data() + (s.step_base[st.peer] + st.match) * set_words;
      if (st.op == Op::kRecvCopy) {
        std::memcpy(a, v, set_words * 8);
      } else {
        if (undefined(a)) {
          return Err(DescribeStep(s, r, i), " reduces into a chunk that is UNDEFINED at rank ",
                     r, " (nothing wrote it yet; a RECV_COPY defines it)");
        }
        for (int64_t w = 0; w < set_words; ++w) {
          if (a[w] & v[w]) {
            return Err(DescribeStep(s, r, i), " adds contributions ",
                       DescribeSet(v, s.nranks), " to ",
                       DescribeSet(a, s.nranks),
                       ": some ranks would be counted twice");
          }
        }
        for (int64_t w = 0; w < set_words; ++w) a[w] |= v[w];
      }
    }
    std::vector<uint64_t> full(set_words, 0), one(set_words, 0);
    for (int64_t r = 0; r < s.nranks; ++r)
      full[r / 64] |= uint64_t{1} << (r % 64);
    for (int64_t r = 0; r < s.nranks; ++r) {
      if (s.collective == Collective::kReduce && r != s.root) continue;
      for (int64_t c = 0; c < s.nchunks; ++c) {
        const uint64_t* want = full.data();
        if (s.collective == Collective::kBroadcast || s.collective == Collective::kAllGather) {
          const int64_t owner = s.collective == Collective::kBroadcast ? s.root : shard_of(c);
          std::fill(one.begin(), one.end(), 0);
          one[owner / 64] = uint64_t{1} << (owner % 64);
          want = one.data();
        } else if (s.collective == Collective::kReduceScatter && shard_of(c) != r) {
          continue;
        }
        const uint64_t* a = acc_at(r, c);
        if (!std::equal(a, a + set_words, want)) {
          return Err(CollectiveName(s.collective), ": rank ", r, " ends with ",
                     "chunk ", c, undefined(a) ? " UNDEFINED" : " = contributions of ranks ",
                     undefined(a) ? "" : DescribeSet(a, s.nranks), ", expected ",
                     DescribeSet(want, s.nranks));
        }
      }
    }
  }
  return std::string();
}

}  // namespace jax_blink
