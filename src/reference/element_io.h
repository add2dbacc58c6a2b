// Element reads and writes for the reference: any storage dtype <-> double, through the strided
// views of kvattn::TensorView. Header-only so that the test-support baseline reads tensors the
// same way.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/numeric.h"
#include "kvattn/tensor.h"

namespace kvattn::ref {

// The stored value of element `offset` (in elements) of a buffer of `dtype`, exactly.
inline double load_element(const void* data, DType dtype, int64_t offset) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(data)[offset];
    case DType::kF16:
      return num::f16_to_f32(static_cast<const uint16_t*>(data)[offset]);
    case DType::kBF16:
      return num::bf16_to_f32(static_cast<const uint16_t*>(data)[offset]);
    case DType::kE4M3:
      return num::e4m3_to_f32(static_cast<const uint8_t*>(data)[offset]);
    case DType::kE5M2:
      return num::e5m2_to_f32(static_cast<const uint8_t*>(data)[offset]);
    case DType::kI32:
      return static_cast<const int32_t*>(data)[offset];
    case DType::kU8:
      return static_cast<const uint8_t*>(data)[offset];
  }
  return std::numeric_limits<double>::quiet_NaN();
}

// Rounds a double to f32 "to odd": truncate toward zero and set the last mantissa bit when the
// result is inexact. Rounding that to a narrower format with round-to-nearest-even then gives
// the correctly rounded result of the double (needs >= 2 extra bits; f32 has 13 more than f16,
// 16 more than bf16, 20 more than fp8), which plain double -> float -> f16 does not
// (double rounding at ties).
inline float round_to_odd_f32(double x) {
  if (!std::isfinite(x)) return static_cast<float>(x);
  float f = static_cast<float>(x);
  if (static_cast<double>(f) == x || std::isinf(f)) return f;
  if (std::fabs(static_cast<double>(f)) > std::fabs(x)) f = std::nextafter(f, 0.0f);
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits |= 1u;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Writes `value` into element `offset` of a buffer of `dtype`, rounding to nearest even.
// 16-bit floats overflow to inf as IEEE says; fp8 saturates to its finite range (satfinite).
inline void store_element(void* data, DType dtype, int64_t offset, double value) {
  switch (dtype) {
    case DType::kF32:
      static_cast<float*>(data)[offset] = static_cast<float>(value);
      return;
    case DType::kF16:
      static_cast<uint16_t*>(data)[offset] = num::f32_to_f16(round_to_odd_f32(value));
      return;
    case DType::kBF16:
      static_cast<uint16_t*>(data)[offset] = num::f32_to_bf16(round_to_odd_f32(value));
      return;
    case DType::kE4M3:
      static_cast<uint8_t*>(data)[offset] = num::f32_to_e4m3(round_to_odd_f32(value));
      return;
    case DType::kE5M2:
      static_cast<uint8_t*>(data)[offset] = num::f32_to_e5m2(round_to_odd_f32(value));
      return;
    case DType::kI32:
      static_cast<int32_t*>(data)[offset] = static_cast<int32_t>(value);
      return;
    case DType::kU8:
      static_cast<uint8_t*>(data)[offset] = static_cast<uint8_t>(value);
      return;
  }
}

// `value` rounded to `dtype` (RNE, fp8 saturating) and back, as a double.
inline double round_to_dtype(double value, DType dtype) {
  unsigned char scratch[8] = {};
  store_element(scratch, dtype, 0, value);
  return load_element(scratch, dtype, 0);
}

// Element offset of index (i0, i1, ...) of a view, in elements.
inline int64_t offset_of(const TensorView& t, int64_t i0) { return i0 * t.strides[0]; }
inline int64_t offset_of(const TensorView& t, int64_t i0, int64_t i1) {
  return i0 * t.strides[0] + i1 * t.strides[1];
}
inline int64_t offset_of(const TensorView& t, int64_t i0, int64_t i1, int64_t i2) {
  return i0 * t.strides[0] + i1 * t.strides[1] + i2 * t.strides[2];
}
inline int64_t offset_of(const TensorView& t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
  return i0 * t.strides[0] + i1 * t.strides[1] + i2 * t.strides[2] + i3 * t.strides[3];
}

template <class... I>
double load(const TensorView& t, I... index) {
  return load_element(t.data, t.dtype, offset_of(t, index...));
}
template <class... I>
void store(const TensorView& t, double value, I... index) {
  store_element(t.data, t.dtype, offset_of(t, index...), value);
}
inline int32_t load_i32(const TensorView& t, int64_t i) {
  return static_cast<const int32_t*>(t.data)[i * t.strides[0]];
}

}  // namespace kvattn::ref
