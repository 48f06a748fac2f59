// The elementwise operations of RECV_REDUCE (docs/schedule_format.md,
// "Semantics"): one definition for the host executors (cpu/executor_cpu.cc,
// testing/stream_emulator.cc) and the CUDA kernels (cuda/cuda_transport.cu),
// so that every executor computes the same bits.
//
// sum: a + b (integers wrap: signed types add as unsigned). max/min: a NaN
// operand counts as -inf (max) or +inf (min), so NaN never wins and an
// all-NaN reduction gives -inf / +inf, as XLA CPU's lax.pmax / lax.pmin do;
// of +0 and -0, max gives +0 and min -0 (on bits commutative and
// associative, so every schedule and fusion order gives the same result).
// The CPU executor's vector kernels (cpu/executor_cpu.cc, MinMaxVec) compute
// the same function in another form (NaN made the fill once, as a value
// enters the accumulator; a plain fold, redone exactly where a result is
// zero); tests/executor/test_v2_collectives.py checks both against each other
// and numpy on random bit patterns.
#ifndef JAX_BLINK_CC_CORE_REDUCE_OP_H_
#define JAX_BLINK_CC_CORE_REDUCE_OP_H_

#include <type_traits>

#include "core/hd.h"
#include "core/schedule.h"

namespace jax_blink {

template <ReduceOp kOp, typename A>
JAX_BLINK_HD A Combine(A a, A b) {
  if constexpr (kOp == ReduceOp::kSum) {
    if constexpr (std::is_integral<A>::value) {
      using U = typename std::make_unsigned<A>::type;
      return static_cast<A>(static_cast<U>(a) + static_cast<U>(b));
    } else {
      return a + b;
    }
  } else if constexpr (std::is_floating_point<A>::value) {
    constexpr bool kMax = kOp == ReduceOp::kMax;
    const A fill = kMax ? -static_cast<A>(__builtin_inf()) : static_cast<A>(__builtin_inf());
    a = a != a ? fill : a;  // NaN never wins
    b = b != b ? fill : b;
    // Equal values differ only as +0 / -0: +0 + -0 = +0 and -0 + -0 = -0
    // give max's sign, -(-a + -b) min's. Every operand is computed
    // unconditionally so that the compiler turns the selects into vector
    // blends (it does not speculate a floating-point add behind a branch).
    if (kMax) {
      const A zeros = a + b;
      return a > b ? a : (b > a ? b : (a == A(0) ? zeros : a));
    }
    const A zeros = -((-a) + (-b));
    return a < b ? a : (b < a ? b : (a == A(0) ? zeros : a));
  } else {
    if (kOp == ReduceOp::kMax) return a < b ? b : a;
    return b < a ? b : a;
  }
}

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_CORE_REDUCE_OP_H_
