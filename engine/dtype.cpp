#include "engine/dtype.h"

namespace nd {

size_t element_size(ScalarType t) {
  switch (t) {
    case kFloat32: case kInt32: return 4;
    case kFloat64: case kInt64: return 8;
    case kBFloat16: case kFloat16: return 2;
    case kUInt8: case kBool: return 1;
  }
  return 0;
}

const char* dtype_name(ScalarType t) {
  switch (t) {
    case kFloat32: return "f32";
    case kFloat64: return "f64";
    case kBFloat16: return "bf16";
    case kFloat16: return "f16";
    case kInt64: return "i64";
    case kInt32: return "i32";
    case kUInt8: return "u8";
    case kBool: return "bool";
  }
  return "?";
}

bool is_floating_point(ScalarType t) {
  return t == kFloat32 || t == kFloat64 || t == kBFloat16 || t == kFloat16;
}

}  // namespace nd
