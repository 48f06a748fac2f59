// CPU executor: runs one rank's steps over shared memory (pull model).
// See executor_cpu.h for the protocol and docs/schedule_format.md for the
// semantics it implements.
#include <algorithm>
#include <array>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <type_traits>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "cpu/executor_cpu.h"

#include "core/debug.h"
#include "core/half.h"
#include "core/reduce_op.h"
#include "core/schedule.h"
#include "core/step_tracker.h"
#include "sync/host_rendezvous.h"
#include "sync/join.h"
#include "sync/rendezvous.h"

namespace jax_blink {

namespace {

// ---- Per-dtype traits
// -------------------------------------------------------- T: element type of
// the buffers; A: accumulator type. Sums of signed integers wrap (unsigned
// arithmetic, core/reduce_op.h); max/min compare them signed.

template <typename E>
struct SameTraits {
  using T = E;
  using A = E;
  static constexpr bool kSame = true;
  static A ToAcc(T x) { return x; }
  static T FromAcc(A x) { return x; }
};
struct F16Traits {
  using T = uint16_t;
  using A = float;
  static constexpr bool kSame = false;
  static A ToAcc(T x) { return HalfToFloat(x); }
  static T FromAcc(A x) { return FloatToHalf(x); }
};
struct BF16Traits {
  using T = uint16_t;
  using A = float;
  static constexpr bool kSame = false;
  static A ToAcc(T x) { return BF16ToFloat(x); }
  static T FromAcc(A x) { return FloatToBF16(x); }
};

// A value of one chunk: in the owner's input (type T) or accumulator (A).
struct Src {
  const void* p;
  bool is_input;
};

constexpr int kMaxPush = 16;
constexpr int64_t kBlock = 1024;
// Early start waits this long for all ranks before running without them:
// ranks that start apart reduce a chunk in several passes and pull what
// ranks starting together are pushed, which cost punctual calls (ranks 0.3
// ms apart at p99) 15-40% on 8 ranks and 2 cores (docs/design_notes.md,
// "Early start's grace").
constexpr auto kEarlyStartGrace = std::chrono::microseconds(500);

// The element loops are kept out of line: GCC drops `__restrict__` when it
// inlines them and then falls back to scalar code behind alias checks.
#define JAX_BLINK_KERNEL __attribute__((noinline))

// max/min of float and double, vectorised by hand (GCC/Clang vector
// extensions; SSE2 on x86-64, NEON on aarch64, no target flags). Same bits as
// core/reduce_op.h's Combine, in every floating-point mode, including flush
// of denormals (DAZ/FTZ, which XLA CPU sets on the threads that run the
// custom call):
// * a value is made canonical once, where it enters the accumulator (the
//   base of a reduction): NaN -> -inf (max) / +inf (min);
// * then op(a, b), for canonical a and any b, is
//     b wins (b > a for max, b < a for min; never for a NaN b) ? b
//     : (a == 0 && b == 0) ? the zero Combine gives (a + b for max,
//                            -0 if either is -0 for min)
//     : a,
//   which is Combine's result: a NaN b counts as the fill, which never wins
//   against a canonical a, and when neither wins and the two are not zeros
//   they are equal, hence the same bits.
// The selects are bitwise (and/andnot/or), never maxps/minps: those return
// a flushed zero for a denormal operand under DAZ, where Combine returns
// the operand's own bits.
// Fused reductions first take the plain fold x = (b wins ? b : x) from the
// canonical base (one maxps/minps or compare and select per operand; a NaN
// never wins). Its result is the winner's value, so Combine's whenever it
// does not compare equal to zero (a zero result, or a denormal one under
// DAZ, where the winner's sign of zero, its own bits or a flushed zero
// matter); lanes of a vector with such a result are all recomputed with the
// exact fold above.
#if defined(__GNUC__)
#define JAX_BLINK_VECTOR_MINMAX 1
template <typename A>
struct VecOf;
template <>
struct VecOf<float> {
  typedef float V __attribute__((vector_size(16)));
  typedef int32_t M __attribute__((vector_size(16)));
  static constexpr int32_t kSign = INT32_MIN;
};
template <>
struct VecOf<double> {
  typedef double V __attribute__((vector_size(16)));
  typedef int64_t M __attribute__((vector_size(16)));
  static constexpr int64_t kSign = INT64_MIN;
};

template <ReduceOp kOp, typename A>
struct MinMaxVec {
  using V = typename VecOf<A>::V;
  using M = typename VecOf<A>::M;
  static constexpr int kW = 16 / sizeof(A);
  static constexpr bool kMax = kOp == ReduceOp::kMax;

  static V Fill() {
    return V{} + (kMax ? -static_cast<A>(__builtin_inf()) : static_cast<A>(__builtin_inf()));
  }
  static V Select(M m, V x, V y) { return (V)(((M)x & m) | ((M)y & ~m)); }
  static V Canonical(V x) { return Select(x == x, x, Fill()); }
  static V Op(V a, V b) {  // a canonical
    const V zero = V{};
    const M wins = kMax ? (b > a) : (b < a);
    const M zeros = (a == zero) & (b == zero);
    V z;
    if constexpr (kMax) {
      z = a + b;
    } else {
      z = (V)(((M)a | (M)b) & (M{} + VecOf<A>::kSign));
    }
    return Select(wins, b, Select(zeros, z, a));
  }
  // The plain fold: exact unless the result compares equal to zero.
  static V FastOp(V a, V b) {
    if constexpr (kMax) {
      return b > a ? b : a;
    } else {
      return b < a ? b : a;
    }
  }
  static V FastCanonical(V x) { return FastOp(Fill(), x); }
  static bool AnyZero(V x) {
    const M z = x == V{};
#if defined(__x86_64__)
    if constexpr (sizeof(A) == 4) {
      return _mm_movemask_ps(reinterpret_cast<__m128>(z)) != 0;
    } else {
      return _mm_movemask_pd(reinterpret_cast<__m128d>(z)) != 0;
    }
#else
    bool any = false;
    for (int j = 0; j < kW; ++j) any |= z[j] != 0;
    return any;
#endif
  }
  static V Load(const A* p) {
    V v;
    std::memcpy(&v, p, sizeof(V));
    return v;
  }
  static void Store(A* p, V v) { std::memcpy(p, &v, sizeof(V)); }

  // t = canonical(p)
  JAX_BLINK_KERNEL static void CanonicalBlock(A* __restrict__ t, const A* __restrict__ p,
                                              int64_t m) {
    int64_t i = 0;
    for (; i + kW <= m; i += kW) Store(t + i, Canonical(Load(p + i)));
    if (i < m) {  // the tail through the same vector code
      A x[kW] = {};
      std::memcpy(x, p + i, (m - i) * sizeof(A));
      Store(x, Canonical(Load(x)));
      std::memcpy(t + i, x, (m - i) * sizeof(A));
    }
  }
  // t = op(t, p), t canonical
  JAX_BLINK_KERNEL static void OpBlock(A* __restrict__ t, const A* __restrict__ p, int64_t m) {
    int64_t i = 0;
    for (; i + kW <= m; i += kW) Store(t + i, Op(Load(t + i), Load(p + i)));
    if (i < m) {
      A x[kW] = {};
      A y[kW] = {};
      std::memcpy(x, t + i, (m - i) * sizeof(A));
      std::memcpy(y, p + i, (m - i) * sizeof(A));
      Store(x, Op(Load(x), Load(y)));
      std::memcpy(t + i, x, (m - i) * sizeof(A));
    }
  }
};
#else
#define JAX_BLINK_VECTOR_MINMAX 0
#endif

// Reductions by kOp (core/reduce_op.h), left to right in step order.
template <class Tr, ReduceOp kOp>
struct Kernels {
  using T = typename Tr::T;
  using A = typename Tr::A;
  static A Op(A a, A b) { return Combine<kOp, A>(a, b); }
  // max/min of floating-point accumulators: the vector kernels above, on
  // blocks (the accumulator block canonical).
  static constexpr bool kMinMaxVec =
      JAX_BLINK_VECTOR_MINMAX && kOp != ReduceOp::kSum && std::is_floating_point<A>::value;
#if JAX_BLINK_VECTOR_MINMAX
  using MM = MinMaxVec<kOp, std::conditional_t<std::is_floating_point<A>::value, A, float>>;
#endif

  // tmp = base (converted to A); `reduce`: the base of a reduction, made
  // canonical for the max/min vector kernels (a copy keeps its bits: NaN
  // payloads included).
  JAX_BLINK_KERNEL static void LoadBlock(A* __restrict__ tmp, Src s,
                                         int64_t off, int64_t m, bool reduce) {
    if (Tr::kSame || !s.is_input) {
#if JAX_BLINK_VECTOR_MINMAX
      if constexpr (kMinMaxVec) {
        if (reduce) {
          MM::CanonicalBlock(tmp, static_cast<const A*>(s.p) + off, m);
          return;
        }
      }
#endif
      std::memcpy(tmp, static_cast<const A*>(s.p) + off, m * sizeof(A));
    } else {
      const T* __restrict__ p = static_cast<const T*>(s.p) + off;
      if constexpr (kMinMaxVec) {
        if (reduce) {
          // canonical as it enters: NaN -> the fill (Combine(x, fill) is x's canonical value)
          constexpr A kFill = kOp == ReduceOp::kMax ? -static_cast<A>(__builtin_inf())
                                                    : static_cast<A>(__builtin_inf());
          for (int64_t i = 0; i < m; ++i) tmp[i] = Combine<kOp, A>(Tr::ToAcc(p[i]), kFill);
          return;
        }
      }
      for (int64_t i = 0; i < m; ++i) tmp[i] = Tr::ToAcc(p[i]);
    }
  }
  JAX_BLINK_KERNEL static void AddBlock(A* __restrict__ tmp, Src s, int64_t off,
                                        int64_t m) {
    if (Tr::kSame || !s.is_input) {
      const A* __restrict__ p = static_cast<const A*>(s.p) + off;
#if JAX_BLINK_VECTOR_MINMAX
      if constexpr (kMinMaxVec) {
        MM::OpBlock(tmp, p, m);
        return;
      }
#endif
      for (int64_t i = 0; i < m; ++i) tmp[i] = Op(tmp[i], p[i]);
    } else {
      const T* __restrict__ p = static_cast<const T*>(s.p) + off;
      for (int64_t i = 0; i < m; ++i) tmp[i] = Op(tmp[i], Tr::ToAcc(p[i]));
    }
  }

  // A sum that starts from a rank's input starts from +0 first, as
  // lax.psum's does: a sum of -0.0 only is +0.0 (x + 0 == x otherwise).
  // (max and min need no start: Combine canonicalises both operands, the
  // vector kernels the base as they load it.)
  static bool ZeroFirst(Src base, int k) {
    return kOp == ReduceOp::kSum && std::is_floating_point<A>::value && base.is_input && k > 0;
  }
  // dst = op(op(op(base, s0), s1), ...), left to right (deterministic).
  static void Reduce(void* dst_v, Src base, const Src* srcs, int k, int64_t n) {
    A* dst = static_cast<A*>(dst_v);
    const bool zero = ZeroFirst(base, k);
    if (Fusable(base, srcs, k) && base.p != dst_v) {  // (sources are peers' buffers)
      Fused(dst, base, srcs, k, 0, n, zero);
      return;
    }
    alignas(64) A tmp[kBlock];
    for (int64_t off = 0; off < n; off += kBlock) {
      const int64_t m = std::min(kBlock, n - off);
      Block(tmp, base, srcs, k, off, m, zero);
      std::memcpy(dst + off, tmp, m * sizeof(A));
    }
  }

  // tmp = op(op(base, s0), ...) over elements [off, off + m) (k = 0: a copy
  // of base); `zero`: ZeroFirst.
  static void Block(A* tmp, Src base, const Src* srcs, int k, int64_t off, int64_t m,
                    bool zero) {
    if (Fusable(base, srcs, k)) {
      Fused(tmp, base, srcs, k, off, m, zero);
      return;
    }
    LoadBlock(tmp, base, off, m, k > 0);
    if (zero) ZeroBlock(tmp, m);
    for (int j = 0; j < k; ++j) AddBlock(tmp, srcs[j], off, m);
  }

  // Every operand is of the accumulator type: one pass over all of them,
  // the running value in registers.
  static bool Fusable(Src base, const Src* srcs, int k) {
    if (k < 1 || k > kMaxFuse) return false;
    if (Tr::kSame) return true;
    if (base.is_input) return false;
    for (int j = 0; j < k; ++j) {
      if (srcs[j].is_input) return false;
    }
    return true;
  }
  static void Fused(A* d, Src base, const Src* srcs, int k, int64_t off, int64_t m, bool zero) {
    static_assert(kMaxFuse == 8, "Fused takes up to 8 sources");
    const A* b = static_cast<const A*>(base.p) + off;
    const A* p[kMaxFuse] = {};
    for (int j = 0; j < k; ++j) p[j] = static_cast<const A*>(srcs[j].p) + off;
    switch (k) {
      case 1: return FusedK<1>(d, b, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], m, zero);
      case 2: return FusedK<2>(d, b, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], m, zero);
      case 3: return FusedK<3>(d, b, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], m, zero);
      case 4: return FusedK<4>(d, b, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], m, zero);
      case 5: return FusedK<5>(d, b, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], m, zero);
      case 6: return FusedK<6>(d, b, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], m, zero);
      case 7: return FusedK<7>(d, b, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], m, zero);
      default: return FusedK<8>(d, b, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], m, zero);
    }
  }
  // d = op(op(b, s0), ...) with K sources (the pointers past K unused); d
  // aliases none of them.
  template <int K>
  JAX_BLINK_KERNEL static void FusedK(A* __restrict__ d, const A* __restrict__ b,
                                      const A* __restrict__ s0, const A* __restrict__ s1,
                                      const A* __restrict__ s2, const A* __restrict__ s3,
                                      const A* __restrict__ s4, const A* __restrict__ s5,
                                      const A* __restrict__ s6, const A* __restrict__ s7,
                                      int64_t n, bool zero) {
#if JAX_BLINK_VECTOR_MINMAX
    if constexpr (kMinMaxVec) {
      using V = typename MM::V;
      constexpr int W = MM::kW;
      auto fold = [&](const A* bb, const A* const* ss) {
        V x = MM::FastCanonical(MM::Load(bb));
        for (int j = 0; j < K; ++j) x = MM::FastOp(x, MM::Load(ss[j]));  // unrolled
        if (__builtin_expect(MM::AnyZero(x), 0)) {
          x = MM::Canonical(MM::Load(bb));
          for (int j = 0; j < K; ++j) x = MM::Op(x, MM::Load(ss[j]));
        }
        return x;
      };
      // (the pointers past K may be null: offset only the K in use)
      const A* const srcs[8] = {s0, s1, s2, s3, s4, s5, s6, s7};
      int64_t i = 0;
      for (; i + W <= n; i += W) {
        const A* ss[8] = {};
        for (int j = 0; j < K; ++j) ss[j] = srcs[j] + i;  // unrolled
        MM::Store(d + i, fold(b + i, ss));
      }
      if (i < n) {  // the tail through the same vector code
        const int64_t r = n - i;
        A xb[W] = {};
        A xs[K][W] = {};
        const A* ss[8] = {};
        std::memcpy(xb, b + i, r * sizeof(A));
        for (int j = 0; j < K; ++j) {
          std::memcpy(xs[j], srcs[j] + i, r * sizeof(A));
          ss[j] = xs[j];
        }
        MM::Store(xb, fold(xb, ss));
        std::memcpy(d + i, xb, r * sizeof(A));
      }
      return;
    }
#endif
    for (int64_t i = 0; i < n; ++i) {
      A x = zero ? A(0) + b[i] : b[i];
      if constexpr (K > 0) x = Op(x, s0[i]);
      if constexpr (K > 1) x = Op(x, s1[i]);
      if constexpr (K > 2) x = Op(x, s2[i]);
      if constexpr (K > 3) x = Op(x, s3[i]);
      if constexpr (K > 4) x = Op(x, s4[i]);
      if constexpr (K > 5) x = Op(x, s5[i]);
      if constexpr (K > 6) x = Op(x, s6[i]);
      if constexpr (K > 7) x = Op(x, s7[i]);
      d[i] = x;
    }
  }

  // tmp = 0 + tmp (see ZeroFirst).
  JAX_BLINK_KERNEL static void ZeroBlock(A* __restrict__ tmp, int64_t m) {
    for (int64_t i = 0; i < m; ++i) tmp[i] = A(0) + tmp[i];
  }

  // dst = src
  static void Copy(void* dst_v, Src s, int64_t n) {
    A* __restrict__ dst = static_cast<A*>(dst_v);
    if (Tr::kSame || !s.is_input) {
      std::memcpy(dst, s.p, n * sizeof(A));
    } else {
      const T* __restrict__ p = static_cast<const T*>(s.p);
      for (int64_t i = 0; i < n; ++i) dst[i] = Tr::ToAcc(p[i]);
    }
  }

  // out = round(acc)
  static void Finalize(void* out_v, const void* acc_v, int64_t n) {
    T* __restrict__ out = static_cast<T*>(out_v);
    const A* __restrict__ acc = static_cast<const A*>(acc_v);
    if constexpr (Tr::kSame) {
      std::memcpy(out, acc, n * sizeof(T));
    } else {
      for (int64_t i = 0; i < n; ++i) out[i] = Tr::FromAcc(acc[i]);
    }
  }
};

inline void StoreFence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

// Non-temporal store of a block; the caller fences once at the end.
JAX_BLINK_KERNEL void StreamStoreNoFence(void* dst_v, const void* src_v,
                                         size_t bytes) {
#if defined(__x86_64__)
  char* dst = static_cast<char*>(dst_v);
  const char* src = static_cast<const char*>(src_v);
  const size_t head = (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15;
  if (bytes < head + 64) {
    std::memcpy(dst, src, bytes);
    return;
  }
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  bytes -= head;
  size_t i = 0;
  for (; i + 64 <= bytes; i += 64) {
    __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  std::memcpy(dst + i, src + i, bytes - i);
#else
  std::memcpy(dst_v, src_v, bytes);
#endif
}

// memcpy with non-temporal stores (no read-for-ownership, no cache
// pollution) for destinations nobody reads soon. Ends with a store fence so
// that the completion flag published afterwards orders after the data.
JAX_BLINK_KERNEL void StreamCopy(void* dst, const void* src, size_t bytes) {
  StreamStoreNoFence(dst, src, bytes);
  StoreFence();
}

// A peer's accumulator chunk that a rank writes on the peer's behalf.
struct PushDst {
  void* p;
  bool nt;  // non-temporal stores (nobody reads it soon)
  // The peer whose accumulator it is (-1: this rank's output, OutputCopy):
  // where accumulators are segmented, each piece's address is the peer's.
  int64_t rank;
};

template <class Tr, ReduceOp kOp>
struct MultiKernels {
  using A = typename Tr::A;
  using K = Kernels<Tr, kOp>;
  // dst = base + s0 + ... (k >= 0 sources; k = 0 copies base) and the same
  // value into every extra destination, in one pass over the sources.
  static void Produce(void* dst_v, bool dst_nt, Src base, const Src* srcs,
                      int k, int64_t n, const PushDst* extra, int nextra) {
    A* dst = static_cast<A*>(dst_v);
    alignas(64) A tmp[kBlock];
    bool any_nt = dst_nt;
    for (int e = 0; e < nextra; ++e) any_nt |= extra[e].nt;
    const bool zero = K::ZeroFirst(base, k);
    for (int64_t off = 0; off < n; off += kBlock) {
      const int64_t m = std::min(kBlock, n - off);
      K::Block(tmp, base, srcs, k, off, m, zero);
      if (dst_nt) {
        StreamStoreNoFence(dst + off, tmp, m * sizeof(A));
      } else {
        std::memcpy(dst + off, tmp, m * sizeof(A));
      }
      for (int e = 0; e < nextra; ++e) {
        A* d = static_cast<A*>(extra[e].p) + off;
        if (extra[e].nt) {
          StreamStoreNoFence(d, tmp, m * sizeof(A));
        } else {
          std::memcpy(d, tmp, m * sizeof(A));
        }
      }
    }
    if (any_nt) StoreFence();
  }
};

struct KernelTable {
  void (*produce)(void*, bool, Src, const Src*, int, int64_t, const PushDst*,
                  int);
  void (*reduce)(void*, Src, const Src*, int, int64_t);
  void (*copy)(void*, Src, int64_t);
  void (*finalize)(void*, const void*, int64_t);
};

template <class Tr, ReduceOp kOp>
constexpr KernelTable MakeTable() {
  return {&MultiKernels<Tr, kOp>::Produce, &Kernels<Tr, kOp>::Reduce,
          &Kernels<Tr, kOp>::Copy, &Kernels<Tr, kOp>::Finalize};
}

template <ReduceOp kOp>
constexpr std::array<KernelTable, kNumDTypes> MakeTables() {
  return {
      MakeTable<SameTraits<float>, kOp>(),     // F32
      MakeTable<SameTraits<double>, kOp>(),    // F64
      MakeTable<F16Traits, kOp>(),             // F16
      MakeTable<BF16Traits, kOp>(),            // BF16
      MakeTable<SameTraits<int32_t>, kOp>(),   // I32
      MakeTable<SameTraits<int64_t>, kOp>(),   // I64
      MakeTable<SameTraits<uint32_t>, kOp>(),  // U32
  };
}

const KernelTable& TableFor(DType d, ReduceOp op) {
  static const std::array<KernelTable, kNumDTypes> kTables[kNumReduceOps] = {
      MakeTables<ReduceOp::kSum>(), MakeTables<ReduceOp::kMax>(), MakeTables<ReduceOp::kMin>()};
  return kTables[static_cast<int>(op)][static_cast<int>(d)];
}

// ---- Per-thread reusable state
// -------------------------------------------------

struct ThreadState {
  StepTracker tracker;
  std::vector<uint8_t> ready;  // RankRunner::ready_
};
thread_local ThreadState tls;

std::string Where(const ExecArgs& a, int64_t generation) {
  return CallSiteText(a.op_id, a.group, generation);
}

std::string StepText(const RankSteps& rs, int32_t i) {
  const Step& st = rs.steps[i];
  std::ostringstream os;
  os << "step " << i << " (" << OpName(st.op) << " chunk " << st.chunk
     << (st.op == Op::kSend ? " to" : " from") << " rank " << st.peer << ")";
  return os.str();
}

// Where an early-starting rank met its peers: what it asks of that
// rendezvous while it runs.
class Arrivals {
 public:
  virtual ~Arrivals() = default;
  // Rank r has published its RankInfo: the slot's info[r] is complete.
  virtual bool Arrived(int64_t r) = 0;
  // Rendezvous::AbortMissing and AwaitAll.
  virtual Status AbortMissing() = 0;
  virtual Status AwaitAll() = 0;
};

// The in-process rendezvous's.
class InProcessArrivals final : public Arrivals {
 public:
  InProcessArrivals(const Ticket& ticket, Clock::time_point deadline, int64_t timeout_ms)
      : ticket_(ticket), deadline_(deadline), timeout_ms_(timeout_ms) {}
  bool Arrived(int64_t r) override { return ticket_.slot->Arrived(r); }
  Status AbortMissing() override { return Rendezvous::Global().AbortMissing(ticket_, timeout_ms_); }
  Status AwaitAll() override {
    const ExecTunables& t = GetExecTunables();
    return Rendezvous::Global().AwaitAll(ticket_, deadline_, timeout_ms_, t.spin, t.yield_ns);
  }

 private:
  const Ticket& ticket_;
  const Clock::time_point deadline_;
  const int64_t timeout_ms_;
};

// The host's slot table's (sync/host_rendezvous.h).
class HostArrivals final : public Arrivals {
 public:
  HostArrivals(HostTicket* ticket, Clock::time_point deadline, int64_t timeout_ms)
      : ticket_(ticket), deadline_(deadline), timeout_ms_(timeout_ms) {}
  bool Arrived(int64_t r) override { return HostArrived(ticket_, r); }
  Status AbortMissing() override { return HostAbortMissing(ticket_, timeout_ms_); }
  Status AwaitAll() override { return HostAwaitAll(ticket_, deadline_, timeout_ms_); }

 private:
  HostTicket* const ticket_;
  const Clock::time_point deadline_;
  const int64_t timeout_ms_;
};

// Runs the steps of one rank; the heart of the executor.
class RankRunner {
 public:
  // `stage`: the host transport's copy of the input in the arena, filled
  // chunk by chunk as the rank sends them to other processes (null: none,
  // or filled before joining). `arrivals`: early start (null: every rank
  // has arrived and the ranks agree).
  RankRunner(const ExecArgs& a, Slot& slot, uint32_t epoch, int64_t generation,
             Clock::time_point deadline, char* stage = nullptr, Arrivals* arrivals = nullptr)
      : a_(a),
        s_(*a.schedule),
        rs_(s_.ranks[a.rank]),
        slot_(slot),
        done_(2 * epoch + 1),
        claimed_(2 * epoch),
        generation_(generation),
        deadline_(deadline),
        flags_(slot.flags()),
        bell_(slot.bell(a.rank)),
        kt_(TableFor(s_.dtype, s_.op)),
        tsize_(DTypeSize(s_.dtype)),
        asize_(AccSize(s_.dtype)),
        in_(static_cast<const char*>(a.in)),
        spin_(GetExecTunables().spin),
        nt_bytes_(GetExecTunables().nt_bytes),
        push_(GetExecTunables().push),
        same_types_(!HasScratchAcc(s_.dtype)),
        inplace_(CpuInPlace(s_, a.in == a.out)),
        yield_ns_(GetExecTunables().yield_ns),
        arrivals_(arrivals) {
    if (a.transport == kTransportHost) {
      // Early start learns where a peer lives when it arrives (PeerReady).
      remote_.assign(s_.nranks, arrivals != nullptr ? kWhereUnknown : 0);
      remote_[a.rank] = 0;
      if (same_types_) {  // this rank's and its same-process peers' private chunks
        private_.assign(s_.nranks * s_.nchunks, 0);
        out_written_.assign(s_.nchunks, 0);
      }
      for (int64_t r = 0; r < s_.nranks; ++r) {
        if (arrivals == nullptr || r == a.rank) LearnWhere(r);
      }
      if (stage != nullptr) {
        stage_ = stage;
        staged_.assign(s_.nchunks, 0);
      }
    }
  }

  // Early start: some rank (this one included) published an error or
  // disagrees with this one; Run() returned without finishing.
  bool Mismatched() const { return mismatch_; }

  Status Run() {
    StepTracker& tr = tls.tracker;
    tr.Reset(rs_);
    tls.ready.assign(s_.nranks, arrivals_ == nullptr ? 1 : 0);
    ready_ = tls.ready.data();
    ready_[a_.rank] = 1;
    if (arrivals_ != nullptr) {
      // Ranks that arrive together run as after a barrier (kEarlyStartGrace).
      slot_.AwaitArrivals(std::min(deadline_, Clock::now() + kEarlyStartGrace), spin_, yield_ns_);
      // Before touching any flag: this rank agrees with every rank already
      // there, among them the first, whose schedule sized the flags.
      mismatch_ = !slot_.info[a_.rank].error.ok();
      for (int64_t p = 0; p < s_.nranks && !mismatch_; ++p) {
        if (arrivals_->Arrived(p)) PeerReady(p);
      }
      if (mismatch_) return Status();
    }
    auto step = [&](int32_t i) { return TryRun(tr, i); };
    while (!tr.AllDone()) {
      if (mismatch_) return Status();
      const uint32_t seen = bell_.seq.load(std::memory_order_seq_cst);
      const uint32_t pushed =
          bell_.pushed_sinks.load(std::memory_order_seq_cst);
      unarrived_ = -1;
      if (tr.Sweep(step)) continue;
      if (unarrived_ >= 0) {
        // A step waits for a rank to arrive: sleep until it does (or a peer
        // completes a step this rank waits for), not until anyone arrives.
        bell_.awaited.store(static_cast<uint32_t>(unarrived_), std::memory_order_seq_cst);
        Status err;
        if (!arrivals_->Arrived(unarrived_)) err = Idle(seen, [&] { return BlockedText(tr); });
        bell_.awaited.store(UINT32_MAX, std::memory_order_seq_cst);
        if (!err.ok()) return err;
        continue;
      }
      // Only copies that senders push remain: sleep until all are in.
      const int32_t left = OnlySinksLeft(tr);
      if (left < 0) continue;
      if (left > 0) {
        const uint32_t target = pushed + static_cast<uint32_t>(left);
        bell_.sink_target.store(target, std::memory_order_seq_cst);
        if (bell_.pushed_sinks.load(std::memory_order_seq_cst) < target) {
          Status err = Idle(seen, [&] { return BlockedText(tr); });
          if (!err.ok()) return err;
        }
        bell_.sink_target.store(UINT32_MAX, std::memory_order_seq_cst);
        continue;
      }
      Status err = Idle(seen, [&] { return BlockedText(tr); });
      if (!err.ok()) return err;
    }
    const bool aliased = a_.in == a_.out;
    if (!aliased) Finalize();
    // Value semantics for XLA: our buffers may be reused as soon as we
    // return, so wait until every receiver has read every SEND.
    bell_.final_wait.store(1, std::memory_order_seq_cst);
    for (int32_t i : rs_.sends) {
      const Step& st = rs_.steps[i];
      while (!PeerDone(st.peer, st.match)) {
        const uint32_t seen = bell_.seq.load(std::memory_order_seq_cst);
        if (PeerDone(st.peer, st.match)) break;
        Status err = Idle(seen, [&] {
          std::ostringstream os;
          os << "all steps are done, waiting for rank " << st.peer
             << " to read chunk " << st.chunk << " (" << StepText(rs_, i)
             << ", read by its step " << st.match << ") before returning";
          return os.str();
        });
        if (!err.ok()) return err;
      }
    }
    if (aliased) Finalize();
    return Status();
  }

 private:
  std::atomic<uint32_t>& Flag(int64_t rank, int32_t idx) const {
    return flags_[s_.step_base[rank] + idx];
  }
  bool PeerDone(int64_t peer, int32_t idx) const {
    return Flag(peer, idx).load(std::memory_order_seq_cst) == done_;
  }
  void SetDone(int32_t i) {
    Flag(a_.rank, i).store(done_, std::memory_order_seq_cst);
  }
  void Publish(int32_t i, int64_t peer) {
    SetDone(i);
    slot_.bell(peer).Ring();
  }
  // A RECV acknowledges its SEND. A SEND of the input only needs the ack for
  // its rank's final wait (and, in place, before the rank overwrites the
  // chunk), so the sender is woken only once it waits there.
  void PublishRecv(int32_t i) {
    const Step& st = rs_.steps[i];
    SetDone(i);
    Bell& b = slot_.bell(st.peer);
    if (!st.src_input || PeerInPlace(st.peer) ||
        b.final_wait.load(std::memory_order_seq_cst) != 0) {
      b.Ring();
    }
  }
  // Rank p has arrived and agrees with this one: steps may read from and
  // write into its buffers. Early start checks each peer once (Agrees).
  bool PeerReady(int64_t p) {
    if (ready_[p]) return true;
    if (!arrivals_->Arrived(p)) {
      if (unarrived_ < 0) unarrived_ = p;
      return false;
    }
    if (!Agrees(slot_.info[a_.rank], slot_.info[p])) {
      mismatch_ = true;
      return false;
    }
    if (!remote_.empty()) LearnWhere(p);
    ready_[p] = 1;
    return true;
  }

  // Host transport: whether rank r lives in another process, and (when it
  // does not) which of its chunks are private (MarkPrivateChunks).
  void LearnWhere(int64_t r) {
    remote_[r] = slot_.info[r].process != slot_.info[a_.rank].process;
    if (!remote_[r] && !private_.empty()) MarkPrivateChunks(r, &private_[r * s_.nchunks]);
  }

  bool PeerInPlace(int64_t peer) const {
    const RankInfo& pi = slot_.info[peer];
    return CpuInPlace(s_, pi.in == pi.out);
  }

  // Claims RECV_COPY `idx` of rank `rank` for execution (by its owner or by
  // its sender pushing the value). False when already claimed or done.
  bool Claim(int64_t rank, int32_t idx) {
    std::atomic<uint32_t>& f = Flag(rank, idx);
    uint32_t x = f.load(std::memory_order_seq_cst);
    if (x == claimed_ || x == done_) return false;
    return f.compare_exchange_strong(x, claimed_, std::memory_order_seq_cst);
  }

  // The receiver-side conditions of peer v's RECV_COPY r: its local
  // dependencies are done and the earlier SENDs of the chunk it overwrites
  // have been read.
  bool PeerRecvReady(int64_t v, int32_t r) const {
    const RankSteps& rv = s_.ranks[v];
    const Step& st = rv.steps[r];
    for (int32_t k = st.deps_begin; k < st.deps_end; ++k) {
      const int32_t d = rv.deps[k];
      if (!rv.steps[d].trivially_done && !PeerDone(v, d)) return false;
    }
    for (int32_t k = st.guards_begin; k < st.guards_end; ++k) {
      if (GuardWaits(v, rv.guards[k], PeerInPlace(v))) return false;
    }
    return true;
  }

  // Whether a write of rank `r` (this rank, or a peer of its process) must
  // still wait on its earlier SEND `g` of the chunk it overwrites: until the
  // receiver has read the value. A value sent from the input is overwritten
  // only when `r` runs in place (the input is its accumulator); and a rank
  // of another process reads it from the arena, where the SEND itself copied
  // it (Stage), so then the write waits for that SEND only.
  bool GuardWaits(int64_t r, int32_t g, bool in_place) const {
    const Step& sg = s_.ranks[r].steps[g];
    if (sg.src_input && !in_place) return false;
    if (sg.src_input && Remote(sg.peer)) return !PeerDone(r, g);
    return !PeerDone(sg.peer, sg.match);
  }

  // After the write `group[n-1]` (completing `group`), the SENDs of the
  // chunk that depend on it go to peers whose RECV_COPY is ready: claim
  // those and write the value straight into the peers' accumulators in the
  // same pass (saves the peers re-reading it). Fills sends/dsts/peers.
  // *all_pushed: every SEND of the chunk after the write was pushed, so no
  // peer reads our accumulator chunk and it may bypass the cache too.
  int CollectPushes(const StepTracker& tr, int32_t* group, int n,
                    int32_t* sends, PushDst* dsts, bool* all_pushed) {
    *all_pushed = false;
    if (!push_) return 0;
    const Step& w = rs_.steps[group[n - 1]];
    const int64_t off = s_.chunk_offset[w.chunk];
    int np = 0;
    int nsends = 0;
    for (int32_t k = w.succ_begin; k < w.succ_end; ++k) {
      const int32_t si = rs_.succs[k];
      const Step& snd = rs_.steps[si];
      if (snd.op != Op::kSend || snd.chunk != w.chunk) continue;
      ++nsends;
      if (np == kMaxPush) continue;
      const Step& rcv = s_.ranks[snd.peer].steps[snd.match];
      if (rcv.op != Op::kRecvCopy) continue;
      if (!PeerReady(snd.peer)) continue;  // it pulls once it is there
      if (Remote(snd.peer)) continue;  // its memory here is the arena only: it pulls
      if (!tr.DepsDoneExcept(si, group, n)) continue;
      if (!PeerRecvReady(snd.peer, snd.match)) continue;
      if (!Claim(snd.peer, snd.match)) continue;
      sends[np] = si;
      dsts[np].p = AccOf(snd.peer, snd.chunk, off);
      dsts[np].nt = StreamTo(snd.peer, rcv, off);
      dsts[np].rank = snd.peer;
      ++np;
    }
    // Sends of the chunk that are not direct successors would read it too.
    *all_pushed = np > 0 && np == nsends && nsends == w.nsends_after;
    return np;
  }

  void FinishPushes(StepTracker& tr, const int32_t* sends, int np) {
    for (int e = 0; e < np; ++e) {
      const Step& snd = rs_.steps[sends[e]];
      // The RECV's flag first: a receiver that sees the SEND done but not
      // its RECV concludes nobody pushes it and pulls it itself.
      Flag(snd.peer, snd.match).store(done_, std::memory_order_seq_cst);
      tr.MarkDone(sends[e]);
      SetDone(sends[e]);
      Bell& b = slot_.bell(snd.peer);
      if (s_.ranks[snd.peer].steps[snd.match].sink) {
        // Wake the receiver only once all the copies it sleeps on are in.
        const uint32_t c =
            b.pushed_sinks.fetch_add(1, std::memory_order_seq_cst) + 1;
        if (c >= b.sink_target.load(std::memory_order_seq_cst)) b.Ring();
      } else {
        b.Ring();
      }
    }
  }

  // Host transport: the chunks of rank r's accumulator that no peer reads
  // (written there, never sent from the accumulator, inside the output
  // range) live in r's output buffer, so they need no copy at the end, and
  // only peers of r's process (which see that buffer) push into them; the
  // others live in the arena, where every peer reads them.
  void MarkPrivateChunks(int64_t r, uint8_t* marks) const {
    const RankSteps& rs = s_.ranks[r];
    for (int64_t c = 0; c < s_.nchunks; ++c) marks[c] = rs.chunk_written[c] && InOutput(r, c);
    for (const Step& st : rs.steps) {
      if (st.op == Op::kSend && !st.src_input) marks[st.chunk] = 0;
    }
  }
  bool Private(int64_t r, int32_t chunk) const {
    return !private_.empty() && private_[r * s_.nchunks + chunk] != 0;
  }
  bool Private(int32_t chunk) const { return Private(a_.rank, chunk); }
  // Where chunk `chunk` (at element `off`) of the accumulator of rank `r`
  // (this rank, or a peer of this process) lives.
  char* AccOf(int64_t r, int32_t chunk, int64_t off) const {
    return Private(r, chunk) ? OutOf(r, off) : AccAt(r, off);
  }
  // Rank `peer` lives in another process (host transport): it reads this
  // rank's input from the arena, once the SEND that stages it is done.
  // False while that is unknown (early start, a peer not there yet): a write
  // then waits until the peer has read the value itself (GuardWaits), which
  // covers both cases.
  bool Remote(int64_t peer) const { return !remote_.empty() && remote_[peer] == 1; }
  // A SEND of the input stages the chunk unless the peer is known to read
  // the input itself (a peer not there yet may be in another process).
  bool ReadsArena(int64_t peer) const { return !remote_.empty() && remote_[peer] != 0; }
  void Stage(int32_t chunk) {
    if (stage_ == nullptr || staged_[chunk]) return;
    const int64_t lo = s_.InputOffset(a_.rank);
    ForPieces(chunk, nullptr, nullptr, 0, [&](int64_t o, int64_t l, char*, const PushDst*) {
      std::memcpy(stage_ + (o - lo) * tsize_, InputAt(a_.rank, o), l * tsize_);
    });
    staged_[chunk] = 1;
  }
  char* OwnAcc(int32_t chunk, int64_t off) const { return AccOf(a_.rank, chunk, off); }
  // Chunk `c` lies inside rank `r`'s output range.
  bool InOutput(int64_t r, int64_t c) const {
    const int64_t lo = s_.OutputOffset(r);
    return s_.chunk_offset[c] >= lo && s_.chunk_offset[c] + s_.chunk_length[c] <= lo + s_.out_count;
  }
  // The collective's vector is large enough for non-temporal stores.
  bool Large() const {
    return nt_bytes_ > 0 && s_.count * static_cast<int64_t>(asize_) >= nt_bytes_;
  }
  // A final value written by `recv` of rank `r` into its output, read by
  // nobody soon.
  bool StreamTo(int64_t r, const Step& recv, int64_t off) const {
    if (Private(r, recv.chunk)) return !recv.sent_after && Large();
    return UseStreamStores(r, recv, off);
  }
  bool OwnStream(const Step& st, int64_t off) const { return StreamTo(a_.rank, st, off); }

  // Host transport: the last write of a chunk of the arena (one that ranks
  // of other processes read) writes its final value into this rank's output
  // too, in the same pass, so that Finalize need not copy it back. Nobody
  // reads the output's chunk during the call: in place, the chunk's first
  // write waited for the readers of its input value (GuardWaits), and where
  // the input was copied whole, every peer reads the copy. Sets *dst and
  // returns 1, or returns 0 where the chunk needs no such write.
  int OutputCopy(const Step& last, PushDst* dst) {
    if (private_.empty() || !last.last_write || Private(last.chunk) ||
        !InOutput(a_.rank, last.chunk)) {
      return 0;
    }
    dst->p = static_cast<char*>(a_.out) +
             (s_.chunk_offset[last.chunk] - s_.OutputOffset(a_.rank)) * tsize_;
    dst->nt = Large();
    dst->rank = -1;
    out_written_[last.chunk] = 1;
    return 1;
  }

  // Where element `off` of rank `rank`'s accumulator lives: in its output
  // segments for a segmented call that accumulates there (RankInfo::
  // acc_segs), in its output buffer for its output range when
  // RankInfo::acc_out is set (a reduce_scatter's shard), else in
  // RankInfo::acc.
  char* AccAt(int64_t rank, int64_t off) const {
    const RankInfo& ri = slot_.info[rank];
    if (ri.acc_segs) {
      const int64_t i = Segment(ri.seg_offset, ri.nsegs, off);
      return static_cast<char*>(ri.out_segs[i]) + (off - ri.seg_offset[i]) * asize_;
    }
    if (ri.acc_out != nullptr) {
      const int64_t lo = s_.OutputOffset(rank);
      if (off >= lo && off < lo + s_.out_count) {
        return static_cast<char*>(ri.acc_out) + (off - lo) * asize_;
      }
    }
    return static_cast<char*>(ri.acc) + off * asize_;
  }
  // Element `off` of rank `rank`'s accumulator is in its output buffer (not
  // a workspace) and the collective's vector is large.
  bool StreamEligible(int64_t rank, int64_t off) const {
    if (!same_types_ || !Large()) return false;
    const RankInfo& ri = slot_.info[rank];
    if (ri.acc == ri.out) return true;  // (a segmented call's too: acc_segs)
    const int64_t lo = s_.OutputOffset(rank);
    return ri.acc_out != nullptr && off >= lo && off < lo + s_.out_count;
  }
  // The value a RECV writes is not read again soon (no later SEND of it).
  bool UseStreamStores(int64_t rank, const Step& recv, int64_t off) const {
    return !recv.sent_after && StreamEligible(rank, off);
  }

  // Where `st` reads element `off` of its chunk: the peer's input or accumulator.
  Src SourceOf(const Step& st, int64_t off) const {
    if (st.src_input) return {InputAt(st.peer, off), true};
    return {AccAt(st.peer, off), false};
  }

  // Element `off` of the vector in rank `rank`'s input (an allgather's input
  // is its shard of the vector; a segmented call's, several buffers).
  const char* InputAt(int64_t rank, int64_t off) const {
    const RankInfo& ri = slot_.info[rank];
    if (ri.nsegs == 0) {
      const char* in = rank == a_.rank ? in_ : static_cast<const char*>(ri.in);
      return in + (off - s_.InputOffset(rank)) * tsize_;
    }
    const int64_t i = Segment(ri.seg_offset, ri.nsegs, off);
    return static_cast<const char*>(ri.in_segs[i]) + (off - ri.seg_offset[i]) * tsize_;
  }
  static int64_t Segment(const int64_t* seg_offset, int32_t nsegs, int64_t off) {
    return std::upper_bound(seg_offset + 1, seg_offset + nsegs + 1, off) - (seg_offset + 1);
  }

  // Runs f(o, l, d, p) for each piece [o, o + l) of chunk `chunk` that lies
  // in one segment of the inputs and outputs (all of it unless the call is
  // segmented: the segments of this rank and of the peers of its process
  // match, CheckConsistent), where d and p are `dst` (this rank's accumulator
  // at the chunk's start, or null) and the pushes' destinations (peers'
  // accumulators, or this rank's output: PushDst::rank) at element o. In a
  // segmented call every piece's addresses are looked up anew (AccOf, OutOf).
  template <typename F>
  void ForPieces(int32_t chunk, char* dst, const PushDst* pushes, int nd, F&& f) const {
    const int64_t off = s_.chunk_offset[chunk];
    const int64_t len = s_.chunk_length[chunk];
    if (a_.nsegs == 0) {
      f(off, len, dst, pushes);
      return;
    }
    PushDst moved[kMaxPush + 1];
    for (int64_t o = off; o < off + len;) {
      const int64_t end =
          std::min(off + len, a_.seg_offset[Segment(a_.seg_offset, a_.nsegs, o) + 1]);
      for (int j = 0; j < nd; ++j) {
        moved[j] = pushes[j];
        moved[j].p = pushes[j].rank >= 0 ? AccOf(pushes[j].rank, chunk, o) : OutOf(a_.rank, o);
      }
      f(o, end - o, dst == nullptr ? nullptr : AccOf(a_.rank, chunk, o), moved);
      o = end;
    }
  }

  bool TryRun(StepTracker& tr, int32_t i) {
    const Step& st = rs_.steps[i];
    if (st.op == Op::kSend) {
      tr.MarkDone(i);
      // A value sent from the input is readable from the start (the input
      // never changes while the collective runs), so its receiver does not
      // wait for this flag and need not be woken; except a receiver in
      // another process (host transport), which reads the copy staged now.
      if (st.src_input && !ReadsArena(st.peer)) {
        SetDone(i);
      } else {
        if (st.src_input) Stage(st.chunk);
        Publish(i, st.peer);
      }
      return true;
    }
    if (st.op == Op::kRecvCopy) {
      const uint32_t x = Flag(a_.rank, i).load(std::memory_order_seq_cst);
      if (x == done_) {  // the sender pushed the value
        tr.MarkDone(i);
        return true;
      }
      if (x == claimed_) {  // the sender is pushing it right now
        blocked_ = i;
        blocked_guard_ = -1;
        return false;
      }
    }
    if (!PeerReady(st.peer)) {
      blocked_ = i;
      blocked_guard_ = -1;
      return false;
    }
    if ((!st.src_input || Remote(st.peer)) && !PeerDone(st.peer, st.match)) {
      blocked_ = i;
      blocked_guard_ = -1;
      return false;
    }
    for (int32_t k = st.guards_begin; k < st.guards_end; ++k) {
      if (GuardWaits(a_.rank, rs_.guards[k], inplace_)) {
        blocked_ = i;
        blocked_guard_ = rs_.guards[k];
        return false;
      }
    }
    const int64_t off = s_.chunk_offset[st.chunk];
    char* dst = OwnAcc(st.chunk, off);
    int32_t push_sends[kMaxPush];
    PushDst push_dsts[kMaxPush + 1];  // and this rank's output (OutputCopy)
    if (st.op == Op::kRecvCopy) {
      if (!Claim(a_.rank, i)) return false;  // the sender got there first
      int32_t self = i;
      bool all_pushed;
      const int np =
          CollectPushes(tr, &self, 1, push_sends, push_dsts, &all_pushed);
      const int nd = np + OutputCopy(st, push_dsts + np);
      ForPieces(st.chunk, dst, push_dsts, nd, [&](int64_t o, int64_t l, char* d, const PushDst* pd) {
        const Src src = SourceOf(st, o);
        if (nd > 0) {
          kt_.produce(d, all_pushed && StreamEligible(a_.rank, off), src, nullptr, 0, l, pd, nd);
        } else if (OwnStream(st, off)) {
          StreamCopy(d, src.p, l * static_cast<int64_t>(asize_));
        } else {
          kt_.copy(d, src, l);
        }
      });
      tr.MarkDone(i);
      PublishRecv(i);
      FinishPushes(tr, push_sends, np);
      return true;
    }
    int32_t group[kMaxFuse];
    int k = 0;
    group[k++] = i;
    for (int32_t j = st.fuse_next; j != -1 && k < kMaxFuse;) {
      const Step& sj = rs_.steps[j];
      if (!PeerReady(sj.peer) ||
          ((!sj.src_input || Remote(sj.peer)) && !PeerDone(sj.peer, sj.match)) ||
          !tr.DepsDoneExcept(j, group, k)) {
        break;
      }
      group[k++] = j;
      j = sj.fuse_next;
    }
    const Step& last = rs_.steps[group[k - 1]];
    bool all_pushed = false;
    const int np = last.last_write ? CollectPushes(tr, group, k, push_sends,
                                                   push_dsts, &all_pushed)
                                   : 0;
    const int nd = np + OutputCopy(last, push_dsts + np);
    ForPieces(st.chunk, dst, push_dsts, nd, [&](int64_t o, int64_t l, char* d, const PushDst* pd) {
      Src srcs[kMaxFuse];  // (the fused steps reduce the same chunk)
      for (int m = 0; m < k; ++m) srcs[m] = SourceOf(rs_.steps[group[m]], o);
      const Src base = st.first_write ? Src{InputAt(a_.rank, o), true} : Src{d, false};
      if (nd > 0) {
        kt_.produce(d, all_pushed && StreamEligible(a_.rank, off), base, srcs, k, l, pd, nd);
      } else if (last.last_write && OwnStream(last, off)) {
        // The final value, read by nobody soon (a reduce_scatter's shard).
        kt_.produce(d, true, base, srcs, k, l, nullptr, 0);
      } else {
        kt_.reduce(d, base, srcs, k, l);
      }
    });
    for (int m = 0; m < k; ++m) {
      tr.MarkDone(group[m]);
      PublishRecv(group[m]);
    }
    FinishPushes(tr, push_sends, np);
    return true;
  }

  std::string BlockedText(const StepTracker& tr) const {
    std::ostringstream os;
    os << tr.NumDone() << " of " << tr.NumSteps() << " steps done";
    if (blocked_ >= 0) {
      const Step& st = rs_.steps[blocked_];
      if (blocked_guard_ < 0 && !ready_[st.peer]) {
        os << "; " << StepText(rs_, blocked_) << " waits for rank " << st.peer << " to arrive";
      } else if (blocked_guard_ < 0) {
        os << "; " << StepText(rs_, blocked_) << " waits for rank " << st.peer
           << " to complete its step " << st.match << " (SEND chunk "
           << st.chunk << " to rank " << a_.rank << ")";
      } else {
        const Step& sg = rs_.steps[blocked_guard_];
        if (sg.src_input && Remote(sg.peer)) {
          os << "; " << StepText(rs_, blocked_) << " waits for its " << StepText(rs_, blocked_guard_)
             << " to copy the chunk into the arena before overwriting it";
        } else {
          os << "; " << StepText(rs_, blocked_) << " waits for rank " << sg.peer
             << " to read chunk " << sg.chunk << " (its step " << sg.match
             << ") before overwriting it";
        }
      }
    }
    return os.str();
  }

  // Nothing runnable: check for failure and deadline, then sleep until a
  // peer rings our bell.
  // When every step left is a RECV_COPY sink that only its sender's push
  // can complete now, their number; -1 when one was completed since the
  // last sweep (sweep again); 0 otherwise (wait as usual).
  int32_t OnlySinksLeft(const StepTracker& tr) const {
    if (!push_) return 0;
    int32_t left = 0;
    for (int32_t i = 0; i < tr.NumSteps(); ++i) {
      if (tr.Done(i)) continue;
      const Step& st = rs_.steps[i];
      if (!st.sink || st.src_input) return 0;  // inputs' values are not pushed
      // Read the SEND's flag before the RECV's: a pusher marks the RECV
      // done before the SEND, so a done SEND with a RECV not done means
      // nobody pushes it: ours to pull (and the SEND rang our bell).
      const bool send_done = PeerDone(st.peer, st.match);
      if (Flag(a_.rank, i).load(std::memory_order_seq_cst) == done_) {
        return -1;  // pushed after the sweep looked at it
      }
      if (send_done) return 0;
      ++left;
    }
    return left;
  }

  template <typename Describe>
  Status Idle(uint32_t seen, Describe&& describe) {
    if (slot_.failed().load(std::memory_order_seq_cst) != 0) {
      return slot_.FailStatus().Prefixed("jax_blink: " + Where(a_, generation_) +
                                         ": ");
    }
    const auto now = Clock::now();
    if (slot_.peers_gone != nullptr && now - peers_checked_ >= std::chrono::milliseconds(100)) {
      peers_checked_ = now;
      const std::string gone = slot_.peers_gone(slot_);
      if (!gone.empty()) {
        if (arrivals_ != nullptr) {  // ranks of that process that never arrived are named
          Status missing = arrivals_->AbortMissing();
          if (!missing.ok()) return missing;
        }
        return Status::DeadlineExceeded("jax_blink: " + Where(a_, generation_) + " at rank " +
                                        std::to_string(a_.rank) + ": " + gone + " (while " +
                                        describe() + ")");
      }
    }
    if (now >= deadline_) {
      if (arrivals_ != nullptr) {  // a rank that never arrived is the one to name
        Status missing = arrivals_->AbortMissing();
        if (!missing.ok()) return missing;
      }
      std::ostringstream os;
      os << "jax_blink: timed out after " << a_.timeout_ms << " ms executing "
         << Where(a_, generation_) << " at rank " << a_.rank << ": "
         << describe();
      return Status::DeadlineExceeded(os.str());
    }
    const int64_t left_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(deadline_ - now)
            .count();
    bell_.Wait(seen, std::min<int64_t>(left_ns, 100000000), spin_, yield_ns_);
    return Status();
  }

  // OUT = ACC (rounded) for chunks written here; OUT = IN for the others
  // (an allgather's unwritten chunks are its own shard). A reduce_scatter's
  // output is its shard of ACC only.
  void Finalize() {
    for (int32_t c = 0; c < s_.nchunks; ++c) {
      if (!InOutput(a_.rank, c)) continue;
      const bool written = rs_.chunk_written[c] != 0;
      if (written && !out_written_.empty() && out_written_[c]) continue;  // by OutputCopy
      char* acc = written ? OwnAcc(c, s_.chunk_offset[c]) : nullptr;
      ForPieces(c, acc, nullptr, 0, [&](int64_t o, int64_t l, char* from, const PushDst*) {
        char* dst = OutOf(a_.rank, o);
        if (written) {
          if (from != dst) kt_.finalize(dst, from, l);
        } else {
          const char* src = InputAt(a_.rank, o);
          if (dst != src) std::memcpy(dst, src, l * tsize_);
        }
      });
    }
  }
  // Element `off` of the vector in the output of rank `r` (this rank, or a
  // peer of this process; a segmented call's, several buffers).
  char* OutOf(int64_t r, int64_t off) const {
    const RankInfo& ri = slot_.info[r];
    if (ri.nsegs == 0) {
      char* out = r == a_.rank ? static_cast<char*>(a_.out) : static_cast<char*>(ri.out);
      return out + (off - s_.OutputOffset(r)) * tsize_;
    }
    const int64_t i = Segment(ri.seg_offset, ri.nsegs, off);
    return static_cast<char*>(ri.out_segs[i]) + (off - ri.seg_offset[i]) * tsize_;
  }

  const ExecArgs& a_;
  const Schedule& s_;
  const RankSteps& rs_;
  Slot& slot_;
  const uint32_t done_;     // flag value: step done in this call
  const uint32_t claimed_;  // flag value: RECV_COPY being executed
  const int64_t generation_;
  const Clock::time_point deadline_;
  std::atomic<uint32_t>* const flags_;
  Bell& bell_;
  const KernelTable& kt_;
  const size_t tsize_;
  const size_t asize_;
  const char* const in_;
  const int spin_;
  const int64_t nt_bytes_;
  const bool push_;
  const bool same_types_;
  // The input is the accumulator (CpuInPlace): a write of a chunk also waits
  // until the receivers of its input value read it.
  const bool inplace_;
  const int64_t yield_ns_;
  Arrivals* const arrivals_;
  uint8_t* ready_ = nullptr;  // per rank: PeerReady (thread-local storage)
  bool mismatch_ = false;
  int64_t unarrived_ = -1;  // in the last sweep, the first peer a step waited for to arrive
  int32_t blocked_ = -1;
  int32_t blocked_guard_ = -1;
  std::vector<uint8_t> private_;  // per rank x chunk: MarkPrivateChunks (empty: none)
  // per rank: in another process (1), in this one (0), or not known yet
  // (kWhereUnknown); empty: all in this one
  std::vector<uint8_t> remote_;
  static constexpr uint8_t kWhereUnknown = 2;
  std::vector<uint8_t> out_written_;  // per chunk: OutputCopy wrote the output (host transport)
  char* stage_ = nullptr;         // see the constructor
  std::vector<uint8_t> staged_;   // per chunk: copied to stage_
  Clock::time_point peers_checked_ = Clock::now();
};

// XLA hands us freshly mapped output buffers; at 4 KiB a page, first-touch
// page faults cost more than the collective itself for large outputs. Ask
// for transparent huge pages on the 2 MiB-aligned interior (a hint: no
// effect where THP is disabled, and only the policy of that range changes).
void AdviseHugePages(void* p, size_t bytes, int64_t min_bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (min_bytes <= 0 || bytes < static_cast<size_t>(min_bytes)) return;
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const uintptr_t lo =
      (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHuge - 1);
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
  (void)min_bytes;
#endif
}

ExecTunables& MutableTunables() {
  static ExecTunables t;  // the defaults until SetExecTunables
  return t;
}
}  // namespace

const ExecTunables& GetExecTunables() { return MutableTunables(); }
void SetExecTunables(const ExecTunables& t) { MutableTunables() = t; }

WorkspacePool::~WorkspacePool() {
  for (void* p : all_) std::free(p);
}

void* WorkspacePool::Acquire() {
  std::lock_guard<std::mutex> lk(mu_);
  if (!free_.empty()) {
    void* p = free_.back();
    free_.pop_back();
    return p;
  }
  const size_t cap = (static_cast<size_t>(bytes_) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, cap);
  if (p != nullptr) all_.push_back(p);
  return p;
}

void WorkspacePool::Release(void* p) {
  if (p == nullptr) return;
  std::lock_guard<std::mutex> lk(mu_);
  free_.push_back(p);
}

namespace {
// The call site as every process names it: the op id counts call sites per
// lowered module, so two programs can share one; the schedule tells most of
// them apart, and ranks of one site pair by generation in call order.
int64_t HostSite(const ExecArgs& a) {
  const uint64_t h = (static_cast<uint64_t>(a.op_id) * 0x9E3779B97F4A7C15ull) ^
                     a.schedule->fingerprint;
  return static_cast<int64_t>(h & 0x7fffffffffffffffull);
}

// A segmented call (ExecArgs::nsegs): an allreduce whose segments cover the
// vector, each with its two buffers, the first ones `in` and `out`.
Status CheckSegments(const ExecArgs& a) {
  const Schedule& s = *a.schedule;
  std::string why;
  if (s.collective != Collective::kAllReduce) {
    why = "only an allreduce takes its vector in several buffers";
  } else if (a.seg_offset == nullptr || a.in_segs == nullptr || a.out_segs == nullptr ||
             a.seg_offset[0] != 0 || a.seg_offset[a.nsegs] != a.in_count) {
    why = "the segments do not cover the vector's " + std::to_string(a.in_count) + " elements";
  } else if (a.in != a.in_segs[0] || a.out != a.out_segs[0]) {
    why = "the first segment's buffers are not the call's";
  } else {
    for (int32_t i = 0; i < a.nsegs && why.empty(); ++i) {
      if (a.seg_offset[i + 1] <= a.seg_offset[i]) {
        why = "segment " + std::to_string(i) + " is empty or out of order";
      } else if (a.in_segs[i] == nullptr || a.out_segs[i] == nullptr) {
        why = "segment " + std::to_string(i) + " has a null buffer";
      } else if (a.in_segs[i] == a.out_segs[i]) {
        why = "segment " + std::to_string(i) + "'s output aliases its input";
      }
    }
  }
  if (why.empty()) return Status();
  return Status::InvalidArgument("the call's " + std::to_string(a.nsegs) + " buffers: " + why);
}

Status CheckRank(const ExecArgs& a) {
  if (a.rank >= 0 && a.rank < a.schedule->nranks) return Status();
  return Status::InvalidArgument(
      "jax_blink: op_id=" + std::to_string(a.op_id) + " group=" + std::to_string(a.group) +
      ": rank " + std::to_string(a.rank) + " is not in [0, " +
      std::to_string(a.schedule->nranks) + ")");
}
}  // namespace

Status ReserveGeneration(ExecArgs* a) {
  Status st = CheckRank(*a);
  if (!st.ok()) return st;
  if (a->transport == kTransportHost) {
    a->generation = HostReserve(HostSite(*a), a->group, a->rank);
    return Status();
  }
  return Rendezvous::Global().Reserve(RendezvousKey{a->run_id, a->op_id, a->group}, a->rank,
                                      a->schedule->nranks, &a->generation);
}

namespace {
// Early start: some rank published an error or two ranks disagree. As at a
// barrier, every rank returns CheckConsistent's verdict, made once all have
// arrived (or the error naming those that never did); the work done before
// is discarded.
Status Disagreement(Arrivals& arrivals, Slot& slot, const std::string& where) {
  Status st = arrivals.AwaitAll();
  if (st.ok()) st = CheckConsistent(slot, where);
  if (st.ok()) {
    st = Status::Internal("jax_blink: " + where +
                          ": a rank found a peer that disagrees, but CheckConsistent agrees");
  }
  slot.FailAll(st);
  return st;
}

// One line per executed collective on stderr (JAX_BLINK_DEBUG): its call
// site, rank, bytes, microseconds in all and waiting for the peers to join.
void DebugLog(const ExecArgs& a, const ExecResult& res, Clock::time_point t0, int64_t wait_us) {
  const int64_t us =
      std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count();
  std::fprintf(
      stderr,
      "jax_blink: op=%" PRId64 " group=%" PRId64 " rank=%" PRId64 " gen=%" PRId64
      " run=%" PRId64 " bytes=%" PRId64 " us=%" PRId64 " wait_us=%" PRId64
      " start_us=%" PRId64 "%s %s%s\n",
      a.op_id, a.group, a.rank, res.generation, a.run_id,
      static_cast<int64_t>(a.in_count * DTypeSize(a.schedule->dtype)), us, wait_us,
      static_cast<int64_t>(
          std::chrono::duration_cast<std::chrono::microseconds>(t0.time_since_epoch()).count()),
      a.transport == kTransportHost ? " transport=host" : "",
      res.status.ok() ? "ok" : "error: ", res.status.message.c_str());
}

// A rank of a call whose ranks live in several processes of this host: the
// chunks of its input that other processes read are copied into its
// process's arena, its accumulator lives there (but for the chunks only its
// process reads: RankRunner::MarkPrivateChunks), and the ranks meet in the
// host's slot table (sync/host_rendezvous.h); the same RankRunner then runs
// its steps on that slot.
ExecResult ExecuteCpuHost(const ExecArgs& a, Clock::time_point t0, Clock::time_point deadline,
                          int64_t timeout_ms) {
  ExecResult res;
  const Schedule& s = *a.schedule;
  HostRankArgs h;
  h.site = HostSite(a);
  h.op_id = a.op_id;
  h.group = a.group;
  h.rank = a.rank;
  h.nranks = s.nranks;
  h.total_steps = s.total_steps;
  h.fingerprint = s.fingerprint;
  h.count = a.in_count;
  h.dtype = a.dtype;
  h.error = a.local_error.ok() ? CheckBuffers(s, a.dtype, a.in_count, a.out_count, a.in, a.out)
                               : a.local_error;
  if (h.error.ok() && a.nsegs > 0) h.error = CheckSegments(a);
  h.in = a.in;
  h.out = a.out;
  if (h.error.ok()) {
    h.nsegs = a.nsegs;
    h.seg_offset = a.seg_offset;
    h.in_segs = a.in_segs;
    h.out_segs = a.out_segs;
  }
  h.in_bytes = h.error.ok() ? a.in_count * static_cast<int64_t>(DTypeSize(s.dtype)) : 0;
  // The rank and its peers in this process read the input where XLA put it,
  // and the rank copies into the arena only the chunks it sends to other
  // processes, when it sends them (RankRunner::Stage); in place too, where
  // the writes of a chunk wait for those copies (GuardWaits). Only an output
  // that overwrites its input without running in place (CpuInPlace: a
  // float16 accumulator, say) copies the whole input into the arena first,
  // where every peer reads it.
  const bool aliased = a.in == a.out;
  h.stage_input = aliased && !CpuInPlace(s, aliased);
  h.acc_bytes = s.count * static_cast<int64_t>(AccSize(s.dtype));
  const int64_t generation =
      a.generation >= 0 ? a.generation : HostReserve(h.site, a.group, a.rank);
  res.generation = generation;
  if (h.error.ok() && a.nsegs == 0) {  // as in-process: the output is this process's own memory
    AdviseHugePages(a.out, s.out_count * DTypeSize(s.dtype), GetExecTunables().hugepage_bytes);
  }
  HostTicket ticket;
  const ExecTunables& tun = GetExecTunables();
  const bool early = !tun.barrier;
  res.status = HostJoin(h, generation, deadline, timeout_ms, &ticket, early);
  const int64_t wait_us =
      std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count();
  if (res.status.ok()) {
    Slot& slot = ticket.view;
    const std::string where = Where(a, generation);
    if (!early) res.status = CheckConsistent(slot, where);
    const auto limit = deadline + std::chrono::milliseconds(timeout_ms) + std::chrono::seconds(1);
    if (res.status.ok()) {
      // The rank writes only its own output. With the input copied whole,
      // it and its peers read that copy; else the input itself, and peers of
      // other processes the chunks Stage() copies.
      ExecArgs staged = a;
      if (h.stage_input) staged.in = slot.info[a.rank].in;
      HostArrivals arrivals(&ticket, deadline, timeout_ms);
      RankRunner runner(staged, slot, slot.epoch, generation, deadline,
                        h.stage_input ? nullptr : static_cast<char*>(ticket.staging),
                        early ? &arrivals : nullptr);
      res.status = runner.Run();
      if (res.status.ok() && runner.Mismatched()) res.status = Disagreement(arrivals, slot, where);
      if (!res.status.ok()) slot.Fail(a.rank, res.status);
      const Status all = slot.Finish(limit, tun.spin, tun.yield_ns);
      if (!all.ok()) res.status = all;
    } else {
      // Some checks only the ranks of this process can make (their segments,
      // which other processes cannot read): fail the call for the ranks of
      // other processes too, and leave once they know, as after a failed
      // run. This rank reports its own error.
      slot.Fail(a.rank, res.status);
      slot.Finish(limit, tun.spin, tun.yield_ns);
    }
    if (!res.status.ok() && res.status.kind == ErrorKind::kDeadlineExceeded &&
        res.status.message.find("has exited") == std::string::npos) {
      res.status.message += HostExitedText();
    }
  }
  HostLeave(&ticket);
  if (DebugEnabled()) DebugLog(a, res, t0, wait_us);
  return res;
}
}  // namespace

ExecResult ExecuteCpu(const ExecArgs& a) {
  ExecResult res;
  const auto t0 = Clock::now();
  const Schedule& s = *a.schedule;
  res.status = CheckRank(a);
  if (!res.status.ok()) return res;
  const int64_t timeout_ms = std::max<int64_t>(a.timeout_ms, 1);
  const auto deadline = t0 + std::chrono::milliseconds(timeout_ms);
  if (a.transport == kTransportHost) return ExecuteCpuHost(a, t0, deadline, timeout_ms);

  RankInfo info;
  info.error = a.local_error.ok()
                   ? CheckBuffers(s, a.dtype, a.in_count, a.out_count, a.in, a.out)
                   : a.local_error;
  if (info.error.ok() && a.nsegs > 0) info.error = CheckSegments(a);
  info.in = a.in;
  info.out = a.out;
  info.acc = a.out;
  info.acc_out = nullptr;
  info.nsegs = a.nsegs;
  info.seg_offset = a.seg_offset;
  info.in_segs = a.in_segs;
  info.out_segs = a.out_segs;
  // A segmented allreduce accumulates in its outputs, as a one-buffer call
  // does in its output, unless its dtype needs a wider accumulator.
  info.acc_segs = a.nsegs > 0 && !HasScratchAcc(s.dtype);
  info.count = a.in_count;
  info.dtype = a.dtype;
  info.nranks = s.nranks;
  info.total_steps = s.total_steps;
  info.fingerprint = s.fingerprint;
  const int64_t ws_bytes = CpuWorkspaceBytes(s, a.in == a.out);
  if (info.error.ok() && ws_bytes > 0) {
    // The accumulator lives in the caller's workspace (see CpuWorkspaceBytes).
    if (a.workspace == nullptr || a.workspace_bytes < ws_bytes) {
      info.error = Status::Internal(
          "the CPU executor needs a workspace of " + std::to_string(ws_bytes) +
          " bytes for the accumulator, got " + std::to_string(a.workspace_bytes) +
          (a.workspace == nullptr ? " (none)" : ""));
    }
    info.acc = a.workspace;
    // A reduce_scatter's output holds its shard of the accumulator (where
    // its final value is reduced); the workspace only the chunks of other
    // shards that the rank reduces on their way (none in a star).
    if (!HasScratchAcc(s.dtype) && a.in != a.out && s.out_count != s.count) {
      info.acc_out = a.out;
    }
  }
  if (info.error.ok() && a.nsegs == 0) {
    AdviseHugePages(a.out, s.out_count * DTypeSize(s.dtype),
                    GetExecTunables().hugepage_bytes);
  }

  Ticket ticket;
  Rendezvous& rv = Rendezvous::Global();
  RendezvousKey key{a.run_id, a.op_id, a.group};
  const ExecTunables& tun = GetExecTunables();
  const bool early = !tun.barrier;
  res.status = rv.Join(key, a.rank, s.nranks, std::move(info), deadline,
                       timeout_ms, &ticket, tun.spin, tun.yield_ns, a.generation, early);
  // Time spent waiting for the other ranks to arrive (debug log; 0 or
  // nearly with early start, which waits inside the steps).
  const int64_t wait_us =
      std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0)
          .count();
  res.generation = ticket.generation;
  if (res.status.ok()) {
    Slot& slot = *ticket.slot;
    const std::string where = Where(a, ticket.generation);
    if (!early) res.status = CheckConsistent(slot, where);
    if (res.status.ok()) {
      InProcessArrivals arrivals(ticket, deadline, timeout_ms);
      RankRunner runner(a, slot, ticket.epoch, ticket.generation, deadline, nullptr,
                        early ? &arrivals : nullptr);
      res.status = runner.Run();
      if (res.status.ok() && runner.Mismatched()) res.status = Disagreement(arrivals, slot, where);
      if (!res.status.ok()) slot.Fail(a.rank, res.status);  // the first one wins
      // All or nothing: no rank returns before every rank's execution is
      // over (so no peer still reads its buffers), and every rank returns
      // the first failure if there was one. Peers started by their own
      // deadlines, at most one timeout after ours.
      const Status all =
          slot.Finish(deadline + std::chrono::milliseconds(timeout_ms) + std::chrono::seconds(1),
                      tun.spin, tun.yield_ns);
      if (!all.ok()) res.status = all;
    }
  }
  rv.Leave(&ticket);

  if (DebugEnabled()) DebugLog(a, res, t0, wait_us);
  return res;
}

}  // namespace jax_blink
