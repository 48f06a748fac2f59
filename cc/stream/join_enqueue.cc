// The stream executors' meeting; see join_enqueue.h.
#include "stream/join_enqueue.h"

#include <utility>
#include <vector>

#include "sync/join.h"

namespace jax_blink {

RankInfo StreamRankInfo(const Schedule& s, int32_t dtype, const void* in, void* out,
                        int64_t in_count, int64_t out_count, int device, void* stream,
                        Status error) {
  RankInfo info;
  info.in = in;
  info.out = out;
  info.acc = out;
  info.count = in_count;
  info.dtype = dtype;
  info.nranks = s.nranks;
  info.total_steps = 1;  // the slot needs no per-step flags
  info.fingerprint = s.fingerprint;
  info.device = device;
  info.stream = stream;
  info.error = error.ok() ? CheckBuffers(s, dtype, in_count, out_count, in, out)
                          : std::move(error);
  return info;
}

Status JoinAndEnqueue(const RendezvousKey& key, const Schedule& s, const StreamPlan& plan,
                      int64_t rank, RankInfo info, StreamId stream, bool direct,
                      StreamTransport& tp, StreamRankExecutor& ex,
                      const WorkspaceFn& workspace, Clock::time_point deadline,
                      int64_t timeout_ms, int64_t* generation) {
  const StreamRank me{info.device, info.in, info.out, stream};
  info.stream_view = &ex.view();
  info.stream_base = ex.next_base();
  Rendezvous& rv = Rendezvous::Global();
  Ticket ticket;
  Status err = rv.Join(key, rank, s.nranks, std::move(info), deadline, timeout_ms, &ticket);
  *generation = ticket.generation;
  if (err.ok()) {
    Slot& slot = *ticket.slot;
    const std::string where = CallSiteText(key.op_id, key.group, ticket.generation);
    err = CheckConsistent(slot, where);  // the same verdict on every rank
    if (err.ok()) {
      const int64_t n = s.nranks;
      std::vector<StreamPeer> peers(n);
      std::vector<uint8_t> staged(n, 0);
      for (int64_t q = 0; q < n; ++q) {
        const RankInfo& ri = slot.info[q];
        peers[q] = {static_cast<const StreamPeerView*>(ri.stream_view), ri.stream_base};
        staged[q] = q != rank && (!direct || !tp.PeerReadable(me.device, ri.device));
      }
      const size_t bytes = StreamRankExecutor::WorkspaceBytes(
          s, plan, rank, staged, s.count > 0 && me.in == me.out);
      void* ws = nullptr;
      if (bytes > 0) {
        std::string e = workspace(bytes, &ws);
        if (!e.empty()) err = Status::Internal(std::move(e));
      }
      if (err.ok()) {
        err = ex.Enqueue(s, plan, rank, me, ws, peers, staged, deadline, &slot.failed());
      }
      if (!err.ok()) slot.Fail(rank, err.Prefixed("jax_blink: " + where + ": "));
      // All or nothing: every rank waits until all have enqueued (or
      // failed), then returns the first failure if there was one.
      // Ranks finish enqueueing close together: spin and yield (100 us)
      // before sleeping, so the barrier costs no wake-up latency.
      const Status all =
          slot.Finish(deadline + std::chrono::milliseconds(timeout_ms) + std::chrono::seconds(1),
                      /*spin=*/256, /*yield_ns=*/100000);
      if (!all.ok()) err = all;
    }
  }
  if (ticket.slot != nullptr) rv.Leave(&ticket);
  return err;
}

}  // namespace jax_blink
