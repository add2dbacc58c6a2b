// One element of any storage DType read or written where the dtype is a run-time value, host and
// device: as f32 (the cpu backend's plain paths and operations, CUDA's elementwise operations) or
// as f64 (the reference, the cpu operations that round once to the output dtype). Vector paths
// widen on their own (simd_<isa>.h, fa2's formats.h); their one-element tails come here.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/hd.h"
#include "core/numeric.h"
#include "kvattn/dtype.h"

namespace kvattn::io {

// Element `offset` of an array of T at `base`, which need not be aligned to T on the host.
template <class T>
KVATTN_HD T load_bits(const void* base, int64_t offset) {
#if defined(__CUDA_ARCH__)
  return static_cast<const T*>(base)[offset];
#else
  T x;
  std::memcpy(&x, static_cast<const unsigned char*>(base) + offset * int64_t{sizeof(T)}, sizeof(T));
  return x;
#endif
}
template <class T>
KVATTN_HD void store_bits(void* base, int64_t offset, T x) {
#if defined(__CUDA_ARCH__)
  static_cast<T*>(base)[offset] = x;
#else
  std::memcpy(static_cast<unsigned char*>(base) + offset * int64_t{sizeof(T)}, &x, sizeof(T));
#endif
}

// Element `offset` (in elements) of a buffer of `dtype` as f32: exact for every float dtype.
// `Isa`: a cpu kernel compiled with an ISA's flags passes its own (file-local) type, so that its
// copy is its own and never the one the linker keeps for lower-ISA code.
template <class Isa = void>
KVATTN_HD float load_f32(const void* base, DType dtype, int64_t offset) {
  switch (dtype) {
    case DType::kF32:
      return load_bits<float>(base, offset);
    case DType::kF16:
      return num::f16_to_f32(load_bits<uint16_t>(base, offset));
    case DType::kBF16:
      return num::bf16_to_f32(load_bits<uint16_t>(base, offset));
    case DType::kE4M3:
      return num::e4m3_to_f32(load_bits<uint8_t>(base, offset));
    case DType::kE5M2:
      return num::e5m2_to_f32(load_bits<uint8_t>(base, offset));
    case DType::kI32:
      return static_cast<float>(load_bits<int32_t>(base, offset));
    case DType::kU8:
      return load_bits<uint8_t>(base, offset);
  }
  return 0.0f;
}

// Writes `x` into element `offset` of a buffer of `dtype`, rounding to nearest even: 16-bit
// floats overflow to inf as IEEE says, fp8 saturates to its finite range (satfinite).
KVATTN_HD void store_f32(void* base, DType dtype, int64_t offset, float x) {
  switch (dtype) {
    case DType::kF32:
      store_bits<float>(base, offset, x);
      return;
    case DType::kF16:
      store_bits<uint16_t>(base, offset, num::f32_to_f16(x));
      return;
    case DType::kBF16:
      store_bits<uint16_t>(base, offset, num::f32_to_bf16(x));
      return;
    case DType::kE4M3:
      store_bits<uint8_t>(base, offset, num::f32_to_e4m3(x));
      return;
    case DType::kE5M2:
      store_bits<uint8_t>(base, offset, num::f32_to_e5m2(x));
      return;
    case DType::kI32:
      store_bits<int32_t>(base, offset, static_cast<int32_t>(x));
      return;
    case DType::kU8:
      store_bits<uint8_t>(base, offset, static_cast<uint8_t>(x));
      return;
  }
}

#if !defined(__CUDA_ARCH__)
// Element `offset` of a buffer of `dtype` as f64: exact for every dtype, i32 included.
inline double load_f64(const void* base, DType dtype, int64_t offset) {
  if (dtype == DType::kI32) return load_bits<int32_t>(base, offset);
  return load_f32(base, dtype, offset);
}

// A double rounded to f32 "to odd": truncated toward zero, the last mantissa bit set when the
// result is inexact. Rounding that once more to a narrower format to nearest even gives the
// correctly rounded double (it needs >= 2 extra bits; f32 has 13 more than f16, 16 more than
// bf16, 20 more than fp8), which plain double -> float -> f16 does not (double rounding at ties).
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

// Writes `value` into element `offset` of a buffer of `dtype`, rounded once (to nearest even,
// fp8 saturating, as store_f32).
inline void store_f64(void* base, DType dtype, int64_t offset, double value) {
  switch (dtype) {
    case DType::kF32:
      store_bits<float>(base, offset, static_cast<float>(value));
      return;
    case DType::kI32:
      store_bits<int32_t>(base, offset, static_cast<int32_t>(value));
      return;
    case DType::kU8:
      store_bits<uint8_t>(base, offset, static_cast<uint8_t>(value));
      return;
    default:
      store_f32(base, dtype, offset, round_to_odd_f32(value));
      return;
  }
}
#endif

}  // namespace kvattn::io
