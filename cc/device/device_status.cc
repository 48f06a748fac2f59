// Turns a device call's control words into a Status (device_status.h).
#include "device/device_status.h"

#include "device/device_interp.h"

#include <set>
#include <sstream>
#include <string>

namespace jax_blink {

namespace {

std::string RankList(const std::set<int64_t>& ranks) {
  std::ostringstream os;
  bool first = true;
  for (int64_t r : ranks) {
    os << (first ? "" : ", ") << r;
    first = false;
  }
  return os.str();
}

}  // namespace

Status DeviceRankStatus(const DeviceProgram& p, const uint64_t* control, int64_t rank,
                        uint64_t generation, int64_t timeout_ms, uint64_t executor,
                        const std::string& where) {
  if (control[0] < generation) return Status();
  std::ostringstream head;
  head << "jax_blink: device executor " << executor << ": " << where << " at rank " << rank
       << " failed: ";
  // A program that was not the executor's: the kernels read nothing of it.
  std::ostringstream bad;
  for (int64_t q = 0; q < p.nranks; ++q) {
    for (int64_t l = 0; l < p.ranks[q].nblocks; ++l) {
      const uint64_t* w = control + DeviceBlockWordsAt(p.nranks, p.max_blocks, q, l);
      if (w[2] != generation || (w[3] >> 32) != kDeviceBadProgram) continue;
      bad << (bad.tellp() > 0 ? "; " : "") << "rank " << q << " block " << l
          << " read a program header of executor " << w[4] << " (magic 0x" << std::hex << w[5]
          << std::dec << ")";
    }
  }
  if (bad.tellp() > 0) {
    std::ostringstream os;
    os << head.str() << "its kernels found another program than executor " << executor
       << "'s (magic 0x" << std::hex << kDeviceProgramMagic << std::dec
       << "): the program was not in place when they ran (its upload had not landed, or "
          "the memory still held an earlier executor's); the call wrote no result: "
       << bad.str();
    return Status::Internal(os.str());
  }
  std::set<int64_t> never_started, waited, waiting;
  std::ostringstream records;
  int nrecords = 0;
  for (int64_t q = 0; q < p.nranks; ++q) {
    bool started = false;
    for (int64_t l = 0; l < p.ranks[q].nblocks; ++l) {
      const uint64_t* w = control + DeviceBlockWordsAt(p.nranks, p.max_blocks, q, l);
      started |= w[0] >= generation;
      if (w[2] != generation) continue;
      const bool timed_out = (w[3] >> 32) == kDeviceTimeout;
      const int64_t wr = static_cast<int32_t>(static_cast<uint32_t>(w[3]));
      const int64_t ws = static_cast<int64_t>(w[4]);
      const int64_t own = static_cast<int64_t>(w[5]);
      waiting.insert(q);
      if (wr != q) waited.insert(wr);
      if (!timed_out || nrecords++ >= 8) continue;
      records << "; rank " << q << " block " << l;
      if (own >= 0) {
        records << " step " << own << " waited for rank " << wr << " step " << ws;
      } else if (wr == q) {
        records << " waited for its rank's other blocks to end";
      } else {
        records << " waited for rank " << wr << " to finish";
      }
    }
    if (!started) never_started.insert(q);
  }
  // Waited for, and neither waiting for another rank nor absent: stuck.
  std::set<int64_t> stalled;
  for (int64_t q : waited) {
    if (!waiting.count(q) && !never_started.count(q)) stalled.insert(q);
  }
  std::ostringstream os;
  os << head.str() << "timed out after " << timeout_ms << " ms";
  if (!never_started.empty()) os << "; rank(s) " << RankList(never_started) << " never started";
  if (!stalled.empty()) os << "; rank(s) " << RankList(stalled) << " stopped making progress";
  if (!waited.empty()) os << "; flags never came from rank(s) " << RankList(waited);
  os << records.str();
  if (nrecords > 8) os << "; ... (" << nrecords << " waits timed out)";
  return Status::DeadlineExceeded(os.str());
}

}  // namespace jax_blink
