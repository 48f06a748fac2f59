// The device executor's program: a decoded schedule turned, once per
// executable, into per-rank lists of steps per block (one kernel launch per
// rank per call; device_interp.h runs a block's list, on the GPU as one
// thread block, on the host as one std::thread).
//
// Partition: a rank's RECVs from one peer form one block (a channel per link
// direction into the rank), so every incoming link has a block pulling from
// it; a SEND (which only publishes a flag) joins the block of the step it
// depends on last, a SEND of the input the rank's first block. Within a
// block the steps run in the order of their level in the schedule's
// deadlock graph (docs/schedule_format.md: dependencies, SEND -> RECV, and
// the RECV of an accumulator value -> the sender's next write of the chunk),
// ties by list order; every wait of a step is on a step of a lower level, so
// the blocks never deadlock however they interleave (a rank's list order
// alone may). A wait on a step of the same block is dropped: order implies it.
//
// Flags: every step of rank r has a 64-bit flag in r's flag array, set to
// the call's generation when the step is done (the RECV of a SEND: when the
// value was read), so generations only grow and nothing is reset between
// calls. A RECV waits for its SEND's flag (the peer's kernel has started, so
// its input is ready), a write of a chunk for the RECVs of the accumulator
// values this rank sent before it (value semantics), and a step for its
// dependencies in other blocks.
#ifndef JAX_BLINK_CC_DEVICE_DEVICE_PROGRAM_H_
#define JAX_BLINK_CC_DEVICE_DEVICE_PROGRAM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "core/hd.h"
#include "core/schedule.h"

namespace jax_blink {

// One step of a block. Offsets are in elements.
struct DeviceInstr {
  int64_t offset;      // the chunk in the accumulator's index space
  int64_t length;      // elements of the chunk
  int64_t in_offset;   // the chunk in this rank's input (a RECV_REDUCE's base)
  int64_t src_offset;  // RECV: the chunk in the peer's input (src_input) or accumulator
  int64_t out_offset;  // write_out: the chunk in this rank's output
  int32_t step;        // index in the rank's list: the flag this step sets
  int32_t peer;        // RECV: the sending rank
  int32_t match;       // RECV: the SEND's index in the peer's list
  int32_t waits_begin, waits_end;  // into DeviceProgram::waits
  uint8_t op;           // Op
  uint8_t src_input;    // RECV: read the peer's input (type T), else its accumulator (A)
  uint8_t first_write;  // RECV_REDUCE: the base is this rank's input, not its accumulator
  uint8_t write_out;    // the chunk's last write: also write the rounded value to the output
};

// Wait until flag `step` of rank `rank` holds the call's generation.
struct DeviceWait {
  int32_t rank;
  int32_t step;
};

// OUT = IN over a chunk this rank never writes (plain bytes of the type).
struct DeviceCopy {
  int64_t in_offset;
  int64_t out_offset;
  int64_t length;
};

struct DeviceBlock {
  int32_t rank;
  int32_t local;                     // index among the rank's blocks
  int32_t instr_begin, instr_end;    // into DeviceProgram::instrs
};

struct DeviceRank {
  int32_t block_begin;  // into DeviceProgram::blocks
  int32_t nblocks;
  int32_t copies_begin, copies_end;  // into DeviceProgram::copies
  int32_t nsteps;                    // flags of this rank
};

// The first 16 bytes of a program's memory (device_setup.h): a kernel checks
// them before it reads anything else of the program, so a program that is
// not in place yet (an upload that has not landed) or is another executor's
// (memory reused after it was freed) gives an error, never sums.
struct DeviceProgramHeader {
  uint64_t magic;
  uint64_t executor;  // DeviceExecutorId() of the executor the program belongs to
};
inline constexpr uint64_t kDeviceProgramMagic = 0x4a42'4c4b'5052'4f47ull;  // "JBLKPROG"

// A new executor's id: unique in the process, never 0.
uint64_t NextDeviceExecutorId();

// A plain view of a program (pointers into host or device memory), what the
// interpreter reads.
struct DeviceProgramView {
  int32_t nranks;
  int32_t max_blocks;  // the most blocks of one rank
  uint8_t dtype;       // DType
  uint8_t op;          // ReduceOp
  uint8_t acc_is_out;  // the accumulator is the output buffer
  const DeviceProgramHeader* header;
  const DeviceRank* ranks;
  const DeviceBlock* blocks;
  const DeviceInstr* instrs;
  const DeviceWait* waits;
  const DeviceCopy* copies;
};

struct DeviceProgram {
  int32_t nranks = 0;
  int32_t max_blocks = 0;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  // The accumulator is the output buffer (same types, out_count == count);
  // else a workspace of count elements of the accumulator type.
  bool acc_is_out = false;
  int64_t count = 0;
  std::vector<DeviceRank> ranks;
  std::vector<DeviceBlock> blocks;
  std::vector<DeviceInstr> instrs;
  std::vector<DeviceWait> waits;
  std::vector<DeviceCopy> copies;

  // Bytes of workspace a rank needs for its accumulator (0: it is the output).
  int64_t WorkspaceBytes() const;
};

// Builds the program of a decoded schedule. max_blocks_per_rank > 0 caps the
// blocks of a rank (peers' RECVs then share blocks); 0: no cap. Returns "" or
// an error message (a schedule whose deadlock graph has a cycle, which
// DecodeSchedule already refuses).
std::string BuildDeviceProgram(const Schedule& s, int max_blocks_per_rank, DeviceProgram* out);

// The call's control words, shared by all its ranks (in memory every rank
// reads and writes: host memory for the host build, device memory for the
// GPU). Every word holds the generation it was last written for, so nothing
// is reset between calls. n ranks, B = max_blocks:
//   [0]                 error: the generation of the last failed call
//   [1 + r]             rank r's blocks are all over (finished)
//   [BlockWords(r, b)]  block b of rank r: started, over, and the record of
//                       the wait it gave up: generation, kind << 32 | waited
//                       rank (kind: timed out, or stopped by the poison),
//                       waited step (-1: the rank's finish), own step (-1:
//                       the finish); or of a program header that was not
//                       the executor's: generation, kind << 32 | r, the
//                       executor and the magic it read
inline constexpr int64_t kDeviceBlockWords = 6;
JAX_BLINK_HD int64_t DeviceControlWords(int64_t nranks, int64_t max_blocks) {
  return 1 + nranks + nranks * max_blocks * kDeviceBlockWords;
}
JAX_BLINK_HD int64_t DeviceBlockWordsAt(int64_t nranks, int64_t max_blocks, int64_t rank,
                                        int64_t block) {
  return 1 + nranks + (rank * max_blocks + block) * kDeviceBlockWords;
}

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_DEVICE_DEVICE_PROGRAM_H_
