// Builds the device executor's per-rank, per-block programs (see
// device_program.h).
#include "device/device_program.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace jax_blink {

uint64_t NextDeviceExecutorId() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

int64_t DeviceProgram::WorkspaceBytes() const {
  return acc_is_out ? 0 : count * static_cast<int64_t>(AccSize(dtype));
}

namespace {

// The steps a step waits for: its dependencies, a RECV's SEND, and a write's
// guards on accumulator values it sent before (their RECVs). As global ids.
void Preds(const Schedule& s, int64_t r, int32_t i, std::vector<int64_t>* out) {
  out->clear();
  const RankSteps& rs = s.ranks[r];
  const Step& st = rs.steps[i];
  for (int32_t k = st.deps_begin; k < st.deps_end; ++k) out->push_back(s.step_base[r] + rs.deps[k]);
  if (st.op != Op::kSend) {
    out->push_back(s.step_base[st.peer] + st.match);
    for (int32_t k = st.guards_begin; k < st.guards_end; ++k) {
      const Step& g = rs.steps[rs.guards[k]];
      // A value sent from the input is never overwritten (the device
      // executor never runs in place): no wait.
      if (!g.src_input) out->push_back(s.step_base[g.peer] + g.match);
    }
  }
}

}  // namespace

std::string BuildDeviceProgram(const Schedule& s, int max_blocks_per_rank, DeviceProgram* out) {
  DeviceProgram& p = *out;
  p = DeviceProgram();
  p.nranks = static_cast<int32_t>(s.nranks);
  p.dtype = s.dtype;
  p.op = s.op;
  p.count = s.count;
  p.acc_is_out = !HasScratchAcc(s.dtype) && s.out_count == s.count;

  // Levels in the deadlock graph (Kahn's algorithm over all ranks' steps).
  const int64_t total = s.total_steps;
  std::vector<int32_t> indeg(total, 0);
  std::vector<std::vector<int64_t>> succ(total);
  std::vector<int64_t> preds;
  for (int64_t r = 0; r < s.nranks; ++r) {
    for (int32_t i = 0; i < static_cast<int32_t>(s.ranks[r].steps.size()); ++i) {
      Preds(s, r, i, &preds);
      const int64_t id = s.step_base[r] + i;
      for (int64_t q : preds) {
        succ[q].push_back(id);
        ++indeg[id];
      }
    }
  }
  std::vector<int64_t> level(total, 0);
  std::vector<int64_t> ready;
  for (int64_t id = 0; id < total; ++id) {
    if (indeg[id] == 0) ready.push_back(id);
  }
  int64_t seen = 0;
  while (!ready.empty()) {
    const int64_t id = ready.back();
    ready.pop_back();
    ++seen;
    for (int64_t q : succ[id]) {
      level[q] = std::max(level[q], level[id] + 1);
      if (--indeg[q] == 0) ready.push_back(q);
    }
  }
  if (seen != total) {
    return "device program: the schedule's steps wait for each other in a cycle";
  }

  for (int64_t r = 0; r < s.nranks; ++r) {
    const RankSteps& rs = s.ranks[r];
    const int32_t n = static_cast<int32_t>(rs.steps.size());
    const int64_t base = s.step_base[r];
    // Steps in level order (ties by list order): dependencies come first.
    std::vector<int32_t> order(n);
    for (int32_t i = 0; i < n; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return level[base + a] < level[base + b]; });
    // Blocks: one per peer the rank receives from (capped), in order of
    // first appearance.
    std::map<int32_t, int32_t> peer_block;
    for (int32_t i = 0; i < n; ++i) {
      const Step& st = rs.steps[i];
      if (st.op == Op::kSend || peer_block.count(st.peer)) continue;
      const int32_t k = static_cast<int32_t>(peer_block.size());
      peer_block[st.peer] = max_blocks_per_rank > 0 ? k % max_blocks_per_rank : k;
    }
    int32_t nblocks = 1;
    for (const auto& [peer, b] : peer_block) nblocks = std::max(nblocks, b + 1);
    std::vector<int32_t> block_of(n, 0);
    for (int32_t i : order) {
      const Step& st = rs.steps[i];
      if (st.op != Op::kSend) {
        block_of[i] = peer_block[st.peer];
        continue;
      }
      // A SEND runs in the block of its latest dependency (it publishes
      // right after the value is there), the first block if it has none.
      int32_t best = -1;
      for (int32_t k = st.deps_begin; k < st.deps_end; ++k) {
        const int32_t d = rs.deps[k];
        if (best < 0 || level[base + d] > level[base + best] ||
            (level[base + d] == level[base + best] && d > best)) {
          best = d;
        }
      }
      block_of[i] = best < 0 ? 0 : block_of[best];
    }

    DeviceRank dr;
    dr.block_begin = static_cast<int32_t>(p.blocks.size());
    dr.nblocks = nblocks;
    dr.nsteps = n;
    const int64_t in_lo = s.InputOffset(r);
    const int64_t out_lo = s.OutputOffset(r);
    for (int32_t b = 0; b < nblocks; ++b) {
      DeviceBlock blk;
      blk.rank = static_cast<int32_t>(r);
      blk.local = b;
      blk.instr_begin = static_cast<int32_t>(p.instrs.size());
      for (int32_t i : order) {
        if (block_of[i] != b) continue;
        const Step& st = rs.steps[i];
        DeviceInstr in{};
        const int64_t off = s.chunk_offset[st.chunk];
        const int64_t len = s.chunk_length[st.chunk];
        in.offset = off;
        in.length = len;
        in.in_offset = off - in_lo;
        in.out_offset = off - out_lo;
        in.step = i;
        in.peer = st.peer;
        in.match = st.match;
        in.op = static_cast<uint8_t>(st.op);
        if (st.op != Op::kSend) {
          in.src_input = st.src_input;
          in.src_offset = st.src_input ? off - s.InputOffset(st.peer) : off;
          in.first_write = st.first_write;
          in.write_out = !p.acc_is_out && st.last_write && off >= out_lo &&
                         off + len <= out_lo + s.out_count;
          if (st.first_write && st.op == Op::kRecvReduce &&
              (in.in_offset < 0 || in.in_offset + len > s.in_count)) {
            return "device program: rank " + std::to_string(r) + " step " + std::to_string(i) +
                   " reduces into a chunk outside its input";
          }
        }
        in.waits_begin = static_cast<int32_t>(p.waits.size());
        Preds(s, r, i, &preds);
        for (int64_t q : preds) {
          // the rank owning global step q
          const int64_t qr =
              std::upper_bound(s.step_base.begin(), s.step_base.begin() + s.nranks, q) -
              s.step_base.begin() - 1;
          const int32_t qi = static_cast<int32_t>(q - s.step_base[qr]);
          if (qr == r && block_of[qi] == b) continue;  // earlier in this block
          p.waits.push_back({static_cast<int32_t>(qr), qi});
        }
        in.waits_end = static_cast<int32_t>(p.waits.size());
        p.instrs.push_back(in);
      }
      blk.instr_end = static_cast<int32_t>(p.instrs.size());
      p.blocks.push_back(blk);
    }
    dr.copies_begin = static_cast<int32_t>(p.copies.size());
    for (int64_t c = 0; c < s.nchunks; ++c) {
      const int64_t off = s.chunk_offset[c];
      const int64_t len = s.chunk_length[c];
      if (rs.chunk_written[c] || off < out_lo || off + len > out_lo + s.out_count) continue;
      if (off - in_lo < 0 || off - in_lo + len > s.in_count) {
        return "device program: rank " + std::to_string(r) + " never writes chunk " +
               std::to_string(c) + " of its output, which its input does not hold";
      }
      p.copies.push_back({off - in_lo, off - out_lo, len});
    }
    dr.copies_end = static_cast<int32_t>(p.copies.size());
    p.ranks.push_back(dr);
    p.max_blocks = std::max(p.max_blocks, nblocks);
  }
  return "";
}

}  // namespace jax_blink
