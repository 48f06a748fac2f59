#include "join.h"

#include <cstdlib>
#include <cstring>
#include <sstream>

namespace jax_blink {
namespace {

std::string DescribeInfo(const RankInfo& ri) {
  std::ostringstream os;
  os << "count=" << ri.count << " dtype="
     << (ri.dtype >= 0 && ri.dtype < kNumDTypes
             ? DTypeName(static_cast<DType>(ri.dtype))
             : "unsupported")
     << " nranks=" << ri.nranks << " schedule=0x" << std::hex << ri.fingerprint;
  return os.str();
}

}  // namespace

std::string CallSiteText(int64_t op_id, int64_t group, int64_t generation) {
  std::ostringstream os;
  os << "op_id=" << op_id << " group=" << group << " generation=" << generation;
  return os.str();
}

std::string CheckBuffers(const Schedule& s, int32_t dtype, int64_t in_count,
                         int64_t out_count, const void* in, const void* out) {
  std::ostringstream os;
  if (dtype != static_cast<int32_t>(s.dtype)) {
    os << "the buffers have dtype "
       << (dtype >= 0 && dtype < kNumDTypes ? DTypeName(static_cast<DType>(dtype))
                                            : "(unsupported)")
       << " but the schedule is for " << DTypeName(s.dtype);
  } else if (in_count != s.count || out_count != s.count) {
    os << "the buffers have " << in_count << " (input) and " << out_count
       << " (output) elements but the schedule is for " << s.count;
  } else if (in == nullptr || out == nullptr) {
    os << "null buffer";
  }
  return os.str();
}

std::string CheckConsistent(const Slot& slot, const std::string& where) {
  const int64_t n = slot.nranks;
  for (int64_t r = 0; r < n; ++r) {
    if (!slot.info[r].error.empty()) {
      return "jax_blink: " + where + ": rank " + std::to_string(r) + ": " +
             slot.info[r].error;
    }
  }
  const RankInfo& r0 = slot.info[0];
  for (int64_t r = 1; r < n; ++r) {
    const RankInfo& ri = slot.info[r];
    if (ri.count != r0.count || ri.dtype != r0.dtype || ri.nranks != r0.nranks ||
        ri.fingerprint != r0.fingerprint) {
      std::ostringstream os;
      os << "jax_blink: the ranks of " << where << " disagree: rank 0 has "
         << DescribeInfo(r0) << ", rank " << r << " has " << DescribeInfo(ri)
         << " (every rank must run the same schedule on buffers of the same "
            "size and dtype)";
      return os.str();
    }
  }
  return std::string();
}

RankInfo StreamRankInfo(const Schedule& s, int32_t dtype, const void* in, void* out,
                        int64_t in_count, int64_t out_count, int device, void* stream,
                        std::string error) {
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
  info.error = error.empty() ? CheckBuffers(s, dtype, in_count, out_count, in, out)
                             : std::move(error);
  return info;
}

std::string JoinAndEnqueue(const RendezvousKey& key, const Schedule& s,
                           const StreamPlan& plan, int64_t rank, RankInfo info,
                           StreamId stream, bool direct, StreamTransport& tp,
                           StreamRankExecutor& ex, const WorkspaceFn& workspace,
                           Clock::time_point deadline, int64_t timeout_ms,
                           int64_t* generation) {
  const StreamRank me{info.device, info.in, info.out, stream};
  info.stream_view = &ex.view();
  info.stream_base = ex.next_base();
  Rendezvous& rv = Rendezvous::Global();
  Ticket ticket;
  std::string err = rv.Join(key, rank, s.nranks, std::move(info), deadline, timeout_ms,
                            &ticket);
  *generation = ticket.generation;
  if (err.empty()) {
    Slot& slot = *ticket.slot;
    const std::string where = CallSiteText(key.op_id, key.group, ticket.generation);
    err = CheckConsistent(slot, where);  // the same verdict on every rank
    if (err.empty()) {
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
      if (bytes > 0) err = workspace(bytes, &ws);
      if (err.empty()) {
        err = ex.Enqueue(s, plan, rank, me, ws, peers, staged, deadline, &slot.failed);
      }
      if (!err.empty()) {
        if (slot.failed.load(std::memory_order_seq_cst) == 0) {
          slot.Fail(rank, "jax_blink: " + where + ": " + err);
        }
        err = slot.FailMessage();
      }
    }
  }
  if (ticket.slot != nullptr) rv.Leave(&ticket);
  return err;
}

bool DebugEnabled() {
  static const bool on = [] {
    const char* v = std::getenv("JAX_BLINK_DEBUG");
    return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
  }();
  return on;
}

}  // namespace jax_blink
