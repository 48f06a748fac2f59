// The device executor's step interpreter: runs one block of a rank's program
// (device_program.h) for one call. Written once, compiled twice:
// * by nvcc (device/device_kernel.cu): a thread block per program block, its
//   threads sharing each chunk's elements, flags in peer-visible memory;
// * by the host compiler (testing/device_host.cc): a std::thread per block,
//   flags as std::atomic_ref with the same acquire/release pairs.
//
// `Env` supplies the memory and flag primitives (one leader lane waits and
// publishes; every lane moves data):
//   uint64_t Load(const uint64_t* p)          acquire
//   void Store(uint64_t* p, uint64_t v)       release (control words)
//   void Publish(uint64_t* flag, uint64_t v)  release (a step's flag)
//   void Fence()                              sequentially consistent fence
//   bool Poisoned(const uint64_t* error, uint64_t gen)   the call failed
//   int64_t Now()                             nanoseconds, monotonic
//   void Pause(uint32_t iteration)            between two polls of a flag
//   bool Leader(); int Lane(); int Lanes();   the block's lanes
//   void Sync()                               barrier of the block's lanes
//   int Share(int v)                          the leader's v, on every lane
//
// A call: a block first checks the program's header (device_program.h); one
// that is not the executor's is recorded in the block's control words and
// poisons the call, and nothing else of that program is read. Then every
// step waits (bounded by timeout_ns from the block's start)
// for its flags (device_program.h), moves its chunk, and publishes its own
// flag with the call's generation. A wait that times out records what it
// waited for in its block's control words and poisons the call (the error
// word); every other wait sees the poison and stops. Block 0 of each rank
// then waits until all the rank's blocks are over, marks the rank finished
// and waits for every rank that started to finish (bounded too), so that no
// rank's buffers are released while a peer may still read them. Reductions
// are core/reduce_op.h's Combine in the accumulator type, one RECV_REDUCE at
// a time in the rank's step order of the chunk, a sum from the rank's input
// starting from +0: the CPU executor's bits.
#ifndef JAX_BLINK_CC_DEVICE_DEVICE_INTERP_H_
#define JAX_BLINK_CC_DEVICE_DEVICE_INTERP_H_

#include <cstdint>
#include <type_traits>

#include "core/dtype.h"
#include "core/half.h"
#include "core/hd.h"
#include "core/reduce_op.h"
#include "core/schedule.h"
#include "device/device_program.h"

namespace jax_blink {

// One rank's memory for one call, as every rank sees it (peer pointers).
struct DeviceRankBuffers {
  const void* in;   // in_count elements of the type
  void* acc;        // count elements of the accumulator type (the output when acc_is_out)
  void* out;        // out_count elements of the type
  uint64_t* flags;  // one per step of the rank
};

// One rank's call. The rank's place in the program comes from the host (the
// launch), not from the program's memory, so that a block whose program
// header does not match reads nothing else of it.
struct DeviceCallView {
  const DeviceRankBuffers* bufs;  // per rank
  uint64_t* control;              // DeviceControlWords(nranks, max_blocks)
  uint64_t generation;            // > 0, grows by one per call of the program
  int64_t timeout_ns;
  uint64_t executor;              // the id the program's header must hold
  int32_t rank;
  int32_t block_begin;            // the rank's first block in the program
  int32_t nblocks;                // the rank's blocks (one kernel launch)
};

// What a block's run ended with.
enum DeviceBlockResult : int {
  kDeviceOk = 0,
  kDeviceTimeout = 1,   // a wait of this block timed out (recorded)
  kDevicePoisoned = 2,  // another wait timed out: the call failed
  kDeviceBadProgram = 3,  // the program's header is not the executor's (recorded)
};

namespace device_detail {

template <typename E>
struct SameTraits {
  using T = E;
  using A = E;
  static JAX_BLINK_HD A ToAcc(T x) { return x; }
  static JAX_BLINK_HD T FromAcc(A x) { return x; }
};
struct F16Traits {
  using T = uint16_t;
  using A = float;
  static JAX_BLINK_HD A ToAcc(T x) { return HalfToFloat(x); }
  static JAX_BLINK_HD T FromAcc(A x) { return FloatToHalf(x); }
};
struct BF16Traits {
  using T = uint16_t;
  using A = float;
  static JAX_BLINK_HD A ToAcc(T x) { return BF16ToFloat(x); }
  static JAX_BLINK_HD T FromAcc(A x) { return FloatToBF16(x); }
};

// Waits (leader lane) until *flag >= gen. poison_stops: give up when the
// call has failed.
template <class Env>
JAX_BLINK_HD int WaitFlag(Env& env, const uint64_t* flag, const uint64_t* error, uint64_t gen,
                          int64_t deadline, bool poison_stops) {
  for (uint32_t k = 0;; ++k) {
    if (env.Load(flag) >= gen) return kDeviceOk;
    if (poison_stops && env.Poisoned(error, gen)) return kDevicePoisoned;
    if (env.Now() > deadline) return kDeviceTimeout;
    env.Pause(k);
  }
}

// Records the wait a block gave up (kind: kDeviceTimeout, its own deadline,
// which then poisons the call; kDevicePoisoned, another wait's) in the
// block's words: the ranks it waited for are named in the error.
template <class Env>
JAX_BLINK_HD void RecordWait(Env& env, uint64_t* words, uint64_t* error, uint64_t gen, int kind,
                             int32_t waited_rank, int32_t waited_step, int32_t own_step) {
  env.Store(&words[3], (static_cast<uint64_t>(kind) << 32) | static_cast<uint32_t>(waited_rank));
  env.Store(&words[4], static_cast<uint64_t>(static_cast<int64_t>(waited_step)));
  env.Store(&words[5], static_cast<uint64_t>(static_cast<int64_t>(own_step)));
  env.Store(&words[2], gen);
  if (kind == kDeviceTimeout) env.Store(error, gen);
}

// Moves one RECV's chunk (every lane a share of the elements).
template <class Tr, ReduceOp kOp, class Env>
JAX_BLINK_HD void Exec(Env& env, const DeviceCallView& c, int32_t rank, const DeviceInstr& in) {
  using T = typename Tr::T;
  using A = typename Tr::A;
  const DeviceRankBuffers& me = c.bufs[rank];
  const DeviceRankBuffers& src = c.bufs[in.peer];
  A* acc = static_cast<A*>(me.acc) + in.offset;
  T* out = in.write_out ? static_cast<T*>(me.out) + in.out_offset : nullptr;
  const T* src_in = static_cast<const T*>(src.in) + in.src_offset;
  const A* src_acc = static_cast<const A*>(src.acc) + in.src_offset;
  const int64_t n = in.length;
  const int64_t lane = env.Lane();
  const int64_t lanes = env.Lanes();
  if (in.op == static_cast<uint8_t>(Op::kRecvCopy)) {
    for (int64_t i = lane; i < n; i += lanes) {
      const A v = in.src_input ? Tr::ToAcc(src_in[i]) : src_acc[i];
      acc[i] = v;
      if (out != nullptr) out[i] = Tr::FromAcc(v);
    }
    return;
  }
  // RECV_REDUCE: acc = op(base, v). A sum that starts from the input starts
  // from +0 (a sum of -0.0 only is +0.0), as the CPU executor's.
  constexpr bool kZeroFirst = kOp == ReduceOp::kSum && std::is_floating_point<A>::value;
  const T* own_in = static_cast<const T*>(me.in) + in.in_offset;
  for (int64_t i = lane; i < n; i += lanes) {
    A base;
    if (in.first_write) {
      base = Tr::ToAcc(own_in[i]);
      if (kZeroFirst) base = A(0) + base;
    } else {
      base = acc[i];
    }
    const A v = Combine<kOp, A>(base, in.src_input ? Tr::ToAcc(src_in[i]) : src_acc[i]);
    acc[i] = v;
    if (out != nullptr) out[i] = Tr::FromAcc(v);
  }
}

template <class Tr, ReduceOp kOp, class Env>
JAX_BLINK_HD int RunBlockTyped(Env& env, const DeviceProgramView& p, const DeviceCallView& c,
                               int32_t local) {
  using T = typename Tr::T;
  const int32_t r = c.rank;
  const uint64_t gen = c.generation;
  uint64_t* const ctl = c.control;
  uint64_t* const error = ctl;
  uint64_t* const words = ctl + DeviceBlockWordsAt(p.nranks, p.max_blocks, r, local);
  const int64_t start = env.Now();
  const int64_t deadline = start + c.timeout_ns;
  // The finish may wait for a peer that started late (by up to a timeout).
  const int64_t finish_deadline = deadline + c.timeout_ns + 1000000000;
  int result = kDeviceOk;
  // Started: a late block of a call that already failed does nothing (the
  // peers that gave up on it before it started no longer wait for it; the
  // fences make one of the two see the other).
  if (env.Leader()) {
    env.Store(&words[0], gen);
    env.Fence();
    // The program is this executor's, in place (device_setup.h); else the
    // call fails, naming what was read, and nothing else of it is read.
    const uint64_t magic = p.header->magic;
    const uint64_t executor = p.header->executor;
    if (magic != kDeviceProgramMagic || executor != c.executor) {
      result = kDeviceBadProgram;
      env.Store(&words[3], (static_cast<uint64_t>(kDeviceBadProgram) << 32) |
                               static_cast<uint32_t>(r));
      env.Store(&words[4], executor);
      env.Store(&words[5], magic);
      env.Store(&words[2], gen);
      env.Store(error, gen);
    } else if (env.Poisoned(error, gen)) {
      result = kDevicePoisoned;
    }
  }
  result = env.Share(result);
  if (result == kDeviceOk && local == 0) {  // OUT = IN where the rank writes nothing
    const DeviceRank& dr = p.ranks[r];
    const T* in = static_cast<const T*>(c.bufs[r].in);
    T* out = static_cast<T*>(c.bufs[r].out);
    for (int32_t k = dr.copies_begin; k < dr.copies_end; ++k) {
      const DeviceCopy& cp = p.copies[k];
      for (int64_t i = env.Lane(); i < cp.length; i += env.Lanes()) {
        out[cp.out_offset + i] = in[cp.in_offset + i];
      }
    }
  }
  const DeviceBlock b = result == kDeviceOk ? p.blocks[c.block_begin + local] : DeviceBlock{};
  for (int32_t k = b.instr_begin; result == kDeviceOk && k < b.instr_end; ++k) {
    const DeviceInstr& in = p.instrs[k];
    int res = kDeviceOk;
    if (env.Leader()) {
      for (int32_t w = in.waits_begin; w < in.waits_end; ++w) {
        const DeviceWait& dw = p.waits[w];
        res = WaitFlag(env, c.bufs[dw.rank].flags + dw.step, error, gen, deadline, true);
        if (res != kDeviceOk) {
          RecordWait(env, words, error, gen, res, dw.rank, dw.step, in.step);
          break;
        }
      }
    }
    res = env.Share(res);
    if (res != kDeviceOk) {
      result = res;
      break;
    }
    if (in.op != static_cast<uint8_t>(Op::kSend)) Exec<Tr, kOp>(env, c, r, in);
    env.Sync();
    if (env.Leader()) env.Publish(c.bufs[r].flags + in.step, gen);
  }
  env.Sync();
  if (!env.Leader()) return result;
  env.Store(&words[1], gen);  // this block is over
  if (local != 0) return result;
  // Block 0: the rank's blocks are over, then every rank that started is
  // (from the launch and the control words: the program may be bad).
  // (A finish that times out keeps the block's record of an earlier wait.)
  for (int32_t l = 1; l < c.nblocks; ++l) {
    uint64_t* other = ctl + DeviceBlockWordsAt(p.nranks, p.max_blocks, r, l);
    if (WaitFlag(env, &other[1], error, gen, finish_deadline, false) != kDeviceOk) {
      if (result == kDeviceOk) result = kDeviceTimeout;
      if (env.Load(&words[2]) != gen) RecordWait(env, words, error, gen, kDeviceTimeout, r, -1, -1);
      env.Store(error, gen);
    }
  }
  env.Store(&ctl[1 + r], gen);
  for (int32_t q = 0; q < p.nranks; ++q) {
    for (uint32_t it = 0; env.Load(&ctl[1 + q]) < gen; ++it) {
      if (env.Poisoned(error, gen)) {
        // A rank none of whose blocks started sees the poison when one does,
        // and touches nothing: no need to wait for it.
        env.Fence();
        bool started = false;  // (blocks a rank does not have are never started)
        for (int32_t l = 0; l < p.max_blocks && !started; ++l) {
          started = env.Load(ctl + DeviceBlockWordsAt(p.nranks, p.max_blocks, q, l)) >= gen;
        }
        if (!started) break;
      }
      if (env.Now() > finish_deadline) {
        if (result == kDeviceOk) result = kDeviceTimeout;
        if (env.Load(&words[2]) != gen) RecordWait(env, words, error, gen, kDeviceTimeout, q, -1, -1);
        env.Store(error, gen);
        break;
      }
      env.Pause(it);
    }
  }
  if (result == kDeviceOk && env.Poisoned(error, gen)) result = kDevicePoisoned;
  return result;
}

template <ReduceOp kOp, class Env>
JAX_BLINK_HD int RunBlockOp(Env& env, const DeviceProgramView& p, const DeviceCallView& c,
                            int32_t local) {
  switch (static_cast<DType>(p.dtype)) {
    case DType::kF32: return RunBlockTyped<SameTraits<float>, kOp>(env, p, c, local);
    case DType::kF64: return RunBlockTyped<SameTraits<double>, kOp>(env, p, c, local);
    case DType::kF16: return RunBlockTyped<F16Traits, kOp>(env, p, c, local);
    case DType::kBF16: return RunBlockTyped<BF16Traits, kOp>(env, p, c, local);
    case DType::kI32: return RunBlockTyped<SameTraits<int32_t>, kOp>(env, p, c, local);
    case DType::kI64: return RunBlockTyped<SameTraits<int64_t>, kOp>(env, p, c, local);
    case DType::kU32: return RunBlockTyped<SameTraits<uint32_t>, kOp>(env, p, c, local);
  }
  return kDeviceOk;  // (the program builder only takes the dtypes above)
}

}  // namespace device_detail

// Runs block `local` (0 .. c.nblocks - 1) of rank c.rank for one call; every
// lane of the block calls it. Returns a DeviceBlockResult (the same on every
// lane for the leader; the finish's result on the leader only).
template <class Env>
JAX_BLINK_HD int RunDeviceBlock(Env& env, const DeviceProgramView& p, const DeviceCallView& c,
                                int32_t local) {
  switch (static_cast<ReduceOp>(p.op)) {
    case ReduceOp::kSum: return device_detail::RunBlockOp<ReduceOp::kSum>(env, p, c, local);
    case ReduceOp::kMax: return device_detail::RunBlockOp<ReduceOp::kMax>(env, p, c, local);
    case ReduceOp::kMin: return device_detail::RunBlockOp<ReduceOp::kMin>(env, p, c, local);
  }
  return kDeviceOk;
}

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_DEVICE_DEVICE_INTERP_H_
