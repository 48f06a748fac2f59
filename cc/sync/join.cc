// Checks around the rendezvous; see join.h.
#include "sync/join.h"

#include <algorithm>
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

bool SameRun(const RankInfo& a, const RankInfo& b) {
  return a.count == b.count && a.dtype == b.dtype && a.nranks == b.nranks &&
         a.fingerprint == b.fingerprint;
}

bool SameSegments(const RankInfo& a, const RankInfo& b) {
  return a.nsegs == b.nsegs &&
         (a.nsegs == 0 || std::equal(a.seg_offset, a.seg_offset + a.nsegs + 1, b.seg_offset));
}

}  // namespace

bool Agrees(const RankInfo& mine, const RankInfo& peer) {
  return peer.error.ok() && SameRun(mine, peer) &&
         (mine.process != peer.process || SameSegments(mine, peer));
}

std::string CallSiteText(int64_t op_id, int64_t group, int64_t generation) {
  std::ostringstream os;
  os << "op_id=" << op_id << " group=" << group << " generation=" << generation;
  return os.str();
}

Status CheckBuffers(const Schedule& s, int32_t dtype, int64_t in_count,
                    int64_t out_count, const void* in, const void* out) {
  std::ostringstream os;
  if (dtype != static_cast<int32_t>(s.dtype)) {
    os << "the buffers have dtype "
       << (dtype >= 0 && dtype < kNumDTypes ? DTypeName(static_cast<DType>(dtype))
                                            : "(unsupported)")
       << " but the schedule is for " << DTypeName(s.dtype);
  } else if (in_count != s.in_count || out_count != s.out_count) {
    os << "the buffers have " << in_count << " (input) and " << out_count
       << " (output) elements but the " << CollectiveName(s.collective)
       << " schedule's are " << s.in_count << " and " << s.out_count;
  } else if (in == nullptr || out == nullptr) {
    os << "null buffer";
  } else {
    return Status();
  }
  return Status::InvalidArgument(os.str());
}

Status CheckConsistent(const Slot& slot, const std::string& where) {
  const int64_t n = slot.nranks;
  for (int64_t r = 0; r < n; ++r) {
    if (!slot.info[r].error.ok()) {
      return slot.info[r].error.Prefixed("jax_blink: " + where + ": rank " +
                                         std::to_string(r) + ": ");
    }
  }
  const RankInfo& r0 = slot.info[0];
  for (int64_t r = 1; r < n; ++r) {
    const RankInfo& ri = slot.info[r];
    if (!SameRun(ri, r0)) {
      std::ostringstream os;
      os << "jax_blink: the ranks of " << where << " disagree: rank 0 has "
         << DescribeInfo(r0) << ", rank " << r << " has " << DescribeInfo(ri)
         << " (every rank must run the same schedule on buffers of the same "
            "size and dtype)";
      return Status::InvalidArgument(os.str());
    }
    // Segments: ranks read each other's only within a process (over the host
    // transport, a rank of another process reads the arena's copy, one
    // buffer), so each rank's must match the first rank's of its process.
    int64_t f = 0;
    while (slot.info[f].process != ri.process) ++f;
    const RankInfo& rf = slot.info[f];
    if (!SameSegments(ri, rf)) {
      return Status::InvalidArgument(
          "jax_blink: the ranks of " + where + " disagree on the segments of their vector: rank " +
          std::to_string(f) + " has " + std::to_string(rf.nsegs) + " buffer(s), rank " +
          std::to_string(r) + " has " + std::to_string(ri.nsegs) +
          (ri.nsegs == rf.nsegs ? " (of other sizes)" : "") + " (every rank must pass the same leaves)");
    }
  }
  return Status();
}

}  // namespace jax_blink
