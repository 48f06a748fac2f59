// StreamExecutor: the event-ordered enqueueing of a decoded schedule over a
// StreamTransport. See stream_exec.h for the model.
#include "stream_exec.h"

#include <algorithm>
#include <sstream>

#include "executor.h"  // StepTracker (shared with the CPU executor)

namespace jax_blink {

struct StreamExecutor::Impl {
  explicit Impl(StreamTransport* t) : tp(t) {}
  ~Impl() { Release(); }

  // Per-rank resources, reused across calls.
  struct Rank {
    int device = -1;
    std::vector<StreamId> link;  // [peer]: this rank's RECVs from peer
    std::vector<EventId> tail;   // [peer]: end of link[peer]'s work
    std::vector<EventId> step_ev;
    std::vector<int32_t> ev_stream;  // [step]: peer of the link that recorded it
    EventId start = -1;  // on the caller's stream: inputs are ready
    EventId done = -1;   // on the caller's stream: the call is over
    void* scratch = nullptr;  // float32 accumulator (f16/bf16)
    size_t scratch_bytes = 0;
    std::vector<void*> stage;  // [peer]: staging of RECVs from peer
    std::vector<size_t> stage_bytes;
    void* snap = nullptr;  // copy of the input when out aliases in
    size_t snap_bytes = 0;
  };

  StreamTransport* tp;
  std::vector<Rank> ranks;

  void Release() {
    for (Rank& r : ranks) {
      for (StreamId s : r.link) if (s >= 0) tp->DestroyStream(s);
      for (EventId e : r.tail) if (e >= 0) tp->DestroyEvent(e);
      for (EventId e : r.step_ev) tp->DestroyEvent(e);
      if (r.start >= 0) tp->DestroyEvent(r.start);
      if (r.done >= 0) tp->DestroyEvent(r.done);
      if (r.scratch) tp->Free(r.device, r.scratch);
      for (void* p : r.stage) if (p) tp->Free(r.device, p);
      if (r.snap) tp->Free(r.device, r.snap);
    }
    ranks.clear();
  }

  // Grows *p to at least `need` bytes on `device`.
  std::string Reserve(int device, size_t need, void** p, size_t* have) {
    if (*have >= need) return std::string();
    if (*p) tp->Free(device, *p);
    *p = nullptr;
    *have = 0;
    std::string err = tp->Alloc(device, need, p);
    if (err.empty()) *have = need;
    return err;
  }

  // Streams, events and buffers for the ranks of `s` on the callers' devices.
  std::string Prepare(const Schedule& s, const std::vector<StreamRank>& b,
                      const std::vector<uint8_t>& staged_from, bool alias) {
    const int64_t n = s.nranks;
    bool same = static_cast<int64_t>(ranks.size()) == n;
    for (int64_t r = 0; same && r < n; ++r) same = ranks[r].device == b[r].device;
    std::string err;
    if (!same) {
      Release();
      ranks.resize(n);
      for (int64_t r = 0; r < n; ++r) {
        Rank& R = ranks[r];
        R.device = b[r].device;
        R.link.assign(n, -1);
        R.tail.assign(n, -1);
        R.stage.assign(n, nullptr);
        R.stage_bytes.assign(n, 0);
        if (!(err = tp->CreateEvent(R.device, &R.start)).empty()) return err;
        if (!(err = tp->CreateEvent(R.device, &R.done)).empty()) return err;
        for (int64_t p = 0; p < n; ++p) {
          if (p == r) continue;
          if (!(err = tp->CreateStream(R.device, &R.link[p])).empty()) return err;
          if (!(err = tp->CreateEvent(R.device, &R.tail[p])).empty()) return err;
        }
      }
    }
    const size_t tsize = DTypeSize(s.dtype);
    const size_t asize = AccSize(s.dtype);
    for (int64_t r = 0; r < n; ++r) {
      Rank& R = ranks[r];
      const size_t nsteps = s.ranks[r].steps.size();
      while (R.step_ev.size() < nsteps) {
        EventId ev;
        if (!(err = tp->CreateEvent(R.device, &ev)).empty()) return err;
        R.step_ev.push_back(ev);
      }
      R.ev_stream.assign(nsteps, -1);
      const size_t count = static_cast<size_t>(s.count);
      if (HasScratchAcc(s.dtype)) {
        err = Reserve(R.device, count * asize, &R.scratch, &R.scratch_bytes);
        if (!err.empty()) return err;
      }
      if (alias) {
        err = Reserve(R.device, count * tsize, &R.snap, &R.snap_bytes);
        if (!err.empty()) return err;
      }
      // One staging area per staged link, indexed like the buffers (chunks
      // never overlap, and a link's copies are ordered by its stream).
      for (int64_t p = 0; p < n; ++p) {
        if (p == r || !staged_from[r * n + p]) continue;
        err = Reserve(R.device, count * std::max(tsize, asize), &R.stage[p],
                      &R.stage_bytes[p]);
        if (!err.empty()) return err;
      }
    }
    return std::string();
  }
};

StreamExecutor::StreamExecutor(StreamTransport* transport)
    : impl_(new Impl(transport)) {}
StreamExecutor::~StreamExecutor() = default;

std::string StreamExecutor::Enqueue(const Schedule& s,
                                    const std::vector<StreamRank>& bufs,
                                    const StreamExecOptions& opts) {
  stats_ = StreamExecStats();
  StreamTransport& tp = *impl_->tp;
  const int64_t n = s.nranks;
  if (static_cast<int64_t>(bufs.size()) != n) {
    return "jax_blink stream executor: the schedule has " + std::to_string(n) +
           " ranks but " + std::to_string(bufs.size()) + " were given";
  }
  bool alias = false;
  for (int64_t r = 0; r < n; ++r) {
    if (bufs[r].stream < 0 || (s.count > 0 && (!bufs[r].in || !bufs[r].out))) {
      return "jax_blink stream executor: rank " + std::to_string(r) +
             " has no stream or no buffers";
    }
    alias |= s.count > 0 && bufs[r].in == bufs[r].out;
  }
  // Per link (receiver r, sender p): read directly or through staging.
  std::vector<uint8_t> staged(n * n, 0);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t p = 0; p < n; ++p) {
      if (p == r) continue;
      const bool direct = opts.direct && tp.PeerReadable(bufs[r].device, bufs[p].device);
      staged[r * n + p] = !direct;
      stats_.staged_links += !direct;
    }
  }
  std::string err = impl_->Prepare(s, bufs, staged, alias);
  if (!err.empty()) return err;
  auto& R = impl_->ranks;
  const size_t tsize = DTypeSize(s.dtype);
  const size_t asize = AccSize(s.dtype);
  const bool scratch_acc = HasScratchAcc(s.dtype);
  auto acc_of = [&](int64_t r) -> char* {
    return static_cast<char*>(scratch_acc ? R[r].scratch : bufs[r].out);
  };
  // The input as peers read it: a snapshot when the output aliases it.
  auto in_of = [&](int64_t r) -> const char* {
    return static_cast<const char*>(bufs[r].in == bufs[r].out ? R[r].snap : bufs[r].in);
  };
  auto wait = [&](StreamId st, EventId ev) {
    ++stats_.waits;
    return tp.Wait(st, ev);
  };
  auto record = [&](EventId ev, StreamId st) {
    ++stats_.records;
    return tp.Record(ev, st);
  };
#define JB_TRY(call)                    \
  do {                                  \
    if (!(err = (call)).empty()) return err; \
  } while (0)

  // Entry. The caller's stream first waits for the end of the previous call
  // on this executor (which may have used another caller stream), takes the
  // input snapshot if needed, and marks the inputs ready; each link stream
  // starts once its receiver's and its sender's inputs are ready.
  for (int64_t r = 0; r < n; ++r) {
    JB_TRY(wait(bufs[r].stream, R[r].done));
    if (bufs[r].in == bufs[r].out && s.count > 0) {
      ++stats_.copies;
      JB_TRY(tp.Copy(bufs[r].stream, R[r].snap, R[r].device, bufs[r].in, R[r].device,
                     s.count * tsize));
    }
    JB_TRY(record(R[r].start, bufs[r].stream));
  }
  if (!(opts.omit & kOmitEntryWaits)) {
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t p = 0; p < n; ++p) {
        if (p == r) continue;
        JB_TRY(wait(R[r].link[p], R[r].start));
        JB_TRY(wait(R[r].link[p], R[p].start));
      }
    }
  }

  // Makes `stream` (link `link_peer` of rank `rr`) wait for the value that
  // the local dependencies of step i of rank `owner` produce: the events of
  // the RECVs among them and, through SENDs (which do no work), the
  // dependencies of those.
  auto wait_deps = [&](auto&& self, StreamId stream, int64_t rr, int64_t link_peer,
                       int64_t owner, int32_t i) -> std::string {
    const RankSteps& rs = s.ranks[owner];
    const Step& st = rs.steps[i];
    for (int32_t k = st.deps_begin; k < st.deps_end; ++k) {
      const int32_t d = rs.deps[k];
      std::string e;
      if (rs.steps[d].op == Op::kSend) {
        e = self(self, stream, rr, link_peer, owner, d);
      } else if (!(owner == rr && R[owner].ev_stream[d] == link_peer)) {
        e = wait(stream, R[owner].step_ev[d]);  // else: same stream, ordered
      }
      if (!e.empty()) return e;
    }
    return std::string();
  };

  std::vector<StepTracker> tr(n);
  for (int64_t r = 0; r < n; ++r) tr[r].Reset(s.ranks[r]);

  auto run_step = [&](int64_t r, int32_t i) -> bool {
    const RankSteps& rs = s.ranks[r];
    const Step& st = rs.steps[i];
    if (st.op == Op::kSend) {  // the receiver does the work
      tr[r].MarkDone(i);
      return true;
    }
    const int64_t p = st.peer;
    // Host-side order: every event this step waits on is recorded already.
    if (!st.src_input && !tr[p].Done(st.match)) return false;
    for (int32_t k = st.guards_begin; k < st.guards_end; ++k) {
      const Step& g = rs.steps[rs.guards[k]];
      if (!g.src_input && !tr[g.peer].Done(g.match)) return false;
    }
    const StreamId stream = R[r].link[p];
    std::string e;
    if (!(opts.omit & kOmitDepWaits)) {
      e = wait_deps(wait_deps, stream, r, p, r, i);
      if (e.empty() && !st.src_input) e = wait_deps(wait_deps, stream, r, p, p, st.match);
    }
    if (!(opts.omit & kOmitGuards)) {
      for (int32_t k = st.guards_begin; k < st.guards_end && e.empty(); ++k) {
        const Step& g = rs.steps[rs.guards[k]];
        if (g.src_input) continue;  // its receiver read our input, not the acc
        e = wait(stream, R[g.peer].step_ev[g.match]);
      }
    }
    const int64_t off = s.chunk_offset[st.chunk];
    const int64_t len = s.chunk_length[st.chunk];
    const size_t src_size = st.src_input ? tsize : asize;
    const char* src = st.src_input ? in_of(p) + off * tsize : acc_of(p) + off * asize;
    char* dst = acc_of(r) + off * asize;
    const int dev_r = R[r].device, dev_p = R[p].device;
    // Staged: bring the peer's chunk next to the receiver before a kernel
    // reads it (a plain RECV_COPY is one copy across devices either way).
    if (e.empty() && staged[r * n + p] && len > 0 &&
        (st.op == Op::kRecvReduce || (st.src_input && scratch_acc))) {
      char* stg = static_cast<char*>(R[r].stage[p]) + off * src_size;
      ++stats_.copies;
      e = tp.Copy(stream, stg, dev_r, src, dev_p, len * src_size);
      src = stg;
    }
    if (e.empty() && len > 0) {
      if (st.op == Op::kRecvCopy) {
        if (st.src_input && scratch_acc) {  // T -> float32
          ++stats_.kernels;
          e = tp.ToAcc(stream, s.dtype, dst, src, len);
        } else {  // a plain copy, across devices if need be
          ++stats_.copies;
          e = tp.Copy(stream, dst, dev_r, src, dev_p, len * asize);
        }
      } else {  // RECV_REDUCE
        const void* base = st.first_write
                               ? static_cast<const void*>(in_of(r) + off * tsize)
                               : static_cast<const void*>(dst);
        ++stats_.kernels;
        e = tp.Reduce(stream, s.dtype, dst, base, st.first_write, src, st.src_input, len);
      }
    }
    if (e.empty()) e = record(R[r].step_ev[i], stream);
    if (!e.empty()) {
      err = e;
      return false;
    }
    R[r].ev_stream[i] = static_cast<int32_t>(p);
    tr[r].MarkDone(i);
    return true;
  };

  // Host-side topological enqueueing: sweep every rank's ready steps until
  // all are enqueued. Nothing here waits on the device.
  for (;;) {
    bool all = true, progress = false;
    for (int64_t r = 0; r < n; ++r) {
      if (tr[r].AllDone()) continue;
      progress |= tr[r].Sweep([&](int32_t i) { return run_step(r, i); });
      if (!err.empty()) return err;
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

  // Exit: each link stream's tail; then every caller stream waits for its
  // own link streams (they write its accumulator) and for its peers' link
  // streams that read its memory, so the caller cannot reuse the input or
  // output before every peer has read it.
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t p = 0; p < n; ++p) {
      if (p != r) JB_TRY(record(R[r].tail[p], R[r].link[p]));
    }
  }
  for (int64_t r = 0; r < n; ++r) {
    const StreamId main = bufs[r].stream;
    if (!(opts.omit & kOmitExitWaits)) {
      for (int64_t p = 0; p < n; ++p) {
        if (p == r) continue;
        JB_TRY(wait(main, R[r].tail[p]));
        JB_TRY(wait(main, R[p].tail[r]));
      }
    }
    // Output: written chunks from the accumulator (rounded once for
    // f16/bf16); unwritten chunks are the input (already in place when the
    // output aliases it).
    const RankSteps& rs = s.ranks[r];
    char* out = static_cast<char*>(bufs[r].out);
    const bool aliased = bufs[r].in == bufs[r].out;
    for (int64_t c = 0; c < s.nchunks; ++c) {
      const int64_t off = s.chunk_offset[c];
      const int64_t len = s.chunk_length[c];
      if (len == 0) continue;
      if (rs.chunk_written[c]) {
        if (scratch_acc) {
          ++stats_.kernels;
          JB_TRY(tp.Finalize(main, s.dtype, out + off * tsize, acc_of(r) + off * asize, len));
        }
      } else if (!aliased) {
        ++stats_.copies;
        JB_TRY(tp.Copy(main, out + off * tsize, R[r].device,
                       static_cast<const char*>(bufs[r].in) + off * tsize, R[r].device,
                       len * tsize));
      }
    }
    JB_TRY(record(R[r].done, main));
  }
#undef JB_TRY
  return std::string();
}

}  // namespace jax_blink
