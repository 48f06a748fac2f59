// The rendezvous of ranks in several processes of one host, over shared
// memory: the host transport of the CPU executor.
//
// Each process of a job owns one arena: an anonymous memory file
// (memfd_create) that is never named in /dev/shm, so nothing is left behind
// when the job ends, by a crash included. A process maps the arena of each
// process of its host by opening /proc/<pid>/fd/<fd>, with the (pid, fd)
// pairs the job exchanged at trace time (jax_blink/processes/transport.py); only
// processes of one job know them, so two jobs never meet.
//
// The first process of the host (slot 0) keeps the host's slot table at the
// start of its arena: a fixed number of entries, each the shared part of a
// rendezvous Slot (words, failure record, bells, per-step flags) and what
// each rank publishes (its buffers as offsets into its process's arena, its
// schedule's fingerprint, a local error). A call finds its entry by hashing
// (call site, group, generation); a busy entry is waited for. A rank's
// input is copied into its arena before it joins and its accumulator lives
// there, so peers read and push exactly as in-process ranks do; the
// executor (cpu/executor_cpu.h) then runs on a Slot view of the entry.
//
// Waits are bounded by the call's timeout. A rank that never arrives is
// named, with the processes of the host that have exited.
#ifndef JAX_BLINK_CC_SYNC_HOST_RENDEZVOUS_H_
#define JAX_BLINK_CC_SYNC_HOST_RENDEZVOUS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "sync/rendezvous.h"

namespace jax_blink {

// One process of the host: its pid and the descriptor of its arena in it.
struct HostProcess {
  int64_t pid = 0;
  int64_t fd = -1;
};

// Limits of the host slot table (what a call over the host transport may use).
inline constexpr int64_t kHostMaxRanks = 64;
inline constexpr int64_t kHostMaxSteps = int64_t{1} << 18;  // steps of one schedule, all ranks
inline constexpr int64_t kHostEntries = 1024;
// What a rank may publish besides its buffers, opaque to the rendezvous
// (the CUDA transport's IPC records: cuda/cuda_ipc.h).
inline constexpr int64_t kHostBlobBytes = 512;

// This process's arena, created on first use: (pid, fd). Internal error
// when the system refuses the memory file.
Status HostArena(HostProcess* self);

// Maps the arenas of the host's processes, in the job's order (`slot` is
// this process's index in `processes`, whose entry is its own arena). Once
// per process; InvalidArgument when called again with other processes,
// Internal when an arena cannot be opened or mapped (the message says why).
Status HostAttach(int64_t slot, const std::vector<HostProcess>& processes);

// Whether HostAttach succeeded in this process.
bool HostAttached();

// A rank's membership of one host slot, from HostJoin to HostLeave.
struct HostTicket {
  int64_t entry = -1;
  int64_t rank = -1;
  int64_t generation = -1;
  Slot view;  // the executor's Slot, over the entry's shared storage
  // This rank's part of its process's arena: the input's copy (in_bytes,
  // rounded up to 64), then the accumulator.
  void* staging = nullptr;
  int64_t staging_bytes = 0;
  // Each rank's blob (HostRankArgs::blob), copied out once all have joined
  // (early start: once the rank has, HostArrived).
  std::vector<std::string> blobs;
  // The call site in messages, and which ranks `view` and `blobs` hold
  // (early start).
  std::string where;
  std::vector<uint8_t> mapped;
};

// What a rank publishes at HostJoin.
struct HostRankArgs {
  int64_t site = 0;   // call site, the same in every process
  int64_t op_id = 0;  // its op id (for messages)
  int64_t group = 0;
  int64_t rank = 0;
  int64_t nranks = 0;
  int64_t total_steps = 0;
  uint64_t fingerprint = 0;
  int64_t count = 0;
  int32_t dtype = -1;
  Status error;       // a local error (still joins, so peers fail fast)
  const void* in = nullptr;  // the rank's input
  void* out = nullptr;       // and output (peers of its process push into it)
  int64_t in_bytes = 0;
  // true: the input is copied into the arena before joining, and every peer
  // reads the copy (its output overwrites it, and the rank does not run in
  // place); false: peers in this process read `in` itself, and the rank
  // copies the chunks that peers of other processes read into the arena as
  // it sends them (cpu/executor_cpu.cc).
  bool stage_input = true;
  int64_t acc_bytes = 0;     // the accumulator's size, in the arena
  // A segmented call (cpu/executor_cpu.h, ExecArgs::nsegs; never staged whole): its
  // buffer table, as its own process sees it. Peers of its process read its input
  // segments and push into its output segments; peers of other processes see only
  // the arena (the chunks the rank stages there, and its accumulator).
  int32_t nsegs = 0;
  const int64_t* seg_offset = nullptr;
  const void* const* in_segs = nullptr;
  void* const* out_segs = nullptr;
  // Bytes every peer receives in HostTicket::blobs (at most kHostBlobBytes;
  // more is InvalidArgument): how a rank hands its peers what only it can
  // make, such as the IPC handles of its device buffers.
  const void* blob = nullptr;
  int64_t blob_bytes = 0;
};

// Takes the call's generation on the calling thread (as Rendezvous::Reserve).
int64_t HostReserve(int64_t site, int64_t group, int64_t rank);

// Copies the input into this process's arena, publishes the rank, waits
// for all ranks until `deadline`. On success ticket->view is the Slot the
// executor runs on (info[r].in/acc point into the arenas as mapped here)
// and ticket->staging holds this rank's input copy then its accumulator.
// The caller calls HostLeave() whenever ticket->entry >= 0.
// `early`: returns once the rank is published, without waiting; the view
// then holds this rank only, and HostArrived() adds each peer once it has
// published. The caller calls HostAbortMissing() at its deadline.
Status HostJoin(const HostRankArgs& args, int64_t generation, Clock::time_point deadline,
                int64_t timeout_ms, HostTicket* ticket, bool early = false);

// Early start: whether rank r of the ticket's call has published; when it
// has, ticket->view.info[r] and ticket->blobs[r] hold what it published.
bool HostArrived(HostTicket* ticket, int64_t r);

// Waits until every rank of the ticket's call has arrived, then maps them
// all into the view (ok), or until `deadline` (HostAbortMissing's error).
Status HostAwaitAll(HostTicket* ticket, Clock::time_point deadline, int64_t timeout_ms);

// At a rank's deadline: when some rank of the call has not arrived, aborts
// it (as Rendezvous::AbortMissing: the message names the missing ranks and
// the host's processes that exited; the view's slot fails with it; the
// missing ranks count as finished; a rank arriving later fails at once).
// Ok when every rank has arrived.
Status HostAbortMissing(HostTicket* ticket, int64_t timeout_ms);

void HostLeave(HostTicket* ticket);

// "; process 1 of this host (pid 123) has exited" for each process of the
// host that has exited ("" when none has), for error messages.
std::string HostExitedText();

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_SYNC_HOST_RENDEZVOUS_H_
