#include "core/dtype.h"

#include "core/errors.h"

namespace sl {

size_t itemsize(DType t) {
  switch (t) {
    case DType::kFloat16: return 2;
    case DType::kFloat32: return 4;
    case DType::kFloat64: return 8;
    case DType::kInt32: return 4;
    case DType::kInt64: return 8;
    case DType::kBool: return 1;
    case DType::kBFloat16: return 2;
  }
  throw ValueError(str("unknown dtype code ", int(t)));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat16: return "float16";
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kBool: return "bool";
    case DType::kBFloat16: return "bfloat16";
  }
  return "unknown";
}

bool is_floating(DType t) {
  return t == DType::kFloat16 || t == DType::kBFloat16 || t == DType::kFloat32 || t == DType::kFloat64;
}

const char* buffer_format(DType t) {
  switch (t) {
    case DType::kFloat16: return "e";
    case DType::kFloat32: return "f";
    case DType::kFloat64: return "d";
    case DType::kInt32: return "i";
    case DType::kInt64: return "q";
    case DType::kBool: return "?";
    // No buffer-protocol or numpy type string exists for bfloat16: the bindings convert through float32.
    case DType::kBFloat16: return nullptr;
  }
  throw ValueError(str("unknown dtype code ", int(t)));
}

}  // namespace sl
