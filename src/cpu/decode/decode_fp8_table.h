// Decode over an FP8 (e4m3 / e5m2) cache for bf16 queries (AVX512_BF16 + AVX512_VBMI): the
// decode kernel of decode_kernel.h with other QK and PV tiles.
//
// An FP8 decode moves half the bytes of a bf16 one, and with fp32 FMAs it is compute-bound:
// widening each code to f32 (5 instructions per 16 values) and one FMA per value per query head
// cost more than the bytes take to arrive (issue 14: e4m3 decode took the time of bf16 decode).
// Here every code is widened exactly to bf16 by two 128-entry byte tables (vpermi2b: low and
// high byte of the bf16 of the code's magnitude, then the sign or'ed in), 64 codes per 5
// instructions, then either multiplied by vdpbf16ps (the bf16 dot-product tiles of
// decode_dot_tiles.h) or split into f32 for fp32 FMAs (TableFmaTiles, below).
//
// The unpacks that interleave the table bytes work inside 128-bit lanes, so the 64 values of a
// chunk come out permuted; q is permuted the same way once per task (prepare_q), and the output
// accumulators are put back in order once per task (finish_o). NaN codes widen to bf16 NaN and
// propagate through the products as the reference's do (a NaN in a visible K row makes the row
// NaN, in a V row its column), so no NaN scan is needed; the kernels are used without a custom
// mask only (a masked key's zero probability times a NaN V would otherwise reach the output).
//
// Included by one file per FP8 dtype (decode_fp8_table_<kv>_avx512bf16.cc, so that the two
// compile side by side), each compiled with the AVX512_BF16 + AVX512_VBMI flags
// (src/cpu/CMakeLists.txt); internal linkage, as decode_dot_tiles.h.
#pragma once

#include <immintrin.h>

#include <array>
#include <atomic>
#include <cstring>

#include "core/numeric.h"
#include "cpu/common/simd_avx512.h"
#include "cpu/decode/decode_dot_tiles.h"
#include "cpu/decode/decode_kernel.h"

namespace kvattn::cpu {
namespace {

using S = avx512::Simd;
using decode_detail::kTile;
using decode_detail::TilePrefetcher;

// Low and high byte of the bf16 of each FP8 magnitude (code & 0x7F), in two halves of 64.
struct Bf16Table {
  alignas(64) std::array<uint8_t, 128> lo{}, hi{};
};

template <DType T>
const Bf16Table& bf16_table() {
  static const Bf16Table table = [] {
    Bf16Table t;
    for (int code = 0; code < 128; ++code) {
      const float x = T == DType::kE4M3 ? num::e4m3_to_f32(static_cast<uint8_t>(code))
                                        : num::e5m2_to_f32(static_cast<uint8_t>(code));
      // Exact: every e4m3 and e5m2 value is a bf16 value (NaN stays NaN, inf inf).
      const uint16_t bits = num::f32_to_bf16(x);
      t.lo[code] = static_cast<uint8_t>(bits & 0xFF);
      t.hi[code] = static_cast<uint8_t>(bits >> 8);
    }
    return t;
  }();
  return table;
}

// The four table registers and the sign mask, loaded once per tile.
struct Widen {
  __m512i lo0, lo1, hi0, hi1, sign;
  explicit Widen(const Bf16Table& t)
      : lo0(_mm512_load_si512(t.lo.data())),
        lo1(_mm512_load_si512(t.lo.data() + 64)),
        hi0(_mm512_load_si512(t.hi.data())),
        hi1(_mm512_load_si512(t.hi.data() + 64)),
        sign(_mm512_set1_epi8(static_cast<char>(0x80))) {}
  // 64 codes -> bf16 words: w0 holds values 16L + i, w1 values 16L + 8 + i, at word 8L + i of
  // 128-bit lane L (L = 0..3, i = 0..7).
  void operator()(__m512i codes, __m512i* w0, __m512i* w1) const {
    const __m512i lo = _mm512_permutex2var_epi8(lo0, codes, lo1);
    __m512i hi = _mm512_permutex2var_epi8(hi0, codes, hi1);
    hi = _mm512_ternarylogic_epi32(hi, codes, sign, 0xF8);  // hi | (codes & 0x80)
    *w0 = _mm512_unpacklo_epi8(lo, hi);
    *w1 = _mm512_unpackhi_epi8(lo, hi);
  }
};

// Where value v (0..63) of a chunk sits among the 64 words w0, w1 (w0 first).
constexpr int widened_word(int v) {
  const int lane = v / 16, i = v % 16;
  return i < 8 ? 8 * lane + i : 32 + 8 * lane + (i - 8);
}

// The table widening as a Loader of decode_dot_tiles.h.
template <DType kKV>
struct Fp8TableLoader {
  static constexpr int kChunkBytes = 64;
  static constexpr bool kMayHoldInf = kKV == DType::kE5M2;  // e4m3 has no inf
  Widen widen{bf16_table<kKV>()};
  void operator()(const uint8_t* chunk, __m512i* w0, __m512i* w1) const {
    widen(_mm512_loadu_si512(chunk), w0, w1);
  }
  // The codes of the two keys interleaved by bytes first, so that the widening itself yields
  // the pairs (the order of the 16-bit unpacks of two widened rows, for 12 instructions, not 14).
  void pairs(const uint8_t* a, const uint8_t* b, __m512i* v) const {
    const __m512i ca = _mm512_loadu_si512(a), cb = _mm512_loadu_si512(b);
    widen(_mm512_unpacklo_epi8(ca, cb), &v[0], &v[1]);
    widen(_mm512_unpackhi_epi8(ca, cb), &v[2], &v[3]);
  }
  static constexpr int word(int v) { return widened_word(v); }
  // The 16-bit unpacks of w0/w1 of two keys give pairs r = 0..3 holding dims 16L + 4r + m at
  // lane 4L + m.
  static constexpr int pv_lane(int v) {
    const int lane = v / 16, r = (v % 16) / 4, m = v % 4;
    return 16 * r + 4 * lane + m;
  }
};

// The same table widening with fp32 FMAs instead of vdpbf16ps (for CPUs whose bf16 dot
// products are slow, see decode.h): each widened bf16 word vector splits by parity into two f32
// vectors with one instruction each (the low word of a 32-bit lane shifted up, the high one
// masked in place), so 64 codes cost 5 + 4 instructions against 20 for the f16 route of
// FmaTiles. Within a 64-value chunk the four f32 vectors (w0 even, w0 odd, w1 even, w1 odd)
// hold value v at block(v), lane(v); q is stored in that order and the output accumulators come
// out in it. Used without a custom mask only, as DotTiles.
constexpr int parity_block(int v) {
  const int j = widened_word(v);
  return (j >= 32 ? 2 : 0) + (j % 2);
}
constexpr int parity_lane(int v) { return (widened_word(v) % 32) / 2; }

template <DType kKV, int kD, int kNG>
struct TableFmaTiles {
  static_assert(kD % 64 == 0);
  static constexpr int kChunks = kD / 64;
  static constexpr float kKRaw = 1.0f;
  static constexpr float kVRaw = 1.0f;
  static constexpr bool kPoisonE4m3Nans = false;

  static void split(__m512i w0, __m512i w1, __m512* b) {
    const __m512i high = _mm512_set1_epi32(int32_t(0xFFFF0000u));
    b[0] = _mm512_castsi512_ps(_mm512_slli_epi32(w0, 16));
    b[1] = _mm512_castsi512_ps(_mm512_and_si512(w0, high));
    b[2] = _mm512_castsi512_ps(_mm512_slli_epi32(w1, 16));
    b[3] = _mm512_castsi512_ps(_mm512_and_si512(w1, high));
  }

  static void prepare_q(float* q, int rows, int q_row, int) {
    float tmp[64];
    for (int g = 0; g < rows; ++g) {
      for (int c = 0; c < kChunks; ++c) {
        float* chunk = q + g * q_row + c * 64;
        std::memcpy(tmp, chunk, sizeof(tmp));
        for (int v = 0; v < 64; ++v) chunk[16 * parity_block(v) + parity_lane(v)] = tmp[v];
      }
    }
  }
  static void finish_o(float* o, int rows, int o_row, int) {
    float tmp[64];
    for (int g = 0; g < rows; ++g) {
      for (int c = 0; c < kChunks; ++c) {
        float* chunk = o + g * o_row + c * 64;
        std::memcpy(tmp, chunk, sizeof(tmp));
        for (int v = 0; v < 64; ++v) chunk[v] = tmp[16 * parity_block(v) + parity_lane(v)];
      }
    }
  }

  // One widened chunk of a K row, split by parity into four f32 vectors.
  struct Chunk {
    __m512 b[4];
  };
  static Chunk chunk(__m512i w0, __m512i w1) {
    Chunk k;
    split(w0, w1, k.b);
    return k;
  }
  static void accumulate(const Chunk& k, const float* q_row, int c, __m512* acc0, __m512* acc1) {
    const float* qc = q_row + c * 64;
    *acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(qc), k.b[0], *acc0);
    *acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(qc + 16), k.b[1], *acc1);
    *acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(qc + 32), k.b[2], *acc0);
    *acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(qc + 48), k.b[3], *acc1);
  }
  static void qk(const float* q, int q_row, int group_padded, const std::byte* const* rows, int n,
                 int, int64_t, float* scores, TilePrefetcher* prefetch) {
    decode_detail::qk_chunks<Fp8TableLoader<kKV>, kChunks, kNG, TableFmaTiles>(
        q, q_row, group_padded, rows, n, scores, prefetch);
  }

  static void pv(const float* p, int group_padded, const std::byte* const* rows, int n, int,
                 int64_t, float* o, int o_row, TilePrefetcher* prefetch) {
    const Widen widen(bf16_table<kKV>());
    for (int g0 = 0; g0 < group_padded; g0 += kNG) {
      const float* pg = p + g0 * kTile;
      float* og = o + g0 * o_row;
      for (int c = 0; c < kChunks; ++c) {
        __m512 acc[kNG][4];
        for (int g = 0; g < kNG; ++g) {
          for (int r = 0; r < 4; ++r) acc[g][r] = _mm512_loadu_ps(og + g * o_row + c * 64 + 16 * r);
        }
        for (int kk = 0; kk < n; ++kk) {
          if (c == 0) prefetch->tick();
          __m512i w0, w1;
          widen(_mm512_loadu_si512(reinterpret_cast<const uint8_t*>(rows[kk]) + c * 64), &w0, &w1);
          __m512 b[4];
          split(w0, w1, b);
          for (int g = 0; g < kNG; ++g) {
            const __m512 w = _mm512_set1_ps(pg[g * kTile + kk]);
            for (int r = 0; r < 4; ++r) acc[g][r] = _mm512_fmadd_ps(w, b[r], acc[g][r]);
          }
        }
        for (int g = 0; g < kNG; ++g) {
          for (int r = 0; r < 4; ++r) _mm512_storeu_ps(og + g * o_row + c * 64 + 16 * r, acc[g][r]);
        }
      }
    }
  }
};

template <DType kKV, int kD>
DecodeItemFn pick_table_fma_group(int group_padded) {
  using decode_detail::decode_task;
  switch (std::min(group_padded, 8)) {
    case 1:
      return &decode_task<S, kKV, kD, kD, 1, TableFmaTiles<kKV, kD, 1>>;
    case 2:
      return &decode_task<S, kKV, kD, kD, 2, TableFmaTiles<kKV, kD, 2>>;
    case 4:
    case 8:  // 8 rows x 4 accumulators would not fit the registers: blocks of 4
      return &decode_task<S, kKV, kD, kD, 4, TableFmaTiles<kKV, kD, 4>>;
    default:
      return nullptr;
  }
}

template <DType kKV, int kD>
DecodeItemFn pick_group(int group_padded, bool dot) {
  return dot ? decode_detail::pick_dot_group<Fp8TableLoader<kKV>, kKV, kD>(group_padded)
             : pick_table_fma_group<kKV, kD>(group_padded);
}

template <DType kKV>
DecodeItemFn pick_dim(int d, int group_padded, bool dot) {
  switch (d) {
    case 64:
      return pick_group<kKV, 64>(group_padded, dot);
    case 128:
      return pick_group<kKV, 128>(group_padded, dot);
    case 256:
      return pick_group<kKV, 256>(group_padded, dot);
    default:
      return nullptr;
  }
}

}  // namespace
}  // namespace kvattn::cpu
