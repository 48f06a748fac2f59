// Element types of the schedule's buffers (docs/schedule_format.md: the
// dtype codes) and their sizes. float16 and bfloat16 accumulate in a
// separate float32 buffer (see half.h for the conversions).
#ifndef JAX_BLINK_CC_CORE_DTYPE_H_
#define JAX_BLINK_CC_CORE_DTYPE_H_

#include <cstddef>
#include <cstdint>

namespace jax_blink {

enum class DType : uint8_t {
  kF32 = 0,
  kF64 = 1,
  kF16 = 2,
  kBF16 = 3,
  kI32 = 4,
  kI64 = 5,
  kU32 = 6,
};
inline constexpr int kNumDTypes = 7;

// Size in bytes of one element of the buffers (input and output).
size_t DTypeSize(DType d);
// Size in bytes of one element of the accumulator (float32 for f16/bf16).
size_t AccSize(DType d);
// True when the accumulator is a separate float32 buffer (f16, bf16).
inline bool HasScratchAcc(DType d) {
  return d == DType::kF16 || d == DType::kBF16;
}
const char* DTypeName(DType d);

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_CORE_DTYPE_H_
