#include "core/dtype.h"

namespace jax_blink {

size_t DTypeSize(DType d) {
  switch (d) {
    case DType::kF32:
      return 4;
    case DType::kF64:
      return 8;
    case DType::kF16:
      return 2;
    case DType::kBF16:
      return 2;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kU32:
      return 4;
  }
  return 0;
}

size_t AccSize(DType d) { return HasScratchAcc(d) ? 4 : DTypeSize(d); }

const char* DTypeName(DType d) {
  switch (d) {
    case DType::kF32:
      return "float32";
    case DType::kF64:
      return "float64";
    case DType::kF16:
      return "float16";
    case DType::kBF16:
      return "bfloat16";
    case DType::kI32:
      return "int32";
    case DType::kI64:
      return "int64";
    case DType::kU32:
      return "uint32";
  }
  return "?";
}

}  // namespace jax_blink
