// float16 / bfloat16 <-> float32 conversions on the host. Widening is
// exact; narrowing rounds to nearest even, as CUDA's __float2half_rn and
// __float2bfloat16_rn do (NaN stays NaN, though its payload may differ from
// CUDA's; overflow rounds to Inf). Shared by the CPU executor, the stream
// emulator (testing/stream_emulator.h) and the device executor's interpreter
// (device/device_interp.h, compiled for the GPU too) so that all compute the
// same bits.
#ifndef JAX_BLINK_CC_CORE_HALF_H_
#define JAX_BLINK_CC_CORE_HALF_H_

#include <cstdint>
#include <cstring>

#include "core/hd.h"

namespace jax_blink {

JAX_BLINK_HD uint32_t BitsOf(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
JAX_BLINK_HD float FloatOf(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// IEEE binary16 -> binary32 (exact).
JAX_BLINK_HD float HalfToFloat(uint16_t h) {
  const uint32_t shifted_exp = 0x7c00u << 13;
  uint32_t o = (static_cast<uint32_t>(h) & 0x7fffu) << 13;
  const uint32_t exp = shifted_exp & o;
  o += (127u - 15u) << 23;
  if (exp == shifted_exp) {
    o += (128u - 16u) << 23;  // Inf / NaN
  } else if (exp == 0) {
    o += 1u << 23;  // zero / subnormal: renormalise
    o = BitsOf(FloatOf(o) - FloatOf(113u << 23));
  }
  o |= (static_cast<uint32_t>(h) & 0x8000u) << 16;
  return FloatOf(o);
}

// binary32 -> binary16, round to nearest even (NaN stays NaN, overflow
// rounds to Inf).
JAX_BLINK_HD uint16_t FloatToHalf(float f) {
  const uint32_t f32infty = 255u << 23;
  const uint32_t f16max = (127u + 16u) << 23;
  const uint32_t denorm_magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  uint32_t u = BitsOf(f);
  const uint32_t sign = u & 0x80000000u;
  u ^= sign;
  uint16_t o;
  if (u >= f16max) {
    o = (u > f32infty) ? 0x7e00 : 0x7c00;
  } else if (u < (113u << 23)) {
    // Subnormal or zero: let the FPU round by adding a magic number.
    o = static_cast<uint16_t>(BitsOf(FloatOf(u) + FloatOf(denorm_magic)) -
                              denorm_magic);
  } else {
    const uint32_t mant_odd = (u >> 13) & 1;
    u += ((15u - 127u) << 23) + 0xfffu;
    u += mant_odd;
    o = static_cast<uint16_t>(u >> 13);
  }
  return static_cast<uint16_t>(o | (sign >> 16));
}

JAX_BLINK_HD float BF16ToFloat(uint16_t h) {
  return FloatOf(static_cast<uint32_t>(h) << 16);
}

// binary32 -> bfloat16, round to nearest even (NaN stays a quiet NaN).
JAX_BLINK_HD uint16_t FloatToBF16(float f) {
  uint32_t u = BitsOf(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((u >> 16) | 0x40u);
  }
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_CORE_HALF_H_
