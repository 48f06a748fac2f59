// Decoding and validation of the flat int64 schedule; see schedule.h and
// docs/schedule_format.md (the authoritative description of the format).
#include "core/schedule.h"

#include "core/validate.h"

namespace jax_blink {

const char* OpName(Op op) {
  switch (op) {
    case Op::kSend:
      return "SEND";
    case Op::kRecvReduce:
      return "RECV_REDUCE";
    case Op::kRecvCopy:
      return "RECV_COPY";
  }
  return "?";
}

const char* CollectiveName(Collective c) {
  switch (c) {
    case Collective::kAllReduce:
      return "allreduce";
    case Collective::kBroadcast:
      return "broadcast";
    case Collective::kReduce:
      return "reduce";
    case Collective::kReduceScatter:
      return "reduce_scatter";
    case Collective::kAllGather:
      return "allgather";
  }
  return "?";
}

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "?";
}

uint64_t FingerprintWords(const int64_t* words, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) {
    uint64_t w = static_cast<uint64_t>(words[i]);
    for (int b = 0; b < 8; ++b) {
      h ^= (w >> (8 * b)) & 0xff;
      h *= 0x100000001b3ull;
    }
  }
  return h;
}

std::string DecodeSchedule(const int64_t* words, size_t n, Schedule* out) {
  *out = Schedule();
  std::string err = DecodeStructure(words, n, out);
  if (err.empty()) err = MatchSendsToRecvs(out);
  GuardWrites guard_writes, inplace_guard_writes;
  if (err.empty()) err = CheckDeterminism(out, &guard_writes, &inplace_guard_writes);
  if (err.empty()) err = SymbolicRun(*out, guard_writes);
  if (!err.empty()) return err;
  out->inplace_ok = InPlaceSafe(*out, inplace_guard_writes);
  out->fingerprint = FingerprintWords(words, n);
  return std::string();
}

}  // namespace jax_blink
