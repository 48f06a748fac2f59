// Decoding and validation of the flat int64 schedule (docs/schedule_format.md).
//
// The schedule is the contract between the Python planner and the executors.
// DecodeSchedule() re-validates everything the executors rely on, in the
// phases of the Python validator (core/validate.h), and returns an error
// message instead of aborting; on success it also precomputes, per step,
// what an executor needs at run time (matching step at the peer, where
// a sent value lives, which sends must be read before a chunk is overwritten,
// which RECV_REDUCEs can be fused, successor lists).
#ifndef JAX_BLINK_CC_CORE_SCHEDULE_H_
#define JAX_BLINK_CC_CORE_SCHEDULE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace jax_blink {

inline constexpr int64_t kScheduleMagic = 0x4B4E494C42;  // "BLINK"
inline constexpr int64_t kScheduleVersion = 2;
inline constexpr int64_t kHeaderWords = 12;
// Version 1 (still read: op = sum, in_count = out_count = count) has no
// op, in_count and out_count words.
inline constexpr int64_t kHeaderWordsV1 = 9;

// The limits of docs/schedule_format.md ("Limits"), the same as the Python
// validator's (jax_blink/schedule/constants.py). DecodeSchedule refuses a
// schedule beyond one before allocating anything sized by it. They keep
// every index in int32 and every product in int64.
inline constexpr int64_t kMaxRanks = int64_t{1} << 16;
inline constexpr int64_t kMaxCount = int64_t{1} << 48;
inline constexpr int64_t kMaxChunks = int64_t{1} << 28;
inline constexpr int64_t kMaxTrees = int64_t{1} << 28;
inline constexpr int64_t kMaxStepsPerRank = int64_t{1} << 28;
// Words of the flat encoding (so a rank's dependency lists index in int32).
inline constexpr int64_t kMaxWords = int64_t{1} << 28;
// Words of the symbolic proof's state, (nranks * nchunks + steps) *
// ceil(nranks / 64): a schedule needing more cannot be proven and is refused.
inline constexpr int64_t kMaxProofWords = int64_t{1} << 24;

enum class Op : uint8_t { kSend = 0, kRecvReduce = 1, kRecvCopy = 2 };
enum class Collective : uint8_t {
  kAllReduce = 0,
  kBroadcast = 1,
  kReduce = 2,
  kReduceScatter = 3,
  kAllGather = 4,
};
inline constexpr int kNumCollectives = 5;
// What RECV_REDUCE computes (core/reduce_op.h defines max and min exactly).
enum class ReduceOp : uint8_t { kSum = 0, kMax = 1, kMin = 2 };
inline constexpr int kNumReduceOps = 3;
const char* OpName(Op op);
const char* CollectiveName(Collective c);
const char* ReduceOpName(ReduceOp op);

// RECV_REDUCEs that executors fuse into one reduction at most (following
// Step::fuse_next), so a fused reduction has at most kMaxFuse + 1 operands.
inline constexpr int kMaxFuse = 8;

struct Step {
  Op op;
  // SEND: the value sent is still the rank's input (no earlier step of this
  // rank wrote the chunk). RECV: the same flag of the matched SEND, i.e.
  // whether to read the peer's input or the peer's accumulator.
  bool src_input;
  // RECV: no earlier step of this rank wrote the chunk, so the base of a
  // RECV_REDUCE is the rank's input, not its accumulator.
  bool first_write;
  // RECV: no later step of this rank writes the chunk.
  bool last_write;
  // RECV: a later SEND of this rank sends the value this step writes (so a
  // peer will read it from the accumulator).
  bool sent_after;
  // RECV: number of SENDs of the chunk after this write and before the
  // chunk's next write at this rank.
  int32_t nsends_after;
  // RECV_COPY with no successor at its rank: completing it (possibly by the
  // sender, see the CPU executor's push) enables nothing else there.
  bool sink;
  // SEND of the input with no dependencies: complete from the start (as a
  // dependency of another step it constrains nothing).
  bool trivially_done;
  int32_t chunk;
  int32_t peer;
  int32_t tree;
  // SEND: index of the matching RECV in the peer's list.
  // RECV: index of the matching SEND in the peer's list.
  int32_t match;
  // Ranges into RankSteps::deps / succs / guards.
  int32_t deps_begin, deps_end;
  int32_t succ_begin, succ_end;
  // RECV: the SENDs of this chunk by this rank since its previous write of
  // the chunk; their receivers must have read the value before this step
  // overwrites the chunk (value semantics).
  int32_t guards_begin, guards_end;
  // RECV_REDUCE: the next RECV_REDUCE of the same chunk when no other step
  // of this rank touches the chunk in between (fusable), else -1.
  int32_t fuse_next;
};

struct RankSteps {
  std::vector<Step> steps;
  std::vector<int32_t> deps;    // flattened dependency lists
  std::vector<int32_t> succs;   // flattened successor lists (inverse of deps)
  std::vector<int32_t> guards;  // flattened guard lists (own SEND indices)
  std::vector<int32_t> sends;   // indices of this rank's SEND steps
  std::vector<uint8_t> chunk_written;  // per chunk: some RECV writes it here
};

struct Schedule {
  int64_t nranks = 0;
  int64_t count = 0;  // elements of the accumulator (the full vector)
  Collective collective = Collective::kAllReduce;
  int64_t root = -1;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  // Elements of each rank's input and output buffers: count, except
  // count / nranks for an allgather's input and a reduce_scatter's output.
  int64_t in_count = 0;
  int64_t out_count = 0;
  int64_t nchunks = 0;
  int64_t ntrees = 0;
  std::vector<int64_t> chunk_offset;
  std::vector<int64_t> chunk_length;
  std::vector<RankSteps> ranks;
  // Index of rank r's first step in a flat array of all steps.
  std::vector<int64_t> step_base;
  int64_t total_steps = 0;
  // Hash of the encoded words; ranks compare it at the rendezvous.
  uint64_t fingerprint = 0;
  // The steps still cannot deadlock when every write of a chunk also waits
  // until the receivers of the earlier SENDs of the chunk's *input* value
  // read it: a rank may then use one buffer as input and accumulator (an
  // output that aliases the input needs no separate accumulator; CPU
  // executor). Set by DecodeSchedule.
  bool inplace_ok = false;

  // Where rank r's input starts in the accumulator's index space (its shard
  // for an allgather, else 0), and its output (its shard for a
  // reduce_scatter, else 0): element i of the input is ACC element
  // InputOffset(r) + i.
  int64_t InputOffset(int64_t r) const {
    return collective == Collective::kAllGather ? r * (count / nranks) : 0;
  }
  int64_t OutputOffset(int64_t r) const {
    return collective == Collective::kReduceScatter ? r * (count / nranks) : 0;
  }
};

// Decodes and validates `n` words. Returns "" on success, else a message
// ("invalid jax_blink schedule: ..."); `out` is only meaningful on success.
std::string DecodeSchedule(const int64_t* words, size_t n, Schedule* out);

// 64-bit FNV-1a over the words (the schedule fingerprint).
uint64_t FingerprintWords(const int64_t* words, size_t n);

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_CORE_SCHEDULE_H_
