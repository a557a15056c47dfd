#pragma once
// Element types. Names follow LibTorch (kFloat32, kBFloat16, ...); short names
// (f32, bf16, ...) appear in messages and in checkpoints' dtype mapping.
#include <cstdint>
#include <string>

#include "kernels/common/float16.h"

namespace nd {

enum class ScalarType : uint8_t { Float32, Float64, BFloat16, Float16, Int64, Int32, UInt8, Bool };

constexpr ScalarType kFloat32 = ScalarType::Float32, kFloat = ScalarType::Float32;
constexpr ScalarType kFloat64 = ScalarType::Float64, kDouble = ScalarType::Float64;
constexpr ScalarType kBFloat16 = ScalarType::BFloat16;
constexpr ScalarType kFloat16 = ScalarType::Float16, kHalf = ScalarType::Float16;
constexpr ScalarType kInt64 = ScalarType::Int64, kLong = ScalarType::Int64;
constexpr ScalarType kInt32 = ScalarType::Int32, kInt = ScalarType::Int32;
constexpr ScalarType kUInt8 = ScalarType::UInt8, kByte = ScalarType::UInt8;
constexpr ScalarType kBool = ScalarType::Bool;

size_t element_size(ScalarType t);
const char* dtype_name(ScalarType t);  // "f32", "f64", "bf16", "f16", "i64", "i32", "u8", "bool"
bool is_floating_point(ScalarType t);

template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr ScalarType value = kFloat32; };
template <> struct dtype_of<double> { static constexpr ScalarType value = kFloat64; };
template <> struct dtype_of<BFloat16> { static constexpr ScalarType value = kBFloat16; };
template <> struct dtype_of<Half> { static constexpr ScalarType value = kFloat16; };
template <> struct dtype_of<int64_t> { static constexpr ScalarType value = kInt64; };
template <> struct dtype_of<int32_t> { static constexpr ScalarType value = kInt32; };
template <> struct dtype_of<uint8_t> { static constexpr ScalarType value = kUInt8; };
template <> struct dtype_of<bool> { static constexpr ScalarType value = kBool; };

// Calls fn.template operator()<T>() with the C++ type of `t` (every dtype).
template <class Fn>
decltype(auto) dispatch_all(ScalarType t, Fn&& fn) {
  switch (t) {
    case kFloat32: return fn.template operator()<float>();
    case kFloat64: return fn.template operator()<double>();
    case kBFloat16: return fn.template operator()<BFloat16>();
    case kFloat16: return fn.template operator()<Half>();
    case kInt64: return fn.template operator()<int64_t>();
    case kInt32: return fn.template operator()<int32_t>();
    case kUInt8: return fn.template operator()<uint8_t>();
    case kBool: return fn.template operator()<bool>();
  }
  return fn.template operator()<float>();
}

}  // namespace nd
