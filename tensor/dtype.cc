// tensor/dtype.cc: dtype names (see dtype.h).
#include "tensor/dtype.h"

namespace devmem {

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kUInt8:
      return "uint8";
    case DType::kBFloat16:
      return "bfloat16";
  }
  return "unknown";
}

}  // namespace devmem
