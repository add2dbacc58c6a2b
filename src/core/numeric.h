// Scalar conversions between f32 and the 16-bit and fp8 storage types, host and device.
// Round to nearest even; quantizing saturates to the finite range (CUDA's satfinite); NaN stays
// NaN. Written with integer arithmetic only so host and device give the same bits.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/hd.h"

namespace kvattn::num {

KVATTN_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
KVATTN_HD float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// ---- bf16: the top half of an f32.
KVATTN_HD float bf16_to_f32(uint16_t h) { return bits_f32(uint32_t(h) << 16); }
KVATTN_HD uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);  // quiet NaN
  uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return uint16_t((u + rounding_bias) >> 16);
}

// A generic small float: 1 sign bit, E exponent bits, M mantissa bits, bias 2^(E-1)-1.
// kHasInf: the all-ones exponent encodes inf/NaN (IEEE); otherwise only S.1111.111 is NaN and
// all other all-ones-exponent codes are finite (OCP e4m3fn).
template <int E, int M, bool kHasInf>
struct SmallFloat {
  static constexpr int kBias = (1 << (E - 1)) - 1;
  static constexpr uint32_t kExpMask = (1u << E) - 1;
  static constexpr uint32_t kManMask = (1u << M) - 1;
  static constexpr uint32_t kSignBit = 1u << (E + M);
  // Largest finite magnitude code (without sign).
  static constexpr uint32_t kMaxFinite =
      kHasInf ? (((kExpMask - 1) << M) | kManMask) : ((kExpMask << M) | (kManMask - 1));
  static constexpr uint32_t kNaN = (kExpMask << M) | kManMask;
  static constexpr uint32_t kInf = kExpMask << M;

  static KVATTN_HD float decode(uint32_t code) {
    uint32_t sign = (code & kSignBit) ? 0x80000000u : 0u;
    uint32_t exp = (code >> M) & kExpMask;
    uint32_t man = code & kManMask;
    if (exp == kExpMask && (kHasInf || man == kManMask)) {
      if (kHasInf && man == 0) return bits_f32(sign | 0x7f800000u);
      return bits_f32(sign | 0x7fc00000u);
    }
    if (exp == 0) {
      if (man == 0) return bits_f32(sign);
      // Subnormal: man * 2^(1 - bias - M); normalize into f32.
      int shift = 0;
      while ((man & (1u << M)) == 0) {
        man <<= 1;
        ++shift;
      }
      man &= kManMask;
      uint32_t f32_exp = uint32_t(1 - kBias - shift + 127);
      return bits_f32(sign | (f32_exp << 23) | (man << (23 - M)));
    }
    uint32_t f32_exp = exp - kBias + 127;
    return bits_f32(sign | (f32_exp << 23) | (man << (23 - M)));
  }

  // Round to nearest even. saturate: values past the largest finite (and inf) become ±max;
  // otherwise they become inf (when the format has one) or NaN.
  static KVATTN_HD uint32_t encode(float f, bool saturate) {
    uint32_t u = f32_bits(f);
    uint32_t sign = (u & 0x80000000u) ? kSignBit : 0u;
    uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) return sign | kNaN;
    if (abs == 0x7f800000u) {
      if (saturate) return sign | kMaxFinite;
      return sign | (kHasInf ? kInf : kNaN);
    }
    int f32_exp = int(abs >> 23);  // biased
    uint32_t f32_man = abs & 0x7fffffu;
    int exp = f32_exp - 127 + kBias;  // target biased exponent
    uint32_t result;
    if (f32_exp == 0) {
      result = 0;  // f32 subnormals are far below the smallest fp8/f16 subnormal
    } else if (exp >= 1) {
      // Normal in the target: keep M bits, round the 23 - M dropped ones.
      uint32_t mant = f32_man | 0x800000u;
      int drop = 23 - M;
      uint32_t kept = mant >> drop;
      uint32_t rest = mant & ((1u << drop) - 1);
      uint32_t half = 1u << (drop - 1);
      if (rest > half || (rest == half && (kept & 1u))) ++kept;
      if (kept >> (M + 1)) {  // mantissa overflowed into the next binade
        kept >>= 1;
        ++exp;
      }
      result = (uint32_t(exp) << M) | (kept & kManMask);
    } else {
      // Subnormal in the target: value = mant * 2^(f32_exp - 127 - 23); unit = 2^(1-bias-M).
      uint32_t mant = f32_man | 0x800000u;
      int drop = 23 - M + (1 - exp);  // bits below the subnormal unit
      if (drop > 24) {
        result = 0;
      } else {
        uint32_t kept = mant >> drop;
        uint32_t rest = mant & ((1u << drop) - 1);
        uint32_t half = 1u << (drop - 1);
        if (rest > half || (rest == half && (kept & 1u))) ++kept;
        result = kept;  // may round up into the smallest normal: the encoding still holds
      }
    }
    if (result > kMaxFinite) {
      if (saturate) return sign | kMaxFinite;
      return sign | (kHasInf ? kInf : kNaN);
    }
    return sign | result;
  }
};

using F16Format = SmallFloat<5, 10, true>;
using E4M3Format = SmallFloat<4, 3, false>;
using E5M2Format = SmallFloat<5, 2, true>;

KVATTN_HD float f16_to_f32(uint16_t h) { return F16Format::decode(h); }
// f16 keeps IEEE overflow to inf (it is a compute type, not a quantized cache).
KVATTN_HD uint16_t f32_to_f16(float f) { return uint16_t(F16Format::encode(f, false)); }

KVATTN_HD float e4m3_to_f32(uint8_t c) { return E4M3Format::decode(c); }
KVATTN_HD float e5m2_to_f32(uint8_t c) { return E5M2Format::decode(c); }
// Quantizing to fp8 saturates (satfinite): ±inf and values past max become ±max; NaN stays NaN.
KVATTN_HD uint8_t f32_to_e4m3(float f) { return uint8_t(E4M3Format::encode(f, true)); }
KVATTN_HD uint8_t f32_to_e5m2(float f) { return uint8_t(E5M2Format::encode(f, true)); }

inline constexpr float kE4M3Max = 448.0f;
inline constexpr float kE5M2Max = 57344.0f;

// The per-(token, head) scale append_paged_kv_cache stores for a row whose largest magnitude is
// `amax` (DESIGN.md §2): amax / fp8_max, rounded once to f32; 1 when amax is 0. The row is then
// stored divided by this f32 value, so that stored * scale reproduces it.
KVATTN_HD float per_token_fp8_scale(double amax, bool e5m2) {
  if (!(amax > 0.0)) return 1.0f;
  return static_cast<float>(amax / (e5m2 ? double{kE5M2Max} : double{kE4M3Max}));
}

}  // namespace kvattn::num
