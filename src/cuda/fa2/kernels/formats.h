// The element formats of fa2's kernel, host and device: the 16-bit compute formats of Q and the
// tiles (bf16, f16), and the K/V cache formats (bf16, f16, e4m3, e5m2). Tiles hold raw 16-bit
// bits (uint16_t); these functions convert them, with the hardware instructions on the device
// and core/numeric.h's exact software conversions on the host (tests/cuda/fa2/cta_replay_test.cc runs
// the kernel body on the CPU through them).
#pragma once

#include <cstdint>

#include "core/hd.h"
#include "core/numeric.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#endif

namespace kvattn::fa2 {

// A 16-bit compute format: the MMA's operand type (F16 = true: f16, else bf16).
struct Bf16Format {
  static constexpr bool kF16 = false;
  static KVATTN_HD float to_float(uint16_t x) {
#if defined(__CUDA_ARCH__)
    return __bfloat162float(__ushort_as_bfloat16(x));
#else
    return num::bf16_to_f32(x);
#endif
  }
  static KVATTN_HD uint16_t from_float(float x) {
#if defined(__CUDA_ARCH__)
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
#else
    return num::f32_to_bf16(x);
#endif
  }
  // Two floats in the b32 register an MMA operand takes: lo in the low half (the lower column,
  // as ldmatrix would load it).
  static KVATTN_HD uint32_t pack(float lo, float hi) {
#if defined(__CUDA_ARCH__)
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
#else
    return uint32_t(from_float(lo)) | (uint32_t(from_float(hi)) << 16);
#endif
  }
  // Whether the bits are an inf or a NaN (exponent all ones).
  static KVATTN_HD bool nonfinite(uint16_t x) { return (x & 0x7f80u) == 0x7f80u; }
};

struct F16Format {
  static constexpr bool kF16 = true;
  static KVATTN_HD float to_float(uint16_t x) {
#if defined(__CUDA_ARCH__)
    return __half2float(__ushort_as_half(x));
#else
    return num::f16_to_f32(x);
#endif
  }
  static KVATTN_HD uint16_t from_float(float x) {
#if defined(__CUDA_ARCH__)
    return __half_as_ushort(__float2half_rn(x));
#else
    return num::f32_to_f16(x);
#endif
  }
  static KVATTN_HD uint32_t pack(float lo, float hi) {
#if defined(__CUDA_ARCH__)
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
#else
    return uint32_t(from_float(lo)) | (uint32_t(from_float(hi)) << 16);
#endif
  }
  static KVATTN_HD bool nonfinite(uint16_t x) { return (x & 0x7c00u) == 0x7c00u; }
};

// K/V cache formats. Raw is the stored element; a 16-bit cache (k16) is copied into the tiles
// as it is (cp.async) and fixed up in place when it needs a conversion, RoPE or a scale; an FP8
// cache is staged raw and decoded 8 elements at a time into a 16-bit tile (decode8: exact, FP8
// values are exact in f32, f16 and bf16).
template <class Format16>
struct Kv16 {
  using Raw = uint16_t;
  using Format = Format16;
  static constexpr bool k16 = true;
  static KVATTN_HD float to_float(Raw x) { return Format::to_float(x); }
};
using KvBf16 = Kv16<Bf16Format>;
using KvF16 = Kv16<F16Format>;

template <bool kE4M3>
struct KvFp8 {
  using Raw = uint8_t;
  struct Format {  // not a 16-bit format: decoded, never copied into a tile as it is
    static constexpr bool kF16 = false;
  };
  static constexpr bool k16 = false;
  static KVATTN_HD float to_float(Raw x) {
#if defined(__CUDA_ARCH__)
    const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(x),
                                                 kE4M3 ? __NV_E4M3 : __NV_E5M2);
    return __half2float(__half(h));
#else
    return kE4M3 ? num::e4m3_to_f32(x) : num::e5m2_to_f32(x);
#endif
  }
  // Elements 0..7 of an 8-byte group (lo: bytes 0-3, hi: bytes 4-7, little-endian), two at a
  // time with the paired conversion (cvt.rn.f16x2.e4m3x2 from SM89; emulated before).
  static KVATTN_HD void decode8(uint32_t lo, uint32_t hi, float (&out)[8]) {
#if defined(__CUDA_ARCH__)
    const uint32_t words[2] = {lo, hi};
#pragma unroll
    for (int w = 0; w < 2; ++w) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(
            static_cast<__nv_fp8x2_storage_t>((words[w] >> (16 * h)) & 0xffffu),
            kE4M3 ? __NV_E4M3 : __NV_E5M2);
        const float2 f = __half22float2(__half2(r));
        out[4 * w + 2 * h] = f.x;
        out[4 * w + 2 * h + 1] = f.y;
      }
    }
#else
    for (int i = 0; i < 8; ++i) {
      const uint32_t word = i < 4 ? lo : hi;
      out[i] = to_float(uint8_t((word >> (8 * (i % 4))) & 0xffu));
    }
#endif
  }
};
using KvE4M3 = KvFp8<true>;
using KvE5M2 = KvFp8<false>;

}  // namespace kvattn::fa2
