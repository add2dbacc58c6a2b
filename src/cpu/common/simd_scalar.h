// Portable one-lane "vector" helpers with the interface of simd_avx512.h: the scalar kernels are
// the same templates instantiated with a width of 1, and decode elements exactly (numeric.h).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/element_io.h"
#include "core/numeric.h"
#include "cpu/common/convert_row.h"
#include "kvattn/dtype.h"

namespace kvattn::cpu::scalar {

struct Simd {
  static constexpr int kWidth = 1;
  using Vec = float;

  static Vec zero() { return 0.0f; }
  static Vec set1(float x) { return x; }
  static Vec load(const float* p) { return *p; }
  static void store(float* p, Vec v) { *p = v; }
  static Vec add(Vec a, Vec b) { return a + b; }
  static Vec sub(Vec a, Vec b) { return a - b; }
  static Vec mul(Vec a, Vec b) { return a * b; }
  static Vec fma(Vec a, Vec b, Vec c) { return std::fma(a, b, c); }
  // Like the vector max/min: b when either is NaN.
  static Vec max(Vec a, Vec b) { return (std::isnan(a) || std::isnan(b)) ? b : (a > b ? a : b); }
  static Vec min(Vec a, Vec b) { return (std::isnan(a) || std::isnan(b)) ? b : (a < b ? a : b); }
  static float reduce_add(Vec v) { return v; }
  static float reduce_max(Vec v) { return v; }
  static Vec reduce_rows(const Vec* parts) { return parts[0]; }
  // Below 2^-125 flushed to 0 as in the vector helpers, so every level masks alike.
  static Vec exp2(Vec x) { return x < -125.0f ? 0.0f : std::exp2(x); }
  static Vec tanh(Vec x) { return std::tanh(x); }
  static Vec round_f16(Vec x) { return num::f16_to_f32(num::f32_to_f16(x)); }
  static Vec iota(float base) { return base; }
  static Vec mask_by_bytes(Vec v, const uint8_t* keep) { return *keep ? v : -__builtin_inff(); }

  template <DType T>
  static constexpr float raw_to_real() {
    return 1.0f;
  }

  template <DType T>
  static Vec load_raw(const void* p) {
    if constexpr (T == DType::kF32) {
      float x;
      std::memcpy(&x, p, 4);
      return x;
    } else if constexpr (T == DType::kF16 || T == DType::kBF16) {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return T == DType::kF16 ? num::f16_to_f32(h) : num::bf16_to_f32(h);
    } else if constexpr (T == DType::kE4M3) {
      return num::e4m3_to_f32(*static_cast<const uint8_t*>(p));
    } else {
      static_assert(T == DType::kE5M2);
      return num::e5m2_to_f32(*static_cast<const uint8_t*>(p));
    }
  }
  template <DType T>
  static Vec load_raw_tail(const void* p, int) {
    return load_raw<T>(p);
  }
  static Vec load_tail(const float* p, int) { return *p; }
  static void store_tail(float* p, Vec v, int) { *p = v; }
  // Scalar loads decode the NaN code exactly: nothing to look for.
  static bool has_e4m3_nan_rows(const std::byte* const*, int, const uint8_t*, int64_t) {
    return false;
  }

  template <DType T>
  static Vec load_scaled(const void* p, float scale) {
    return load_raw<T>(p) * scale;
  }

  // Row conversions, shared by the prefill kernels (K/V staging, the output) and the decode
  // kernels (the queries, the output): convert_row<T> reads n stored elements as real f32 times
  // `scale` (convert_row_as_f32 picks T at run time), store_convert writes n f32 values in the
  // output's dtype (f32, f16 or bf16, rounded to nearest even), both at unit stride.
  template <DType T>
  static void convert_row(const unsigned char* src, int n, float scale, float* dst) {
    for (int i = 0; i < n; ++i) dst[i] = io::load_f32(src, T, i) * scale;
  }
  static void store_convert(const float* src, int n, DType dtype, void* dst) {
    for (int i = 0; i < n; ++i) io::store_f32(dst, dtype, i, src[i]);
  }
};

}  // namespace kvattn::cpu::scalar
