// The row helpers of the cpu backend's operations that are not attention (ops.h): element load
// and store of every DType through fp64 (values rounded once to the output dtype, as the
// reference does), strided addressing, and the pool's parallel-for over rows.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/numeric.h"
#include "cpu/common/thread_pool.h"
#include "kvattn/attention.h"

namespace kvattn::cpu::ops {

// Rows handed to a thread at a time: enough to amortize the hand-out, few enough to balance.
constexpr int64_t kRowsPerItem = 16;

inline double load(const TensorView& t, int64_t offset) {
  switch (t.dtype) {
    case DType::kF32:
      return t.as<const float>()[offset];
    case DType::kF16:
      return num::f16_to_f32(t.as<const uint16_t>()[offset]);
    case DType::kBF16:
      return num::bf16_to_f32(t.as<const uint16_t>()[offset]);
    case DType::kE4M3:
      return num::e4m3_to_f32(t.as<const uint8_t>()[offset]);
    case DType::kE5M2:
      return num::e5m2_to_f32(t.as<const uint8_t>()[offset]);
    case DType::kI32:
      return t.as<const int32_t>()[offset];
    case DType::kU8:
      return t.as<const uint8_t>()[offset];
  }
  return std::numeric_limits<double>::quiet_NaN();
}

// A double rounded to f32 "to odd", so that rounding it once more to a narrower float gives the
// correctly rounded double (no double-rounding error at ties).
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

inline void store(const TensorView& t, int64_t offset, double value) {
  switch (t.dtype) {
    case DType::kF32:
      t.as<float>()[offset] = static_cast<float>(value);
      return;
    case DType::kF16:
      t.as<uint16_t>()[offset] = num::f32_to_f16(round_to_odd_f32(value));
      return;
    case DType::kBF16:
      t.as<uint16_t>()[offset] = num::f32_to_bf16(round_to_odd_f32(value));
      return;
    case DType::kE4M3:
      t.as<uint8_t>()[offset] = num::f32_to_e4m3(round_to_odd_f32(value));
      return;
    case DType::kE5M2:
      t.as<uint8_t>()[offset] = num::f32_to_e5m2(round_to_odd_f32(value));
      return;
    case DType::kI32:
      t.as<int32_t>()[offset] = static_cast<int32_t>(value);
      return;
    case DType::kU8:
      t.as<uint8_t>()[offset] = static_cast<uint8_t>(value);
      return;
  }
}

inline int64_t at(const TensorView& t, int64_t i0) { return i0 * t.strides[0]; }
inline int64_t at(const TensorView& t, int64_t i0, int64_t i1) {
  return i0 * t.strides[0] + i1 * t.strides[1];
}
inline int64_t at(const TensorView& t, int64_t i0, int64_t i1, int64_t i2) {
  return i0 * t.strides[0] + i1 * t.strides[1] + i2 * t.strides[2];
}
inline int64_t at(const TensorView& t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
  return i0 * t.strides[0] + i1 * t.strides[1] + i2 * t.strides[2] + i3 * t.strides[3];
}

inline int32_t load_i32(const TensorView& t, int64_t i) { return t.as<const int32_t>()[at(t, i)]; }

// Runs fn(row) for rows [0, rows) in items of kRowsPerItem rows.
template <class Fn>
void for_rows(int num_threads, int64_t rows, Fn&& fn) {
  const int64_t items = (rows + kRowsPerItem - 1) / kRowsPerItem;
  ThreadPool::global().parallel_for(num_threads, items, [&](int64_t item, int) {
    const int64_t end = std::min(rows, (item + 1) * kRowsPerItem);
    for (int64_t row = item * kRowsPerItem; row < end; ++row) fn(row);
  });
}

}  // namespace kvattn::cpu::ops
