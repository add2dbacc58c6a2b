// Decode over a bf16 cache for bf16 queries with bf16 dot products (AVX512_BF16): the decode
// kernel of decode_kernel.h with the dot-product tiles of decode_dot_tiles.h, the rows loaded as
// they lie. Against the fp32-FMA tiles (decode_fma_tiles.h) it drops the widening of every K and
// V element to f32 and halves the multiply instructions: two products per lane. On CPUs whose
// vdpbf16ps runs at the FMA rate (AMD Zen 4; a quarter of it on the Intel Xeons measured), where
// the kernel table prefers it.
#include <immintrin.h>

#include <cstdint>

#include "cpu/decode/decode_dot_tiles.h"

namespace kvattn::cpu {
namespace {

// A 64-value chunk of a bf16 row is two vectors of 32 words in order. The 16-bit unpacks of two
// keys' w0 (w1) give pairs r = 0, 1 (2, 3) holding dims 32h + 8L + 4(r % 2) + m at lane 4L + m
// (h = r / 2, L the 128-bit lane, m = 0..3).
struct Bf16Loader {
  static constexpr int kChunkBytes = 128;
  static constexpr bool kMayHoldInf = true;
  void operator()(const uint8_t* chunk, __m512i* w0, __m512i* w1) const {
    *w0 = _mm512_loadu_si512(chunk);
    *w1 = _mm512_loadu_si512(chunk + 64);
  }
  void pairs(const uint8_t* a, const uint8_t* b, __m512i* v) const {
    const __m512i a0 = _mm512_loadu_si512(a), a1 = _mm512_loadu_si512(a + 64);
    const __m512i b0 = _mm512_loadu_si512(b), b1 = _mm512_loadu_si512(b + 64);
    v[0] = _mm512_unpacklo_epi16(a0, b0);
    v[1] = _mm512_unpackhi_epi16(a0, b0);
    v[2] = _mm512_unpacklo_epi16(a1, b1);
    v[3] = _mm512_unpackhi_epi16(a1, b1);
  }
  static constexpr int word(int v) { return v; }
  static constexpr int pv_lane(int v) {
    const int half = v / 32, u = v % 32;
    const int lane = u / 8, r = 2 * half + (u % 8) / 4, m = u % 4;
    return 16 * r + 4 * lane + m;
  }
};

}  // namespace

DecodeItemFn find_decode_kernel_bf16_dot_avx512(DType kv, int dqk, int dvo, int group_padded) {
  if (kv != DType::kBF16 || dqk != dvo) return nullptr;
  switch (dqk) {
    case 64:
      return decode_detail::pick_dot_group<Bf16Loader, DType::kBF16, 64>(group_padded);
    case 128:
      return decode_detail::pick_dot_group<Bf16Loader, DType::kBF16, 128>(group_padded);
    case 256:
      return decode_detail::pick_dot_group<Bf16Loader, DType::kBF16, 256>(group_padded);
    default:
      return nullptr;
  }
}

}  // namespace kvattn::cpu
