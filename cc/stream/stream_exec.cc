// StreamPlan (the per-rank enqueue order, built once per schedule) and
// StreamRankExecutor (one rank's enqueueing over a StreamTransport). See
// stream_exec.h for the model.
#include "stream/stream_exec.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "core/step_tracker.h"  // shared with the CPU executor
#include "sync/rendezvous.h"     // CpuRelax

namespace jax_blink {

namespace {

using Clock = std::chrono::steady_clock;

// Workspace pieces start at this alignment (vectorised kernel accesses).
constexpr size_t kAlign = 256;
size_t AlignUp(size_t b) { return (b + kAlign - 1) / kAlign * kAlign; }

enum WaitClass : uint32_t {
  kEntry = kOmitEntryWaits,
  kDep = kOmitDepWaits,
  kGuard = kOmitGuards,
  kExit = kOmitExitWaits,
};

// Merged runs of the chunks with (or without) `flag` set inside rank r's
// output (all of the vector, or a reduce_scatter's shard), in offset order.
std::vector<StreamPlan::Span> ChunkSpans(const Schedule& s, int64_t r,
                                         const std::vector<uint8_t>& written,
                                         bool want) {
  const int64_t lo = s.OutputOffset(r), hi = lo + s.out_count;
  std::vector<int64_t> order(s.nchunks);
  for (int64_t c = 0; c < s.nchunks; ++c) order[c] = c;
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return s.chunk_offset[a] < s.chunk_offset[b];
  });
  std::vector<StreamPlan::Span> spans;
  for (int64_t c : order) {
    if ((written[c] != 0) != want || s.chunk_length[c] == 0) continue;
    if (s.chunk_offset[c] < lo || s.chunk_offset[c] + s.chunk_length[c] > hi) continue;
    const int64_t off = s.chunk_offset[c], len = s.chunk_length[c];
    if (!spans.empty() && spans.back().offset + spans.back().length == off) {
      spans.back().length += len;
    } else {
      spans.push_back({off, len});
    }
  }
  return spans;
}

}  // namespace

// ---- StreamPlan ------------------------------------------------------------

std::string StreamPlan::Build(const Schedule& s, uint32_t omit_bits) {
  omit = omit_bits;
  const int64_t n = s.nranks;
  ranks.assign(n, Rank());

  // Fused groups: a RECV_REDUCE and the next RECV_REDUCEs of its chunk
  // (fuse_next) while the only step depending on a partial sum is the next
  // member, so that holding the partial back delays nothing else.
  std::vector<std::vector<int32_t>> next_member(n);
  std::vector<std::vector<uint8_t>> non_head(n);
  for (int64_t r = 0; r < n; ++r) {
    const RankSteps& rs = s.ranks[r];
    const int32_t m = static_cast<int32_t>(rs.steps.size());
    next_member[r].assign(m, -1);
    non_head[r].assign(m, 0);
    for (int32_t i = 0; i < m; ++i) {
      if (rs.steps[i].op != Op::kRecvReduce || non_head[r][i]) continue;
      int32_t cur = i;
      for (int size = 1; size < kMaxFuse; ++size) {
        const Step& st = rs.steps[cur];
        const int32_t nx = st.fuse_next;
        if (nx < 0 || st.succ_end - st.succ_begin != 1 || rs.succs[st.succ_begin] != nx) break;
        next_member[r][cur] = nx;
        non_head[r][nx] = 1;
        cur = nx;
      }
    }
  }

  std::vector<StepTracker> tr(n);
  for (int64_t r = 0; r < n; ++r) tr[r].Reset(s.ranks[r]);
  std::vector<std::vector<int32_t>> item_of(n);
  std::vector<std::vector<uint8_t>> needed(n);  // [owner][item]: some stream waits on it
  for (int64_t r = 0; r < n; ++r) item_of[r].assign(s.ranks[r].steps.size(), -1);
  // Per stream (rank, link; link n = the caller stream): per stream it
  // waited on (owner, link), the latest item waited for; stream order makes
  // the earlier items of that stream implied.
  const int32_t caller = static_cast<int32_t>(n);
  auto key = [n](int64_t owner, int32_t link) { return owner * (n + 1) + link; };
  std::vector<std::vector<std::unordered_map<int64_t, int32_t>>> seen(
      n, std::vector<std::unordered_map<int64_t, int32_t>>(n + 1));

  // During the build a WaitRef's `event` holds the item (-1: the start);
  // events are numbered at the end.
  struct Pending {
    std::vector<StreamPlan::WaitRef>* waits;
    std::map<int32_t, int32_t> gates;  // owner -> progress
  };
  auto add_wait = [&](Pending& pd, int64_t r, int32_t link, int32_t owner, int32_t item,
                      uint32_t cls) {
    if (omit & cls) return;
    const int32_t olink = item < 0 ? caller : ranks[owner].items[item].link;
    if (owner == r && olink == link) return;  // the same stream: ordered
    auto& m = seen[r][link];
    auto it = m.find(key(owner, olink));
    if (it != m.end() && it->second >= item) return;  // implied
    m[key(owner, olink)] = item;
    pd.waits->push_back({owner, item});
    if (item >= 0) needed[owner][item] = 1;
    if (owner != r) {
      int32_t& g = pd.gates[owner];
      g = std::max(g, item < 0 ? 1 : item + 2);
    }
  };
  // Waits for the values that the local dependencies of step i of `owner`
  // produce: the RECVs among them and, through SENDs, their dependencies.
  auto wait_deps = [&](auto&& self, Pending& pd, int64_t r, int32_t link, int32_t owner,
                       int32_t i, const std::vector<int32_t>& group) -> void {
    const RankSteps& rs = s.ranks[owner];
    const Step& st = rs.steps[i];
    for (int32_t k = st.deps_begin; k < st.deps_end; ++k) {
      const int32_t d = rs.deps[k];
      if (rs.steps[d].op == Op::kSend) {
        self(self, pd, r, link, owner, d, group);
      } else if (!(owner == r && std::find(group.begin(), group.end(), d) != group.end())) {
        add_wait(pd, r, link, owner, item_of[owner][d], kDep);
      }
    }
  };
  auto finish_gates = [](Pending& pd, std::vector<Gate>* gates) {
    for (const auto& [owner, progress] : pd.gates) gates->push_back({owner, progress});
  };

  std::vector<int32_t> group;
  auto try_step = [&](int64_t r, int32_t i) -> bool {
    const RankSteps& rs = s.ranks[r];
    const Step& st = rs.steps[i];
    if (st.op == Op::kSend) {  // the receiver does the work
      tr[r].MarkDone(i);
      return true;
    }
    if (non_head[r][i]) return false;  // enqueued with its group's head
    group.clear();
    for (int32_t j = i; j >= 0; j = next_member[r][j]) group.push_back(j);
    // Ready when every member's value and guards are (host order: the
    // events it waits on are recorded first).
    for (int32_t m : group) {
      const Step& sm = rs.steps[m];
      if (m != i && !tr[r].DepsDoneExcept(m, group.data(), static_cast<int>(group.size()))) {
        return false;
      }
      if (!sm.src_input && !tr[sm.peer].Done(sm.match)) return false;
      for (int32_t k = sm.guards_begin; k < sm.guards_end; ++k) {
        const Step& g = rs.steps[rs.guards[k]];
        if (!g.src_input && !tr[g.peer].Done(g.match)) return false;
      }
    }
    Rank& R = ranks[r];
    Item item;
    item.op = st.op;
    item.link = st.peer;
    item.chunk = st.chunk;
    item.base_input = st.first_write;
    item.src_begin = static_cast<int32_t>(R.srcs.size());
    for (int32_t m : group) R.srcs.push_back({rs.steps[m].peer, rs.steps[m].src_input});
    item.src_end = static_cast<int32_t>(R.srcs.size());
    const int32_t k = static_cast<int32_t>(R.items.size());
    R.items.push_back(item);  // (its link is read by add_wait for later items)
    Pending pd{&R.waits, {}};
    const int32_t wait_begin = static_cast<int32_t>(R.waits.size());
    add_wait(pd, r, st.peer, static_cast<int32_t>(r), -1, kEntry);
    for (int32_t m : group) {
      const Step& sm = rs.steps[m];
      // The peer's published pointers are read after its start, whatever
      // waits the plan keeps (or omits).
      pd.gates[sm.peer] = std::max(pd.gates[sm.peer], 1);
      add_wait(pd, r, st.peer, sm.peer, -1, kEntry);
      wait_deps(wait_deps, pd, r, st.peer, static_cast<int32_t>(r), m, group);
      if (!sm.src_input) wait_deps(wait_deps, pd, r, st.peer, sm.peer, sm.match, group);
      for (int32_t g = sm.guards_begin; g < sm.guards_end; ++g) {
        const Step& gs = rs.steps[rs.guards[g]];
        if (gs.src_input) continue;  // its receiver read our input, not the acc
        add_wait(pd, r, st.peer, gs.peer, item_of[gs.peer][gs.match], kGuard);
      }
    }
    Item& it = R.items[k];
    it.wait_begin = wait_begin;
    it.wait_end = static_cast<int32_t>(R.waits.size());
    it.gate_begin = static_cast<int32_t>(R.gates.size());
    finish_gates(pd, &R.gates);
    it.gate_end = static_cast<int32_t>(R.gates.size());
    needed[r].push_back(0);
    for (int32_t m : group) {
      item_of[r][m] = k;
      tr[r].MarkDone(m);
    }
    R.fused_steps += static_cast<int64_t>(group.size()) - 1;
    return true;
  };

  for (;;) {
    bool all = true, progress = false;
    for (int64_t r = 0; r < n; ++r) {
      if (tr[r].AllDone()) continue;
      progress |= tr[r].Sweep([&](int32_t i) { return try_step(r, i); });
      all &= tr[r].AllDone();
    }
    if (all) break;
    if (!progress) {
      std::ostringstream os;
      os << "jax_blink stream executor: the schedule's steps cannot be ordered "
            "(cross-rank dependency cycle);";
      for (int64_t r = 0; r < n; ++r) {
        os << " rank " << r << ": " << tr[r].NumDone() << "/" << tr[r].NumSteps();
      }
      return os.str();
    }
  }

  // Exit: each caller stream waits for the last item of every stream that
  // touches its rank's memory (its own link streams write the accumulator
  // and read the input; peers' link streams read them).
  std::vector<std::map<std::pair<int32_t, int32_t>, int32_t>> last_touch(n);
  for (int64_t q = 0; q < n; ++q) {
    const Rank& Q = ranks[q];
    for (int32_t k = 0; k < static_cast<int32_t>(Q.items.size()); ++k) {
      const Item& x = Q.items[k];
      last_touch[q][{static_cast<int32_t>(q), x.link}] = k;
      for (int32_t j = x.src_begin; j < x.src_end; ++j) {
        last_touch[Q.srcs[j].peer][{static_cast<int32_t>(q), x.link}] = k;
      }
    }
  }
  for (int64_t r = 0; r < n; ++r) {
    Rank& R = ranks[r];
    Pending pd{&R.exit_waits, {}};
    for (const auto& [stream, k] : last_touch[r]) {
      add_wait(pd, r, caller, stream.first, k, kExit);
    }
    finish_gates(pd, &R.exit_gates);
    std::vector<uint8_t> links(n, 0);
    for (const Item& x : R.items) links[x.link] = 1;
    for (int64_t p = 0; p < n; ++p) {
      if (links[p]) R.links.push_back(static_cast<int32_t>(p));
    }
    R.written = ChunkSpans(s, r, s.ranks[r].chunk_written, true);
    R.unwritten = ChunkSpans(s, r, s.ranks[r].chunk_written, false);
  }

  // Number the events that some stream waits on; resolve the waits.
  for (int64_t r = 0; r < n; ++r) {
    Rank& R = ranks[r];
    R.nevents = 2;
    for (size_t k = 0; k < R.items.size(); ++k) {
      if (needed[r][k]) R.items[k].event = R.nevents++;
    }
  }
  for (int64_t r = 0; r < n; ++r) {
    for (auto* waits : {&ranks[r].waits, &ranks[r].exit_waits}) {
      for (WaitRef& w : *waits) {
        w.event = w.event < 0 ? kStartEvent : ranks[w.owner].items[w.event].event;
      }
    }
  }
  return std::string();
}

// ---- StreamRankExecutor ----------------------------------------------------

namespace {

// Bytes a RECV of `src` needs in staging when its link is staged: kernels
// read staged copies (reductions, and the float32 conversion of an input);
// a plain copy goes straight across devices.
size_t StagedBytes(const Schedule& s, const StreamPlan::Item& item,
                   const StreamPlan::Src& src) {
  const size_t len = static_cast<size_t>(s.chunk_length[item.chunk]);
  if (item.op == Op::kRecvReduce) return len * (src.input ? DTypeSize(s.dtype) : AccSize(s.dtype));
  if (src.input && HasScratchAcc(s.dtype)) return len * DTypeSize(s.dtype);
  return 0;
}

}  // namespace

StreamRankExecutor::StreamRankExecutor(StreamTransport* transport) : tp_(transport) {}

StreamRankExecutor::~StreamRankExecutor() { Release(); }

void StreamRankExecutor::Release() {
  for (StreamId st : link_) {
    if (st >= 0) tp_->DestroyStream(st);
  }
  for (EventId e : view_.events) tp_->DestroyEvent(e);
  link_.clear();
  view_.events.clear();
  plan_ = nullptr;
  rank_ = -1;
  last_caller_ = -1;
}

std::string StreamRankExecutor::Prepare(const StreamPlan& plan, int64_t rank, int device) {
  if (plan_ == &plan && rank_ == rank && view_.device == device) return std::string();
  Release();
  const StreamPlan::Rank& P = plan.ranks[rank];
  std::string err;
  link_.assign(plan.ranks.size(), -1);
  for (int32_t p : P.links) {
    if (!(err = tp_->CreateStream(device, &link_[p])).empty()) return err;
  }
  view_.events.reserve(P.nevents);
  for (int32_t k = 0; k < P.nevents; ++k) {
    EventId e;
    if (!(err = tp_->CreateEvent(device, &e)).empty()) return err;
    view_.events.push_back(e);
  }
  plan_ = &plan;
  rank_ = rank;
  view_.device = device;
  return std::string();
}

size_t StreamRankExecutor::WorkspaceBytes(const Schedule& s, const StreamPlan& plan,
                                          int64_t rank, const std::vector<uint8_t>& staged,
                                          bool alias) {
  const size_t count = static_cast<size_t>(s.count);
  size_t bytes = 0;
  if (HasScratchAcc(s.dtype) || s.out_count != s.count) bytes += AlignUp(count * AccSize(s.dtype));
  if (alias) bytes += AlignUp(static_cast<size_t>(s.in_count) * DTypeSize(s.dtype));
  const StreamPlan::Rank& P = plan.ranks[rank];
  for (const StreamPlan::Item& item : P.items) {
    for (int32_t j = item.src_begin; j < item.src_end; ++j) {
      if (staged[P.srcs[j].peer]) bytes += AlignUp(StagedBytes(s, item, P.srcs[j]));
    }
  }
  return bytes;
}

void StreamRankExecutor::PeerBuffers(const Schedule& s, const StreamRank& me, void* workspace,
                                     const void** in, void** acc) {
  // The workspace starts with the separate accumulator, then the input's
  // snapshot (WorkspaceBytes' order).
  char* ws = static_cast<char*>(workspace);
  const bool separate_acc = HasScratchAcc(s.dtype) || s.out_count != s.count;
  const bool alias = s.count > 0 && me.in == me.out;
  *acc = separate_acc ? ws : me.out;
  const size_t acc_bytes =
      separate_acc ? AlignUp(static_cast<size_t>(s.count) * AccSize(s.dtype)) : 0;
  *in = alias ? ws + acc_bytes : me.in;
}

Status StreamRankExecutor::Enqueue(const Schedule& s, const StreamPlan& plan, int64_t rank,
                                   const StreamRank& me, void* workspace,
                                   const std::vector<StreamPeer>& peers,
                                   const std::vector<uint8_t>& staged,
                                   Clock::time_point deadline,
                                   const std::atomic<uint32_t>* failed,
                                   StreamPublish publish) {
  const auto t0 = Clock::now();
  stats_ = StreamExecStats();
  const int64_t n = s.nranks;
  if (static_cast<int64_t>(peers.size()) != n || static_cast<int64_t>(staged.size()) != n ||
      static_cast<int64_t>(plan.ranks.size()) != n || rank < 0 || rank >= n) {
    return Status::Internal(
        "jax_blink stream executor: the plan, peers and staging flags do not match the "
        "schedule's " + std::to_string(n) + " ranks");
  }
  if (me.stream < 0 || (s.count > 0 && (!me.in || !me.out))) {
    return Status::Internal("jax_blink stream executor: rank " + std::to_string(rank) +
                            " has no stream or no buffers");
  }
  std::string err = Prepare(plan, rank, me.device);
  if (!err.empty()) return Status::Internal(err);
  const StreamPlan::Rank& P = plan.ranks[rank];
  const size_t tsize = DTypeSize(s.dtype);
  const size_t asize = AccSize(s.dtype);
  const size_t count = static_cast<size_t>(s.count);
  const bool scratch = HasScratchAcc(s.dtype);
  // The accumulator is the output unless it must be float32 or the output
  // is a reduce_scatter's shard (in WorkspaceBytes' order).
  const bool separate_acc = scratch || s.out_count != s.count;
  const bool alias = s.count > 0 && me.in == me.out;
  const int64_t in_lo = s.InputOffset(rank), out_lo = s.OutputOffset(rank);
  for (int64_t p = 0; p < n; ++p) stats_.staged_links += p != rank && staged[p];

  // Workspace, in the order WorkspaceBytes counts it.
  char* ws = static_cast<char*>(workspace);
  size_t used = 0;
  auto carve = [&](size_t bytes) {
    char* p = ws + used;
    used += AlignUp(bytes);
    return p;
  };
  const void* peer_in = nullptr;
  void* peer_acc = nullptr;
  PeerBuffers(s, me, workspace, &peer_in, &peer_acc);
  char* acc = static_cast<char*>(peer_acc);
  const char* in = static_cast<const char*>(peer_in);
  const size_t in_bytes = static_cast<size_t>(s.in_count) * tsize;
  if (separate_acc) carve(count * asize);
  if (alias) carve(in_bytes);
  char* out = static_cast<char*>(me.out);
  const int dev = me.device;

  auto wait = [&](StreamId st, const StreamPlan::WaitRef& w) {
    ++stats_.waits;
    return tp_->Wait(st, peers[w.owner].view->events[w.event]);
  };
  auto record = [&](int32_t event, StreamId st) {
    ++stats_.records;
    return tp_->Record(view_.events[event], st);
  };
  auto copy = [&](StreamId st, void* dst, int dst_dev, const void* src, int src_dev,
                  size_t bytes) {
    ++stats_.copies;
    return tp_->Copy(st, dst, dst_dev, src, src_dev, bytes);
  };
  // Spins until each gated peer has enqueued far enough (see stream_exec.h).
  auto await = [&](const std::vector<StreamPlan::Gate>& gates, int32_t b,
                   int32_t e) -> Status {
    for (int32_t k = b; k < e; ++k) {
      const StreamPlan::Gate& g = gates[k];
      const StreamPeer& p = peers[g.owner];
      const uint64_t target = p.base + static_cast<uint64_t>(g.progress);
      const std::atomic<uint64_t>& progress = p.progress ? *p.progress : p.view->progress;
      if (progress.load(std::memory_order_acquire) >= target) continue;
      const auto w0 = Clock::now();
      for (uint32_t spin = 1;; ++spin) {
        if (progress.load(std::memory_order_acquire) >= target) break;
        if (spin < 128) {
          CpuRelax();
        } else {
          std::this_thread::yield();
        }
        if ((spin & 127) == 0) {
          if (failed != nullptr && failed->load(std::memory_order_acquire) != 0) {
            return Status::Internal("a peer failed");
          }
          if (Clock::now() >= deadline) {
            return Status::DeadlineExceeded(
                "jax_blink stream executor: timed out waiting for rank " +
                std::to_string(g.owner) + " to enqueue its part of the collective");
          }
        }
      }
      stats_.gate_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                            Clock::now() - w0).count();
    }
    return Status();
  };
  // A transport call's error is Internal; a gate's is its own.
#define JB_TRY(call)                                           \
  do {                                                         \
    if (!(err = (call)).empty()) return Status::Internal(err); \
  } while (0)
#define JB_AWAIT(...)                       \
  do {                                      \
    Status waited = await(__VA_ARGS__);     \
    if (!waited.ok()) return waited;        \
  } while (0)

  // Entry, on the caller stream: order after the previous call if it used
  // another stream, snapshot an aliased input, copy the chunks that no RECV
  // writes, mark the inputs ready, and publish.
  const uint64_t base = peers[rank].base;
  auto advance = [&](uint64_t progress) {
    view_.progress.store(base + progress, std::memory_order_release);
    if (publish.at != nullptr) {
      publish.at->store(publish.base + progress, std::memory_order_release);
    }
  };
  if (last_caller_ >= 0 && last_caller_ != me.stream) {
    ++stats_.waits;
    JB_TRY(tp_->Wait(me.stream, view_.events[StreamPlan::kDoneEvent]));
  }
  if (alias) {
    JB_TRY(copy(me.stream, const_cast<char*>(in), dev, me.in, dev, in_bytes));
  } else {
    // (an allgather's unwritten chunks are its own shard: its input)
    for (const StreamPlan::Span& sp : P.unwritten) {
      JB_TRY(copy(me.stream, out + (sp.offset - out_lo) * tsize, dev,
                  static_cast<const char*>(me.in) + (sp.offset - in_lo) * tsize, dev,
                  sp.length * tsize));
    }
  }
  JB_TRY(record(StreamPlan::kStartEvent, me.stream));
  view_.in = in;
  view_.acc = acc;
  advance(1);

  StreamOperand ops[kMaxFuse + 1];
  for (int32_t k = 0; k < static_cast<int32_t>(P.items.size()); ++k) {
    const StreamPlan::Item& item = P.items[k];
    JB_AWAIT(P.gates, item.gate_begin, item.gate_end);
    const StreamId st = link_[item.link];
    for (int32_t w = item.wait_begin; w < item.wait_end; ++w) JB_TRY(wait(st, P.waits[w]));
    const int64_t off = s.chunk_offset[item.chunk];
    const int64_t len = s.chunk_length[item.chunk];
    char* dst = acc + off * asize;
    // The sources as the kernel reads them: the peer's memory, or a staged
    // copy of it next to this rank.
    int nops = 0;
    if (item.op == Op::kRecvReduce) {
      ops[nops++] = item.base_input ? StreamOperand{in + (off - in_lo) * tsize, true}
                                    : StreamOperand{dst, false};
    }
    for (int32_t j = item.src_begin; j < item.src_end; ++j) {
      const StreamPlan::Src& src = P.srcs[j];
      const StreamPeerView& v = *peers[src.peer].view;
      const size_t size = src.input ? tsize : asize;
      const char* p = src.input ? static_cast<const char*>(v.in) +
                                      (off - s.InputOffset(src.peer)) * size
                                : static_cast<const char*>(v.acc) + off * size;
      const size_t sb = staged[src.peer] ? StagedBytes(s, item, src) : 0;
      if (sb > 0) {
        char* stg = carve(sb);
        if (len > 0) JB_TRY(copy(st, stg, dev, p, v.device, sb));
        p = stg;
      }
      ops[nops++] = {p, src.input};
    }
    if (len > 0) {
      if (item.op == Op::kRecvReduce) {
        ++stats_.kernels;
        JB_TRY(tp_->Reduce(st, s.dtype, s.op, dst, ops, nops, len));
      } else if (ops[0].is_input && scratch) {  // T -> float32
        ++stats_.kernels;
        JB_TRY(tp_->ToAcc(st, s.dtype, dst, ops[0].p, len));
      } else {  // a plain copy, across devices if need be
        JB_TRY(copy(st, dst, dev, ops[0].p, peers[P.srcs[item.src_begin].peer].view->device,
                    len * asize));
      }
    }
    if (item.event >= 0) JB_TRY(record(item.event, st));
    advance(static_cast<uint64_t>(k) + 2);
  }

  // Exit, on the caller stream: wait for every stream that touches this
  // rank's memory, then write the output from a separate accumulator (its
  // float32 values rounded, or a reduce_scatter's shard copied).
  JB_AWAIT(P.exit_gates, 0, static_cast<int32_t>(P.exit_gates.size()));
  for (const StreamPlan::WaitRef& w : P.exit_waits) JB_TRY(wait(me.stream, w));
  if (separate_acc) {
    for (const StreamPlan::Span& sp : P.written) {
      ++stats_.kernels;
      JB_TRY(tp_->Finalize(me.stream, s.dtype, out + (sp.offset - out_lo) * tsize,
                           acc + sp.offset * asize, sp.length));
    }
  }
  JB_TRY(record(StreamPlan::kDoneEvent, me.stream));
  last_caller_ = me.stream;
#undef JB_TRY
#undef JB_AWAIT
  stats_.workspace_bytes = static_cast<int64_t>(used);
  stats_.enqueue_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
  return Status();
}

}  // namespace jax_blink
