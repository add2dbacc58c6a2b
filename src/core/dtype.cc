#include "kvattn/dtype.h"

namespace kvattn {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kE4M3: return 1;
    case DType::kE5M2: return 1;
    case DType::kI32: return 4;
    case DType::kU8: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kE4M3: return "e4m3";
    case DType::kE5M2: return "e5m2";
    case DType::kI32: return "i32";
    case DType::kU8: return "u8";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view name) {
  struct Alias { std::string_view name; DType dtype; };
  static constexpr Alias kAliases[] = {
      {"f32", DType::kF32},          {"float32", DType::kF32},
      {"f16", DType::kF16},          {"float16", DType::kF16},
      {"half", DType::kF16},         {"bf16", DType::kBF16},
      {"bfloat16", DType::kBF16},    {"e4m3", DType::kE4M3},
      {"fp8_e4m3", DType::kE4M3},    {"float8_e4m3fn", DType::kE4M3},
      {"e5m2", DType::kE5M2},        {"fp8_e5m2", DType::kE5M2},
      {"float8_e5m2", DType::kE5M2}, {"i32", DType::kI32},
      {"int32", DType::kI32},        {"u8", DType::kU8},
      {"uint8", DType::kU8},
  };
  for (const Alias& a : kAliases) {
    if (a.name == name) return a.dtype;
  }
  return std::nullopt;
}

}  // namespace kvattn
