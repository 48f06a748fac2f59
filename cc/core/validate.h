// The phases of DecodeSchedule (core/schedule.h), the same as the Python
// validator's (jax_blink/schedule/validate.py, Schedule.validate), which
// accepts exactly the same schedules: structure (with the limits),
// matching SENDs to RECVs, the determinism rule, a symbolic run. DecodeSchedule
// calls them in this order; each assumes that the earlier ones passed,
// returns "" or the error ("invalid jax_blink schedule: ...") and fills in
// the part of the Schedule its checks establish.
#ifndef JAX_BLINK_CC_CORE_VALIDATE_H_
#define JAX_BLINK_CC_CORE_VALIDATE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/schedule.h"

namespace jax_blink {

// guard_writes[r][i]: for a SEND of rank r from its accumulator, the later
// write of the chunk that must wait until the SEND's receiver read it (-1 if
// none). Found by CheckDeterminism, needed by SymbolicRun's deadlock check.
using GuardWrites = std::vector<std::vector<int32_t>>;

// 1. Structure: decodes the header, the chunk table and the steps of `n`
// words into *s, checking the limits of schedule.h before allocating
// anything sized by them, every field's range, the contiguous chunk
// partition, dependencies that are distinct and point backwards and the
// array's length; then builds the successor lists. *s must be a default
// Schedule.
std::string DecodeStructure(const int64_t* words, size_t n, Schedule* s);

// 2. Matching: every (sender, receiver, chunk) has exactly one SEND and one
// RECV; sets Step::match at both ends.
std::string MatchSendsToRecvs(Schedule* s);

// 3. Determinism: steps of a rank that touch the same chunk are ordered by
// dependencies unless both are SENDs. Sets where each sent value lives
// (input or accumulator), the first and last writes of each chunk, the
// guards (sends read before an overwrite), the fusable RECV_REDUCE chains,
// sinks and trivially done SENDs; fills *guard_writes.
// *inplace_guard_writes: the same for every SEND, from the input too (the
// waits a rank whose input is its accumulator adds).
std::string CheckDeterminism(Schedule* s, GuardWrites* guard_writes,
                             GuardWrites* inplace_guard_writes);

// 4. Symbolic run: the steps can all complete (no cycle through the
// dependencies, the SEND->RECV matching and the guard waits), and executing
// them on sets of contributing ranks counts every contribution exactly once
// and leaves each rank with what the collective promises. Its state is
// bounded by kMaxProofWords (checked by DecodeStructure).
std::string SymbolicRun(const Schedule& s, const GuardWrites& guard_writes);

// 5. In place: whether the steps can all complete with the waits of
// `inplace_guard_writes` as well (Schedule::inplace_ok). Not an error when
// not: such a schedule runs with a separate accumulator.
bool InPlaceSafe(const Schedule& s, const GuardWrites& inplace_guard_writes);

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_CORE_VALIDATE_H_
