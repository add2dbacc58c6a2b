// Element types of tensors.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace kvattn {

enum class DType {
  kF32,
  kF16,
  kBF16,
  kE4M3,  // OCP fp8 "e4m3fn": no inf, max 448, NaN = S.1111.111
  kE5M2,  // IEEE-like fp8 with inf
  kI32,
  kU8,
};

// Bytes per element.
std::size_t dtype_size(DType dtype);
// The command-line spelling: f32, f16, bf16, e4m3, e5m2, i32, u8.
std::string_view dtype_name(DType dtype);
// Accepts the command-line spelling (and float32/float16/bfloat16/float8_e4m3fn/float8_e5m2
// as PyTorch spells them). nullopt if unknown.
std::optional<DType> parse_dtype(std::string_view name);

inline bool is_fp8(DType d) { return d == DType::kE4M3 || d == DType::kE5M2; }
inline bool is_float(DType d) { return d != DType::kI32 && d != DType::kU8; }
inline bool is_16bit_float(DType d) { return d == DType::kF16 || d == DType::kBF16; }

}  // namespace kvattn
